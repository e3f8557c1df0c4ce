"""The blobref command line (put/get/stat/lookup) against a real blobrefd: hashes, dedup without
re-sending the body (proved by a byte-counting TCP relay), Range, -o FILE, redirects, lookup
batching and exit codes, local validation and usage errors."""
import hashlib
import http.server
import json
import os
import pathlib
import socket
import subprocess
import threading
import time

import pytest
import requests

from conftest import BIN_DIR, Server, free_port

BLOBREF = str(BIN_DIR / "blobref")
UNKNOWN = hashlib.sha256(b"blobref cli test: never uploaded").hexdigest()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def run(srv_url, *args, input=None, env=None, timeout=120):
    """Runs bin/blobref with --server srv_url (unless srv_url is None); returns CompletedProcess
    with bytes stdout/stderr."""
    cmd = [BLOBREF] + (["--server", srv_url] if srv_url else []) + [str(a) for a in args]
    full_env = dict(os.environ)
    full_env.pop("BLOBREF_SERVER", None)
    full_env.pop("BLOBREF_TOKEN", None)
    full_env.update(env or {})
    return subprocess.run(cmd, input=input, capture_output=True, env=full_env, timeout=timeout)


def one_line_error(p):
    """The stderr of a failed run: exactly one line starting with 'blobref'."""
    err = p.stderr.decode()
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("blobref"), err
    return lines[0]


def upload(srv, data, content_type=None):
    h = sha(data)
    headers = {"Content-Type": content_type} if content_type else {}
    r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, headers=headers, timeout=30)
    assert r.status_code in (200, 201), (r.status_code, r.text)
    return h


class Relay:
    """A TCP relay in front of the server that counts what clients send (request line, headers
    and body bytes) and how many connections they open."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.lock = threading.Lock()
        self.sent = []  # per connection: bytes client -> server
        self.heads = []  # per connection: first 16 KiB client -> server
        self.active = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                idx = len(self.sent)
                self.sent.append(0)
                self.heads.append(b"")
                self.active += 1
            threading.Thread(target=self._serve, args=(c, idx), daemon=True).start()

    def _pump(self, src, dst, idx):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                if idx is not None:
                    with self.lock:
                        self.sent[idx] += len(d)
                        if len(self.heads[idx]) < 16384:
                            self.heads[idx] += d[: 16384 - len(self.heads[idx])]
                dst.sendall(d)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _serve(self, c, idx):
        try:
            u = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            c.close()
            with self.lock:
                self.active -= 1
            return
        t = threading.Thread(target=self._pump, args=(u, c, None), daemon=True)
        t.start()
        self._pump(c, u, idx)
        t.join(30)
        c.close()
        u.close()
        with self.lock:
            self.active -= 1

    def settle(self, timeout=10):
        """Waits until every relayed connection has ended (so the counters are final)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if self.active == 0:
                    return
            time.sleep(0.01)
        raise AssertionError("relay connections still open")

    def reset(self):
        self.settle()
        with self.lock:
            self.sent.clear()
            self.heads.clear()

    def total(self):
        self.settle()
        with self.lock:
            return sum(self.sent)

    def request_lines(self):
        self.settle()
        with self.lock:
            return [h.split(b"\r\n", 1)[0].decode() for h in self.heads if h]

    def close(self):
        self.lsock.close()


@pytest.fixture
def relay(server):
    r = Relay(server.port)
    yield r
    r.close()


# ---------------------------------------------------------------------------------------------
# put


def test_put_file_prints_sha256_and_stores_bytes(server, tmp_path):
    data = os.urandom(300_000)
    f = tmp_path / "blob.bin"
    f.write_bytes(data)
    p = run(server.url, "put", f)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == sha(data) + "\n"
    r = requests.get(f"{server.url}/v1/blobs/{sha(data)}", timeout=30)
    assert r.status_code == 200 and r.content == data


def test_put_type_is_stored(server, tmp_path):
    f = tmp_path / "pic.png"
    f.write_bytes(b"\x89PNG not really")
    p = run(server.url, "put", "--type", "image/png", f)
    assert p.returncode == 0, p.stderr
    meta = requests.get(f"{server.url}/v1/blobs/{sha(f.read_bytes())}/meta", timeout=30).json()
    assert meta["content_type"] == "image/png"


