/* The floor for a hop that batches its system calls: the same relay as epoll_relay.c (bytes
 * copied both ways, nothing parsed), on one io_uring instead of epoll. Every completion reaped in
 * a pass is answered (a send for a recv, a recv for a finished send) and all of them go to the
 * kernel in the one io_uring_enter that also waits for the next: where epoll_relay makes an
 * epoll_wait, a read and a write per event, this makes one call per pass, however many events the
 * pass holds. What is left per event is what the kernel itself charges (the socket's receive, the
 * send and the wake-ups of the readers), so the two relays side by side say how much of a hop's
 * cost is system calls and how much is the TCP path.
 * MIN_WAIT_US > 0 also asks the kernel (6.12+, IORING_FEAT_MIN_TIMEOUT) to hold a wake-up until 64
 * completions or MIN_WAIT_US have passed: fewer, fuller passes for at most that much added
 * latency per hop.
 *   cc -O2 -o uring_relay benches/uring_relay.c -luring
 *   ./uring_relay LISTEN_PORT UPSTREAM_PORT [MIN_WAIT_US=0]
 * Loopback only (127.0.0.1). benches/proxy.sh runs it after epoll_relay when FLOOR=uring. */
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXFD 65536
#define BUF 16384
#define FEAT_MIN_TIMEOUT (1U << 15)
enum op { ACCEPT, RECV, SEND };

static struct io_uring ring;
static int peer[MAXFD], inflight[MAXFD], len[MAXFD], off[MAXFD];
static char dead[MAXFD], *buf[MAXFD];
static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static struct sockaddr_in addr(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static struct io_uring_sqe *sqe(void) {
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    while (!s) { /* the ring is full: hand what it holds to the kernel now */
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    return s;
}

static void tag(struct io_uring_sqe *s, int fd, enum op op) {
    io_uring_sqe_set_data64(s, ((unsigned long long)fd << 2) | op);
}

static void post_recv(int fd) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_recv(s, fd, buf[fd], BUF, 0);
    tag(s, fd, RECV);
    inflight[fd]++;
}

/* sends the rest of src's buffer to its peer */
static void post_send(int src) {
    int dst = peer[src];
    struct io_uring_sqe *s = sqe();
    io_uring_prep_send(s, dst, buf[src] + off[src], len[src] - off[src], MSG_NOSIGNAL);
    tag(s, dst, SEND);
    inflight[dst]++;
}

/* one side ended: end both; each is closed once nothing of ours is pending on it */
static void kill_pair(int fd) {
    int p = peer[fd];
    if (!dead[fd]) {
        dead[fd] = dead[p] = 1;
        shutdown(fd, SHUT_RDWR);
        shutdown(p, SHUT_RDWR);
    }
}

static void settle(int fd) {
    inflight[fd]--;
    if (dead[fd] && inflight[fd] == 0) {
        close(fd);
        dead[fd] = 0;
    }
}

static void accepted(int c, int lfd_port_upstream) {
    struct sockaddr_in ua = addr(lfd_port_upstream);
    int one = 1, u = socket(AF_INET, SOCK_STREAM, 0);
    if (c >= MAXFD || u < 0 || u >= MAXFD || connect(u, (struct sockaddr *)&ua, sizeof ua)) {
        close(c);
        if (u >= 0) close(u);
        return;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    peer[c] = u;
    peer[u] = c;
    for (int i = 0; i < 2; i++) {
        int fd = i ? u : c;
        if (!buf[fd] && !(buf[fd] = malloc(BUF))) exit(1);
        post_recv(fd);
    }
}

static void complete(struct io_uring_cqe *cqe, int lfd, int upstream_port) {
    int fd = (int)(cqe->user_data >> 2), res = cqe->res;
    switch ((enum op)(cqe->user_data & 3)) {
    case ACCEPT:
        if (res >= 0) accepted(res, upstream_port);
        if (!(cqe->flags & IORING_CQE_F_MORE)) {
            struct io_uring_sqe *s = sqe();
            io_uring_prep_multishot_accept(s, lfd, NULL, NULL, 0);
            tag(s, lfd, ACCEPT);
        }
        return;
    case RECV:
        if (res > 0 && !dead[fd]) {
            len[fd] = res;
            off[fd] = 0;
            post_send(fd);
        } else if (res == -EINTR || res == -EAGAIN) {
            if (!dead[fd]) post_recv(fd);
        } else {
            kill_pair(fd);
        }
        settle(fd);
        return;
    case SEND: {
        int src = peer[fd];
        if (res > 0 && !dead[fd]) {
            off[src] += res;
            if (off[src] < len[src]) post_send(src);
            else post_recv(src);
        } else {
            kill_pair(fd);
        }
        settle(fd);
        return;
    }
    }
}

/* submits what is queued and waits for the next completion, holding the wake-up up to
 * min_wait_us for a fuller batch when asked */
static int submit_and_wait(unsigned min_wait_us) {
    if (!min_wait_us) return io_uring_submit_and_wait(&ring, 1);
    io_uring_submit(&ring);
    struct __kernel_timespec ts = {.tv_sec = 1};
    struct io_uring_getevents_arg arg = {.ts = (unsigned long long)&ts};
    arg.pad = min_wait_us; /* min_wait_usec since Linux 6.12 */
    int r = (int)syscall(__NR_io_uring_enter, ring.ring_fd, 0, 64,
                         IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof arg);
    return r < 0 && errno != ETIME && errno != EINTR ? -errno : 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: uring_relay LISTEN_PORT UPSTREAM_PORT [MIN_WAIT_US=0]\n");
        return 2;
    }
    unsigned min_wait_us = argc == 4 ? (unsigned)atoi(argv[3]) : 0;
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), upstream_port = atoi(argv[2]);
    struct sockaddr_in la = addr(atoi(argv[1]));
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&la, sizeof la) || listen(lfd, 4096)) {
        perror("uring_relay: listen");
        return 1;
    }
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    int r = io_uring_queue_init_params(4096, &ring, &p);
    if (r < 0) {
        fprintf(stderr, "uring_relay: io_uring_setup: %s\n", strerror(-r));
        return 1;
    }
    if (min_wait_us && !(p.features & FEAT_MIN_TIMEOUT)) {
        fprintf(stderr, "uring_relay: this kernel has no min-wait (IORING_FEAT_MIN_TIMEOUT, 6.12+)\n");
        return 1;
    }
    struct io_uring_sqe *s = sqe();
    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, 0);
    tag(s, lfd, ACCEPT);
    signal(SIGTERM, on_term);
    unsigned long long passes = 0, completions = 0;
    while (!stop) {
        r = submit_and_wait(min_wait_us);
        if (r < 0 && r != -EINTR && r != -ETIME) {
            fprintf(stderr, "uring_relay: io_uring_enter: %s\n", strerror(-r));
            return 1;
        }
        struct io_uring_cqe *cqe;
        unsigned head, n = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            complete(cqe, lfd, upstream_port);
            n++;
        }
        io_uring_cq_advance(&ring, n);
        passes++;
        completions += n;
    }
    /* how full the passes were: the batching this relay is for */
    fprintf(stderr, "uring_relay: %llu passes, %llu completions, %.2f per pass\n", passes,
            completions, passes ? (double)completions / passes : 0.0);
    return 0;
}
