"""Keys a running tap on and off without restarting it: its packet sockets' filter is swapped
between its own program and one that takes nothing (scripts/gpu/proxy_acceptance.sh, SIDES=keyedtog).

  usage: tap_toggle.py [--signals] PID[,PID...] STOPFILE KEYS KEY_MS

PID is a `sglang-supervisor run --tap` already watching; several, comma-separated, are keyed
together (TOG_TAPS=N in proxy_acceptance.sh: N taps of one port, each copying every segment, so
that what each tap pays again is read N times over, above the host's noise). Their packet
sockets are duplicated into this process (pidfd_getfd, Linux 5.6+, needs the right to ptrace
PID: root), their filter read (SO_GET_FILTER), and then, until STOPFILE exists: off for a turn (a filter that returns 0: the
kernel copies nothing into the ring, and the tap's reader has nothing to read), on for a turn
(the tap's own filter back: every segment of the port copied again). A turn lasts KEY_MS to
1.5 x KEY_MS at random. Each on-turn goes to KEYS as "ON ON OFF tog" (Unix seconds): the swap
is instant, so the turn is measured from it (scripts/gpu/keyed.py), where a tap started for each
turn is measured only from when every request in flight began after it was ready. What differs
between the turns is the tap's work alone: no process started, no /health, no /server_info.
The filter is the tap's own again at exit, SIGTERM and SIGHUP included (not SIGKILL: a tap
left taking nothing is refused by the next run of this script, which would read that filter as
the tap's own). "Off" is not "no tap": the packet hook still runs the (one-instruction) filter for
every packet, so on against off is the copy, the tap's own filter and its reader's work: what a
tap costs less that hook.

--signals keys processes told by a signal instead: SIGUSR2 off, SIGUSR1 on (benches/ring_drain.c
detaches and attaches its eBPF programs, or binds its packet sockets off and back on the packet
hook), with the same turns and the same KEYS lines, and on again at exit. Off, nothing of theirs
is on any hook: on against off is their whole cost. (A packet socket bound again hears only after
the kernel's RCU grace period, 8–16 ms on the dev VM: an on-turn's first slice is not all on.)
"""
import ctypes
import os
import random
import signal
import sys
import time

SOL_SOCKET, SO_ATTACH_FILTER, SO_GET_FILTER = 1, 26, 26
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def packet_socket_fds(pid):
    """One fd of PID for each of its packet sockets (their inodes listed in PID's namespace's
    /proc/net/packet; the tap holds a second fd of each, for its drop counts)."""
    with open(f"/proc/{pid}/net/packet") as f:
        inodes = {line.split()[-1] for line in f.readlines()[1:] if line.split()}
    fds = {}
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            fds.setdefault(target, int(fd))
    return list(fds.values())


def grab(pid, fds):
    long = ctypes.c_long
    pidfd = libc.syscall(long(SYS_PIDFD_OPEN), long(pid), long(0))
    if pidfd < 0:
        sys.exit(f"tap_toggle: pidfd_open({pid}): {os.strerror(ctypes.get_errno())}")
    ours = []
    for fd in fds:
        n = libc.syscall(long(SYS_PIDFD_GETFD), long(pidfd), long(fd), long(0))
        if n < 0:
            sys.exit(f"tap_toggle: pidfd_getfd({pid}, {fd}): {os.strerror(ctypes.get_errno())}")
        ours.append(n)
    os.close(pidfd)
    return ours


def get_filter(fd):
    buf = ctypes.create_string_buffer(8 * 4096)
    n = ctypes.c_uint(4096)  # the kernel counts this one in instructions, not bytes
    if libc.getsockopt(fd, SOL_SOCKET, SO_GET_FILTER, buf, ctypes.byref(n)) != 0:
        sys.exit(f"tap_toggle: SO_GET_FILTER: {os.strerror(ctypes.get_errno())}")
    if n.value == 0:
        sys.exit("tap_toggle: the socket has no filter")
    return buf.raw[:8 * n.value]


def attach(fd, prog):
    """Attaches `prog` to the socket `fd`; the error's text if it failed."""
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, ctypes.byref(fprog), ctypes.sizeof(fprog)) != 0:
        return f"SO_ATTACH_FILTER: {os.strerror(ctypes.get_errno())}"
    return None


def attach_all(socks, progs):
    """Attaches each program to its socket, every one tried; exits naming the first failure."""
    failed = [e for e in (attach(s, p) for s, p in zip(socks, progs)) if e]
    if failed:
        sys.exit(f"tap_toggle: {failed[0]} ({len(failed)} of {len(socks)} sockets)")


NOTHING = (0x06).to_bytes(2, "little") + b"\0\0" + (0).to_bytes(4, "little")  # BPF_RET|BPF_K 0


def by_filters(pids, named):
    """(on, off, what) for taps keyed by their packet sockets' filters."""
    socks = []
    for pid in pids:
        fds = packet_socket_fds(pid)
        if not fds:
            sys.exit(f"tap_toggle: process {pid} has no packet socket (is it running with --tap?)")
        socks += grab(pid, fds)
    own = [get_filter(s) for s in socks]
    if NOTHING in own:
        sys.exit(f"tap_toggle: a tap of {named} takes nothing already (left so by a killed run of this"
                 " script?): restart it")
    nothing = [NOTHING] * len(socks)
    what = f"{len(socks)} packet socket(s) of {named}, filter of {len(own[0]) // 8} instructions"
    return (lambda: attach_all(socks, own)), (lambda: attach_all(socks, nothing)), what


def by_signals(pids, named):
    """(on, off, what) for processes keyed by SIGUSR1 (on) and SIGUSR2 (off)."""
    def send(sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError as e:
                sys.exit(f"tap_toggle: signalling process {pid}: {e.strerror}")
    return (lambda: send(signal.SIGUSR1)), (lambda: send(signal.SIGUSR2)), f"process(es) {named}, by signals"


def main(argv):
    signals = argv[:1] == ["--signals"]
    argv = argv[1:] if signals else argv
    if len(argv) != 4:
        sys.exit(__doc__)
    try:
        pids = [int(p) for p in argv[0].split(",")]
    except ValueError:
        sys.exit(f"tap_toggle: PID {argv[0]!r}: expected process ids, comma-separated")
    stop, keys, key_ms = argv[1], argv[2], int(argv[3])
    on_, off_, what = (by_signals if signals else by_filters)(pids, argv[0])

    def leave(signum, _frame):
        raise SystemExit(128 + signum)  # through the finally below: the tap's filter back

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGHUP, leave)

    def turn():
        end = time.monotonic() + (key_ms + random.random() * key_ms / 2) / 1000
        while time.monotonic() < end and not os.path.exists(stop):
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    try:
        off_()
        # said once the first off-turn has begun (a caller may wait for this line)
        print(f"tap_toggle: {what}; off", flush=True)
        while not os.path.exists(stop):
            turn()
            if os.path.exists(stop):
                break
            on = time.time()
            on_()
            turn()
            off = time.time()
            off_()
            with open(keys, "a") as f:
                f.write(f"{on:.6f} {on:.6f} {off:.6f} tog\n")
    finally:
        on_()


if __name__ == "__main__":
    main(sys.argv[1:])
