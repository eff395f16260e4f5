"""A loopback HTTP proxy in front of an S3-compatible endpoint that adds a fixed delay per request
and counts requests by kind (LIST, HEAD, GET, PUT, POST, DELETE) and the most in flight at once.

    proxy = S3Proxy("http://127.0.0.1:PORT_OF_MOTO", delay_s=0.020).start()
    ... point the client at proxy.url ...
    proxy.stats()   # {"ops": {...}, "max_in_flight": n}

Each request is forwarded on its own upstream connection after the delay, as a distant endpoint
answers after a round trip; requests are served concurrently (one thread each).

`proxy.replay = True` answers a request already seen (same method, path with query, and body) from
the answer recorded when it was forwarded, still after the delay, without asking the upstream: the
upstream's own cost leaves the measurement. moto spends ~0.5 s of Python on one LIST page of a
12,295-key bucket, so behind moto a client is measured at moto's speed, not at 20 ms per request;
a replayed run measures the client, the delay and the proxy, as a real endpoint that answers in
its round trip would. A request not seen before is forwarded (and recorded) as ever.
"""
from __future__ import annotations

import hashlib
import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class S3Proxy:
    def __init__(self, upstream: str, delay_s: float):
        u = urlsplit(upstream)
        self.host, self.port, self.delay = u.hostname, u.port, delay_s
        self.ops: dict[str, int] = {}
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.server = None
        self.replay = False
        self.recorded: dict[tuple, tuple] = {}
        self.replayed = 0

    def kind(self, method: str, path: str) -> str:
        q = parse_qs(urlsplit(path).query, keep_blank_values=True)
        if method == "GET" and ("list-type" in q or "delimiter" in q or "prefix" in q):
            return "LIST"
        return method

    def start(self) -> "S3Proxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                kind = proxy.kind(self.command, self.path)
                with proxy.lock:
                    proxy.ops[kind] = proxy.ops.get(kind, 0) + 1
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else None
                    time.sleep(proxy.delay)
                    key = (self.command, self.path, hashlib.sha256(body or b"").hexdigest())
                    answer = proxy.recorded.get(key) if proxy.replay else None
                    if answer is None:
                        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                        conn.request(self.command, self.path, body=body, headers=headers)
                        r = conn.getresponse()
                        data = r.read()
                        length = str(len(data)) if self.command != "HEAD" else r.getheader("Content-Length", "0")
                        answer = (r.status, r.reason, [(k, v) for k, v in r.getheaders() if k.lower() not in
                                                       ("connection", "transfer-encoding", "content-length")],
                                  length, data)
                        conn.close()
                        if self.command in ("GET", "HEAD"):
                            proxy.recorded[key] = answer
                    else:
                        with proxy.lock:
                            proxy.replayed += 1
                    status, reason, headers, length, data = answer
                    self.send_response(status, reason)
                    for k, v in headers:
                        self.send_header(k, v)
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.ops, self.max_in_flight, self.replayed = {}, 0, 0

    def stats(self) -> dict:
        with self.lock:
            return {"ops": dict(self.ops), "max_in_flight": self.max_in_flight, "replayed": self.replayed}

    def stop(self) -> None:
        self.server.shutdown()
