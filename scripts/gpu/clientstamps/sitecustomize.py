"""When each request of a Python HTTP client left and when its answer's head came back.

On PYTHONPATH with BENCH_STAMPS=FILE set (scripts/gpu/proxy_acceptance.sh, CLIENT_STAMPS=1), every
aiohttp request made by the process appends "SENT_UNIX HEAD_UNIX" to FILE at exit: the client's
side of scripts/gpu/arrivals.py, which has the server's. bench_serving itself is not changed.
"""
import atexit
import os
import time

_path = os.environ.get("BENCH_STAMPS")
if _path:
    try:
        import aiohttp
    except ImportError:
        aiohttp = None
    if aiohttp is not None:
        _stamps = []
        _request = aiohttp.ClientSession._request

        async def _stamped(self, *args, **kwargs):
            sent = time.time()
            response = await _request(self, *args, **kwargs)
            _stamps.append((sent, time.time()))
            return response

        aiohttp.ClientSession._request = _stamped

        @atexit.register
        def _write():
            with open(_path, "w") as f:
                f.writelines(f"{a:.6f} {b:.6f}\n" for a, b in _stamps)
