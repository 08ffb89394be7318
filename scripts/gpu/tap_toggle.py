"""Keys a running tap on and off without restarting it: its packet sockets' filter is swapped
between its own program and one that takes nothing (scripts/gpu/proxy_acceptance.sh, SIDES=keyedtog).

  usage: tap_toggle.py PID STOPFILE KEYS KEY_MS

PID is a `sglang-supervisor run --tap` already watching. Its packet sockets are duplicated into
this process (pidfd_getfd, Linux 5.6+, needs the right to ptrace PID: root), their filter read
(SO_GET_FILTER), and then, until STOPFILE exists: off for a turn (a filter that returns 0: the
kernel copies nothing into the ring, and the tap's reader has nothing to read), on for a turn
(the tap's own filter back: every segment of the port copied again). A turn lasts KEY_MS to
1.5 x KEY_MS at random. Each on-turn goes to KEYS as "ON ON OFF tog" (Unix seconds): the swap
is instant, so the turn is measured from it (scripts/gpu/keyed.py), where a tap started for each
turn is measured only from when every request in flight began after it was ready. What differs
between the turns is the tap's work alone: no process started, no /health, no /server_info.
The filter is the tap's own again at exit.
"""
import ctypes
import os
import random
import sys
import time

SOL_SOCKET, SO_ATTACH_FILTER, SO_GET_FILTER = 1, 26, 26
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438
libc = ctypes.CDLL(None, use_errno=True)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def packet_socket_fds(pid):
    """The fds of PID that are packet sockets (their inodes listed in /proc/net/packet)."""
    with open("/proc/net/packet") as f:
        inodes = {line.split()[-1] for line in f.readlines()[1:] if line.split()}
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            fds.append(int(fd))
    return fds


def grab(pid, fds):
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        sys.exit(f"tap_toggle: pidfd_open({pid}): {os.strerror(ctypes.get_errno())}")
    ours = []
    for fd in fds:
        n = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
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
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, ctypes.byref(fprog), ctypes.sizeof(fprog)) != 0:
        sys.exit(f"tap_toggle: SO_ATTACH_FILTER: {os.strerror(ctypes.get_errno())}")


NOTHING = (0x06).to_bytes(2, "little") + b"\0\0" + (0).to_bytes(4, "little")  # BPF_RET|BPF_K 0


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    pid, stop, keys, key_ms = int(argv[0]), argv[1], argv[2], int(argv[3])
    fds = packet_socket_fds(pid)
    if not fds:
        sys.exit(f"tap_toggle: process {pid} has no packet socket (is it running with --tap?)")
    socks = grab(pid, fds)
    own = [get_filter(s) for s in socks]

    def turn():
        end = time.monotonic() + (key_ms + random.random() * key_ms / 2) / 1000
        while time.monotonic() < end and not os.path.exists(stop):
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    try:
        for s in socks:
            attach(s, NOTHING)
        # said once the first off-turn has begun (a caller may wait for this line)
        print(f"tap_toggle: {len(socks)} packet socket(s) of {pid}, filter of {len(own[0]) // 8} instructions; off", flush=True)
        while not os.path.exists(stop):
            turn()
            if os.path.exists(stop):
                break
            on = time.time()
            for s, prog in zip(socks, own):
                attach(s, prog)
            turn()
            off = time.time()
            for s in socks:
                attach(s, NOTHING)
            with open(keys, "a") as f:
                f.write(f"{on:.6f} {on:.6f} {off:.6f} tog\n")
    finally:
        for s, prog in zip(socks, own):
            attach(s, prog)


if __name__ == "__main__":
    main(sys.argv[1:])
