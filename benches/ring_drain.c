/* The tap's copy without the tap's reader: SOCKETS packet sockets on loopback, each with the
 * tap's kind of ring (TPACKET_V3, 128 KiB blocks, 32 MiB, handed over when full or 8 ms old) and a
 * filter keeping what the tap's keeps on loopback (IPv4 TCP segments to or from PORT that carry
 * bytes, a SYN, a FIN or a RST; IPv4 only, headers without options), so that the kernel copies each such segment SOCKETS times in the sender's
 * path, as SOCKETS taps would. The reader here looks at each block every 4 ms, as the tap's naps
 * do, and hands it straight back: MODE "drain" reads no packet (the copy's cost alone, on the
 * sender); "touch" reads every byte of every packet (a sum), as a reader that parses does, pulling
 * the lines the sender's CPU wrote. Keyed on and off by scripts/gpu/tap_toggle.py like a tap
 * (proxy_acceptance.sh, TOG_DRAIN=MODE): what part of a tap's cost is the copy, what the reading.
 *   cc -O2 -o ring_drain benches/ring_drain.c && ./ring_drain PORT [SOCKETS=1] [MODE=drain]
 * Needs CAP_NET_RAW. Prints its counts at SIGTERM or SIGINT. */
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_SIZE (128 << 10)
#define BLOCKS 256
#define MAX_SOCKETS 64

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

struct ring {
    int fd;
    unsigned char *map;
    unsigned next;
};

static int open_ring(struct ring *r, long port, unsigned lo) {
    /* The tap's own fast path for loopback (exporters/src/tap/ring.rs, `filter`): IPv4 headers
     * without options, loaded at fixed offsets (inline in the kernel, where an indexed load is a
     * helper call). IPv6 and headers with options are dropped here: loopback sends neither on an
     * IPv4 benchmark. Jump offsets count from the next instruction: drop is [22], accept [21]. */
    struct sock_filter code[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SKF_AD_OFF + SKF_AD_PROTOCOL),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ETH_P_IP, 0, 20),
        /* 2 */ BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 9),
        /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 6, 0, 18),        /* TCP */
        /* 4 */ BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 6),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x3fff, 16, 0),  /* a whole segment */
        /* 6 */ BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 0),
        /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x45, 0, 14),     /* no IP options */
        /* 8 */ BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 20),
        /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)port, 2, 0),
        /* 10 */ BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 22),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)port, 0, 10),
        /* 12 */ BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 32),              /* the TCP header's length */
        /* 13 */ BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 2),
        /* 14 */ BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x3c),
        /* 15 */ BPF_STMT(BPF_MISC | BPF_TAX, 0),
        /* 16 */ BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 2),               /* the datagram's length */
        /* 17 */ BPF_STMT(BPF_ALU | BPF_SUB | BPF_X, 0),
        /* 18 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 20, 2, 0),       /* bytes past both headers */
        /* 19 */ BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 33),
        /* 20 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x07, 0, 1),    /* FIN, SYN or RST */
        /* 21 */ BPF_STMT(BPF_RET | BPF_K, BLOCK_SIZE - 512),
        /* 22 */ BPF_STMT(BPF_RET | BPF_K, 0),
    };
    _Static_assert(sizeof code / sizeof code[0] == 23, "the jump offsets above count on 23 instructions");
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    int one = 1, v3 = TPACKET_V3;
    /* protocol 0: nothing arrives until bind, after the filter and the ring are set */
    r->fd = socket(AF_PACKET, SOCK_DGRAM, 0);
    struct tpacket_req3 req = {.tp_block_size = BLOCK_SIZE, .tp_block_nr = BLOCKS,
                               .tp_frame_size = 2048, .tp_frame_nr = BLOCK_SIZE / 2048 * BLOCKS,
                               .tp_retire_blk_tov = 8};
    struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                             .sll_ifindex = (int)lo};
    if (r->fd < 0 || setsockopt(r->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) ||
        setsockopt(r->fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) ||
        setsockopt(r->fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof v3) ||
        setsockopt(r->fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) ||
        bind(r->fd, (struct sockaddr *)&ll, sizeof ll))
        return -1;
    r->map = mmap(NULL, (size_t)BLOCK_SIZE * BLOCKS, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    r->next = 0;
    return r->map == MAP_FAILED ? -1 : 0;
}

int main(int argc, char **argv) {
    char *end = "";
    long port = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    int bad = *end != '\0';
    long n = argc > 2 ? strtol(argv[2], &end, 10) : 1;
    bad |= *end != '\0';
    const char *mode = argc > 3 ? argv[3] : "drain";
    int touch = !strcmp(mode, "touch");
    if (bad || argc < 2 || argc > 4 || port <= 0 || port > 65535 || n < 1 || n > MAX_SOCKETS ||
        (!touch && strcmp(mode, "drain"))) {
        fprintf(stderr, "usage: ring_drain PORT (1..65535) [SOCKETS=1 (1..%d)] [MODE=drain|touch]\n", MAX_SOCKETS);
        return 2;
    }
    unsigned lo = if_nametoindex("lo"); /* 0 would bind every interface */
    if (!lo) {
        perror("ring_drain: the loopback interface");
        return 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    static struct ring rings[MAX_SOCKETS];
    for (int i = 0; i < n; i++)
        if (open_ring(&rings[i], port, lo)) {
            perror("ring_drain: a packet socket's ring on lo (needs CAP_NET_RAW)");
            return 1;
        }
    fprintf(stderr, "ring_drain: %ld ring(s) on port %ld, %s\n", n, port, mode);
    unsigned long long blocks = 0, packets = 0, sum = 0;
    struct timespec nap = {0, 4000000};
    while (!stop) {
        for (int i = 0; i < n; i++) {
            struct ring *r = &rings[i];
            for (;;) {
                struct tpacket_block_desc *b = (void *)(r->map + (size_t)r->next * BLOCK_SIZE);
                if (!(__atomic_load_n(&b->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) break;
                packets += b->hdr.bh1.num_pkts;
                if (touch) {
                    struct tpacket3_hdr *h = (void *)((unsigned char *)b + b->hdr.bh1.offset_to_first_pkt);
                    for (unsigned k = 0; k < b->hdr.bh1.num_pkts; k++) {
                        const unsigned char *p = (unsigned char *)h + h->tp_mac;
                        for (unsigned j = 0; j < h->tp_snaplen; j++) sum += p[j];
                        h = (void *)((unsigned char *)h + h->tp_next_offset);
                    }
                }
                __atomic_store_n(&b->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
                r->next = (r->next + 1) % BLOCKS;
                blocks++;
            }
        }
        nanosleep(&nap, NULL);
    }
    unsigned drops = 0;
    for (int i = 0; i < n; i++) {
        struct tpacket_stats_v3 s = {0};
        socklen_t len = sizeof s;
        getsockopt(rings[i].fd, SOL_PACKET, PACKET_STATISTICS, &s, &len);
        drops += s.tp_drops;
    }
    fprintf(stderr, "ring_drain: %llu blocks, %llu packets over %ld ring(s) (%s; sum %llu), %u dropped\n",
            blocks, packets, n, mode, sum, drops);
    return 0;
}
