/* What the kernel charges for one event's socket work alone, with nobody to wake: one thread
 * sends EVENT_BYTES on a loopback TCP connection and reads them at the other end, COUNT times,
 * never blocking. A hop does one such read and one such send per forwarded event, so their sum is
 * the least any relay can cost per event on this host, before any wake-up or system-call batching
 * (benches/epoll_relay.c, benches/uring_relay.c).
 * PORT puts the listener on 127.0.0.2:PORT (default: any free port on 127.0.0.1), where a tap
 * attached to PORT sees every event (benches/tap_writer_cost.sh: what the tap adds to a writer);
 * HOST (2..254, default 2) puts it on 127.0.0.HOST instead, so that several writers at once use
 * the same tapped port. WORK_KB (default 0) adds the writer's own work to each event: a walk of a
 * WORK_KB KiB working set, a write to each cache line, as a server's code touches its data
 * between sends; its user and system time an event are printed apart (getrusage), so that what
 * a tap costs the writer's own code (its caches, refilled after the kernel's copy) shows as user
 * time.
 *   cc -O2 -o tcp_op_cost benches/tcp_op_cost.c && ./tcp_op_cost [COUNT=200000] [EVENT_BYTES=200] [PORT] [HOST] [WORK_KB] */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double seconds(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 200000, bytes = argc > 2 ? atol(argv[2]) : 200;
    long port = argc > 3 ? atol(argv[3]) : 0, host = argc > 4 ? atol(argv[4]) : 2;
    long work_kb = argc > 5 ? atol(argv[5]) : 0;
    if (count <= 0 || bytes <= 0 || bytes > 65536 || port < 0 || port > 65535 || host < 2 || host > 254 ||
        work_kb < 0 || work_kb > 1 << 20) {
        fprintf(stderr, "usage: tcp_op_cost [COUNT=200000] [EVENT_BYTES=200 (1..65536)] [PORT (1..65535)] [HOST (2..254)] [WORK_KB (0..1048576)]\n");
        return 2;
    }
    size_t work = (size_t)work_kb * 1024;
    volatile char *ws = work ? calloc(work, 1) : NULL;
    if (work && !ws) {
        perror("tcp_op_cost: working set");
        return 1;
    }
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), a = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(port ? INADDR_LOOPBACK + (unsigned)host - 1 : INADDR_LOOPBACK);
    sa.sin_port = htons((unsigned short)port);
    socklen_t n = sizeof sa;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 1) || getsockname(l, (struct sockaddr *)&sa, &n) ||
        connect(a, (struct sockaddr *)&sa, sizeof sa)) {
        perror("tcp_op_cost: loopback connection");
        return 1;
    }
    int b = accept(l, NULL, NULL);
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static char buf[65536];
    /* the whole loop timed once (a thread-CPU clock read is itself a system call here), then
     * again with each send timed apart, less what the clock reads cost on their own */
    double t0 = now(CLOCK_THREAD_CPUTIME_ID), send_s = 0;
    struct rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    for (int timed = 0; timed < 2; timed++) {
        for (long i = 0; i < count; i++) {
            double s0 = timed ? now(CLOCK_THREAD_CPUTIME_ID) : 0;
            if (send(a, buf, bytes, 0) != bytes) return 1;
            if (timed) send_s += now(CLOCK_THREAD_CPUTIME_ID) - s0;
            for (long got = 0; got < bytes;) {
                ssize_t r = recv(b, buf, sizeof buf, 0);
                if (r <= 0) return 1;
                got += r;
            }
            for (size_t j = 0; j < work; j += 64) ws[j]++;
        }
        if (!timed) {
            t0 = now(CLOCK_THREAD_CPUTIME_ID) - t0;
            getrusage(RUSAGE_THREAD, &ru1);
        }
    }
    double clock_s = 0;
    for (long i = 0; i < count; i++) {
        double s0 = now(CLOCK_THREAD_CPUTIME_ID);
        clock_s += now(CLOCK_THREAD_CPUTIME_ID) - s0;
    }
    double both = t0 * 1e6 / count, send_us = (send_s - clock_s) * 1e6 / count;
    printf("tcp_op_cost: %ld events of %ld bytes%s: send + recv %.2f us per event (CPU); send %.2f, recv %.2f",
           count, bytes, port ? " (port given)" : "", both, send_us, both - send_us);
    if (work)
        printf("; with a %ld KiB walk an event: user %.2f us, system %.2f us per event", work_kb,
               (seconds(ru1.ru_utime) - seconds(ru0.ru_utime)) * 1e6 / count,
               (seconds(ru1.ru_stime) - seconds(ru0.ru_stime)) * 1e6 / count);
    printf("\n");
    return 0;
}
