#!/usr/bin/env python3
"""Keep-alive HTTPS load client for bench/gateway.sh (standard library only).

Each of --procs processes opens one TLS connection -- through `CONNECT host:port` on
--proxy when given, else straight to --connect -- and, once all are ready, sends
`GET --path` requests back to back on it (closed loop) for --duration seconds. Prints one
line like wrk.lua's:  RESULT rps=.. bps=.. p50_us=.. p99_us=.. requests=.. errors=..
"""
import argparse
import multiprocessing as mp
import socket
import ssl
import sys
import time


def read_head(sock, buf):
    while True:
        i = buf.find(b"\r\n\r\n")
        if i >= 0:
            head = bytes(buf[:i])
            del buf[: i + 4]
            return head
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed before a response head")
        buf += data


def open_tls(args):
    host, port = args.target.rsplit(":", 1)
    if args.proxy:
        ph, pp = args.proxy.rsplit(":", 1)
        sock = socket.create_connection((ph, int(pp)), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        buf = bytearray()
        head = read_head(sock, buf)
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise ConnectionError("CONNECT refused: " + head.split(b"\r\n")[0].decode("latin1"))
        if buf:
            raise ConnectionError("bytes after the CONNECT answer")
    else:
        ch, cp = args.connect.rsplit(":", 1)
        sock = socket.create_connection((ch, int(cp)), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctx = ssl.create_default_context(cafile=args.cafile)
    return ctx.wrap_socket(sock, server_hostname=host)


def worker(args, barrier, out):
    host_hdr = args.target
    req = f"GET {args.path} HTTP/1.1\r\nHost: {host_hdr}\r\n\r\n".encode()
    lat = []
    nbytes = 0
    errors = 0
    try:
        tls = open_tls(args)
    except Exception as e:  # noqa: BLE001 -- report and count
        print(f"tls_client: {e}", file=sys.stderr)
        barrier.wait()
        out.put((0, 0, 1, []))
        return
    buf = bytearray()
    barrier.wait()
    end = time.perf_counter() + args.duration
    now = time.perf_counter()
    while now < end:
        t0 = now
        try:
            tls.sendall(req)
            head = read_head(tls, buf)
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            while len(buf) < length:
                data = tls.recv(262144)
                if not data:
                    raise ConnectionError("connection closed in a body")
                buf += data
            del buf[:length]
            nbytes += len(head) + 4 + length
            now = time.perf_counter()
            if status != b"200":
                errors += 1
            lat.append(now - t0)
        except Exception as e:  # noqa: BLE001 -- count, reconnect, go on
            errors += 1
            print(f"tls_client: {e}", file=sys.stderr)
            try:
                tls.close()
                tls = open_tls(args)
                buf = bytearray()
            except Exception:  # noqa: BLE001
                break
            now = time.perf_counter()
    try:
        tls.close()
    except Exception:  # noqa: BLE001
        pass
    out.put((len(lat), nbytes, errors, lat))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--proxy", default="", help="host:port of an HTTP proxy (CONNECT)")
    p.add_argument("--connect", default="", help="host:port to dial without a proxy")
    p.add_argument("--target", required=True, help="TLS name and port, e.g. tls.local:18443")
    p.add_argument("--cafile", required=True)
    p.add_argument("--path", default="/1k")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args()
    barrier = mp.Barrier(args.procs + 1)
    out = mp.Queue()
    procs = [mp.Process(target=worker, args=(args, barrier, out)) for _ in range(args.procs)]
    for pr in procs:
        pr.start()
    barrier.wait(timeout=30)
    results = [out.get(timeout=args.duration + 60) for _ in procs]
    for pr in procs:
        pr.join(timeout=10)
    n = sum(r[0] for r in results)
    nbytes = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    lat = sorted(x for r in results for x in r[3])
    secs = args.duration  # every worker measured for exactly this long

    def pct(q):
        return int(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6) if lat else 0

    print(f"RESULT rps={n / secs:.1f} bps={nbytes / secs:.1f} p50_us={pct(0.50)} "
          f"p99_us={pct(0.99)} requests={n} errors={errors}")


if __name__ == "__main__":
    main()
