/* The tap's copy without the tap's reader: SOCKETS packet sockets on loopback, each with the
 * tap's kind of ring (TPACKET_V3, 128 KiB blocks, 32 MiB, handed over when full or 8 ms old) and a
 * filter keeping what the tap's keeps on loopback (IPv4 TCP segments to or from PORT that carry
 * bytes, a SYN, a FIN or a RST; IPv4 only, headers without options), so that the kernel copies each such segment SOCKETS times in the sender's
 * path, as SOCKETS taps would. The reader here looks at each block every 4 ms, as the tap's naps
 * do, and hands it straight back: MODE "drain" reads no packet (the copy's cost alone, on the
 * sender); "touch" reads every byte of every packet (a sum), as a reader that parses does, pulling
 * the lines the sender's CPU wrote. Keyed on and off by scripts/gpu/tap_toggle.py like a tap
 * (proxy_acceptance.sh, TOG_DRAIN=MODE): what part of a tap's cost is the copy, what the reading.
 * KIND "bpf" asks what another way of copying would cost the sender: instead of packet sockets,
 * SOCKETS eBPF programs on the cgroup-v2 root's egress hook (every socket's sends, in the
 * sender's path as the packet socket's copy is; while they run, every process's sends on the
 * host pay the hook: run nothing else to be measured beside them), each keeping loopback's
 * sends only and the same bytes (the same test, on
 * the same header bytes; a segment not yet cut to loopback's MTU there is one record where the
 * packet socket sees two or more) in a BPF ring buffer of 32 MiB: a record a segment, its size the
 * smallest of a few classes that holds it, its time (CLOCK_MONOTONIC) and the segment from the IP
 * header on, copied once, with no wake-up (the reader looks every 4 ms). Either kind is keyed by
 * signals: SIGUSR2 detaches the programs or binds the packet sockets to a protocol nothing carries
 * (off the packet hook), SIGUSR1 attaches or binds them again (tap_toggle.py --signals; TOG_DRAIN=bpf, tap_server_cost.sh's arms bpfN and packetN:
 * the whole cost of each, where tap_toggle.py's filter swap keys a packet socket's copy alone);
 * the programs go when this exits (links). "touch" also counts
 * the TCP payload's bytes kept and their sum, which both kinds must agree on (tests/tests/tap.rs).
 *   cc -O2 -o ring_drain benches/ring_drain.c && ./ring_drain PORT [SOCKETS=1] [MODE=drain] [KIND=packet|bpf]
 * Needs CAP_NET_RAW (packet), CAP_BPF and CAP_NET_ADMIN (bpf). Prints its counts at SIGTERM or SIGINT. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_SIZE (128 << 10)
#define BLOCKS 256
#define MAX_SOCKETS 64

static volatile sig_atomic_t stop, keyed = -1;
static void on_signal(int sig) { (void)sig; stop = 1; }
/* keyed from outside: SIGUSR1 attaches the programs or binds the packet sockets to every protocol,
 * SIGUSR2 detaches them or binds the sockets to one that nothing carries */
static void on_key(int sig) { keyed = sig == SIGUSR1; }

