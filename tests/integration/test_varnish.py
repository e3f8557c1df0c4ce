"""A real CDN in front of blobrefd: Varnish running conf/varnish/blobref.vcl (its backend pointed
at the test's blobrefd). Proves what the VCL documents: a blob is fetched from blobrefd once and
then served from the cache (ranges and 304 included), error answers and redirects are not kept,
anonymous reads work while writes need a token, and PURGE/BAN from trusted addresses drop a blob
(the building block of purge-on-quarantine). conf/nginx-cdn.conf is checked with `nginx -t`."""
import hashlib
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time

import pytest
import requests

from conftest import ROOT, Server, free_port

VCL = ROOT / "conf" / "varnish" / "blobref.vcl"
NGINX_CONF = ROOT / "conf" / "nginx-cdn.conf"
T = 30


def sha(b):
    return hashlib.sha256(b).hexdigest()


class Varnish:
    """varnishd -F on a free loopback port with conf/varnish/blobref.vcl, backend = origin."""

    def __init__(self, workdir, origin):
        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.origin = origin
        self.proc = None

    def vcl_text(self):
        text = VCL.read_text()
        backend = re.search(r"backend blobrefd \{.*?\n\}", text, re.S)
        assert backend, "conf/varnish/blobref.vcl has no `backend blobrefd { ... }`"
        b = re.sub(r'\.host = "[^"]*";', '.host = "127.0.0.1";', backend.group(0))
        b = re.sub(r'\.port = "[^"]*";', f'.port = "{self.origin.port}";', b)
        return text[:backend.start()] + b + text[backend.end():]

    def start(self, timeout=60):
        """Starts varnishd; when another test process bound its free port first, again on another
        free port (self.port and self.url change), up to 5 times."""
        for _ in range(5):
            log_start = len(self.read_log()) if (self.dir / "varnishd.log").exists() else 0
            try:
                return self._start_once(timeout)
            except RuntimeError:
                if self.proc is None or "Address already in use" not in self.read_log()[log_start:]:
                    raise
                self.proc = None
                self.log.close()
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        return self._start_once(timeout)

    def _start_once(self, timeout):
        vcl = self.dir / "blobref.vcl"
        vcl.write_text(self.vcl_text())
        self.log = open(self.dir / "varnishd.log", "ab")
        # -j none: no privilege separation (as root it would run the compiler as another user,
        # who cannot read pytest's private temp directories)
        self.proc = subprocess.Popen(
            ["varnishd", "-F", "-j", "none", "-a", f"127.0.0.1:{self.port}", "-f", str(vcl),
             "-n", str(self.dir / "n"), "-s", "malloc,64m", "-T", "127.0.0.1:0",
             "-p", "thread_pools=1", "-p", "thread_pool_min=10", "-p", "ban_lurker_sleep=0.01"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"varnishd exited {self.proc.returncode}:\n{self.read_log()}")
            try:
                if requests.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("varnishd did not start:\n" + self.read_log())

    def read_log(self):
        return (self.dir / "varnishd.log").read_text(errors="replace")

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.log.close()


def need_varnish():
    if shutil.which("varnishd") is None and not os.path.exists("/usr/sbin/varnishd"):
        pytest.skip("varnishd is not installed (tools/install-deps.sh test installs it)")
    if shutil.which("varnishd") is None:
        os.environ["PATH"] += ":/usr/sbin"


@pytest.fixture
def varnish_for(tmp_path):
    """varnish_for(origin) -> a Varnish in front of that blobrefd, stopped after the test."""
    need_varnish()
    started = []

    def start(origin):
        v = Varnish(tmp_path / f"varnish{len(started)}", origin).start()
        started.append(v)
        return v

    yield start
    for v in started:
        alive = v.proc is not None and v.proc.poll() is None
        v.stop()
        assert alive, "varnishd died during the test:\n" + v.read_log()


@pytest.fixture
def cdn(server, varnish_for):
    """(blobrefd on its default config, Varnish in front of it)."""
    return server, varnish_for(server)


def origin_gets(srv):
    """GET/HEAD requests of /v1/blobs/{hash} blobrefd has answered (any status)."""
    text = requests.get(srv.url + "/metrics", timeout=T).text
    n = 0
    for line in text.splitlines():
        if line.startswith('blobref_http_requests_total{route="/v1/blobs/{hash}",method="GET"'):
            n += int(float(line.rsplit(" ", 1)[1]))
    return n


def expect_origin_gets(srv, n, timeout=5.0):
    """Waits (a miss's request is counted when blobrefd finished sending it) until blobrefd has
    answered n blob GETs, then checks it stays there a moment."""
    deadline = time.time() + timeout
    while origin_gets(srv) < n and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)
    got = origin_gets(srv)
    assert got == n, f"blobrefd answered {got} blob GETs, expected {n}"


