"""The tap keyed on and off within one benchmark run: what the client saw in its on-turns against
the off-turns beside them (scripts/gpu/proxy_acceptance.sh, SIDES=keyed).

  usage: keyed.py CONC RUN KEYS [RUN KEYS ...]
         keyed.py --pool [--backend NAME] [--counters pmu|software] OUTPUT [OUTPUT ...]
    RUN   the prefix of a client's event stamps (RUN.chunks, RUN.begun: scripts/gpu/clientstamps,
          BENCH_CHUNKS=RUN), and of RUN.cpu if there is one ("UNIX USER_S SYSTEM_S [CYCLES
          INSTRUCTIONS KERNEL_CYCLES]" lines: the server's HTTP process's CPU so far, sampled
          beside the run by scripts/gpu/cpu_trace.py)
    KEYS  one line per on-turn: "START READY END [KIND]" (Unix seconds): the tap's start, when
          it was ready (watching), and its exit; KIND (SIDES=keyedmix) says which supervisor the
          turn held: "tap" (run --tap) or "ctl" (the same without --tap); "tog" (SIDES=keyedtog):
          one tap for the whole run, its filter swapped on at READY and off at END
          (scripts/gpu/tap_toggle.py), the turn measured from the swap

Run-to-run drift of a server (the H100 host's ran 50 % apart between runs of one arm) does not
reach a comparison made within seconds: each on-turn is held against the mean of the off-turns
before and after it. The tap follows only connections it saw open, so an on-turn counts from
when every request in flight began after the tap was ready (before that it reads a part of the
traffic only); an off-turn likewise counts from when every request in flight began after the tap's
exit. The same rule for both matters: in lockstep (fixed lengths, requests ending in waves) the
end of the last request in flight is where a wave ends and the next one's prefill begins, with no
events for a while; an on-turn counted from there and an off-turn from an ordinary instant read a
slowdown of 4 % where there was none (tests/tests/keyed_analysis.rs). Only turns with the run at
full concurrency count (on average over the turn at least 90 % of CONC in flight): the ramp up
and the drain are left out. A turn is held against its neighbours only when both were kept, and
none counts past the last request's begin: the keys start and end with an on-turn, so the run's
ramp and its end (a drain, or a client stopped by its timeout) otherwise fell in on-turns held
against one side alone (a run stopped in its last on-turn read 0.992 with nothing slower).

Per turn, as the client saw it: events per second (SGLang's native stream sends one event per
decode step of a request: its tokens), the median and the mean gap between a request's events
(the mean is the TPOT of the slice), the median TTFT of the requests begun in it, and the median
E2E of the requests begun and ended in it (when at least 8 were); with RUN.cpu beside the
stamps, the server's HTTP process's user and system CPU per event over the turn (the tap's copy of
each segment is paid in the system time of that process, which sets the pace when saturated),
and where the machine lent counters its cycles, instructions and kernel cycles per event: the
same cost, apart from the speed its CPU ran at (which drifts on the device hosts).
Per run and over all runs: the geometric mean of the on/off ratios with a 95 % interval
(Student's t).

With on-turns of two kinds in one run (keyedmix: the tap and its control in turn), each kind is
held against the off-turns beside it, and each tap turn against the control turns on either side
(tap/ctl): what the tap adds over a supervisor that measures nothing, within one run.

Each run's ratios are also printed on one "keyed-ratios {json}" line, with the client's backend
(bench_serving's "Backend:" line in RUN.txt): --pool reads those lines from saved outputs (a
call's summary.txt: its stamps are too large to bring back) and gives the same verdicts over the
runs of several calls, by concurrency, backend and what is compared: tap/off (the keyed arm's
on-turns and keyedmix's tap turns), ctl/off (keyedctl's and keyedmix's control turns) and tap/ctl
(keyedmix). A pooled interval is widened as for shared turns if any of its runs' ratios share
turns (keyed's do, keyedmix's tap/off do not): wider than it need be, never narrower. A line
without a backend (saved before it was printed) counts as --backend's (default: sglang, the only
one run before). For toggled runs (SIDES=keyedtog) --pool also reads the saved "keyed-turns" lines
and gives the HTTP process's CPU per event that each on-turn adds over the mean of the off-turns
beside it (µs, and as a share of that process's user + system CPU an event; mean and 95 %
interval, widened as above): the tap's cost to the process that sets the pace, read directly;
with counters, the same in cycles, kernel cycles (as a share of all its cycles) and instructions.
--counters software says the runs' traces held the kernel's software counters instead
(CPU_TRACE_COUNTERS=software: task clock in ns, context switches, page faults, in the same
columns; a saved output does not say which): their lines are named so, each a share of its own
off-turns' count.
"""
import bisect
import json
import math
import os
import statistics as st
import sys
from array import array

