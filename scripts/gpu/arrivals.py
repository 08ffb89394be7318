#!/usr/bin/env python3
"""Where each request's time went inside SGLang, per benchmark run (docs/real-gpu.md, tenth session).

usage: arrivals.py SERVER_LOG RUNS_TSV
  SERVER_LOG  the server's log with `--log-requests --log-requests-level 0
              --enable-request-time-stats-logging` and SGLANG_LOG_MS=1
  RUNS_TSV    lines "NAME START_UNIX END_UNIX CONCURRENCY" (the script's runs); a file
              NAME.jsonl.stamps beside it (CLIENT_STAMPS=1) adds the client's send times

Per request, matched by rid: its arrival at the tokenizer manager (`request_received_ts` in the
`Finish:` line's meta_info: the `Receive:` line's own stamp has whole seconds only), its entry into
the scheduler's wait queue (`entry_time`), the wait there (`queue_duration`) and the rest
(`forward_duration`). Per run it prints those for the first wave (the first CONCURRENCY
arrivals, sent at once by bench_serving) and for the rest, so two arms of one benchmark can be told
apart by where their requests waited. A split run (NAME cC-split-I: two bench_serving, each with its
own warm-up) has two warm-ups, and its clients' stamps in cC-splitd-I and cC-splitp-I.
"""
import os
import re
import statistics as st
import sys

RID = re.compile(r"rid='?([0-9a-zA-Z_-]+)")
RECEIVED = re.compile(r"'request_received_ts': ([\d.]+)")
# the request's end (its last chunk): a streamed request's response_sent_to_client_ts is its FIRST chunk
FINISHED = re.compile(r"'request_finished_ts': ([\d.]+)")
STATS = re.compile(
    r"ReqTimeStats\(rid=([0-9a-zA-Z_-]+).*queue_duration=([\d.]+)ms, forward_duration=([\d.]+)ms, entry_time=([\d.]+)"
)


def read_log(path):
    got, stats, done = {}, {}, {}
    for line in open(path, errors="replace"):
        if "Finish: obj=" in line:
            m, r, d = RID.search(line), RECEIVED.search(line), FINISHED.search(line)
            if m and r:
                got[m.group(1)] = float(r.group(1))
                done[m.group(1)] = float(d.group(1)) if d else None
        elif "ReqTimeStats(" in line:
            m = STATS.search(line)
            if m:
                stats[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))
    return got, stats, done


def q(v, p):
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def show(label, ms):
    ms = sorted(ms)
    if not ms:
        return f"{label} n/a"
    return f"{label} p10 {q(ms, .1):.0f} p50 {q(ms, .5):.0f} p90 {q(ms, .9):.0f}"


def main():
    got, stats, done = read_log(sys.argv[1])
    print(f"arrivals: {len(got)} received, {len(stats)} with time stats, {len(done)} finished in the log")
    for row in open(sys.argv[2]):
        name, t0, t1, conc = row.split()
        t0, t1, conc = float(t0), float(t1), int(conc)
        rids = sorted((t, r) for r, t in got.items() if t0 <= t <= t1)
        # bench_serving sends one warm-up request and waits for its answer before the rest; the
        # split arm's run is two bench_serving (NAME with -splitd- and -splitp-), each with its own
        # warm-up, both released after the later warm-up's answer
        halves = [name.replace("-split-", f"-{h}-") for h in ("splitd", "splitp")] if "-split-" in name else [name]
        if len(rids) <= len(halves):
            print(f"arrivals {name}: {len(rids)} requests in its span")
            continue
        warms, body = rids[:len(halves)], rids[len(halves):]
        start = max(done.get(r) or t for t, r in warms)
        wave, rest = body[:conc], body[conc:]
        line = [f"arrivals {name}: {len(body)} requests; wave 1 arrived {(wave[0][0] - start) * 1e3:.0f} to {(wave[-1][0] - start) * 1e3:.0f} ms after the warm-up's answer"]
        for half in halves:
            stamps = os.path.join(os.path.dirname(sys.argv[2]), f"{half}.jsonl.stamps")
            if not os.path.exists(stamps):
                continue
            # the client's own clock (scripts/gpu/clientstamps): when it sent, when each head came back
            sent = sorted(tuple(map(float, x.split())) for x in open(stamps) if x.strip())[1:conc // len(halves) + 1]
            if sent:
                line.append(f"  client{' ' + half if len(halves) > 1 else ''}: wave 1 begun (its calls into aiohttp, which connects, then writes) {(sent[0][0] - start) * 1e3:.0f} to {(sent[-1][0] - start) * 1e3:.0f} ms after the warm-up's answer; "
                            + show("its heads back ms after start", [(h - start) * 1e3 for _, h in sent]))
        for label, part in (("wave 1", wave), ("later", rest)):
            s = [(t, stats[r]) for t, r in part if r in stats]
            tm = [(x[2] - t) * 1e3 for t, x in s]  # arrival -> scheduler wait queue
            qd = [x[0] for _, x in s]
            fw = [x[1] for _, x in s]
            # the wave's requests entered the queue when, counted from the warm-up's answer
            entry = [(x[2] - start) * 1e3 for _, x in s]
            line.append(f"  {label} ({len(s)}): " + "; ".join([
                show("to queue ms", tm), show("queued ms", qd), show("forward ms", fw)]
                + ([show("queue entry after start ms", entry)] if label == "wave 1" else [])))
        print("\n".join(line))


if __name__ == "__main__":
    main()