def upload(srv, data, token=None):
    h = sha(data)
    hd = {"Authorization": f"Bearer {token}"} if token else {}
    r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, headers=hd, timeout=T)
    assert r.status_code in (200, 201), r.text
    return h


def raw_request(port, method, path, source="127.0.0.1"):
    """(status, body) of one request sent from the loopback address `source`."""
    with socket.create_connection(("127.0.0.1", port), timeout=T,
                                  source_address=(source, 0)) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_blob_fetched_once_then_served_from_cache(cdn):
    srv, edge = cdn
    data = os.urandom(300_000)
    h = upload(srv, data)
    base = origin_gets(srv)
    r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)
    assert r.status_code == 200 and r.content == data and r.headers["X-Cache"] == "MISS"
    assert r.headers["ETag"] == f'"{h}"'
    assert r.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    expect_origin_gets(srv, base + 1)
    for _ in range(5):
        r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)
        assert r.status_code == 200 and r.content == data and r.headers["X-Cache"] == "HIT"
    r = requests.head(f"{edge.url}/v1/blobs/{h}", timeout=T)
    assert r.status_code == 200 and r.headers["Content-Length"] == str(len(data))
    # the alias, a query string and another Host are the same object
    r = requests.get(f"{edge.url}/v1/blobs/sha256:{h}?x=1", headers={"Host": "cdn.example"},
                     timeout=T)
    assert r.status_code == 200 and r.content == data and r.headers["X-Cache"] == "HIT"
    expect_origin_gets(srv, base + 1)
    # a HEAD first also fills the cache with one origin GET
    other = os.urandom(5000)
    h2 = upload(srv, other)
    r = requests.head(f"{edge.url}/v1/blobs/{h2}", timeout=T)
    assert r.status_code == 200 and r.headers["Content-Length"] == "5000"
    assert requests.get(f"{edge.url}/v1/blobs/{h2}", timeout=T).content == other
    expect_origin_gets(srv, base + 2)


def test_ranges_are_served_from_the_cached_object(cdn):
    srv, edge = cdn
    data = os.urandom(1_000_000)
    h = upload(srv, data)
    base = origin_gets(srv)
    r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"Range": "bytes=100-199"}, timeout=T)
    assert r.status_code == 206 and r.content == data[100:200]
    assert r.headers["Content-Range"] == "bytes 100-199/1000000"
    expect_origin_gets(srv, base + 1)   # the miss fetched the whole blob...
    for rng, want, cr in (("bytes=500000-500009", data[500000:500010], "bytes 500000-500009/1000000"),
                          ("bytes=-10", data[-10:], "bytes 999990-999999/1000000"),
                          ("bytes=999000-", data[999000:], "bytes 999000-999999/1000000")):
        r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"Range": rng}, timeout=T)
        assert r.status_code == 206 and r.content == want, (rng, r.status_code)
        assert r.headers["Content-Range"] == cr and r.headers["X-Cache"] == "HIT"
    r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"Range": "bytes=2000000-"}, timeout=T)
    assert r.status_code == 416
    r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)
    assert r.status_code == 200 and r.content == data
    expect_origin_gets(srv, base + 1)   # ...and every range after it came from the cache


def test_if_none_match_gets_304(cdn):
    srv, edge = cdn
    data = os.urandom(20_000)
    h = upload(srv, data)
    base = origin_gets(srv)
    r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"If-None-Match": f'"{h}"'}, timeout=T)
    assert r.status_code == 304 and r.content == b"" and r.headers["ETag"] == f'"{h}"'
    r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"If-None-Match": f'"{h}"'}, timeout=T)
    assert r.status_code == 304 and r.headers["X-Cache"] == "HIT"
    r = requests.get(f"{edge.url}/v1/blobs/{h}", headers={"If-None-Match": '"other"'}, timeout=T)
    assert r.status_code == 200 and r.content == data
    expect_origin_gets(srv, base + 1)


def test_a_404_is_not_cached(cdn):
    srv, edge = cdn
    data = os.urandom(4000)
    h = sha(data)
    for _ in range(2):
        r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert r.headers["Cache-Control"] == "no-store"
    upload(srv, data)
    r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)   # at once, no waiting
    assert r.status_code == 200 and r.content == data
    r = requests.get(f"{edge.url}/v1/blobs/{'0' * 63}", timeout=T)   # not a blob URL: passed
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_hash"


