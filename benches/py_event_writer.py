"""What a tap costs a Python writer's own code: one thread builds an OpenAI chat chunk a token
(a dict, `json.dumps`, the SSE framing: the kind of work SGLang's HTTP process does for each
event), sends it on a loopback TCP connection and reads it back at the other end, never
blocking; its user and system time an event are printed apart (getrusage of the thread). A tap
copies each segment into its ring in the writer's send, in the kernel: system time. Whatever it
costs the writer's own Python besides (caches, branch predictors left colder) shows as user
time. benches/tap_writer_cost.sh runs it bare and tapped (PY_WRITER=1); its line has the shape
of benches/tcp_op_cost.c's, which that script reads.
  usage: python3 benches/py_event_writer.py COUNT EVENT_BYTES PORT [HOST=2]
  (listens on 127.0.0.HOST:PORT, where a tap of PORT sees every event; EVENT_BYTES is ignored:
  a chunk is about 290 bytes, as InferenceX's chat streams' are)"""
import json
import resource
import socket
import sys
import time

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
HEAD = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1733600000, "model": "tiny"}


def chunk(i):
    d = dict(HEAD)
    delta = {"role": None, "content": " " + WORDS[i % 6] * (1 + i % 3), "reasoning_content": None, "tool_calls": None}
    d["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "matched_stop": None}]
    d["usage"] = None
    return f"data: {json.dumps(d, separators=(',', ':'))}\n\n".encode()


def main(argv):
    try:
        count, port = int(argv[0]), int(argv[2])
        host = int(argv[3]) if len(argv) > 3 else 2
        if count <= 0 or not 0 < port < 65536 or not 2 <= host <= 254:
            raise ValueError
    except (ValueError, IndexError):
        sys.exit(__doc__)
    addr = (f"127.0.0.{host}", port)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(addr)
    listener.listen(1)
    send = socket.create_connection(addr)
    recv, _ = listener.accept()
    for s in (send, recv):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    recv.setblocking(False)
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.perf_counter()
    for i in range(count):
        m = chunk(i)
        send.send(m)
        try:
            while recv.recv(65536):
                pass
        except BlockingIOError:
            pass
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    user = (r1.ru_utime - r0.ru_utime) / count * 1e6
    system = (r1.ru_stime - r0.ru_stime) / count * 1e6
    print(f"py_event_writer: {count} events of {len(m)} bytes (port given): send + recv {user + system:.2f} us"
          f" per event (CPU), {wall / count * 1e6:.2f} us wall; with Python's own work an event:"
          f" user {user:.2f} us, system {system:.2f} us per event")


if __name__ == "__main__":
    main(sys.argv[1:])