# Student's t, 97.5th percentile, for 1..30 degrees of freedom (past 30: 1.96)
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
METRICS = [("events/s", "rate"), ("median gap ms", "gap_p50"), ("mean gap (TPOT) ms", "gap_mean"),
           ("median TTFT ms", "ttft_p50"), ("median E2E ms", "e2e_p50"),
           ("HTTP process user us/event", "cpu_user"), ("HTTP process system us/event", "cpu_sys"),
           ("HTTP process cycles/event", "cycles"), ("HTTP process instructions/event", "instructions"),
           ("HTTP process kernel cycles/event", "kcycles")]
# the acceptance's figures, also pooled a run at a time (--pool, from three runs)
RUN_AT_A_TIME = [m for m in METRICS if m[1] in ("rate", "gap_mean", "e2e_p50")]
# read from RUN.cpu, where a run has one (the last three where the machine lent counters)
FROM_CPU_TRACE = ("cpu_user", "cpu_sys", "cycles", "instructions", "kcycles")
# what the three counter columns hold, by scripts/gpu/cpu_trace.py's CPU_TRACE_COUNTERS
COUNTER_NAMES = {"pmu": ("cycles", "instructions", "kernel cycles"),
                 "software": ("task clock ns", "context switches", "page faults")}


def labelled(counters):
    """METRICS with the counter columns named for `counters` (a key of COUNTER_NAMES)."""
    names = dict(zip(("cycles", "instructions", "kcycles"), COUNTER_NAMES[counters]))
    return [(f"HTTP process {names[key]}/event", key) if key in names else (label, key)
            for label, key in METRICS]


def load(run):
    stamps = array("d")
    with open(run + ".chunks", "rb") as f:
        stamps.frombytes(f.read())
    times, numbers = stamps[0::2], [int(n) for n in stamps[1::2]]
    begun = {}
    with open(run + ".begun") as f:
        for line in f:
            n, t = line.split()
            begun[int(n)] = float(t)
    return times, numbers, begun


def turns(keys_file, all_begun_after):
    """[(start, end, kind)]: each on-turn (kind "on", or the KIND its line names), from when every
    request in flight began after the tap was ready (`all_begun_after(ready)`), and the off-turn
    after it (kind None), from when every request in flight began after the tap's exit (the
    last off-turn's end is unknown)."""
    ons = []
    with open(keys_file) as f:
        for line in f:
            fields = line.split()
            ons.append((*map(float, fields[:3]), fields[3] if len(fields) > 3 else "on"))
    out = []
    for k, (start, ready, end, kind) in enumerate(ons):
        # a toggled tap (kind "tog": scripts/gpu/tap_toggle.py) watched on and stopped watching at
        # the swap of its filter, every connection alike: its turns start there
        edge = (lambda t: t) if kind == "tog" else all_begun_after
        out.append((edge(ready), end, kind))
        if k + 1 < len(ons):
            out.append((edge(end), ons[k + 1][0], None))
    return out


