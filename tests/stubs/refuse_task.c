/* Fault injection for tests/tests/task_refusal.rs: preloaded into the supervisor, it refuses the
 * Nth start of a thread or process (SGLSUP_REFUSE_TASK=N, counted from 1 over pthread_create,
 * fork, posix_spawn and posix_spawnp together) with EAGAIN, as the OS does at the limit on
 * processes and threads, and says so on stderr and, with SGLSUP_REFUSE_NOTE=FILE, in FILE (for a
 * stderr the test cannot read). The preload and its settings are removed from the environment at
 * load, so what the supervisor starts runs without them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

static long refuse_at = -1;
static long started = 0;
static char note[4096];

__attribute__((constructor)) static void load(void) {
    const char *n = getenv("SGLSUP_REFUSE_TASK");
    if (n) refuse_at = atol(n);
    const char *f = getenv("SGLSUP_REFUSE_NOTE");
    if (f) snprintf(note, sizeof note, "%s", f);
    unsetenv("SGLSUP_REFUSE_TASK");
    unsetenv("SGLSUP_REFUSE_NOTE");
    unsetenv("LD_PRELOAD");
}

/* Whether this start is the one to refuse; says which it was when it is. */
static int refuse(const char *what) {
    long k = __atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
    if (k != refuse_at) return 0;
    char line[96];
    int len = snprintf(line, sizeof line, "refuse_task: refused start %ld (%s)\n", k, what);
    /* Not to a stderr the test does not read (it could be full and block this thread). */
    if (len > 0 && !note[0]) (void)!write(2, line, (size_t)len);
    if (len > 0 && note[0]) {
        int fd = open(note, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            (void)!write(fd, line, (size_t)len);
            close(fd);
        }
    }
    return 1;
}

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
    static int (*next)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!next) next = dlsym(RTLD_NEXT, "pthread_create");
    if (refuse("pthread_create")) return EAGAIN;
    return next(t, a, f, arg);
}

pid_t fork(void) {
    static pid_t (*next)(void);
    if (!next) next = dlsym(RTLD_NEXT, "fork");
    if (refuse("fork")) {
        errno = EAGAIN;
        return -1;
    }
    return next();
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);

/* posix_spawn and posix_spawnp differ only in how the program is found. */
static int spawn_next(const char *name, pid_t *pid, const char *prog,
                      const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                      char *const argv[], char *const envp[]) {
    spawn_fn next = (spawn_fn)dlsym(RTLD_NEXT, name);
    if (refuse(name)) return EAGAIN;
    return next(pid, prog, fa, attr, argv, envp);
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return spawn_next("posix_spawn", pid, path, fa, attr, argv, envp);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return spawn_next("posix_spawnp", pid, file, fa, attr, argv, envp);
}
