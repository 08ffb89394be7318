"""Which CPUs of this machine slow a given one when busy (a virtual machine hides the host's SMT
siblings: `Thread(s) per core: 1` says nothing about which vCPUs share a physical core).

  usage: vcpu_pairs.py TARGET [TARGET ...] [--window S]

For each TARGET CPU a timer process pinned there times a fixed pure-Python loop (chunks of 3–5
ms, as the server's HTTP process runs Python), while a busy loop is started on each other CPU
in turn: WINDOW seconds off, WINDOW on, per CPU, then off once more. Printed per target and per
other CPU: the timer's median chunk time in the on-window over the mean of the off-windows beside
it (1.00: no effect; 1.3: as a shared physical core). Last ("all"), a busy loop on every other
CPU at once. Every child dies with this script (a timeout's kill leaves nothing spinning).
"""
import ctypes
import os
import signal
import statistics as st
import sys
import time


def chunk():
    x = 0
    for i in range(60000):
        x += i * i % 7
    return x


def die_with_parent():
    """In a child: SIGKILL when the parent dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def timer(cpu, path):
    """In a child: times chunks on `cpu`, writing "UNIX_END SECONDS" lines to `path` (a file: a
    pipe nobody reads till the end would fill and stop the timer)."""
    die_with_parent()
    os.sched_setaffinity(0, {cpu})
    out = open(path, "w", buffering=1)
    while True:
        t0 = time.perf_counter()
        chunk()
        t1 = time.perf_counter()
        out.write(f"{time.time():.6f} {t1 - t0:.6f}\n")


def burners(cpus):
    """A busy loop pinned to each of `cpus`: their pids."""
    pids = []
    for cpu in cpus:
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            os.sched_setaffinity(0, {cpu})
            while True:
                pass
        pids.append(pid)
    return pids


def window_median(samples, a, b):
    v = [d for t, d in samples if a <= t <= b]
    return st.median(v) if v else float("nan")


def main():
    args = sys.argv[1:]
    window = 0.8
    if "--window" in args:
        k = args.index("--window")
        window = float(args[k + 1])
        del args[k:k + 2]
    if not args:
        sys.exit(__doc__)
    cpus = sorted(os.sched_getaffinity(0))
    for target in map(int, args):
        path = f"/tmp/vcpu_pairs.{os.getpid()}.{target}"
        tpid = os.fork()
        if tpid == 0:
            timer(target, path)
            os._exit(0)
        time.sleep(0.5)
        marks = []  # (other cpu or "all", off_before_start, on_start, on_end, off_after_end)
        others = [c for c in cpus if c != target]
        for c in others + ["all"]:
            a = time.time()
            time.sleep(window)
            b = time.time()
            busy = burners(others if c == "all" else [c])
            time.sleep(window)
            e = time.time()
            for bp in busy:
                os.kill(bp, signal.SIGKILL)
                os.waitpid(bp, 0)
            marks.append((c, a, b, e))
        a = time.time()
        time.sleep(window)
        end = time.time()
        os.kill(tpid, signal.SIGKILL)
        os.waitpid(tpid, 0)
        with open(path) as f:
            samples = [tuple(map(float, line.split())) for line in f.read().splitlines() if len(line.split()) == 2]
        os.unlink(path)
        # an off-window: from its start + 0.1 s (the burner just killed) to its end
        offs = [(m[1] + 0.1, m[2]) for m in marks] + [(a + 0.1, end)]
        rows = []
        for k, (c, a0, b0, e0) in enumerate(marks):
            on = window_median(samples, b0 + 0.1, e0)
            off = (window_median(samples, *offs[k]) + window_median(samples, *offs[k + 1])) / 2
            rows.append((c, on / off, off))
        line = ", ".join(f"{c}:{ratio:.2f}" for c, ratio, _ in rows)
        base = st.median(off for _, _, off in rows) * 1000
        worst = max((x for x in rows if x[0] != "all"), key=lambda x: x[1])
        print(f"vcpu-pairs target {target}: idle chunk {base:.2f} ms; on/off with a busy loop on: {line}; "
              f"worst single CPU {worst[0]} ({worst[1]:.2f})")


if __name__ == "__main__":
    main()
