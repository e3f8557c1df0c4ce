"""Helpers for the blobrefd integration tests: raw-socket HTTP, error checks, store snapshots."""
import base64
import hashlib
import json
import os
import pathlib
import re
import socket
import subprocess
import threading
import time

import requests

from conftest import BIN_DIR

TIMEOUT = 30
HEX_RE = re.compile(r"^[0-9a-f]{64}$")
RFC3339_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
JSON_TYPE_RE = re.compile(r"^application/json\b")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def repr_digest(data):
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def object_key(hexd, prefix=""):
    return f"{prefix}sha256/{hexd[0:2]}/{hexd[2:4]}/{hexd}"


def object_path(srv, hexd, root=None, prefix=""):
    root = pathlib.Path(root) if root else srv.data_dir / "blobs"
    return root / object_key(hexd, prefix)


def blob_files(root):
    """Every regular file under root (relative path -> (size, mtime_ns, inode))."""
    root = pathlib.Path(root)
    out = {}
    if not root.exists():
        return out
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = pathlib.Path(dirpath) / f
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def non_object_files(root, prefix=""):
    """Files under root that are not final object files (temp files, partial uploads)."""
    pat = re.compile("^" + re.escape(prefix) + r"sha256/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})$")
    bad = []
    for rel in blob_files(root):
        m = pat.match(rel)
        if not m or m.group(3)[0:2] != m.group(1) or m.group(3)[2:4] != m.group(2):
            bad.append(rel)
    return sorted(bad)


def wait_until(pred, timeout=5.0, step=0.05):
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v or time.time() >= deadline:
            return v
        time.sleep(step)


def assert_error(resp, status, code):
    """resp is a requests.Response: status, JSON error body with the code and a message."""
    assert resp.status_code == status, (resp.status_code, resp.headers, resp.content[:500])
    ctype = resp.headers.get("Content-Type", "")
    assert JSON_TYPE_RE.match(ctype), f"error Content-Type {ctype!r}: {resp.content[:300]!r}"
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    assert body["error"].get("code") == code, body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
    return body


def assert_raw_error(raw, status, code):
    """Same for a RawResponse."""
    assert raw.status == status, (raw.status, raw.headers, raw.body[:500])
    assert JSON_TYPE_RE.match(raw.header("content-type") or ""), raw.headers
    body = json.loads(raw.body)
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body


def put(srv, data, hexd=None, headers=None, **kw):
    hexd = sha(data) if hexd is None else hexd
    return requests.put(f"{srv.url}/v1/blobs/{hexd}", data=data, headers=headers or {},
                        timeout=TIMEOUT, **kw)


def post(srv, data, headers=None, **kw):
    return requests.post(f"{srv.url}/v1/blobs", data=data, headers=headers or {},
                         timeout=TIMEOUT, **kw)


def get(srv, hexd, headers=None, **kw):
    return requests.get(f"{srv.url}/v1/blobs/{hexd}", headers=headers or {}, timeout=TIMEOUT,
                        **kw)


def lookup(srv, hashes, **kw):
    return requests.post(f"{srv.url}/v1/lookup", json={"hashes": hashes}, timeout=TIMEOUT, **kw)


def healthy(srv):
    r = requests.get(srv.url + "/healthz", timeout=10)
    return r.status_code == 200 and r.json()["status"] == "ok"


def fsck(data_dir, config=None, verify=False, timeout=120):
    """Runs blobrefd --fsck; returns (exit code, blobs, problems, output)."""
    args = [str(BIN_DIR / "blobrefd"), "--fsck", "--data", str(data_dir)]
    if config is not None:
        args += ["-c", str(config)]
    if verify:
        args.append("--verify")
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")
    p = subprocess.run(args, capture_output=True, timeout=timeout, env=env)
    out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    m = re.search(r"fsck: (\d+) blobs, (\d+) problems", out)
    blobs, problems = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    return p.returncode, blobs, problems, out


class RawResponse:
    def __init__(self, status, reason, headers, body, raw_head):
        self.status = status
        self.reason = reason
        self.headers = headers  # list of (name, value)
        self.body = body
        self.raw_head = raw_head

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]


