"""A process's CPU so far, sampled beside a run: "UNIX USER_S SYSTEM_S [CYCLES INSTRUCTIONS
KERNEL_CYCLES]" lines every PERIOD s (0.1) until STOPFILE exists or the process has exited
(scripts/gpu/keyed.py reads them as RUN.cpu).

  usage: cpu_trace.py PID OUTFILE STOPFILE [PERIOD]

The kernel keeps a process's user and system time in clock ticks (10 ms at 100 Hz): a turn of
15 s holds ~1.3 s of the HTTP process's system time, so a tick is under 1 % of it. Each line is
written as it is taken, so a run stopped early keeps what it had.

Where the CPU has counters to lend (perf_event_open: root, or perf_event_paranoid <= 1, and a
PMU the machine shows), each line also holds the process's cycles, instructions and kernel
cycles so far, summed over its threads (each counted apart from when it is first seen; the
list is read at every sample). Time on a CPU moves with that CPU's clock, which on the device
hosts drifts by up to 2x within a minute; cycles and instructions an event do not, so they tell
the work the tap adds to the server from the speed it was done at. Without counters the lines
keep three fields, and a line on stderr says why. CPU_TRACE_COUNTERS=software counts the
threads' task clock (ns), context switches and page faults instead, in the same columns: the
same code path on a machine with no PMU (tests/tests/keyed_analysis.rs).
"""
import ctypes
import os
import struct
import sys
import time

SYS_PERF_EVENT_OPEN = 298  # x86_64
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
HW_CPU_CYCLES, HW_INSTRUCTIONS = 0, 1
SW_TASK_CLOCK, SW_PAGE_FAULTS, SW_CONTEXT_SWITCHES = 1, 2, 3
READ_TOTAL_TIMES = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | _RUNNING
EXCLUDE_USER, EXCLUDE_HV = 1 << 4, 1 << 6
PERF_FLAG_FD_CLOEXEC = 8
MAX_FDS = 3000  # a process that makes threads without end is counted no further past this

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def events():
    """The three counters, as (type, config, flags): all cycles, all instructions, kernel cycles."""
    if os.environ.get("CPU_TRACE_COUNTERS") == "software":
        return [(PERF_TYPE_SOFTWARE, SW_TASK_CLOCK, 0), (PERF_TYPE_SOFTWARE, SW_CONTEXT_SWITCHES, 0),
                (PERF_TYPE_SOFTWARE, SW_PAGE_FAULTS, 0)]
    return [(PERF_TYPE_HARDWARE, HW_CPU_CYCLES, EXCLUDE_HV), (PERF_TYPE_HARDWARE, HW_INSTRUCTIONS, EXCLUDE_HV),
            (PERF_TYPE_HARDWARE, HW_CPU_CYCLES, EXCLUDE_HV | EXCLUDE_USER)]


def open_counter(tid, kind, config, flags):
    """A counter of one thread (PERF_ATTR_SIZE_VER0: the first 64 bytes of perf_event_attr),
    counting from now; its fd, or the error's text."""
    attr = struct.pack("<IIQQQQQ", kind, 64, config, 0, 0, READ_TOTAL_TIMES, flags).ljust(64, b"\0")
    buf = ctypes.create_string_buffer(attr, 64)
    long = ctypes.c_long
    fd = libc.syscall(long(SYS_PERF_EVENT_OPEN), buf, long(tid), long(-1), long(-1), long(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        return None, os.strerror(ctypes.get_errno())
    return fd, None


class Counters:
    """Each thread of a process counted from when it is first seen: three counters a thread."""

    def __init__(self, pid):
        self.pid, self.fds, self.seen, self.squeezed = pid, [], set(), 0.0

    def start(self):
        """The error's text if the first thread's counters cannot be opened (then none are)."""
        return self.add_threads()

    def add_threads(self):
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return None
        for tid in tids:
            if tid in self.seen or len(self.fds) >= MAX_FDS:
                continue
            opened = []
            for kind, config, flags in events():
                fd, err = open_counter(int(tid), kind, config, flags)
                if fd is None:
                    for f in opened:
                        os.close(f)
                    if not self.fds:
                        return err  # none open at all: the machine lends no counters
                    break  # the thread is gone already
                opened.append(fd)
            if len(opened) == 3:
                self.fds.append(opened)
                self.seen.add(tid)
        return None

    def read(self):
        """The three sums so far, each scaled by the share of its time it was on the PMU (the
        least share seen is kept: under 1 the counts are estimates)."""
        sums = [0, 0, 0]
        for thread in self.fds:
            for k, fd in enumerate(thread):
                value, enabled, running = struct.unpack("<QQQ", os.read(fd, 24))
                if running:
                    sums[k] += value if running == enabled else value * enabled // running
                    self.squeezed = max(self.squeezed, 1 - running / enabled)
        return sums


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    pid, out, stop = argv[0], argv[1], argv[2]
    period = float(argv[3]) if len(argv) == 4 else 0.1
    tick = os.sysconf("SC_CLK_TCK")
    counters = Counters(int(pid))
    err = counters.start()
    if err:
        print(f"cpu_trace: no counters for process {pid} ({err}): user and system time only", file=sys.stderr)
        counters = None
    with open(out, "w", buffering=1) as f:
        while not os.path.exists(stop):
            try:
                with open(f"/proc/{pid}/stat") as s:
                    # the name in parentheses may hold spaces: fields count from after it
                    fields = s.read().rsplit(")", 1)[1].split()
            except OSError:
                break
            if fields[0] == "Z":
                break  # exited, not yet reaped by its parent
            # utime and stime are fields 14 and 15 of stat(5), 12th and 13th after the name
            line = f"{time.time():.6f} {int(fields[11]) / tick:.2f} {int(fields[12]) / tick:.2f}"
            if counters:
                counters.add_threads()
                line += " " + " ".join(map(str, counters.read()))
            f.write(line + "\n")
            time.sleep(period)
    if counters:
        # a saved summary keeps this line: the one place that says what the columns hold
        what = ("software counters (task clock, context switches, page faults)"
                if os.environ.get("CPU_TRACE_COUNTERS") == "software" else "counters")
        print(f"cpu_trace: {what} over {len(counters.fds)} threads of process {pid}, each on the PMU"
              f" at least {100 * (1 - counters.squeezed):.1f} % of its time", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