def load_cpu(run):
    """RUN.cpu ("UNIX USER_S SYSTEM_S [CYCLES INSTRUCTIONS KERNEL_CYCLES]": the server's HTTP
    process's CPU so far, sampled every 0.1 s beside the run) as a function of time to those
    values, linear between samples; None without the file (runs from before it was written)."""
    try:
        with open(run + ".cpu") as f:
            rows = [tuple(map(float, line.split())) for line in f if len(line.split()) in (3, 6)]
    except FileNotFoundError:
        return None
    # one shape for the whole trace (a line cut by a kill has fewer fields and is left out above)
    rows = [r for r in rows if len(r) == len(rows[0])] if rows else rows
    if len(rows) < 2:
        return None
    at = [r[0] for r in rows]

    def cpu(t):
        if not at[0] <= t <= at[-1]:
            return None  # outside the trace (it stopped early): not read as no CPU at all
        k = min(max(bisect.bisect_left(at, t), 1), len(rows) - 1)
        r0, r1 = rows[k - 1], rows[k]
        w = (t - r0[0]) / (r1[0] - r0[0]) if r1[0] > r0[0] else 0.0
        return tuple(a + (b - a) * w for a, b in zip(r0[1:], r1[1:]))

    return cpu


def per_turn(conc, run, keys_file):
    times, numbers, begun = load(run)
    cpu = load_cpu(run)
    first, last, prev = {}, {}, {}
    gaps = []  # (time of the later event, gap)
    for t, n in zip(times, numbers):
        if n in prev:
            gaps.append((t, t - prev[n]))
        else:
            first[n] = t
        prev[n] = t
        last[n] = t
    starts = sorted(begun[n] for n in first if n in begun)
    ends = sorted(last.values())

    def in_flight(x):
        return bisect.bisect_right(starts, x) - bisect.bisect_right(ends, x)

    event_times = sorted(times)
    gaps.sort()
    gap_times = [g[0] for g in gaps]
    ttfts = sorted((begun[n], first[n] - begun[n]) for n in first if n in begun)
    ttft_times = [x[0] for x in ttfts]
    e2es = sorted((begun[n], last[n], last[n] - begun[n]) for n in first if n in begun)
    e2e_times = [x[0] for x in e2es]

    def all_begun_after(t):
        # the last end of a request that began before t and was still running at t
        return max([t] + [last[n] for n in first if begun.get(n, t) < t < last[n]])

    last_begin = starts[-1] if starts else 0.0
    rows, kinds, spans = [], [], []
    for a, b, kind in turns(keys_file, all_begun_after):
        kinds.append(kind)
        spans.append((a, b))
        if b - a < 0.5:
            rows.append(None)  # a turn too short to measure once its start is left out
            continue
        if b > last_begin:
            # past the last request's begin the run drains (or was stopped by its timeout); the
            # keys end with an on-turn, so only on-turns would hold that tail
            rows.append(None)
            continue
        # At full concurrency on average over the turn. Not the least of a few instants: an
        # on-turn's start is the end of a request (the last one the tap did not see begin),
        # which in a real run ends with a wave of others before their successors are sent, so
        # a check at that instant dropped nearly every on-turn and kept the off-turns.
        spread = [in_flight(a + (b - a) * (k + 0.5) / 200) for k in range(200)]
        if st.fmean(spread) < 0.9 * conc:
            rows.append(None)
            continue
        events = bisect.bisect_left(event_times, b) - bisect.bisect_left(event_times, a)
        g = [x[1] for x in gaps[bisect.bisect_left(gap_times, a):bisect.bisect_left(gap_times, b)]]
        tt = [x[1] for x in ttfts[bisect.bisect_left(ttft_times, a):bisect.bisect_left(ttft_times, b)]]
        # requests wholly inside the turn (a turn several E2Es long holds some)
        e2e = [x[2] for x in e2es[bisect.bisect_left(e2e_times, a):bisect.bisect_left(e2e_times, b)] if x[1] <= b]
        rows.append({"on": kind is not None, "kind": kind, "span": b - a, "rate": events / (b - a), "whole": len(e2e),
                     "e2e_p50": st.median(e2e) * 1e3 if len(e2e) >= 8 else None,
                     "gap_p50": st.median(g) * 1e3 if g else None,
                     "gap_mean": st.fmean(g) * 1e3 if g else None,
                     "ttft_p50": st.median(tt) * 1e3 if tt else None,
                     **cpu_per_event(cpu, a, b, events)})
    return rows, kinds, spans


