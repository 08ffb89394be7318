#!/usr/bin/env python3
"""The server's processes under a supervisor, for scripts/gpu/proxy_acceptance.sh.

  server_procs.py stats SUP_PID
      one JSON line: per process name (SGLang names its processes sglang::scheduler, ...; the main
      one, uvicorn and the tokenizer manager, keeps python's name) user and system ticks, and for
      the main process its context switches and each thread's ticks
  server_procs.py isolate SUP_PID CPUS
      pins every thread of the main process to one CPU of CPUS and every other process of the tree
      to the rest of CPUS less that CPU's SMT siblings: the server's bottleneck thread (one core,
      always busy under load) then runs alone, at the same speed in every run, whatever the other
      processes do. Prints the CPU it chose and the siblings it left idle.
"""
import json
import os
import sys


def tree(sup):
    kids, names = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = open(f"/proc/{d}/stat").read()
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        kids.setdefault(int(raw.rsplit(")", 1)[1].split()[1]), []).append(int(d))
        names[int(d)] = os.path.basename(cmd.split()[0]) if cmd else raw[raw.index("(") + 1:raw.rindex(")")]
    out, todo = [], list(kids.get(sup, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out, names


def main_pid(sup):
    # the supervisor's direct child (through taskset's exec, the same pid) is the server's main process
    kids, _ = tree(sup)
    direct = [p for p in kids if stat(p) and int(stat(p)[1]) == sup]
    return direct[0] if direct else None


def stat(pid, tid=None):
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        return open(path).read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tasks(pid):
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def stats(sup):
    pids, names = tree(sup)
    by = {}
    for p in pids:
        f = stat(p)
        if not f:
            continue
        d = by.setdefault(names.get(p, "?"), {"utime": 0, "stime": 0})
        d["utime"] += int(f[11])
        d["stime"] += int(f[12])
    main = main_pid(sup)
    m = {"pid": main, "vcsw": 0, "nvcsw": 0, "threads": {}}
    for t in tasks(main) if main else []:
        try:
            for line in open(f"/proc/{main}/task/{t}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    m["vcsw"] += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    m["nvcsw"] += int(line.split()[1])
            f = stat(main, t)
            comm = open(f"/proc/{main}/task/{t}/comm").read().strip()
            m["threads"][f"{t}:{comm}"] = int(f[11]) + int(f[12])
        except (OSError, TypeError):
            continue
    print(json.dumps({"by": by, "main": m, "hz": os.sysconf("SC_CLK_TCK")}))


def cpulist(text):
    out = []
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def siblings(cpu):
    try:
        return set(cpulist(open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read()))
    except OSError:
        return {cpu}


def isolate(sup, cpus):
    cpus = cpulist(cpus)
    main = main_pid(sup)
    if main is None:
        sys.exit("isolate: no server process under the supervisor")
    own = cpus[-1]
    rest = [c for c in cpus if c not in siblings(own)]
    if not rest:
        sys.exit(f"isolate: CPUs {cpus} leave nothing beside {own}'s core")
    pids, names = tree(sup)
    moved = 0
    for p in pids:
        for t in tasks(p):
            try:
                os.sched_setaffinity(t, {own} if p == main else set(rest))
                moved += 1
            except OSError:
                pass
    print(f"isolated the server's main process {main} on CPU {own} (left idle: {sorted(siblings(own) - {own})}); "
          f"its other processes ({len(pids) - 1}) on {rest}; {moved} threads pinned")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "stats":
        stats(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "isolate":
        isolate(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(__doc__)
