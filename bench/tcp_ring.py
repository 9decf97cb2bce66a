"""Raw TCP streams in a ring, the bound of a ring all-reduce's bus bandwidth: every rank
sends MB megabytes to the next rank while it receives as many from the previous one, as a
ring step does, three times; prints (rank 0) one JSON line with the median per-stream
bandwidth in MB/s. Rank i listens on NET.(10 + i), as on the namespace hosts of
scripts/netns-hosts.sh.

Usage: python3 bench/tcp_ring.py --rank I --world W --net 10.213.20 [--mb 256]
"""
import argparse, json, socket, statistics, threading, time

PORT = 29700
CHUNK = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--net", required=True)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    addr = lambda r: (f"{a.net}.{10 + r}", PORT)
    server = socket.create_server(addr(a.rank))
    nxt = (a.rank + 1) % a.world
    out = None
    while out is None:
        try:
            out = socket.create_connection(addr(nxt))
        except OSError:
            time.sleep(0.05)
    inp, _ = server.accept()
    for s in (out, inp):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    total = a.mb << 20
    block = bytes(CHUNK)
    rates = []
    for _ in range(a.repeats):
        # A one-byte handshake round the ring so that every rank starts together.
        out.sendall(b"g")
        inp.recv(1)

        def send():
            for _ in range(total // CHUNK):
                out.sendall(block)

        sender = threading.Thread(target=send)
        start = time.perf_counter()
        sender.start()
        buf = bytearray(CHUNK)
        got = 0
        while got < total:
            n = inp.recv_into(buf, min(CHUNK, total - got))
            if n == 0:
                raise SystemExit("the previous rank hung up")
            got += n
        sender.join()
        rates.append(total / 1e6 / (time.perf_counter() - start))
    if a.rank == 0:
        print(json.dumps({"world": a.world, "mb": a.mb, "stream_mb_per_s": statistics.median(rates)}))


if __name__ == "__main__":
    main()