def cpu_per_event(cpu, a, b, events):
    """The HTTP process's user and system CPU per event over [a, b], in µs: the tap's copy of
    each segment is paid in the system time of the process that sends it, and that process sets
    the pace when saturated, so this is its cost read directly. Where the trace has counters,
    also its cycles, instructions and kernel cycles per event: the same cost, apart from the
    speed of the CPU it ran on."""
    ends = (cpu(a), cpu(b)) if cpu is not None and events else (None, None)
    if None in ends:
        return {"cpu_user": None, "cpu_sys": None}
    per = [(v1 - v0) / events for v0, v1 in zip(*ends)]
    out = {"cpu_user": per[0] * 1e6, "cpu_sys": per[1] * 1e6}
    if len(per) == 5:
        out.update(cycles=per[2], instructions=per[3], kcycles=per[4])
    return out


def ratios(rows, kinds, key, kind="on", against=None):
    """Each kept on-turn of `kind` against the mean of the kept turns beside it: the off-turns
    on either side (`against` None), or the on-turns of kind `against` on either side (turns
    alternate on and off, so those are two away). `kinds`: each turn's kind, kept or not."""
    step = 1 if against is None else 2
    out = []
    for k, r in enumerate(rows):
        if not r or kinds[k] != kind or r.get(key) is None:
            continue
        beside = [rows[j][key] for j in (k - step, k + step)
                  if 0 <= j < len(rows) and kinds[j] == against and rows[j] and rows[j].get(key) is not None]
        # both sides or none: a turn held against one side only takes the drift of a turn's
        # length, and which turns have one side depends on where the ramp and the drain fell
        if len(beside) == 2 and r[key] > 0 and min(beside) > 0:
            out.append(r[key] / st.fmean(beside))
    return out


def t975(n):
    """Student's t at 97.5 % for the mean of `n` values (n - 1 degrees of freedom)."""
    return T975[n - 2] if n <= 31 else 1.96


def half_width(xs, shared):
    """Half the 95 % interval of the mean of `xs`; `shared`: widened by √(4/3), neighbours
    sharing the off-turn between them."""
    return t975(len(xs)) * st.stdev(xs) / math.sqrt(len(xs)) * (math.sqrt(4 / 3) if shared else 1.0)


def verdict(rs, shared=True, unit="turns"):
    """The geometric mean of the ratios and its 95 % interval. `shared`: neighbouring ratios
    share a turn in their denominators (on/off: an off-turn between two on-turns; tap/ctl: a
    control turn between two tap turns), which correlates them: the variance of their mean is
    2σ²/n where their spread reads 1.5σ², so the interval is widened by √(4/3) (a helper's Monte
    Carlo: coverage 0.91 without, 0.95 with). keyedmix's tap/off and ctl/off share nothing."""
    if not rs:
        return "no turn at full concurrency with kept turns on both sides"
    logs = [math.log(r) for r in rs]
    gm = math.exp(st.fmean(logs))
    if len(logs) < 2:
        return f"{gm:.4f} (one turn: no interval)"
    half = half_width(logs, shared)
    lo, hi = math.exp(st.fmean(logs) - half), math.exp(st.fmean(logs) + half)
    return f"{gm:.4f}, 95 % interval {lo:.4f}..{hi:.4f}, {len(rs)} {unit}"


def shares_turns(kind, against):
    """Whether neighbouring ratios of this comparison share a turn (see `verdict`)."""
    return against is not None or kind in ("on", "tog")


def arm(run):
    """c256-keyed-1.jsonl -> keyed: the arm a run belongs to (the name itself if not of that shape)."""
    name = run.removesuffix(".jsonl")
    parts = name.split("-")
    return "-".join(parts[1:-1]) if len(parts) >= 3 and parts[0].startswith("c") else name


def compared(arm_name, kind):
    """What a saved line's ratios compare: keyed's on-turns and keyedmix's tap turns are both the
    tap against the off-turns; keyedctl's and keyedmix's control turns both its control."""
    if kind == "tap-vs-ctl":
        return "tap/ctl"
    if kind in ("tap", "ctl"):
        return f"{kind}/off"
    if kind == "tog":
        return "tap/off, toggled"
    return {"keyed": "tap/off", "keyedctl": "ctl/off"}.get(arm_name, f"{arm_name} on/off")