struct ring {
    int fd;
    unsigned char *map;
    unsigned next;
    /* KIND bpf: the ring buffer's map, its consumer position (ours to write), its producer
     * page, and its data (mapped twice over, so that a record across the end reads whole) */
    int prog, link, drops;
    unsigned long *consumer;
    const unsigned long *producer;
    const unsigned char *data;
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

/* ---- KIND bpf ---- */
#define BPF_RING_BYTES (32u << 20)
/* the largest segment kept whole: at the egress hook a segment is not cut to the MTU yet, and
 * loopback takes up to its tso_max_size (524 280 bytes) at once, in segments of more than 64 KiB
 * (an IPv4 total length then reads 0) that the packet socket sees cut in two or more */
#define BPF_CAP (512 << 10)
#define MAX_INSNS 320

static long sys_bpf(int cmd, union bpf_attr *attr) { return syscall(__NR_bpf, cmd, attr, sizeof *attr); }

/* A program being written, with forward jumps to labels patched at the end. */
struct prog {
    struct bpf_insn insn[MAX_INSNS];
    int n;
    struct { int at, label; } jumps[64];
    int njumps;
    int labels[16]; /* -1: not placed */
};
static void emit(struct prog *p, __u8 code, __u8 dst, __u8 src, __s16 off, __s32 imm) {
    if (p->n < MAX_INSNS)
        p->insn[p->n] = (struct bpf_insn){.code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm};
    p->n++;
}
/* a jump (op on dst against imm, or against src with BPF_X in op) to `label` */
static void jump_to(struct prog *p, __u8 op, __u8 dst, __u8 src, __s32 imm, int label) {
    if (p->njumps < 64) p->jumps[p->njumps] = (typeof(p->jumps[0])){p->n, label};
    p->njumps++;
    emit(p, BPF_JMP | op, dst, src, 0, imm);
}
static void jump(struct prog *p, __u8 op, __u8 dst, __s32 imm, int label) { jump_to(p, op | BPF_K, dst, 0, imm, label); }
static void label(struct prog *p, int label) { if (label >= 0 && label < 16) p->labels[label] = p->n; }
#define MOV_IMM(d, i) emit(pp, BPF_ALU64 | BPF_MOV | BPF_K, d, 0, 0, i)
#define MOV_REG(d, s) emit(pp, BPF_ALU64 | BPF_MOV | BPF_X, d, s, 0, 0)
#define ALU_IMM(op, d, i) emit(pp, BPF_ALU64 | (op) | BPF_K, d, 0, 0, i)
#define SUB_REG(d, s) emit(pp, BPF_ALU64 | BPF_SUB | BPF_X, d, s, 0, 0)
#define LOAD(size, d, s, off) emit(pp, BPF_LDX | BPF_MEM | (size), d, s, off, 0)
#define STORE(size, d, off, s) emit(pp, BPF_STX | BPF_MEM | (size), d, s, off, 0)
#define CALL(f) emit(pp, BPF_JMP | BPF_CALL, 0, 0, 0, f)

enum { PASS, COPIED, OURS_IN_PLACE, OURS_COPIED, KEEP, SIZED, FULL };
/* The tap's test on the headers at `base` + `off` (IP at off, TCP at off + 20): to KEEP with the
 * segment's length in r8, or to PASS. `ours`: a label of its own for each place it is written. */
static void test_headers(struct prog *pp, __u8 base, __s16 off, __u16 be_port, int ours) {
    LOAD(BPF_B, BPF_REG_5, base, off);
    jump(pp, BPF_JNE, BPF_REG_5, 0x45, PASS);
    LOAD(BPF_B, BPF_REG_5, base, off + 9);
    jump(pp, BPF_JNE, BPF_REG_5, 6, PASS);
    LOAD(BPF_H, BPF_REG_5, base, off + 6);
    jump(pp, BPF_JSET, BPF_REG_5, htons(0x3fff), PASS);
    LOAD(BPF_H, BPF_REG_5, base, off + 20);
    jump(pp, BPF_JEQ, BPF_REG_5, be_port, ours);
    LOAD(BPF_H, BPF_REG_5, base, off + 22);
    jump(pp, BPF_JNE, BPF_REG_5, be_port, PASS);
    label(pp, ours);
    LOAD(BPF_W, BPF_REG_8, BPF_REG_6, offsetof(struct __sk_buff, len));
    LOAD(BPF_B, BPF_REG_5, base, off + 32);
    ALU_IMM(BPF_RSH, BPF_REG_5, 2);
    ALU_IMM(BPF_AND, BPF_REG_5, 0x3c);
    ALU_IMM(BPF_ADD, BPF_REG_5, 20);
    MOV_REG(BPF_REG_0, BPF_REG_8);
    SUB_REG(BPF_REG_0, BPF_REG_5);
    jump(pp, BPF_JSGT, BPF_REG_0, 0, KEEP);
    LOAD(BPF_B, BPF_REG_5, base, off + 33);
    jump(pp, BPF_JSET, BPF_REG_5, 0x07, KEEP);
    jump(pp, BPF_JA, 0, 0, PASS);
}

/* The egress program: the tap's test (IPv4 TCP without IP options, not a fragment, PORT at
 * either end, bytes past the headers or SYN, FIN or RST) on the first 40 bytes, then a record of
 * the smallest class that holds the segment: [u64 time][u32 length][u32 0][the segment]; where
 * the ring has no room, a drop counted in `drops`. */
static int bpf_program(int map, int drops, long port, unsigned lo) {
    enum { NEXT0 = FULL + 1 };
    static const unsigned classes[] = {512, 1024, 2048, 4096, 16384, 65536 + 16, (128 << 10) + 16,
                                       (256 << 10) + 16, BPF_CAP + 16};
    enum { NCLASSES = sizeof classes / sizeof classes[0] };
    _Static_assert(NEXT0 + NCLASSES <= 16, "labels");
    struct prog prog = {0}, *pp = &prog;
    memset(prog.labels, -1, sizeof prog.labels);
    __u16 be_port = htons((unsigned short)port); /* as a 16-bit load of the header reads it */
    MOV_REG(BPF_REG_6, BPF_REG_1);
    /* loopback's sends only, as the packet kind's socket bound to lo hears */
    LOAD(BPF_W, BPF_REG_5, BPF_REG_6, offsetof(struct __sk_buff, ifindex));
    jump(pp, BPF_JNE, BPF_REG_5, (__s32)lo, PASS);
    /* the headers read in place where they are in the skb's linear part (every TCP segment this
     * machine sends), else copied to the stack first */
    LOAD(BPF_W, BPF_REG_2, BPF_REG_6, offsetof(struct __sk_buff, data));
    LOAD(BPF_W, BPF_REG_3, BPF_REG_6, offsetof(struct __sk_buff, data_end));
    MOV_REG(BPF_REG_4, BPF_REG_2);
    ALU_IMM(BPF_ADD, BPF_REG_4, 40);
    jump_to(pp, BPF_JGT | BPF_X, BPF_REG_4, BPF_REG_3, 0, COPIED);
    test_headers(pp, BPF_REG_2, 0, be_port, OURS_IN_PLACE);
    label(pp, COPIED);
    MOV_REG(BPF_REG_1, BPF_REG_6);
    MOV_IMM(BPF_REG_2, 0);
    MOV_REG(BPF_REG_3, BPF_REG_10);
    ALU_IMM(BPF_ADD, BPF_REG_3, -40);
    MOV_IMM(BPF_REG_4, 40);
    CALL(BPF_FUNC_skb_load_bytes);
    jump(pp, BPF_JNE, BPF_REG_0, 0, PASS);
    test_headers(pp, BPF_REG_10, -40, be_port, OURS_COPIED);
    label(pp, KEEP);
    jump(pp, BPF_JLE, BPF_REG_8, BPF_CAP, SIZED);
    MOV_IMM(BPF_REG_8, BPF_CAP);
    label(pp, SIZED);
    jump(pp, BPF_JLT, BPF_REG_8, 1, PASS);
    for (int c = 0; c < NCLASSES; c++) {
        if (c + 1 < NCLASSES) jump(pp, BPF_JGT, BPF_REG_8, (int)classes[c] - 16, NEXT0 + c);
        emit(pp, BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map);
        emit(pp, 0, 0, 0, 0, 0);
        MOV_IMM(BPF_REG_2, (int)classes[c]);
        MOV_IMM(BPF_REG_3, 0);
        CALL(BPF_FUNC_ringbuf_reserve);
        jump(pp, BPF_JEQ, BPF_REG_0, 0, FULL);
        MOV_REG(BPF_REG_7, BPF_REG_0);
        CALL(BPF_FUNC_ktime_get_ns);
        STORE(BPF_DW, BPF_REG_7, 0, BPF_REG_0);
        STORE(BPF_W, BPF_REG_7, 8, BPF_REG_8);
        emit(pp, BPF_ST | BPF_MEM | BPF_W, BPF_REG_7, 0, 12, 0);
        MOV_REG(BPF_REG_1, BPF_REG_6);
        MOV_IMM(BPF_REG_2, 0);
        MOV_REG(BPF_REG_3, BPF_REG_7);
        ALU_IMM(BPF_ADD, BPF_REG_3, 16);
        MOV_REG(BPF_REG_4, BPF_REG_8);
        CALL(BPF_FUNC_skb_load_bytes);
        MOV_REG(BPF_REG_1, BPF_REG_7);
        MOV_IMM(BPF_REG_2, BPF_RB_NO_WAKEUP);
        CALL(BPF_FUNC_ringbuf_submit);
        jump(pp, BPF_JA, 0, 0, PASS);
        if (c + 1 < NCLASSES) label(pp, NEXT0 + c);
    }
    /* no room in the ring: counted in the drops map's one u64 */
    label(pp, FULL);
    emit(pp, BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -4, 0);
    emit(pp, BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, drops);
    emit(pp, 0, 0, 0, 0, 0);
    MOV_REG(BPF_REG_2, BPF_REG_10);
    ALU_IMM(BPF_ADD, BPF_REG_2, -4);
    CALL(BPF_FUNC_map_lookup_elem);
    jump(pp, BPF_JEQ, BPF_REG_0, 0, PASS);
    MOV_IMM(BPF_REG_1, 1);
    emit(pp, BPF_STX | BPF_ATOMIC | BPF_DW, BPF_REG_0, BPF_REG_1, 0, BPF_ADD);
    label(pp, PASS);
    MOV_IMM(BPF_REG_0, 1); /* cgroup egress: let the segment go */
    emit(pp, BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    if (pp->n > MAX_INSNS || pp->njumps > 64) { fprintf(stderr, "ring_drain: program too long\n"); errno = E2BIG; return -1; }
    for (int j = 0; j < pp->njumps; j++) {
        int to = pp->jumps[j].label;
        if (to < 0 || to >= 16 || pp->labels[to] < 0) { fprintf(stderr, "ring_drain: a jump to label %d, never placed\n", to); errno = EINVAL; return -1; }
        pp->insn[pp->jumps[j].at].off = (__s16)(pp->labels[to] - pp->jumps[j].at - 1);
    }
    static char log[1 << 16];
    union bpf_attr a = {0};
    a.prog_type = BPF_PROG_TYPE_CGROUP_SKB;
    a.expected_attach_type = BPF_CGROUP_INET_EGRESS;
    a.insns = (unsigned long)pp->insn;
    a.insn_cnt = (unsigned)pp->n;
    a.license = (unsigned long)"GPL";
    a.log_buf = (unsigned long)log;
    a.log_size = sizeof log;
    a.log_level = 1;
    int fd = (int)sys_bpf(BPF_PROG_LOAD, &a);
    if (fd < 0) fprintf(stderr, "ring_drain: the verifier said:\n%s\n", log);
    return fd;
}

/* the cgroup-v2 hierarchy's root, as mounted here */
static int cgroup2_root(void) {
    FILE *f = fopen("/proc/self/mounts", "r");
    char dev[256], dir[4096], type[64];
    int fd = -1;
    while (f && fd < 0 && fscanf(f, "%255s %4095s %63s %*[^\n]", dev, dir, type) == 3)
        if (!strcmp(type, "cgroup2")) fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (f) fclose(f);
    return fd;
}

static int attach_bpf(struct ring *r, int cgroup);

static int open_bpf_ring(struct ring *r, long port, int cgroup, unsigned lo) {
    union bpf_attr a = {0};
    a.map_type = BPF_MAP_TYPE_RINGBUF;
    a.max_entries = BPF_RING_BYTES;
    r->fd = (int)sys_bpf(BPF_MAP_CREATE, &a);
    if (r->fd < 0) return -1;
    long page = sysconf(_SC_PAGESIZE);
    void *cons = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    void *prod = mmap(NULL, (size_t)page + 2 * BPF_RING_BYTES, PROT_READ, MAP_SHARED, r->fd, page);
    if (cons == MAP_FAILED || prod == MAP_FAILED) return -1;
    r->consumer = cons;
    r->producer = prod;
    r->data = (const unsigned char *)prod + page;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 8;
    a.max_entries = 1;
    r->drops = (int)sys_bpf(BPF_MAP_CREATE, &a);
    if (r->drops < 0) return -1;
    r->prog = bpf_program(r->fd, r->drops, port, lo);
    r->link = -1;
    return r->prog < 0 ? -1 : attach_bpf(r, cgroup);
}

/* Attaches the ring's program by a link: detached when the link's descriptor is closed, at the
 * latest when this process ends however it ends. */
static int attach_bpf(struct ring *r, int cgroup) {
    union bpf_attr a = {0};
    a.link_create.prog_fd = (unsigned)r->prog;
    a.link_create.target_fd = (unsigned)cgroup;
    a.link_create.attach_type = BPF_CGROUP_INET_EGRESS;
    r->link = (int)sys_bpf(BPF_LINK_CREATE, &a);
    return r->link < 0 ? -1 : 0;
}

/* What "touch" reads: every byte's sum, and the TCP payload's bytes and their sum. */
struct tally {
    unsigned long long sum, payload, payload_sum;
};

/* Reads a segment of `len` bytes from its IPv4 header on into `t`. */
static void touch_segment(const unsigned char *ip, unsigned len, struct tally *t) {
    unsigned headers = (ip[0] & 0x0f) * 4u + ((ip[(ip[0] & 0x0f) * 4 + 12] >> 4) * 4u);
    for (unsigned j = 0; j < len; j++) t->sum += ip[j];
    for (unsigned j = headers; j < len; j++) t->payload_sum += ip[j];
    if (len > headers) t->payload += len - headers;
}

/* Reads what the program wrote since the last look; returns the records, each read into `t` when
 * touching. */
static unsigned long long drain_bpf_ring(struct ring *r, int touch, struct tally *t) {
    unsigned long cons = *r->consumer, n = 0;
    unsigned long prod = __atomic_load_n(r->producer, __ATOMIC_ACQUIRE);
    while (cons < prod) {
        const unsigned char *rec = r->data + (cons & (BPF_RING_BYTES - 1));
        unsigned len = __atomic_load_n((const unsigned *)rec, __ATOMIC_ACQUIRE);
        if (len & BPF_RINGBUF_BUSY_BIT) break;
        if (touch && !(len & BPF_RINGBUF_DISCARD_BIT)) {
            /* the record as the program wrote it: [u64 time][u32 length][u32][the segment] */
            const unsigned char *own = rec + BPF_RINGBUF_HDR_SZ;
            unsigned seg;
            memcpy(&seg, own + 8, sizeof seg);
            touch_segment(own + 16, seg, t);
        }
        cons += ((len & ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT)) + BPF_RINGBUF_HDR_SZ + 7) & ~7u;
        n++;
    }
    __atomic_store_n(r->consumer, cons, __ATOMIC_RELEASE);
    return n;
}

/* The program's count of records it had no room for; -1 where it cannot be read. */
static long long bpf_ring_drops(const struct ring *r) {
    __u32 key = 0;
    __u64 value = 0;
    union bpf_attr a = {0};
    a.map_fd = (unsigned)r->drops;
    a.key = (unsigned long)&key;
    a.value = (unsigned long)&value;
    if (sys_bpf(BPF_MAP_LOOKUP_ELEM, &a)) {
        perror("ring_drain: reading the drops counter");
        return -1;
    }
    return (long long)value;
}

/* The kernel's count of packets the ring had no room for; -1 where it cannot be read. */
static long long packet_ring_drops(const struct ring *r) {
    struct tpacket_stats_v3 s = {0};
    socklen_t len = sizeof s;
    if (getsockopt(r->fd, SOL_PACKET, PACKET_STATISTICS, &s, &len)) {
        perror("ring_drain: reading a packet ring's drops");
        return -1;
    }
    return s.tp_drops;
}

/* Keyed off, a packet socket is bound to a protocol no packet here carries (the local
 * experimental ethertype; bind reads protocol 0 as "unchanged"), which takes it off the list every
 * packet is handed to, as an eBPF program is detached: on against off is then the whole cost of
 * either kind (tap_toggle.py's filter swap leaves the socket on that list, and keys the copy
 * alone). Its ring stays, and its open block is handed over by the timer as ever. */
static int bind_packet_ring(struct ring *r, int on, unsigned lo) {
    struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(on ? ETH_P_ALL : ETH_P_802_EX1),
                             .sll_ifindex = (int)lo};
    return bind(r->fd, (struct sockaddr *)&ll, sizeof ll);
}

