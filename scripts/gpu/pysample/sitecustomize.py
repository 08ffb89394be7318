"""Where SGLang's HTTP process spends its Python time, run by run, with no profiler installed.

On PYTHONPATH with PYSAMPLE_DIR=DIR set (scripts/gpu/proxy_acceptance.sh, PYSAMPLE=1), the
process started with --model-path (the server's HTTP process: uvicorn and the tokenizer manager;
its spawned children have other arguments) runs a thread that samples its main thread's stack
every PYSAMPLE_MS (2) milliseconds. Samples only count between marks: writing "start NAME" to
DIR/mark begins a run, "stop" writes DIR/NAME.folded (one "frame;frame;... count" line per stack,
outermost first, the flame-graph "folded" format) and ends it. Taking a sample needs the GIL, so
it lands where the main thread lets go of it (mostly in the event loop's poll, with the GIL
released): a sample says where the thread waits more than where it computes.

PYSAMPLE_MODE=profile instead runs cProfile on the main thread between the marks (the sampler
thread signals the main thread, SIGRTMIN+6, whose handler turns it on and off) and writes
DIR/NAME.prof.txt: per function its calls, own time and time with callees. The calls are exact;
the times carry cProfile's overhead, alike in every arm.
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
                    try:
                        with open(mark) as fh:
                            words = fh.read().split()
                    except OSError:
                        words = []
                    # a mark caught half written is read again at the next check
                    if words:
                        seen = st
                    if words[:1] == ["start"] and len(words) > 1:
                        name, counts = words[1], collections.Counter()
                        _mark(name)
                    elif words[:1] == ["stop"] and name:
                        _mark(None)
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

    _profile = os.environ.get("PYSAMPLE_MODE") == "profile"
    _want = {"name": None}
    _prof = {"p": None}

    def _toggle(signum, frame):
        import cProfile
        import pstats

        name = _want["name"]
        if name and _prof["p"] is None:
            _prof["p"] = cProfile.Profile()
            _prof["p"].enable()
        elif not name and _prof["p"] is not None:
            p, _prof["p"] = _prof["p"], None
            p.disable()
            st = pstats.Stats(p)
            try:
                with open(os.path.join(_dir, f"{_want['last']}.prof.txt"), "w") as out:
                    for (fn, line, func), (cc, nc, tt, ct, _) in sorted(
                        st.stats.items(), key=lambda kv: -kv[1][2]
                    ):
                        out.write(f"{nc}\t{tt:.6f}\t{ct:.6f}\t{os.path.basename(fn)}:{line}({func})\n")
            except OSError:
                pass

    if _profile:
        import signal

        _SIG = signal.SIGRTMIN + 6
        signal.signal(_SIG, _toggle)

    def _mark(name):
        if _profile:
            if name:
                _want["last"] = name
            _want["name"] = name
            os.kill(os.getpid(), _SIG)

    os.makedirs(_dir, exist_ok=True)
    threading.Thread(
        target=_sampler, args=(threading.main_thread().ident,), name="pysample", daemon=True
    ).start()
