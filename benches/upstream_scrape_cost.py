#!/usr/bin/env python3
"""Measure the CPU cost of ONE /metrics scrape of an SGLang-like server that uses
prometheus_client multiprocess mode (MultiProcessCollector), as served by
prometheus_client.make_asgi_app on SGLang's HTTP/tokenizer-manager process.

It recreates, from a real SGLang 0.5.14 scrape (text exposition file), every metric
family (same name, type, HELP, label names, label values, histogram buckets, values),
written into PROMETHEUS_MULTIPROC_DIR by 3 forked writer processes that play the
roles SGLang uses (tokenizer/HTTP, scheduler, detokenizer), with the gauge
multiprocess_mode SGLang 0.5.14 declares:
  * "livesum":  sglang:http_requests_active, sglang:routing_keys_active
                (sglang/srt/utils/common.py:1620,1627)
  * "all" (prometheus default, no multiprocess_mode given):
                sglang:num_retracted_reqs, sglang:num_paused_reqs
                (sglang/srt/observability/metrics_collector.py:443,464)
  * "mostrecent": every other gauge (metrics_collector.py, gauge_histogram.py:50)

Then, in the parent (the "HTTP process"), it builds
    registry = CollectorRegistry(); MultiProcessCollector(registry)
exactly like sglang/srt/utils/common.py:add_prometheus_middleware, and times:
  text   : prometheus_client.generate_latest(registry)            (curl-style scrape)
  bake_om_gz : exposition._bake_output(...) with a Prometheus-server Accept header
           (OpenMetrics) + Accept-Encoding: gzip  -- what make_asgi_app runs for a
           real Prometheus scrape
  bake_txt_gz: _bake_output with text/plain + gzip
Per-iteration CPU time (time.process_time_ns) and wall time (perf_counter_ns).

Variant "allgauges": hypothetical worst case -- every gauge in "all" mode and written by
all 3 processes (gauge series x3, with pid label). NOT what SGLang 0.5.14 does.

Why it is here: the supervisor re-exposes the server's series on its own /metrics and fetched
them every 5 s whether or not anybody scraped the supervisor; it now fetches them only for a
scrape of its own (BENCHMARKS.md, "What a fetch of the server's /metrics costs the server").

Usage:
  python3 benches/upstream_scrape_cost.py [--fixture PATH] [--iters 200] [--runs 3]
(each run is a fresh subprocess with a fresh multiproc dir; medians over runs printed)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# a real 0.5.14 scrape (tiny Llama on the H200, after a benchmark: 61 KB, 416 sample lines)
DEFAULT_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                               "sglang-0.5.14-h200", "D_sigint", "metrics.txt")

LIVESUM = {"sglang:http_requests_active", "sglang:routing_keys_active"}
ALL_MODE = {"sglang:num_retracted_reqs", "sglang:num_paused_reqs"}
# families written by the tokenizer-manager (= HTTP) process in SGLang 0.5.14
# (TokenizerMetricsCollector, metrics_collector.py:1410.., http middleware common.py:1601..)
TOKENIZER_FAMILIES = {
    "sglang:prompt_tokens", "sglang:generation_tokens", "sglang:cached_tokens",
    "sglang:num_requests", "sglang:prompt_tokens_histogram",
    "sglang:uncached_prompt_tokens_histogram", "sglang:generation_tokens_histogram",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:http_requests", "sglang:http_responses",
    "sglang:http_requests_active", "sglang:routing_keys_active",
}
PROM_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
               "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def sample_lines(text):
    return [l for l in text.splitlines() if l and not l.startswith("#")]


def parse_fixture(path):
    from prometheus_client.parser import text_string_to_metric_families
    text = open(path).read()
    fams = []
    for fam in text_string_to_metric_families(text):
        fams.append(fam)
    return text, fams


def role_of(fam, sample_labels):
    if fam.name == "sglang:process_cpu_seconds":
        return sample_labels.get("component", "tokenizer")
    if fam.name in TOKENIZER_FAMILIES:
        return "tokenizer"
    return "scheduler"


def writer(role, fams, variant):
    """Runs in a forked child: create the metrics this role owns and write values."""
    from prometheus_client import Counter, Gauge, Histogram
    for fam in fams:
        by_role = {}
        for s in fam.samples:
            lbl = {k: v for k, v in s.labels.items() if k not in ("pid",)}
            r = role_of(fam, lbl)
            if variant == "allgauges" and fam.type == "gauge":
                r = role  # every process writes every gauge
            if r != role:
                continue
            by_role.setdefault("x", []).append((s.name, lbl, s.value))
        samples = by_role.get("x")
        if not samples:
            continue
        if fam.type == "counter":
            labelnames = sorted(samples[0][1].keys())
            c = Counter(fam.name, fam.documentation, labelnames, registry=None)
            for name, lbl, v in samples:
                if name.endswith("_created"):
                    continue
                (c.labels(**lbl) if labelnames else c).inc(v)
        elif fam.type == "gauge":
            labelnames = sorted(samples[0][1].keys())
            if variant == "allgauges":
                mode = "all"
            else:
                mode = "livesum" if fam.name in LIVESUM else ("all" if fam.name in ALL_MODE else "mostrecent")
            g = Gauge(fam.name, fam.documentation, labelnames, registry=None, multiprocess_mode=mode)
            for name, lbl, v in samples:
                (g.labels(**lbl) if labelnames else g).set(v)
        elif fam.type == "histogram":
            series = {}
            for name, lbl, v in samples:
                key_l = tuple(sorted((k, x) for k, x in lbl.items() if k != "le"))
                d = series.setdefault(key_l, {"buckets": {}, "sum": 0.0})
                if name.endswith("_bucket"):
                    d["buckets"][float(lbl["le"])] = v
                elif name.endswith("_sum"):
                    d["sum"] = v
            labelnames = sorted(k for k, _ in next(iter(series)))
            bucket_sets = {tuple(sorted(d["buckets"])) for d in series.values()}
            # one Histogram object per distinct bucket layout (SGLang uses one; all
            # series of a family share buckets in the fixture)
            assert len(bucket_sets) == 1, (fam.name, bucket_sets)
            les = [b for b in sorted(next(iter(bucket_sets))) if b != float("inf")]
            h = Histogram(fam.name, fam.documentation, labelnames, registry=None, buckets=les)
            for key_l, d in series.items():
                child = h.labels(**dict(key_l)) if labelnames else h
                prev = 0.0
                for i, le in enumerate(sorted(d["buckets"])):
                    cum = d["buckets"][le]
                    child._buckets[i].inc(cum - prev)
                    prev = cum
                child._sum.inc(d["sum"])
        else:
            raise ValueError(fam.type)


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def one_run(fixture, iters, variant):
    d = tempfile.mkdtemp(prefix="promdir_", dir="/tmp/metricscost")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = d
    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.exposition import _bake_output
    real_text, fams = parse_fixture(fixture)

    pids = {}
    for role in ("tokenizer", "scheduler", "detokenizer"):
        pid = os.fork()
        if pid == 0:
            try:
                writer(role, fams, variant)
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        pids[role] = pid
    for role, pid in pids.items():
        _, st = os.waitpid(pid, 0)
        assert st == 0, (role, st)

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)

    out = generate_latest(registry).decode()
    real_lines, our_lines = sample_lines(real_text), sample_lines(out)

    def series_set(lines, drop_pid):
        s = set()
        for l in lines:
            name_labels = l.rsplit(" ", 1)[0]
            if drop_pid:
                import re
                name_labels = re.sub(r',?pid="\d+"', "", name_labels).replace("{,", "{").replace("{}", "")
            s.add(name_labels)
        return s
    real_s, our_s = series_set(real_lines, True), series_set(our_lines, True)
    bake_om = _bake_output(registry, PROM_ACCEPT, "gzip", {}, False)
    shape = {
        "prometheus_client": __import__("importlib.metadata").metadata.version("prometheus_client"),
        "db_files": sorted(os.listdir(d)),
        "db_used_bytes": sum(int.from_bytes(open(os.path.join(d, f), "rb").read(4), "little") for f in os.listdir(d)),
        "real_bytes": len(real_text.encode()), "real_sample_lines": len(real_lines),
        "our_text_bytes": len(out.encode()), "our_sample_lines": len(our_lines),
        "families": len(fams),
        "series_missing_vs_real": len(real_s - our_s), "series_extra_vs_real": len(our_s - real_s),
        "om_gz_bytes": len(bake_om[2]), "om_headers": bake_om[1],
    }

    cases = {
        "collect_only": lambda: [list(m.samples) for m in registry.collect()],
        "text": lambda: generate_latest(registry),
        "bake_om_gz": lambda: _bake_output(registry, PROM_ACCEPT, "gzip", {}, False),
        "bake_txt_gz": lambda: _bake_output(registry, "text/plain;version=0.0.4", "gzip", {}, False),
    }
    res = {}
    for name, fn in cases.items():
        for _ in range(10):  # warm-up
            fn()
        cpu, wall = [], []
        for _ in range(iters):
            c0, w0 = time.process_time_ns(), time.perf_counter_ns()
            fn()
            c1, w1 = time.process_time_ns(), time.perf_counter_ns()
            cpu.append((c1 - c0) / 1e6)
            wall.append((w1 - w0) / 1e6)
        res[name] = {"cpu_med_ms": statistics.median(cpu), "cpu_p90_ms": pct(cpu, 0.9),
                     "wall_med_ms": statistics.median(wall), "wall_p90_ms": pct(wall, 0.9)}
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    return {"shape": shape, "timing": res}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default=DEFAULT_FIXTURE)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default="sglang,allgauges")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one_run(a.fixture, a.iters, a.child)))
        return
    for variant in a.variants.split(","):
        runs = []
        for r in range(a.runs):
            p = subprocess.run([sys.executable, __file__, "--child", variant, "--fixture", a.fixture,
                                "--iters", str(a.iters)], capture_output=True, text=True)
            if p.returncode:
                sys.stderr.write(p.stderr)
                raise SystemExit(p.returncode)
            runs.append(json.loads(p.stdout))
        sh = runs[0]["shape"]
        print(f"=== variant={variant}  prometheus_client={sh['prometheus_client']}  runs={a.runs} iters={a.iters}")
        print(f"  db files: {sh['db_files']}  (used bytes total {sh['db_used_bytes']})")
        print(f"  real scrape: {sh['real_bytes']} B, {sh['real_sample_lines']} sample lines | "
              f"ours (text): {sh['our_text_bytes']} B, {sh['our_sample_lines']} sample lines, "
              f"{sh['families']} families; series missing vs real={sh['series_missing_vs_real']}, "
              f"extra={sh['series_extra_vs_real']} (pid label ignored); openmetrics+gzip body {sh['om_gz_bytes']} B")
        for case in runs[0]["timing"]:
            per = [r["timing"][case] for r in runs]
            line = "  %-12s" % case
            for k in ("cpu_med_ms", "cpu_p90_ms", "wall_med_ms", "wall_p90_ms"):
                vals = [x[k] for x in per]
                line += f"  {k}={statistics.median(vals):.3f} [{', '.join(f'{v:.3f}' for v in vals)}]"
            print(line)


if __name__ == "__main__":
    main()