def test_redirects_are_not_cached_beyond_their_max_age(tmp_path, varnish_for):
    conf = (f"[server]\ncache_max_age = 2s\n[store local]\nkind = fs\n"
            f"root = {tmp_path / 'data' / 'blobs'}\nserve = redirect\n"
            f"public_url = http://files.example/blobs/\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        edge = varnish_for(srv)
        h = upload(srv, b"redirected")
        base = origin_gets(srv)
        url = f"{edge.url}/v1/blobs/{h}"
        r = requests.get(url, allow_redirects=False, timeout=T)
        assert r.status_code == 307 and r.headers["Location"].startswith("http://files.example/blobs/")
        assert r.headers["Cache-Control"] == "private, max-age=2"
        expect_origin_gets(srv, base + 1)
        # private: a shared cache keeps none of it, so within max-age blobrefd is asked again...
        r = requests.get(url, allow_redirects=False, timeout=T)
        assert r.status_code == 307 and r.headers["X-Cache"] == "MISS"
        expect_origin_gets(srv, base + 2)
        time.sleep(3)   # ...and after it, certainly
        r = requests.get(url, allow_redirects=False, timeout=T)
        assert r.status_code == 307
        expect_origin_gets(srv, base + 3)
    finally:
        assert srv.stop() == 0


def test_anonymous_reads_while_writes_need_a_token(tmp_path, varnish_for):
    token = "br_" + "5a" * 32
    conf = (f"[auth]\nanonymous = read\n"
            f"[token writer]\nsha256 = {sha(token.encode())}\nscopes = write\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        edge = varnish_for(srv)
        data = os.urandom(10_000)
        h = sha(data)
        r = requests.put(f"{edge.url}/v1/blobs/{h}", data=data, timeout=T)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = requests.post(f"{edge.url}/v1/blobs", data=data, timeout=T)
        assert r.status_code == 401
        r = requests.put(f"{edge.url}/v1/blobs/{h}", data=data,
                         headers={"Authorization": f"Bearer {token}"}, timeout=T)
        assert r.status_code == 201, r.text
        base = origin_gets(srv)
        for _ in range(3):
            r = requests.get(f"{edge.url}/v1/blobs/{h}", timeout=T)
            assert r.status_code == 200 and r.content == data
        expect_origin_gets(srv, base + 1)
        # a request with a token is never answered from the cache (nor stored)
        r = requests.get(f"{edge.url}/v1/blobs/{h}",
                         headers={"Authorization": f"Bearer {token}"}, timeout=T)
        assert r.status_code == 200 and r.content == data
        expect_origin_gets(srv, base + 2)
        r = requests.get(f"{edge.url}/v1/blobs/{h}",
                         headers={"Authorization": "Bearer br_" + "00" * 32}, timeout=T)
        assert r.status_code == 401
        expect_origin_gets(srv, base + 3)
    finally:
        assert srv.stop() == 0


def test_purge_and_ban_drop_a_cached_blob(cdn):
    srv, edge = cdn
    data = os.urandom(8000)
    h = upload(srv, data)
    base = origin_gets(srv)
    path = f"/v1/blobs/{h}"
    assert requests.get(edge.url + path, timeout=T).content == data
    assert requests.get(edge.url + path, timeout=T).headers["X-Cache"] == "HIT"
    expect_origin_gets(srv, base + 1)
    # not from a trusted address: refused, the object stays
    assert raw_request(edge.port, "PURGE", path, source="127.0.0.2")[0] == 403
    assert raw_request(edge.port, "BAN", path, source="127.0.0.2")[0] == 403
    assert requests.get(edge.url + path, timeout=T).headers["X-Cache"] == "HIT"
    assert raw_request(edge.port, "PURGE", "/v1/lookup")[0] == 400
    # PURGE: the next GET goes to blobrefd
    assert raw_request(edge.port, "PURGE", path)[0] == 200
    r = requests.get(edge.url + path, timeout=T)
    assert r.content == data and r.headers["X-Cache"] == "MISS"
    expect_origin_gets(srv, base + 2)
    assert requests.get(edge.url + path, timeout=T).headers["X-Cache"] == "HIT"
    # the alias spelling purges the same object
    assert raw_request(edge.port, "PURGE", f"/v1/blobs/sha256:{h}")[0] == 200
    assert requests.get(edge.url + path, timeout=T).headers["X-Cache"] == "MISS"
    expect_origin_gets(srv, base + 3)
    # BAN: same effect
    assert raw_request(edge.port, "BAN", path)[0] == 200
    r = requests.get(edge.url + path, timeout=T)
    assert r.content == data and r.headers["X-Cache"] == "MISS"
    expect_origin_gets(srv, base + 4)


def test_quarantine_then_purge_answers_410_at_the_edge(cdn):
    """What purge-on-quarantine will do: until the purge, the edge still serves the cached bytes;
    after it, the edge asks blobrefd, whose 410 (no-store) is not kept either."""
    srv, edge = cdn
    data = os.urandom(6000)
    h = upload(srv, data)
    path = f"/v1/blobs/{h}"
    assert requests.get(edge.url + path, timeout=T).status_code == 200
    r = requests.delete(f"{srv.url}{path}?reason=test", timeout=T)
    assert r.status_code == 200, r.text
    assert requests.get(edge.url + path, timeout=T).status_code == 200   # stale at the edge
    assert raw_request(edge.port, "PURGE", path)[0] == 200
    for _ in range(2):
        r = requests.get(edge.url + path, timeout=T)
        assert r.status_code == 410 and r.json()["error"]["code"] == "quarantined"
    assert requests.post(f"{srv.url}{path}/restore", timeout=T).status_code == 200
    r = requests.get(edge.url + path, timeout=T)
    assert r.status_code == 200 and r.content == data


def test_nginx_cdn_example_parses(tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        pytest.skip("nginx is not installed (tools/install-deps.sh bench installs nginx-light)")
    text = NGINX_CONF.read_text().replace("/var/cache/nginx/blobref", str(tmp_path / "cache"))
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    p = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf),
                        "-g", f"pid {tmp_path}/nginx.pid; error_log stderr;"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_python_client_reads_through_the_edge(cdn):
    """tools/python/blobref.py pointed at Varnish: ranged open() and verified get() are served
    from the cached object after one origin fetch."""
    import sys
    sys.path.insert(0, str(ROOT / "tools" / "python"))
    import blobref
    srv, edge = cdn
    data = os.urandom(500_000)
    h = upload(srv, data)
    base = origin_gets(srv)
    c = blobref.Client(edge.url)
    with c.open(h, buffer_size=4096) as f:
        assert f.size == len(data) and f.bytes_fetched == 4096
        f.seek(300_000)
        assert f.read(1000) == data[300_000:301_000]
    assert c.get(h) == data
    assert c.fetch_many([h, h]) == {h: data}
    expect_origin_gets(srv, base + 1)
    with pytest.raises(blobref.NotFound):
        c.get(sha(b"not there"))


def test_quarantine_purges_the_edge_by_itself(tmp_path):
    """[cdn edge] purge_url points at Varnish: a blob cached at the edge answers 410 there right
    after an admin quarantines it (the server sends the PURGE), and reads again after restore."""
    need_varnish()
    srv = Server(tmp_path / "data")
    edge = Varnish(tmp_path / "varnish", srv)
    srv.config_text = (f"[cdn edge]\npurge_url = http://127.0.0.1:{edge.port}/v1/blobs/{{hash}}\n"
                       "method = PURGE\n[reconcile]\ninterval = 0\n")
    srv.start()
    try:
        edge.start()
        data = os.urandom(7000)
        h = upload(srv, data)
        path = f"/v1/blobs/{h}"
        assert requests.get(edge.url + path, timeout=T).status_code == 200
        assert requests.get(edge.url + path, timeout=T).status_code == 200   # from the cache
        r = requests.delete(f"{srv.url}{path}?reason=test", timeout=T)
        assert r.status_code == 200, r.text
        codes = []
        deadline = time.time() + 5
        while time.time() < deadline:
            codes.append(requests.get(edge.url + path, timeout=T).status_code)
            if codes[-1] == 410:
                break
            time.sleep(0.05)
        assert codes[-1] == 410, codes
        print(f"edge answers after the quarantine: {codes}")
        # counted once the purge is settled in the index, a commit after the edge's answer
        deadline = time.time() + 5
        while True:
            m = requests.get(srv.url + "/metrics", timeout=T).text
            done = ('blobref_cdn_purges_total{result="sent"} 1' in m
                    and "blobref_cdn_purges_pending 0" in m)
            if done or time.time() > deadline:
                break
            time.sleep(0.02)
        assert 'blobref_cdn_purges_total{result="sent"} 1' in m, m
        assert "blobref_cdn_purges_pending 0" in m, m
        assert requests.post(f"{srv.url}{path}/restore", timeout=T).status_code == 200
        r = requests.get(edge.url + path, timeout=T)
        assert r.status_code == 200 and r.content == data
    finally:
        edge.stop()
        assert srv.stop() == 0, srv.read_log()
