"""Detection latency of one event over RUNS runs: from the wall clock a child stamped (nanoseconds,
field FIELD of the file STAMP with {i} the run) to the supervisor's EVENT in WORK/ev{i}.jsonl.
usage: event_lag.py WORK RUNS EVENT STAMP FIELD LABEL"""
import datetime, json, statistics, sys

work, runs, event, stamp_file, field, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
lags = []
for i in range(1, runs + 1):
    stamp = int(open(f"{work}/{stamp_file.format(i=i)}").read().split()[field]) / 1e9
    ev = [json.loads(l) for l in open(f"{work}/ev{i}.jsonl")]
    e = next(e for e in ev if e["event"] == event)
    ts = datetime.datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    lags.append((ts - stamp) * 1000)
lags.sort()
q = lambda p: lags[min(len(lags) - 1, int(p * len(lags)))]
print(f"{label} over {runs} runs: p50 {statistics.median(lags):.3f} ms, p90 {q(0.9):.3f} ms, max {lags[-1]:.3f} ms")