def test_put_again_is_dedup_and_body_not_resent(server, relay, tmp_path):
    data = os.urandom(3 * 1024 * 1024)
    f = tmp_path / "big.bin"
    f.write_bytes(data)
    h = sha(data)

    p = run(relay.url, "put", "-v", f)
    assert p.returncode == 0, p.stderr
    fields = p.stdout.decode().split()
    assert fields[:3] == [h, f"size={len(data)}", "dedup=no"], p.stdout
    first = relay.total()
    assert first > len(data), first  # the body went through the relay
    assert relay.request_lines() == [f"PUT /v1/blobs/{h} HTTP/1.1"]
    assert b"\r\nexpect: 100-continue\r\n" in relay.heads[0].lower()
    assert f"\r\ncontent-length: {len(data)}\r\n".encode() in relay.heads[0].lower()

    relay.reset()
    p = run(relay.url, "put", "-v", f)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split() == [h, f"size={len(data)}", "dedup=yes", "sent=0"], p.stdout
    second = relay.total()
    assert second < 4096, f"{second} bytes sent for a blob the server already has"
    assert requests.get(f"{server.url}/v1/blobs/{h}", timeout=30).content == data


def test_put_stdin_streams_with_post(server, relay):
    data = os.urandom(200_000)
    p = run(relay.url, "put", "-v", "-", input=data)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split()[:3] == [sha(data), f"size={len(data)}", "dedup=no"]
    assert relay.request_lines() == ["POST /v1/blobs HTTP/1.1"]
    assert b"\r\ntransfer-encoding: chunked\r\n" in relay.heads[0].lower()
    assert requests.get(f"{server.url}/v1/blobs/{sha(data)}", timeout=30).content == data
    # The same bytes again from stdin: the server reports a dedup hit.
    p = run(server.url, "put", "-v", "-", input=data)
    assert p.returncode == 0 and p.stdout.decode().split()[2] == "dedup=yes", p.stdout


def test_put_non_regular_file_streams_with_post(server, relay):
    data = os.urandom(10_000)
    p = run(relay.url, "put", "/dev/stdin", input=data)  # a pipe: cannot be hashed, then re-read
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == sha(data) + "\n"
    assert relay.request_lines() == ["POST /v1/blobs HTTP/1.1"]


def test_put_stdin_with_sha256_known_blob_not_resent(server, relay):
    data = os.urandom(2 * 1024 * 1024)
    h = upload(server, data)
    p = run(relay.url, "put", "-v", "--sha256", "sha256:" + h, "-", input=data)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split()[:3] == [h, f"size={len(data)}", "dedup=yes"]
    assert relay.request_lines() == [f"PUT /v1/blobs/{h} HTTP/1.1"]
    assert relay.total() < 4096


def test_put_stdin_with_sha256_new_blob_uploads(server):
    data = os.urandom(100_000)
    p = run(server.url, "put", "--sha256", sha(data).upper(), "-", input=data)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == sha(data) + "\n"
    assert requests.get(f"{server.url}/v1/blobs/{sha(data)}", timeout=30).content == data


def test_put_wrong_sha256_is_digest_mismatch(server, tmp_path):
    data = os.urandom(5000)
    f = tmp_path / "x.bin"
    f.write_bytes(data)
    for args in (["--sha256", UNKNOWN, f], ["--sha256", UNKNOWN, "-"]):
        p = run(server.url, "put", *args, input=data)
        assert p.returncode == 1, p
        line = one_line_error(p)
        assert "digest_mismatch" in line, line
        assert p.stdout == b""
    for h in (UNKNOWN, sha(data)):
        assert requests.get(f"{server.url}/v1/blobs/{h}", timeout=30).status_code == 404


def test_put_missing_file(server, tmp_path):
    p = run(server.url, "put", tmp_path / "nope.bin")
    assert p.returncode == 1
    assert "cannot open" in one_line_error(p)


