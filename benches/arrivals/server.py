# The recording server of benches/arrivals/run.sh (see there).
# Records when each request's bytes reached this host's socket (kernel receive timestamp), then
# answers after HOLD seconds with a short SSE stream. Prints arrival spread on SIGUSR1 / exit.
import socket, select, sys, time, struct, json, signal
port = int(sys.argv[1]); hold = float(sys.argv[2]); out = sys.argv[3]
SO_TIMESTAMPNS = 35
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(4096); ls.setblocking(False)
ep = select.epoll(); ep.register(ls.fileno(), select.EPOLLIN)
conns = {}; arrivals = []; pending = []
body = b'data: {"text":"x","meta_info":{"completion_tokens":1}}\n\ndata: [DONE]\n\n'
resp = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
def dump(*_):
    json.dump(arrivals, open(out, "w")); 
signal.signal(signal.SIGTERM, lambda *a: (dump(), sys.exit(0)))
while True:
    for fd, ev in ep.poll(0.001):
        if fd == ls.fileno():
            while True:
                try: c, _ = ls.accept()
                except BlockingIOError: break
                c.setblocking(False); c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                conns[c.fileno()] = [c, time.time(), b""]; ep.register(c.fileno(), select.EPOLLIN)
        else:
            c, acc, buf = conns[fd]
            try: data, anc, _, _ = c.recvmsg(65536, 256)
            except BlockingIOError: continue
            if not data:
                ep.unregister(fd); c.close(); del conns[fd]; continue
            if not buf:
                ts = None
                for lvl, typ, d in anc:
                    if typ == SO_TIMESTAMPNS: s, ns = struct.unpack("qq", d[:16]); ts = s + ns / 1e9
                arrivals.append({"accept": acc, "data": ts, "line": data.split(b"\r\n", 1)[0].decode("latin-1")})
                pending.append((time.time() + hold, c))
            conns[fd][2] = buf + data
    now = time.time()
    while pending and pending[0][0] <= now:
        _, c = pending.pop(0)
        try: c.sendall(resp)
        except OSError: pass
