/* What watching a server's streams costs when nothing stands between it and its client: a
 * packet socket on loopback (TPACKET_V3 ring, a wake-up per filled block or per RETIRE_MS, never
 * per packet) sees a copy of every TCP segment to or from PORT, and counts the SSE events in
 * them with a byte scan for "data:". No hop: the client's connection goes straight to the server.
 * The price moves to the kernel's copy of each segment into the ring, charged to the writer (the
 * server) and to the softirq, and to this reader's scan. Its figures, beside epoll_relay's
 * (benches/proxy.sh FLOOR=1), say what a passive tap would save over any relay. It does not
 * reassemble TCP: an event split across segments is counted where its "data:" lands (the
 * figure is a cost, not a count to trust).
 *   cc -O2 -o packet_tap benches/packet_tap.c && ./packet_tap PORT [RETIRE_MS=1]
 * Needs CAP_NET_RAW (root, or a container's default capabilities). */
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define BLOCK_SIZE (1 << 20)
#define BLOCKS 64

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }
static unsigned long long segments, payload_bytes, events, wakeups;

/* counts "data:" at the start of a payload or after a newline */
static void scan(const unsigned char *p, size_t n) {
    for (size_t i = 0; i + 5 <= n; i++) {
        const unsigned char *hit = memchr(p + i, 'd', n - i);
        if (!hit || (size_t)(hit - p) + 5 > n) return;
        i = hit - p;
        if ((i == 0 || p[i - 1] == '\n') && !memcmp(hit, "data:", 5)) events++;
    }
}

static void segment(const unsigned char *frame, unsigned len, int port) {
    if (len < ETH_HLEN + sizeof(struct iphdr)) return;
    const struct iphdr *ip = (const void *)(frame + ETH_HLEN);
    if (ip->version != 4 || ip->protocol != IPPROTO_TCP) return;
    unsigned ihl = ip->ihl * 4, total = ntohs(ip->tot_len);
    if (len < ETH_HLEN + ihl + sizeof(struct tcphdr) || total > len - ETH_HLEN) return;
    const struct tcphdr *tcp = (const void *)((const unsigned char *)ip + ihl);
    if (ntohs(tcp->source) != port && ntohs(tcp->dest) != port) return;
    unsigned off = ihl + tcp->doff * 4;
    if (total <= off) return;
    segments++;
    payload_bytes += total - off;
    scan((const unsigned char *)ip + off, total - off);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || atoi(argv[1]) <= 0) {
        fprintf(stderr, "usage: packet_tap PORT [RETIRE_MS=1]\n");
        return 2;
    }
    int port = atoi(argv[1]), one = 1, v3 = TPACKET_V3;
    /* protocol 0: nothing arrives (and nothing is dropped) until the ring is there and bind asks */
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) {
        perror("packet_tap: packet socket (needs CAP_NET_RAW)");
        return 1;
    }
    /* on loopback each segment passes the tap twice, going out and coming in: keep one */
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    struct tpacket_req3 req = {.tp_block_size = BLOCK_SIZE, .tp_block_nr = BLOCKS,
                               .tp_frame_size = 2048, .tp_frame_nr = BLOCK_SIZE / 2048 * BLOCKS,
                               .tp_retire_blk_tov = argc == 3 ? atoi(argv[2]) : 1};
    struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                             .sll_ifindex = (int)if_nametoindex("lo")};
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof v3) ||
        setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) ||
        bind(fd, (struct sockaddr *)&ll, sizeof ll)) {
        perror("packet_tap: ring on lo");
        return 1;
    }
    unsigned char *ring = mmap(NULL, (size_t)BLOCK_SIZE * BLOCKS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) {
        perror("packet_tap: mmap");
        return 1;
    }
    signal(SIGTERM, on_term);
    for (unsigned b = 0; !stop;) {
        struct tpacket_block_desc *block = (void *)(ring + (size_t)b * BLOCK_SIZE);
        if (!(block->hdr.bh1.block_status & TP_STATUS_USER)) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            poll(&p, 1, 100);
            wakeups++;
            continue;
        }
        struct tpacket3_hdr *h = (void *)((unsigned char *)block + block->hdr.bh1.offset_to_first_pkt);
        for (unsigned i = 0; i < block->hdr.bh1.num_pkts; i++) {
            segment((unsigned char *)h + h->tp_mac, h->tp_snaplen, port);
            h = (void *)((unsigned char *)h + h->tp_next_offset);
        }
        block->hdr.bh1.block_status = TP_STATUS_KERNEL;
        b = (b + 1) % BLOCKS;
    }
    struct tpacket_stats_v3 stats = {0};
    socklen_t n = sizeof stats;
    getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &stats, &n); /* the drops since the ring opened */
    fprintf(stderr, "packet_tap: %llu segments with payload on port %d, %llu bytes, %llu events, %llu wake-ups, %u packets dropped by the ring\n",
            segments, port, payload_bytes, events, wakeups, stats.tp_drops);
    return 0;
}
