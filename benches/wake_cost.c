// What a reader's habits cost the writer: a process writes N small messages (256 bytes, one per
// GAP_US of busy work, as a server streams events) to a loopback TCP peer, and reports its own
// kernel time per write. The reader reads each message as it comes (blocked in read: every write
// wakes it), or spins on non-blocking reads (never asleep), or reads whatever came every TICK_US.
// The server behind the proxy pays this: it is why the proxy reads in turns under load.
//   usage: wake_cost N GAP_US TICK_US   (TICK_US 0: blocked reader, -1: spinning reader)
//   build: cc -O2 -o wake_cost benches/wake_cost.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double secs(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: wake_cost N GAP_US TICK_US (0 blocked reader, -1 spinning)\n");
    return 2;
  }
  int n = atoi(argv[1]), gap_us = atoi(argv[2]), tick_us = atoi(argv[3]);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t al = sizeof a;
  if (bind(l, (void *)&a, sizeof a) || getsockname(l, (void *)&a, &al) || listen(l, 1)) {
    perror("listen");
    return 1;
  }
  pid_t reader = fork();
  if (reader == 0) {
    pin(1);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) {
      perror("connect");
      _exit(1);
    }
    if (tick_us != 0) fcntl(c, F_SETFL, O_NONBLOCK);
    char buf[1 << 16];
    long got = 0, reads = 0, want = (long)n * 256;
    while (got < want) {
      if (tick_us > 0) usleep(tick_us);
      ssize_t r = read(c, buf, sizeof buf);
      if (r > 0) {
        got += r;
        reads++;
      } else if (r == 0) {
        break;
      }
    }
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    fprintf(stderr, "  reader: %ld reads, CPU %.3f s\n", reads, secs(u.ru_utime) + secs(u.ru_stime));
    _exit(0);
  }
  pin(0);
  int s = accept(l, 0, 0), one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char msg[256];
  memset(msg, 'x', sizeof msg);
  struct rusage u0, u1;
  getrusage(RUSAGE_SELF, &u0);
  for (int i = 0; i < n; i++) {
    if (write(s, msg, sizeof msg) != sizeof msg) {
      perror("write");
      return 1;
    }
    double until = now() + gap_us * 1e-6;
    while (now() < until) {
    }
  }
  getrusage(RUSAGE_SELF, &u1);
  const char *how = tick_us == 0 ? "blocked in read" : tick_us < 0 ? "spinning" : "every TICK";
  printf("writer kernel time per write: %.2f us (reader %s, TICK %d us, %d writes %d us apart)\n",
         (secs(u1.ru_stime) - secs(u0.ru_stime)) * 1e6 / n, how, tick_us, n, gap_us);
  fflush(stdout);
  close(s);
  wait(0);
  return 0;
}