class RawConn:
    """A plain TCP client that reads HTTP/1.1 responses as they come (for 100-continue, pipelining,
    truncated bodies and the like)."""

    def __init__(self, srv, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
        self.buf = b""
        self.sent = 0

    def send(self, data):
        self.sock.sendall(data)
        self.sent += len(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed")
        self.buf += chunk

    def read_until(self, marker):
        while marker not in self.buf:
            self._fill()
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, head_only=False):
        """Reads one response (status line, headers, body by Content-Length / chunked / EOF)."""
        raw = self.read_until(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        m = re.match(r"^HTTP/1\.[01] (\d{3}) ?(.*)$", lines[0])
        assert m, f"bad status line {lines[0]!r}"
        status = int(m.group(1))
        headers = []
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers.append((k.strip(), v.strip()))
        resp = RawResponse(status, m.group(2), headers, b"", raw)
        if head_only or status in (100, 204, 304) or 100 <= status < 200:
            return resp
        te = (resp.header("transfer-encoding") or "").lower()
        cl = resp.header("content-length")
        if "chunked" in te:
            body = b""
            while True:
                size = int(self.read_until(b"\r\n").split(b";")[0].strip(), 16)
                if size == 0:
                    self.read_until(b"\r\n")
                    break
                body += self.read_exact(size)
                self.read_exact(2)
            resp.body = body
        elif cl is not None:
            resp.body = self.read_exact(int(cl))
        else:
            resp.body = self.read_to_eof()
        return resp

    def read_to_eof(self):
        try:
            while True:
                self._fill()
        except EOFError:
            pass
        out, self.buf = self.buf, b""
        return out

    def closed_by_peer(self, timeout=5.0):
        """True when the server closes (EOF or reset) within timeout and sends nothing more."""
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
        if chunk:
            self.buf += chunk
            return False
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def request_head(method, path, headers=(), host="127.0.0.1"):
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def raw_exchange(srv, head, body=b"", timeout=15, chunk=65536):
    """Sends head, then body from a background thread (ignoring write errors: the server may answer
    early and close), and reads one response. Returns (RawResponse or None on close, bytes sent)."""
    conn = RawConn(srv, timeout=timeout)
    conn.send(head)
    sent = [0]

    def writer():
        try:
            if callable(body):
                for piece in body():
                    conn.sock.sendall(piece)
                    sent[0] += len(piece)
            else:
                for i in range(0, len(body), chunk):
                    conn.sock.sendall(body[i:i + chunk])
                    sent[0] += len(body[i:i + chunk])
        except OSError:
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        resp = conn.read_response()
    except (EOFError, ConnectionResetError):
        resp = None
    except socket.timeout:
        conn.close()
        raise AssertionError(f"no answer and no close within {timeout}s "
                             f"({sent[0]} body bytes sent)") from None
    t.join(timeout)
    conn.close()
    return resp, sent[0]


def parse_ranges(status, headers, body):
    """Parses a 206 response (single part or multipart/byteranges) into
    [(first, last, total, bytes, part_headers)]."""
    assert status == 206, status
    ctype = headers.get("Content-Type", "")
    if ctype.startswith("multipart/byteranges"):
        m = re.search(r'boundary="?([^";]+)"?', ctype)
        assert m, ctype
        boundary = b"--" + m.group(1).encode()
        assert body.count(boundary + b"--") == 1, "missing closing boundary"
        parts = []
        segs = body.split(boundary)
        # segs[0] is the preamble, the last one starts with "--" (closing delimiter).
        assert segs[-1].startswith(b"--"), segs[-1][:20]
        for seg in segs[1:-1]:
            assert seg.startswith(b"\r\n"), seg[:20]
            head, sep, data = seg[2:].partition(b"\r\n\r\n")
            assert sep, "part without header end"
            assert data.endswith(b"\r\n"), "part data must end with CRLF before the boundary"
            data = data[:-2]
            ph = {}
            for line in head.decode("latin-1").split("\r\n"):
                k, _, v = line.partition(":")
                ph[k.strip().lower()] = v.strip()
            first, last, total = parse_content_range(ph["content-range"])
            parts.append((first, last, total, data, ph))
        return parts
    first, last, total = parse_content_range(headers["Content-Range"])
    return [(first, last, total, body, {})]


def parse_content_range(v):
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", v)
    assert m, f"bad Content-Range {v!r}"
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def curl(*args, timeout=60):
    p = subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")
