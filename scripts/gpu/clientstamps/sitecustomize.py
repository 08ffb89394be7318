"""When each request of a Python HTTP client began and when its answer's head came back.

On PYTHONPATH with BENCH_STAMPS=FILE set (scripts/gpu/proxy_acceptance.sh, CLIENT_STAMPS=1), every
aiohttp request made by the process appends "BEGUN_UNIX HEAD_UNIX" to FILE at exit (begun: the call
into aiohttp, which connects before it writes; head: its answer's head back): the client's
side of scripts/gpu/arrivals.py, which has the server's.

BENCH_BARRIER="DIR N" holds the process's first request (bench_serving's warm-up) once its answer
has come, until N processes have reached that point (each leaves a file in DIR). bench_serving
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
if _path or _barrier:
    try:
        import aiohttp
    except ImportError:
        aiohttp = None
    if aiohttp is not None:
        _stamps = []
        _calls = [0]
        _request = aiohttp.ClientSession._request

        async def _all_here():
            folder, n = _barrier[0], int(_barrier[1])
            open(os.path.join(folder, str(os.getpid())), "w").close()
            deadline = time.time() + 120
            while len(os.listdir(folder)) < n and time.time() < deadline:
                await asyncio.sleep(0.0005)

        async def _stamped(self, *args, **kwargs):
            _calls[0] += 1
            first = _calls[0] == 1
            sent = time.time()
            response = await _request(self, *args, **kwargs)
            _stamps.append((sent, time.time()))
            if _barrier and first:
                await _all_here()
            return response

        aiohttp.ClientSession._request = _stamped

        if _path:

            @atexit.register
            def _write():
                with open(_path, "w") as f:
                    f.writelines(f"{a:.6f} {b:.6f}\n" for a, b in _stamps)
