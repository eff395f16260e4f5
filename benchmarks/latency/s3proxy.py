"""A loopback HTTP proxy in front of an S3-compatible endpoint that adds a fixed delay per request
and counts requests by kind (LIST, HEAD, GET, PUT, POST, DELETE) and the most in flight at once.

    proxy = S3Proxy("http://127.0.0.1:PORT_OF_MOTO", delay_s=0.020).start()
    ... point the client at proxy.url ...
    proxy.stats()   # {"ops": {...}, "max_in_flight": n}

Each request is forwarded on its own upstream connection after the delay, as a distant endpoint
answers after a round trip; requests are served concurrently (one thread each).
"""
from __future__ import annotations

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
                    conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    self.send_response(r.status, r.reason)
                    for k, v in r.getheaders():
                        if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)) if self.command != "HEAD" else
                                     r.getheader("Content-Length", "0"))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    conn.close()
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
            self.ops, self.max_in_flight = {}, 0

    def stats(self) -> dict:
        with self.lock:
            return {"ops": dict(self.ops), "max_in_flight": self.max_in_flight}

    def stop(self) -> None:
        self.server.shutdown()
