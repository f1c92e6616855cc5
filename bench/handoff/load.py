# A client of bench/handoff/run.sh: 50 threads, each sending its share of
# N requests (argv[1]) one after the other, one connection each; prints
# how many were answered 200 and the requests a second.
import socket, threading, time, sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
C = 50
done = []
lock = threading.Lock()
def worker(n):
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", 18931))
        s.sendall(b"GET /a.html HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            d = s.recv(4096)
            if not d: break
            data += d
        s.close()
        with lock: done.append(data.split(b" ")[1])
t = time.time()
ts = [threading.Thread(target=worker, args=(N // C,)) for _ in range(C)]
[x.start() for x in ts]; [x.join() for x in ts]
el = time.time() - t
print(f"{len(done)} requests, {sum(1 for d in done if d == b'200')} ok, {el:.3f}s, {len(done)/el:.0f} req/s")