def test_put_empty_file(server, tmp_path):
    f = tmp_path / "empty"
    f.write_bytes(b"")
    p = run(server.url, "put", f)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == sha(b"") + "\n"


# ---------------------------------------------------------------------------------------------
# get


@pytest.fixture
def stored(server):
    data = os.urandom(100_000)
    return data, upload(server, data)


def test_get_full_to_stdout(server, stored):
    data, h = stored
    p = run(server.url, "get", h)
    assert p.returncode == 0, p.stderr
    assert p.stdout == data
    p = run(server.url, "get", "sha256:" + h.upper())
    assert p.returncode == 0 and p.stdout == data


@pytest.mark.parametrize("spec,part", [
    ("10-19", lambda d: d[10:20]),
    ("bytes=0-0", lambda d: d[0:1]),
    ("99990-", lambda d: d[99990:]),
    ("-7", lambda d: d[-7:]),
    ("50-200000", lambda d: d[50:]),
])
def test_get_range(server, stored, spec, part):
    data, h = stored
    p = run(server.url, "get", "--range", spec, h)
    assert p.returncode == 0, p.stderr
    assert p.stdout == part(data)


def test_get_multiple_ranges_passes_multipart_through(server, stored):
    data, h = stored
    p = run(server.url, "get", "--range", "0-9,1000-1009", h)
    assert p.returncode == 0, p.stderr
    assert data[0:10] in p.stdout and data[1000:1010] in p.stdout
    assert b"Content-Range: bytes 1000-1009/100000" in p.stdout


def test_get_unsatisfiable_range(server, stored):
    _, h = stored
    p = run(server.url, "get", "--range", "200000-", h)
    assert p.returncode == 1
    assert "range_not_satisfiable" in one_line_error(p)
    assert p.stdout == b""


def test_get_to_file(server, stored, tmp_path):
    data, h = stored
    out = tmp_path / "out" / "blob.bin"
    out.parent.mkdir()
    out.write_bytes(b"old content")
    p = run(server.url, "get", "-o", out, h)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b""
    assert out.read_bytes() == data
    assert sorted(os.listdir(out.parent)) == ["blob.bin"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    p = run(server.url, "get", "--range", "5-9", "-o", out, h)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == data[5:10]


def test_get_unknown_hash_is_not_found_and_leaves_no_file(server, tmp_path):
    p = run(server.url, "get", UNKNOWN)
    assert p.returncode == 1
    line = one_line_error(p)
    assert "not_found" in line and UNKNOWN in line, line
    assert p.stdout == b""
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "new.bin"
    p = run(server.url, "get", "-o", out, UNKNOWN)
    assert p.returncode == 1 and "not_found" in one_line_error(p)
    assert os.listdir(outdir) == []
    out.write_bytes(b"keep me")
    p = run(server.url, "get", "-o", out, UNKNOWN)
    assert p.returncode == 1
    assert out.read_bytes() == b"keep me" and os.listdir(outdir) == ["new.bin"]


def test_get_detects_corrupted_bytes(server, tmp_path):
    # over the server's small-blob cache limit (64 KiB), which would itself refuse bad bytes
    data = os.urandom(200_000)
    h = upload(server, data)
    obj = server.data_dir / "blobs" / "sha256" / h[0:2] / h[2:4] / h
    assert obj.read_bytes() == data
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(b ^ 0xFF for b in data))  # same size, other bytes
    outdir = tmp_path / "out"
    outdir.mkdir()
    p = run(server.url, "get", "-o", outdir / "blob.bin", h)
    assert p.returncode == 1
    assert "not the requested hash" in one_line_error(p)
    assert os.listdir(outdir) == []  # neither FILE nor a temporary file
    p = run(server.url, "get", h)
    assert p.returncode == 1 and "not the requested hash" in one_line_error(p)
    # A range is not checked (it cannot be): it succeeds with what the store has.
    p = run(server.url, "get", "--range", "0-3", h)
    assert p.returncode == 0 and p.stdout == bytes(b ^ 0xFF for b in data[:4])


class _Origin(http.server.SimpleHTTPRequestHandler):
    seen = []

    def do_GET(self):
        _Origin.seen.append((self.path, self.headers.get("Authorization")))
        super().do_GET()

    def log_message(self, *args):
        pass


