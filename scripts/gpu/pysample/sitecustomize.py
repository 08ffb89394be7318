"""Where SGLang's HTTP process spends its Python time, run by run, with no profiler installed.

On PYTHONPATH with PYSAMPLE_DIR=DIR set (scripts/gpu/proxy_acceptance.sh, PYSAMPLE=1), the
process started with --model-path (the server's HTTP process: uvicorn and the tokenizer manager;
its spawned children have other arguments) runs a thread that samples its main thread's stack
every PYSAMPLE_MS (2) milliseconds. Samples only count between marks: writing "start NAME" to
DIR/mark begins a run, "stop" writes DIR/NAME.folded (one "frame;frame;... count" line per stack,
outermost first, the flame-graph "folded" format) and ends it. Taking a sample needs the GIL, so
it lands where the main thread lets go of it (at most every switch interval, 5 ms): a sample is a
share of the time the main thread ran Python or waited, not an exact count.
"""
import os
import sys

_dir = os.environ.get("PYSAMPLE_DIR")
if _dir and "--model-path" in sys.argv:
    import collections
    import threading
    import time

    def _frames(f):
        out = []
        while f is not None and len(out) < 40:
            c = f.f_code
            out.append(f"{os.path.basename(c.co_filename)}:{c.co_name}")
            f = f.f_back
        return ";".join(reversed(out))

    def _sampler(main_id):
        period = float(os.environ.get("PYSAMPLE_MS", "2")) / 1000
        mark = os.path.join(_dir, "mark")
        seen = None
        name = None
        counts = collections.Counter()
        last_check = 0.0
        while True:
            time.sleep(period)
            now = time.monotonic()
            if now - last_check > 0.05:
                last_check = now
                try:
                    st = os.stat(mark).st_mtime_ns
                except OSError:
                    st = None
                if st != seen:
                    seen = st
                    try:
                        with open(mark) as fh:
                            words = fh.read().split()
                    except OSError:
                        words = []
                    if words[:1] == ["start"] and len(words) > 1:
                        name, counts = words[1], collections.Counter()
                    elif words[:1] == ["stop"] and name:
                        try:
                            with open(os.path.join(_dir, f"{name}.folded"), "w") as out:
                                for k, v in counts.most_common():
                                    out.write(f"{k} {v}\n")
                        except OSError:
                            pass
                        name = None
            if name is None:
                continue
            f = sys._current_frames().get(main_id)
            counts[_frames(f) if f is not None else "<none>"] += 1

    os.makedirs(_dir, exist_ok=True)
    threading.Thread(
        target=_sampler, args=(threading.main_thread().ident,), name="pysample", daemon=True
    ).start()
