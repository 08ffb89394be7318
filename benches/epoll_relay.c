/* The floor for any hop between a benchmark client and its server: one thread, one epoll set,
 * each connection's bytes copied both ways as they come (read, write), nothing parsed. What a
 * forwarded SSE event costs here is what the kernel charges a hop for it (the wake-up, the read,
 * the write and the wake-up of the reader beyond); the proxy's own cost is what it spends above
 * this. benches/proxy.sh runs it as the third arm (FLOOR=1).
 *   cc -O2 -o epoll_relay benches/epoll_relay.c && ./epoll_relay LISTEN_PORT UPSTREAM_PORT
 * Loopback only (127.0.0.1). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXFD 65536
static int peer[MAXFD];

static struct sockaddr_in addr(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static void watch(int ep, int fd) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* writes to loopback rarely block at these sizes; when they do, wait for them (a relay that
 * buffers would only hide the same cost) */
static int write_all(int fd, const char *p, ssize_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: epoll_relay LISTEN_PORT UPSTREAM_PORT\n");
        return 2;
    }
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = addr(atoi(argv[1])), ua = addr(atoi(argv[2]));
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&la, sizeof la) || listen(lfd, 4096)) {
        perror("epoll_relay: listen");
        return 1;
    }
    int ep = epoll_create1(0);
    watch(ep, lfd);
    struct epoll_event evs[256];
    static char buf[65536];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c = accept(lfd, NULL, NULL), u = socket(AF_INET, SOCK_STREAM, 0);
                if (c < 0 || c >= MAXFD || u >= MAXFD || connect(u, (struct sockaddr *)&ua, sizeof ua)) {
                    if (c >= 0) close(c);
                    close(u);
                    continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                peer[c] = u;
                peer[u] = c;
                watch(ep, c);
                watch(ep, u);
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r > 0 && write_all(peer[fd], buf, r) == 0) continue;
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            close(peer[fd]); /* closing drops both from the epoll set */
            close(fd);
        }
    }
}