/* KIND packet: hands back every block the kernel has handed over; returns the packets. */
static unsigned long long drain_packet_ring(struct ring *r, int touch, struct tally *t,
                                            unsigned long long *blocks) {
    unsigned long long packets = 0;
    for (;;) {
        struct tpacket_block_desc *b = (void *)(r->map + (size_t)r->next * BLOCK_SIZE);
        if (!(__atomic_load_n(&b->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) break;
        packets += b->hdr.bh1.num_pkts;
        if (touch) {
            struct tpacket3_hdr *h = (void *)((unsigned char *)b + b->hdr.bh1.offset_to_first_pkt);
            for (unsigned k = 0; k < b->hdr.bh1.num_pkts; k++) {
                touch_segment((unsigned char *)h + h->tp_mac, h->tp_snaplen, t);
                h = (void *)((unsigned char *)h + h->tp_next_offset);
            }
        }
        __atomic_store_n(&b->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        r->next = (r->next + 1) % BLOCKS;
        (*blocks)++;
    }
    return packets;
}

/* Every ring read once; returns the packets or records. */
static unsigned long long drain_all(struct ring *rings, long n, int bpf, int touch, struct tally *t,
                                    unsigned long long *blocks) {
    unsigned long long packets = 0;
    for (int i = 0; i < n; i++)
        packets += bpf ? drain_bpf_ring(&rings[i], touch, t) : drain_packet_ring(&rings[i], touch, t, blocks);
    return packets;
}

/* Keyed on (programs attached, sockets bound to every protocol) or off; 0, or -1 said. */
static int key_all(struct ring *rings, long n, int bpf, int on, unsigned lo, int cgroup) {
    for (int i = 0; i < n; i++) {
        struct ring *r = &rings[i];
        if (!bpf) {
            if (bind_packet_ring(r, on, lo)) {
                perror("ring_drain: binding a packet socket to another protocol");
                return -1;
            }
            continue;
        }
        if (r->link >= 0) close(r->link);
        r->link = -1;
        if (on && attach_bpf(r, cgroup)) {
            perror("ring_drain: attaching an egress program again");
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    char *end = "";
    long port = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    int bad = *end != '\0';
    long n = argc > 2 ? strtol(argv[2], &end, 10) : 1;
    bad |= *end != '\0';
    const char *mode = argc > 3 ? argv[3] : "drain";
    const char *kind = argc > 4 ? argv[4] : "packet";
    int touch = !strcmp(mode, "touch"), bpf = !strcmp(kind, "bpf");
    if (bad || argc < 2 || argc > 5 || port <= 0 || port > 65535 || n < 1 || n > MAX_SOCKETS ||
        (!touch && strcmp(mode, "drain")) || (!bpf && strcmp(kind, "packet"))) {
        fprintf(stderr, "usage: ring_drain PORT (1..65535) [SOCKETS=1 (1..%d)] [MODE=drain|touch] [KIND=packet|bpf]\n", MAX_SOCKETS);
        return 2;
    }
    unsigned lo = if_nametoindex("lo"); /* 0 would bind every interface */
    if (!lo) {
        perror("ring_drain: the loopback interface");
        return 1;
    }
    int cgroup = bpf ? cgroup2_root() : -1;
    if (bpf && cgroup < 0) {
        fprintf(stderr, "ring_drain: no cgroup2 hierarchy mounted (/proc/self/mounts): KIND bpf needs one (not allowed here)\n");
        return 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGUSR1, on_key);
    signal(SIGUSR2, on_key);
    /* a caller killed outright takes this down too: its programs are on every send of the host */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    static struct ring rings[MAX_SOCKETS];
    for (int i = 0; i < n; i++)
        if (bpf ? open_bpf_ring(&rings[i], port, cgroup, lo) : open_ring(&rings[i], port, lo)) {
            /* "needs" only where the kernel said so: a program the verifier refused is EACCES */
            int denied = errno == EPERM;
            fprintf(stderr, "ring_drain: %s: %s%s\n",
                    bpf ? "an eBPF ring buffer and its egress program" : "a packet socket's ring on lo",
                    strerror(errno),
                    !denied ? "" : bpf ? " (needs CAP_BPF and CAP_NET_ADMIN)" : " (needs CAP_NET_RAW)");
            return 1;
        }
    fprintf(stderr, "ring_drain: %ld ring(s) on port %ld, %s, %s\n", n, port, mode, kind);
    unsigned long long blocks = 0, packets = 0;
    struct tally t = {0};
    struct timespec nap = {0, 4000000};
    while (!stop) {
        int key = keyed;
        if (key >= 0) {
            keyed = -1;
            if (key_all(rings, n, bpf, key, lo, cgroup)) return 1;
        }
        packets += drain_all(rings, n, bpf, touch, &t, &blocks);
        nanosleep(&nap, NULL);
    }
    /* what came since the last look: a packet ring's open block is handed over by its timer */
    if (!bpf) nanosleep(&(struct timespec){0, 20000000}, NULL);
    packets += drain_all(rings, n, bpf, touch, &t, &blocks);
    unsigned long long drops = 0;
    int unknown = 0;
    for (int i = 0; i < n; i++) {
        long long d = bpf ? bpf_ring_drops(&rings[i]) : packet_ring_drops(&rings[i]);
        unknown |= d < 0;
        drops += d < 0 ? 0 : (unsigned long long)d;
    }
    /* (the bpf kind has records, not blocks; a count not read is "?", never 0) */
    char dropped[32] = "?";
    if (!unknown) snprintf(dropped, sizeof dropped, "%llu", drops);
    fprintf(stderr, "ring_drain: %llu %s, %llu packets over %ld ring(s) (%s, %s; sum %llu, %llu payload bytes summing %llu), %s dropped\n",
            bpf ? packets : blocks, bpf ? "records" : "blocks", packets, n, mode, kind, t.sum, t.payload, t.payload_sum, dropped);
    return 0;
}
