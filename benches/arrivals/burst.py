# The client of benches/arrivals/run.sh (see there).
# bench_serving's pattern: N requests at once, a new aiohttp session per request, streamed answer.
import aiohttp, asyncio, sys, time, json
port, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
payload = {"input_ids": list(range(256)), "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}, "stream": True}
async def one(i, res):
    st = time.time()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.post(f"http://127.0.0.1:{port}/generate", json=payload) as r:
            async for line in r.content:
                pass
    res.append({"send": st, "done": time.time()})
async def main():
    res = []
    await asyncio.gather(*(one(i, res) for i in range(n)))
    json.dump(res, open(out, "w"))
asyncio.run(main())