def backend_of(run):
    """The client's backend, from bench_serving's own output beside the stamps (RUN.txt); where a
    run stopped by its timeout printed none, the keyed arm's as proxy_acceptance.sh was given it
    (KEYED_BACKEND, in the environment it runs this in)."""
    try:
        with open(run + ".txt", errors="replace") as f:
            for line in f:
                if line.startswith("Backend:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.environ.get("KEYED_BACKEND")


def cpu_differences(turn_lists, kind="tog", counters="pmu"):
    """Each kept on-turn of `kind` less the mean of the kept off-turns on either side, in the HTTP
    process's CPU per event (µs): user, system and the two together; and each as a share of the
    off-turns' user + system. Read from saved "keyed-turns" lines (each a run's turns). The
    counters as shares too: kernel cycles of all cycles (pmu), a software count of its own."""
    out = {"cpu_user": [], "cpu_sys": [], "cpu_both": [], "share_sys": [], "share_both": [],
           "share_cycles": [], "share_kcycles": [], "share_instructions": []}
    both = lambda r: r["cpu_user"] + r["cpu_sys"]
    for turns in turn_lists:
        rows = [t["measured"] for t in turns]
        kinds = [t["kind"] for t in turns]
        for k, r in enumerate(rows):
            if not r or kinds[k] != kind or r["cpu_sys"] is None:
                continue
            beside = [rows[j] for j in (k - 1, k + 1) if 0 <= j < len(rows) and kinds[j] is None
                      and rows[j] and rows[j]["cpu_sys"] is not None]
            if len(beside) != 2:
                continue
            mean = lambda f: st.fmean(f(b) for b in beside)
            off_both = mean(both)
            if off_both <= 0:
                continue  # no CPU read beside it: nothing to hold it against
            for key in ("cpu_user", "cpu_sys"):
                out[key].append(r[key] - mean(lambda b: b[key]))
            out["cpu_both"].append(both(r) - off_both)
            out["share_sys"].append(100 * out["cpu_sys"][-1] / off_both)
            out["share_both"].append(100 * out["cpu_both"][-1] / off_both)
            if r.get("cycles") is not None and all(b.get("cycles") for b in beside):
                # as shares of the off-turns' cycles an event: kernel cycles too, so that the
                # kernel's work for the tap reads as a part of all the work the process does
                off_cycles = mean(lambda b: b["cycles"])
                out["share_cycles"].append(100 * (r["cycles"] - off_cycles) / off_cycles)
                off_k = mean(lambda b: b["kcycles"])
                of = off_cycles if counters == "pmu" else off_k
                if of > 0:  # page faults may be none at all beside a turn
                    out["share_kcycles"].append(100 * (r["kcycles"] - off_k) / of)
                off_instr = mean(lambda b: b["instructions"])
                out["share_instructions"].append(100 * (r["instructions"] - off_instr) / off_instr)
    return out


def mean_interval(xs, unit):
    """The mean and its 95 % interval, widened by √(4/3) for the off-turns two on-turns share."""
    if len(xs) < 2:
        return "fewer than two turns"
    half = half_width(xs, shared=True)
    m = st.fmean(xs)
    return f"{m:+.3f}{unit} ({m - half:+.3f} to {m + half:+.3f})"


def pool(outputs, default_backend, counters="pmu"):
    # a file named twice would count its turns twice (and narrow the intervals)
    outputs = list(dict.fromkeys(os.path.realpath(p) for p in outputs))
    groups = {}
    turn_lists = {}  # (conc, backend) -> the toggled runs' turns
    for path in outputs:
        # a summary prints a run's line twice (after the run, and again pooled at the end): once
        # per file; two calls' runs of one name are two runs
        runs, turns_by_run = {}, {}
        with open(path) as f:
            for line in f:
                if line.startswith("keyed-ratios "):
                    d = json.loads(line[len("keyed-ratios "):])
                    runs[(d["conc"], d["run"], d.get("kind"))] = d
                elif line.startswith("keyed-turns "):
                    d = json.loads(line[len("keyed-turns "):])
                    turns_by_run[(d["conc"], d["run"])] = d["turns"]
        for (conc, run, kind), d in runs.items():
            backend = d.get("backend") or default_backend
            g = groups.setdefault((conc, backend, compared(arm(run), kind)),
                                  {"arms": {}, "shared": False, "by_run": {k: [] for _, k in METRICS},
                                   **{k: [] for _, k in METRICS}})
            name = arm(run) + (f"/{kind}" if kind else "")
            g["arms"][name] = g["arms"].get(name, 0) + 1
            # a saved line's kind: none (on/off), "tap-vs-ctl", or a kind against the off-turns
            g["shared"] |= kind in (None, "tap-vs-ctl") or shares_turns(kind, None)
            for _, key in METRICS:
                rs = d["ratios"].get(key, [])
                g[key] += rs
                if rs:
                    g["by_run"][key].append(math.exp(st.fmean(math.log(r) for r in rs)))
            if kind == "tog" and (conc, run) in turns_by_run:
                turn_lists.setdefault((conc, backend), []).append(turns_by_run[(conc, run)])
    if not groups:
        sys.exit(f"keyed.py --pool: no keyed-ratios line in {', '.join(outputs)}")
    metrics = labelled(counters)
    for (conc, backend, what), g in sorted(groups.items()):
        arms = ", ".join(f"{a} {n} run{'s' if n > 1 else ''}" for a, n in sorted(g["arms"].items()))
        for label, key in metrics:
            if g[key] or key not in FROM_CPU_TRACE:
                print(f"keyed, pooled, c={conc} {backend} {what} ({arms}), {label}: {verdict(g[key], g['shared'])}")
        # The same, a run at a time: each run's own ratio as one value, so that runs that differ
        # among themselves (another host, another hour) widen the interval as they should.
        for label, key in RUN_AT_A_TIME:
            runs = g["by_run"][key]
            if len(runs) >= 3:
                print(f"keyed, pooled, c={conc} {backend} {what}, a run at a time, {label}:"
                      f" {verdict(runs, shared=False, unit='runs')}")
    for (conc, backend), lists in sorted(turn_lists.items()):
        d = cpu_differences(lists, counters=counters)
        if not d["cpu_sys"]:
            continue
        print(f"keyed, pooled, c={conc} {backend} toggled, HTTP process CPU per event, on-turn less the"
              f" off-turns beside it, {len(d['cpu_sys'])} turns: system {mean_interval(d['cpu_sys'], ' us')},"
              f" {mean_interval(d['share_sys'], ' %')} of its CPU; user {mean_interval(d['cpu_user'], ' us')};"
              f" both {mean_interval(d['cpu_both'], ' us')}, {mean_interval(d['share_both'], ' %')}")
        if d["share_cycles"] and counters == "pmu":
            print(f"keyed, pooled, c={conc} {backend} toggled, HTTP process counters per event, on-turn less"
                  f" the off-turns beside it, as a share of the off-turns' cycles or instructions,"
                  f" {len(d['share_cycles'])} turns: cycles {mean_interval(d['share_cycles'], ' %')};"
                  f" kernel cycles {mean_interval(d['share_kcycles'], ' %')};"
                  f" instructions {mean_interval(d['share_instructions'], ' %')}")
        elif d["share_cycles"]:
            clock, switches, faults = COUNTER_NAMES[counters]
            print(f"keyed, pooled, c={conc} {backend} toggled, HTTP process software counters per event,"
                  f" on-turn less the off-turns beside it, as a share of the off-turns' own,"
                  f" {len(d['share_cycles'])} turns: {clock} {mean_interval(d['share_cycles'], ' %')};"
                  f" {switches} {mean_interval(d['share_instructions'], ' %')};"
                  f" {faults} {mean_interval(d['share_kcycles'], ' %')}"
                  f" ({len(d['share_kcycles'])} turns with faults beside them)")


def main(argv):
    if argv[:1] == ["--pool"]:
        rest, options = argv[1:], {"--backend": "sglang", "--counters": "pmu"}
        while rest[:1] and rest[0] in options and len(rest) > 1:
            options[rest[0]], rest = rest[1], rest[2:]
        if options["--counters"] not in COUNTER_NAMES:
            sys.exit(f"keyed.py --pool: --counters {options['--counters']!r}: give pmu or software")
        if rest:
            return pool(rest, options["--backend"], options["--counters"])
    if len(argv) < 3 or len(argv) % 2 != 1:
        sys.exit(__doc__)
    conc = int(argv[0])
    every = {}  # (comparison, shares turns) -> metric -> ratios over all runs
    for run, keys_file in zip(argv[1::2], argv[2::2]):
        try:
            report_run(conc, run, keys_file, every)
        except (OSError, ValueError) as e:
            print(f"keyed {run}: not read ({e})")
        except Exception as e:  # one run's failure must not cost the others' verdicts
            print(f"keyed {run}: not analysed ({e!r})")
    if len(argv) > 3:
        for (name, shared), found in every.items():
            for label, key in METRICS:
                if key in found:
                    print(f"keyed, all runs at c={conc}, {label}: {name} {verdict(found[key], shared)}")


def report_run(conc, run, keys_file, every):
    """One run's turns and verdicts, its "keyed-ratios" lines, and its ratios added to `every`."""
    rows, kinds, spans = per_turn(conc, run, keys_file)
    # every turn as measured (null: not counted), so that what pairs with what can be asked
    # again of a saved summary: the stamps themselves are too large to bring back
    print("keyed-turns " + json.dumps({"conc": conc, "run": os.path.basename(run), "turns": [
        {"from": round(a, 3), "to": round(b, 3), "kind": kind,
         "measured": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} if r else None}
        for (a, b), kind, r in zip(spans, kinds, rows)]}))
    kept = [r for r in rows if r]
    on = [r for r in kept if r["on"]]
    off = [r for r in kept if not r["on"]]
    print(f"keyed {run}: {len(rows)} turns, {len(on)} on and {len(off)} off at full concurrency,"
          f" {sum(r['whole'] for r in on)} and {sum(r['whole'] for r in off)} requests wholly in them"
          f" (median on {st.median([r['span'] for r in on]) if on else 0:.2f} s, off"
          f" {st.median([r['span'] for r in off]) if off else 0:.2f} s)")
    backend = backend_of(run)
    for kind, against in comparisons(kinds):
        a, b = kind, against or "off"
        shared = shares_turns(kind, against)
        side = lambda k: [r for r in kept if r["kind"] == k]
        if kind != "on":
            print(f"  {a}/{b}: {len(side(kind))} {a} turns and {len(side(against))} {b} turns at full concurrency")
        found = {}
        for label, key in METRICS:
            if key in FROM_CPU_TRACE and all(r.get(key) is None for r in kept):
                continue  # not measured in this run (no RUN.cpu, or no counters in it)
            rs = found[key] = ratios(rows, kinds, key, kind, against)
            every.setdefault((f"{a}/{b}", shared), {}).setdefault(key, []).extend(rs)
            med = lambda turns: st.median([r[key] for r in turns if r.get(key) is not None] or [float("nan")])
            print(f"    {label}: {a} median {med(side(kind)):.3f}, {b} median {med(side(against)):.3f};"
                  f" {a}/{b} {verdict(rs, shared)}")
        line = {"conc": conc, "run": os.path.basename(run), "ratios": found}
        if backend:
            line["backend"] = backend
        if kind != "on":
            line["kind"] = kind if against is None else f"{kind}-vs-{against}"
        print("keyed-ratios " + json.dumps(line))


def comparisons(kinds):
    """[(kind, against)]: the on-turns against the off-turns beside them, and with the tap and
    its control in turn (keyedmix), each against the off-turns and the tap against the control."""
    on = set(kinds) - {None}
    if on == {"tap", "ctl"}:
        return [("tap", None), ("ctl", None), ("tap", "ctl")]
    return [(k, None) for k in sorted(on)]


if __name__ == "__main__":
    main(sys.argv[1:])
