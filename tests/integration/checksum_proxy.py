"""A stand-in for a backend that enforces x-amz-checksum-sha256 (as AWS S3 does): an HTTP proxy in
front of radosgw, used by the direct-upload tests (the trusted branch: no re-hash on commit) and by
tests/bench/direct_bench.py. Its other modes are faults for blobrefd's startup probe: "accept"
answers the probe's PUTs 200 unread (a store that checks neither header), "keep_refused" relays
without checking and, when radosgw refuses a PUT, stores its body anyway through writer (a store
that answers 400 yet keeps the bytes). Imports nothing of the test harness."""
import base64
import hashlib
import http.client
import http.server
import socketserver
import threading


class ChecksumProxy:
    """An HTTP proxy in front of radosgw that behaves like AWS S3 for checksums: a PUT whose
    x-amz-checksum-sha256 is not the body's is refused (400 BadDigest), and a HEAD with
    x-amz-checksum-mode: ENABLED answers the checksum the object was stored with."""

    def __init__(self, target, mode="enforce", writer=None):
        host, port = target.split("//")[1].split(":")
        proxy = self
        assert mode in ("enforce", "accept", "keep_refused")
        assert writer or mode != "keep_refused"
        self.checksums = {}
        self.refused = 0
        self.log = []  # (method, path, Range) of each request relayed

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def relay(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                path = self.path.split("?")[0]
                proxy.log.append((self.command, path, self.headers.get("Range")))
                want = self.headers.get("x-amz-checksum-sha256")
                if mode == "accept" and self.command == "PUT" and "/.direct-probe/" in path:
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if (mode == "enforce" and self.command == "PUT" and want and
                        want != base64.b64encode(hashlib.sha256(body).digest()).decode()):
                    proxy.refused += 1
                    err = b"<Error><Code>BadDigest</Code><Message>checksum</Message></Error>"
                    self.send_response(400)
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                c = http.client.HTTPConnection(host, int(port), timeout=30)
                c.request(self.command, self.path, body=body if n else None,
                          headers={k: v for k, v in self.headers.items()})
                r = c.getresponse()
                data = r.read()
                if mode == "keep_refused" and self.command == "PUT" and r.status == 400:
                    writer(path, body)
                if self.command == "PUT" and want and r.status == 200:
                    proxy.checksums[path] = want
                if self.command == "DELETE":
                    proxy.checksums.pop(path, None)
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                if (self.command == "HEAD" and path in proxy.checksums and
                        self.headers.get("x-amz-checksum-mode") == "ENABLED"):
                    self.send_header("x-amz-checksum-sha256", proxy.checksums[path])
                self.send_header("Content-Length", r.getheader("Content-Length") or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = relay

        class Threaded(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.httpd = Threaded(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    # python3 checksum_proxy.py http://HOST:PORT: serves in front of it, the endpoint on stdout
    import sys
    p = ChecksumProxy(sys.argv[1])
    print(p.endpoint, flush=True)
    threading.Event().wait()
