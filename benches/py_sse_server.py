"""A saturated Python streaming server, for what a tap costs it: asyncio (stdlib), each request
answered with MAX_NEW_TOKENS OpenAI chat chunks as SSE events, chunked, a `json.dumps` and a
write each, every stream yielding to the others between events (SGLang's HTTP process does this
work for each event, with more of its own besides). Every 0.25 s it appends to SAMPLES one line:
"START END EVENTS USER_S SYSTEM_S", the events written and the process's CPU over that slice,
for benches/tap_server_cost.sh to read against the keyed turns.
  usage: python3 benches/py_sse_server.py PORT SAMPLES   (listens on 127.0.0.1:PORT)"""
import asyncio
import json
import resource
import sys
import time

from py_event_writer import chunk as event  # the same chat chunk (benches/ is on the path)

written = 0


def chunk(i):
    """Event `i` in HTTP/1.1 chunked framing."""
    e = event(i)
    return b"%x\r\n%s\r\n" % (len(e), e)


async def answer(reader, writer):
    global written
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length) if length else b""
        try:
            tokens = int(json.loads(body)["sampling_params"]["max_new_tokens"])
        except (ValueError, KeyError, TypeError):
            tokens = 16  # a readiness probe: a short answer
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        for i in range(tokens):
            writer.write(chunk(i))
            written += 1
            await writer.drain()
            await asyncio.sleep(0)
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # a client gone mid-answer (a readiness probe's may be)
    finally:
        writer.close()


async def sample(path):
    with open(path, "w") as out:
        last = (time.time(), resource.getrusage(resource.RUSAGE_SELF), written)
        while True:
            await asyncio.sleep(0.25)
            now = (time.time(), resource.getrusage(resource.RUSAGE_SELF), written)
            user = now[1].ru_utime - last[1].ru_utime
            system = now[1].ru_stime - last[1].ru_stime
            out.write(f"{last[0]:.3f} {now[0]:.3f} {now[2] - last[2]} {user:.6f} {system:.6f}\n")
            out.flush()
            last = now


async def main(port, path):
    server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=1024)
    sampler = asyncio.get_running_loop().create_task(sample(path))
    async with server:
        await server.serve_forever()
    sampler.cancel()


if __name__ == "__main__":
    try:
        port, path = int(sys.argv[1]), sys.argv[2]
    except (IndexError, ValueError):
        sys.exit(__doc__)
    asyncio.run(main(port, path))
