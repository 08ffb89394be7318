"""A process's CPU so far, sampled beside a run: "UNIX USER_S SYSTEM_S" lines every PERIOD s
(0.1) until STOPFILE exists or the process is gone (scripts/gpu/keyed.py reads them as RUN.cpu).

  usage: cpu_trace.py PID OUTFILE STOPFILE [PERIOD]

The kernel keeps a process's user and system time in clock ticks (10 ms at 100 Hz): a turn of
15 s holds ~1.3 s of the HTTP process's system time, so a tick is under 1 % of it. Each line is
written as it is taken, so a run stopped early keeps what it had.
"""
import os
import sys
import time


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    pid, out, stop = argv[0], argv[1], argv[2]
    period = float(argv[3]) if len(argv) == 4 else 0.1
    tick = os.sysconf("SC_CLK_TCK")
    with open(out, "w", buffering=1) as f:
        while not os.path.exists(stop):
            try:
                with open(f"/proc/{pid}/stat") as s:
                    # the name in parentheses may hold spaces: fields count from after it
                    fields = s.read().rsplit(")", 1)[1].split()
            except OSError:
                return
            # utime and stime are fields 14 and 15 of stat(5), 12th and 13th after the name
            f.write(f"{time.time():.6f} {int(fields[11]) / tick:.2f} {int(fields[12]) / tick:.2f}\n")
            time.sleep(period)


if __name__ == "__main__":
    main(sys.argv[1:])
