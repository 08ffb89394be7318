"""When each request of a Python HTTP client began and when its answer's head came back.

On PYTHONPATH with BENCH_STAMPS=FILE set (scripts/gpu/proxy_acceptance.sh, CLIENT_STAMPS=1), every
aiohttp request made by the process appends "BEGUN_UNIX HEAD_UNIX" to FILE at exit (begun: the call
into aiohttp, which connects before it writes; head: its answer's head back): the client's
side of scripts/gpu/arrivals.py, which has the server's.

BENCH_BARRIER="DIR N" holds the process's first request (bench_serving's warm-up) once its answer
has been read to the end and its session closed, until N processes have reached that point (each
leaves a file in DIR; one that exits before that leaves its file at exit). The head alone is not
enough: SGLang sends it before the first token, and the 32-token warm-up's rest then takes tens of
ms, which a hold at the head would leave between the two main runs. bench_serving
then sleeps a fixed second and starts its clock and its main run: two benchmarks started together
send their first waves within a millisecond of each other, whatever their start-up took (the
split arm of proxy_acceptance.sh), and no hold falls inside what either one times (a request's
TTFT and the run's duration start after the warm-up). bench_serving itself is not changed.
"""
import asyncio
import atexit
import os
import time

_path = os.environ.get("BENCH_STAMPS")
_barrier = os.environ.get("BENCH_BARRIER", "").split()
_chunks = os.environ.get("BENCH_CHUNKS")
if _path or _barrier or _chunks:
    try:
        import aiohttp
    except ImportError:
        aiohttp = None
    if aiohttp is not None:
        _stamps = []
        _first = []  # the session of the process's first request (bench_serving: one per request)
        _begun = {}  # BENCH_CHUNKS: id(reader) -> call time, until its first event
        _request = aiohttp.ClientSession._request

        def _arrive():
            open(os.path.join(_barrier[0], str(os.getpid())), "w").close()

        async def _all_here():
            folder, n = _barrier[0], int(_barrier[1])
            _arrive()
            deadline = time.time() + 120
            while len(os.listdir(folder)) < n and time.time() < deadline:
                await asyncio.sleep(0.0005)

        async def _stamped(self, *args, **kwargs):
            if not _first:
                _first.append(self)
            sent = time.time()
            response = await _request(self, *args, **kwargs)
            _stamps.append((sent, time.time()))
            if _chunks:
                _begun[id(response.content)] = sent
            return response

        aiohttp.ClientSession._request = _stamped

        if _barrier:
            _exit = aiohttp.ClientSession.__aexit__

            async def _held(self, *exc):
                # the warm-up's `async with session` ends after its body was read (or its error
                # caught), outside every clock bench_serving keeps
                r = await _exit(self, *exc)
                if _first and self is _first[0]:
                    _first[0] = None
                    await _all_here()
                return r

            aiohttp.ClientSession.__aexit__ = _held
            # a process that ends before its warm-up (a failed start) releases the others at once
            atexit.register(_arrive)

        if _chunks:
            # BENCH_CHUNKS=FILE: when each SSE event of each request arrived, for an analysis by
            # time slice (scripts/gpu/keyed.py). FILE.chunks holds (time, request number) as two
            # float64 each, in arrival order; FILE.begun "NUMBER BEGUN_UNIX" for each request, its
            # call into aiohttp. A request's number is given at its first event; an event is a
            # line that starts "data:" (bench_serving reads the same lines), and its "[DONE]"
            # frees the reader's id for reuse.
            from array import array

            _times = array("d")
            _number = {}  # id(reader) -> request number, until its [DONE]
            _begins = []
            _readline = aiohttp.StreamReader.readline

            async def _timed_readline(self):
                line = await _readline(self)
                if line[:5] == b"data:":
                    now = time.time()
                    key = id(self)
                    n = _number.get(key)
                    if n is None:
                        n = _number[key] = len(_begins)
                        _begins.append(_begun.pop(key, now))
                    if line[5:].strip() == b"[DONE]":
                        del _number[key]
                    else:
                        _times.append(now)
                        _times.append(n)
                return line

            aiohttp.StreamReader.readline = _timed_readline

            # `timeout` ends a run that overran with SIGTERM, which would skip atexit and lose
            # every stamp of it (a device call did: 26 368 prompts sized on a faster warm-up):
            # exit instead, so the stamps of the turns it ran are written
            import signal
            import sys

            def _stop(*_):
                # once: a second SIGTERM while Python unwinds must not cut the write short
                # (`timeout -k` kills for good if the unwinding hangs)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                sys.exit(143)

            signal.signal(signal.SIGTERM, _stop)

            @atexit.register
            def _write_chunks():
                with open(_chunks + ".chunks", "wb") as f:
                    _times.tofile(f)
                with open(_chunks + ".begun", "w") as f:
                    f.writelines(f"{n} {t:.6f}\n" for n, t in enumerate(_begins))

        if _path:

            @atexit.register
            def _write():
                with open(_path, "w") as f:
                    f.writelines(f"{a:.6f} {b:.6f}\n" for a, b in _stamps)

# this file shadows any other sitecustomize on sys.path (Debian's /usr/lib/python3.X one, a venv's):
# run the next one too
try:
    import importlib.machinery
    import sys

    _here = os.path.dirname(os.path.abspath(__file__))
    _next = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
    if _next and _next.origin and _next.origin.endswith(".py"):
        exec(compile(open(_next.origin).read(), _next.origin, "exec"), {"__name__": "sitecustomize", "__file__": _next.origin})
except Exception as e:  # never stop the client over it
    print(f"clientstamps: the next sitecustomize failed: {e!r}", file=sys.stderr)