def test_get_follows_redirect_without_leaking_token(tmp_path):
    root = tmp_path / "blobs"
    root.mkdir()
    handler = lambda *a, **kw: _Origin(*a, directory=str(root), **kw)  # noqa: E731
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    conf = (f"[store local]\nkind = fs\nroot = {root}\nserve = redirect\n"
            f"public_url = http://127.0.0.1:{origin.server_address[1]}\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        data = os.urandom(20_000)
        h = upload(srv, data)
        r = requests.get(f"{srv.url}/v1/blobs/{h}", allow_redirects=False, timeout=30)
        assert r.status_code == 307, (r.status_code, r.text)
        _Origin.seen.clear()
        out = tmp_path / "got.bin"
        p = run(srv.url, "--token", "s3cret", "get", "-o", out, h)
        assert p.returncode == 0, p.stderr
        assert out.read_bytes() == data
        assert _Origin.seen == [(f"/sha256/{h[0:2]}/{h[2:4]}/{h}", None)]
    finally:
        origin.shutdown()
        assert srv.stop() == 0


# ---------------------------------------------------------------------------------------------
# stat


def test_stat_prints_pretty_meta(server):
    data = b"hello stat"
    h = upload(server, data, content_type="text/plain")
    p = run(server.url, "stat", h)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    assert text.count("\n") > 3 and "\n  \"" in text  # indented, not one line
    meta = json.loads(text)
    assert meta["sha256"] == h and meta["size"] == len(data)
    assert meta["content_type"] == "text/plain" and meta["state"] == "live"
    assert meta == requests.get(f"{server.url}/v1/blobs/{h}/meta", timeout=30).json()


def test_stat_unknown(server):
    p = run(server.url, "stat", UNKNOWN)
    assert p.returncode == 1 and "not_found" in one_line_error(p)
    assert p.stdout == b""


# ---------------------------------------------------------------------------------------------
# lookup


def test_lookup_args_exit_codes_and_order(server):
    a, b = b"lookup a", b"lookup bb"
    ha, hb = upload(server, a), upload(server, b)
    p = run(server.url, "lookup", ha, "sha256:" + hb.upper())
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == f"found {ha} {len(a)}\nfound {hb} {len(b)}\n"
    p = run(server.url, "lookup", hb, UNKNOWN, ha, hb)
    assert p.returncode == 1, p.stderr
    assert p.stdout.decode().splitlines() == [
        f"found {hb} {len(b)}", f"missing {UNKNOWN}", f"found {ha} {len(a)}",
        f"found {hb} {len(b)}"]


def test_lookup_stdin(server):
    a = b"lookup stdin"
    ha = upload(server, a)
    text = f"{UNKNOWN}\n\n  {ha}  \r\nsha256:{ha}\n"
    p = run(server.url, "lookup", "-", input=text.encode())
    assert p.returncode == 1, p.stderr
    assert p.stdout.decode().splitlines() == [
        f"missing {UNKNOWN}", f"found {ha} {len(a)}", f"found {ha} {len(a)}"]
    p = run(server.url, "lookup", "-", input=f"{ha}\n".encode())
    assert p.returncode == 0 and p.stdout.decode() == f"found {ha} {len(a)}\n"
    p = run(server.url, "lookup", "-", input=b"")
    assert p.returncode == 0 and p.stdout == b""


def test_lookup_batches_of_10000(tmp_path):
    # The server refuses more than 10,000 hashes per request, so one big request would fail.
    conf = (f"[server]\nmax_lookup_hashes = 10000\n"
            f"[store local]\nkind = fs\nroot = {tmp_path / 'data' / 'blobs'}\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    relay = Relay(srv.port)
    try:
        too_many = {"hashes": [sha(str(i).encode()) for i in range(10001)]}
        r = requests.post(f"{srv.url}/v1/lookup", json=too_many, timeout=30)
        assert r.status_code == 413, r.text
        known = {}
        for i in (0, 9999, 10000, 24999):
            data = f"known {i}".encode()
            known[i] = (upload(srv, data), len(data))
        hashes = [known[i][0] if i in known else sha(f"unknown {i}".encode())
                  for i in range(25000)]
        p = run(relay.url, "lookup", "-", input="".join(h + "\n" for h in hashes).encode())
        assert p.returncode == 1, p.stderr
        lines = p.stdout.decode().splitlines()
        assert len(lines) == 25000
        for i, (h, line) in enumerate(zip(hashes, lines)):
            want = f"found {h} {known[i][1]}" if i in known else f"missing {h}"
            assert line == want, (i, line)
        assert relay.request_lines() == ["POST /v1/lookup HTTP/1.1"] * 3
        # Arguments are batched too.
        relay.reset()
        args = [known[0][0]] * 10001
        p = run(relay.url, "lookup", *args)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode() == f"found {known[0][0]} {known[0][1]}\n" * 10001
        assert relay.request_lines() == ["POST /v1/lookup HTTP/1.1"] * 2
    finally:
        relay.close()
        assert srv.stop() == 0


def test_lookup_invalid_stdin_line(server):
    p = run(server.url, "lookup", "-", input=f"{UNKNOWN}\nnot-a-hash\n".encode())
    assert p.returncode == 2
    assert "line 2" in one_line_error(p)


# ---------------------------------------------------------------------------------------------
# usage, local validation, help, environment, server down


@pytest.mark.parametrize("args", [
    [],
    ["frobnicate"],
    ["--bogus", "stat", UNKNOWN],
    ["put"],
    ["put", "-", "a"],  # several files take no standard input (put a b uploads both)
    ["put", "--nope", "x"],
    ["put", "--type", "", "x"],
    ["put", "--type", "a\r\nX-Evil: 1", "x"],
    ["put", "--type"],
    ["get"],
    ["get", UNKNOWN, UNKNOWN],
    ["get", "--range", "9-1", UNKNOWN],
    ["get", "--range", "a-b", UNKNOWN],
    ["get", "--range", ",".join(f"{i}-{i}" for i in range(65)), UNKNOWN],
    ["get", "-o", "", UNKNOWN],
    ["stat"],
    ["stat", UNKNOWN, UNKNOWN],
    ["lookup"],
    ["lookup", "-", UNKNOWN],
])
def test_usage_errors_exit_2_without_a_request(relay, args):
    p = run(relay.url, *args)
    assert p.returncode == 2, (args, p)
    assert p.stderr.strip(), args
    assert relay.total() == 0 and relay.sent == []


@pytest.mark.parametrize("args", [
    ["get", "abc"],
    ["get", UNKNOWN[:-1]],
    ["get", UNKNOWN + "0"],
    ["get", "g" + UNKNOWN[1:]],
    ["get", "md5:" + UNKNOWN],
    ["stat", "sha256:" + UNKNOWN[:10]],
    ["put", "--sha256", "xyz", "-"],
    ["lookup", UNKNOWN, "nothex"],
    ["lookup", "../../etc/passwd"],
])
def test_invalid_hash_rejected_locally(relay, args):
    p = run(relay.url, *args, input=b"data")
    assert p.returncode == 2, (args, p)
    assert "SHA-256" in one_line_error(p)
    assert relay.sent == []


@pytest.mark.parametrize("cmd,words", [
    ("put", ["--type", "--sha256", "100-continue", "Exit status"]),
    ("get", ["--range", "-o FILE", "Exit status"]),
    ("stat", ["meta", "Exit status"]),
    ("lookup", ["found HEX SIZE", "missing HEX", "1 at least one missing", "10000"]),
])
def test_help_per_command(cmd, words):
    p = run(None, cmd, "--help")
    assert p.returncode == 0 and p.stderr == b""
    text = p.stdout.decode()
    assert text.startswith(f"usage: blobref {cmd}")
    for w in words:
        assert w in text, (cmd, w)


def test_environment_server_and_token(server, relay):
    data = b"env server"
    h = upload(server, data)
    p = run(None, "lookup", h, env={"BLOBREF_SERVER": relay.url, "BLOBREF_TOKEN": "tok123"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == f"found {h} {len(data)}\n"
    relay.settle()
    assert b"\r\nauthorization: bearer tok123\r\n" in relay.heads[0].lower()
    # --server wins over the environment.
    p = run(server.url, "lookup", h, env={"BLOBREF_SERVER": "http://127.0.0.1:1"})
    assert p.returncode == 0, p.stderr


def test_server_down_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    f = tmp_path / "f"
    f.write_bytes(b"x")
    for args, rc in ((["put", f], 1), (["get", UNKNOWN], 1), (["stat", UNKNOWN], 1),
                     (["lookup", UNKNOWN], 3)):
        p = run(url, *args, input=b"x")
        assert p.returncode == rc, (args, p)
        line = one_line_error(p)
        assert "cannot reach" in line and url in line, line
    p = run("ftp://127.0.0.1:1", "stat", UNKNOWN)
    assert p.returncode == 1 and "http://" in one_line_error(p)


# ---------------------------------------------------------------------------------------------
# server-side limits reach the user as one clear line


@pytest.fixture
def small_server(tmp_path):
    conf = (f"[server]\nmax_blob_size = 1KiB\n"
            f"[store local]\nkind = fs\nroot = {tmp_path / 'data' / 'blobs'}\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    yield srv
    assert srv.stop() == 0


def test_put_file_over_max_blob_size(small_server, tmp_path):
    relay = Relay(small_server.port)
    try:
        f = tmp_path / "big.bin"
        f.write_bytes(os.urandom(3 * 1024 * 1024))
        t0 = time.time()
        p = run(relay.url, "put", f)
        assert p.returncode == 1, p
        line = one_line_error(p)
        assert "too_large" in line and "413" in line, line
        assert time.time() - t0 < 10
        # Content-Length + Expect: the server refuses before the body is sent.
        assert relay.total() < 64 * 1024
    finally:
        relay.close()


def test_put_stdin_over_max_blob_size(small_server):
    # A chunked body: the server only sees the size while reading; its 413 must still arrive.
    for n in (5000, 3 * 1024 * 1024):
        t0 = time.time()
        p = run(small_server.url, "put", "-", input=os.urandom(n), timeout=15)
        assert p.returncode == 1, p
        assert "too_large" in one_line_error(p)
        assert time.time() - t0 < 10


def test_token_new_section_authenticates(tmp_path):
    """The printed section, pasted into a config, makes the printed token work (and only it)."""
    p = run(None, "token", "new", "--scopes", "write,read", "--name", "pipeline")
    assert p.returncode == 0 and p.stderr == b"", p
    out = p.stdout.decode()
    token, blank, rest = out.split("\n", 2)
    assert token.startswith("br_") and len(token) == 67 and blank == ""
    assert int(token[3:], 16) >= 0
    assert f"sha256 = {sha(token.encode())}\n" in rest and "[token pipeline]\n" in rest
    assert "scopes = read, write\n" in rest
    again = run(None, "token", "new", "--scopes", "read").stdout.decode()
    assert again.split("\n")[0] != token  # random each time
    srv = Server(tmp_path / "data", config_text="[auth]\nanonymous = none\n" + rest).start()
    try:
        data = b"uploaded with a token from blobref token new"
        f = tmp_path / "blob"
        f.write_bytes(data)
        p = run(srv.url, "--token", token, "put", f)
        assert p.returncode == 0, p
        assert p.stdout.decode().strip() == sha(data)
        p = run(srv.url, "--token", token, "get", sha(data))
        assert p.returncode == 0 and p.stdout == data
        r = requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=30)
        assert r.status_code == 401
        r = requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=30,
                         headers={"Authorization": f"Bearer {token}x"})
        assert r.status_code == 401
    finally:
        assert srv.stop() == 0, srv.read_log()


@pytest.mark.parametrize("args", [["token"], ["token", "new"], ["token", "old"],
                                  ["token", "new", "--scopes", "everything"],
                                  ["token", "new", "--scopes", "read", "--name", "a b"],
                                  ["token", "new", "--scopes", "read", "extra"]])
def test_token_usage_errors(args):
    p = run(None, *args)
    assert p.returncode == 2 and p.stdout == b"", p
    one_line_error(p)
