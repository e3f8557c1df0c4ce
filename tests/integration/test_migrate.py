"""blobref migrate: every blob moves (copy, verify, switch, drain) while readers see no failed
read, fs -> fs and back (proxied reads, and redirects to a web server over the target store),
fs -> S3 and back on radosgw (presigned redirects); SIGKILL at random points, then a rerun,
leaves every blob at the target, verified. The moves run as a job in the server (core/jobs.c):
the CLI only starts and follows it."""
import functools
import hashlib
import http.server
import os
import random
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

from conftest import BIN_DIR, Server


class FileServer:
    """A static web server over a directory (the public_url of a redirecting fs store)."""

    def __init__(self, root):
        root.mkdir(parents=True, exist_ok=True)
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def config(tmp_path, web_url, extra_stores=""):
    return f"""[server]
upload_store = a
drain_grace = 2s
cache_size = 0

[store a]
kind = fs
root = {tmp_path / 'a'}
serve = proxy

[store b]
kind = fs
root = {tmp_path / 'b'}
serve = redirect
public_url = {web_url}
{extra_stores}"""


def upload_many(srv, n, seed):
    rnd = random.Random(seed)
    blobs = {}
    for i in range(n):
        data = rnd.randbytes(rnd.choice([100, 5000, 70_000, 300_000])) + i.to_bytes(4, "big")
        h = hashlib.sha256(data).hexdigest()
        r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data)
        assert r.status_code in (200, 201), r.text
        blobs[h] = data
    return blobs


def run_migrate(srv, conf, src, dst, *extra, check=True, timeout=300):
    args = [str(BIN_DIR / "blobref"), "--server", srv.url, "migrate", "-c", str(conf),
            "--from", src, "--to", dst, *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def primaries(srv):
    out, after = {}, ""
    while True:
        j = requests.get(f"{srv.url}/v1/blobs", params={"after": after, "limit": 500}).json()
        for b in j["blobs"]:
            out[b["sha256"]] = [l["store"] for l in b["locations"] if l["role"] == "primary"][0]
        if j["next"] is None:
            return out
        after = j["next"]


class Readers:
    """Threads that GET every blob over and over (following redirects) and check the bytes."""

    def __init__(self, srv, blobs, n=4):
        self.srv, self.blobs = srv, blobs
        self.stop = threading.Event()
        self.reads = 0
        self.failures = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def loop(self, i):
        s = requests.Session()
        hashes = list(self.blobs)
        random.Random(i).shuffle(hashes)
        while not self.stop.is_set():
            for h in hashes:
                if self.stop.is_set():
                    break
                try:
                    r = s.get(f"{self.srv.url}/v1/blobs/{h}", timeout=30)
                    ok = r.status_code == 200 and r.content == self.blobs[h]
                    why = f"{r.status_code} {r.url} {r.text[:200] if r.status_code != 200 else 'bytes differ'}"
                except requests.RequestException as e:
                    ok, why = False, repr(e)
                with self.lock:
                    self.reads += 1
                    if not ok:
                        self.failures.append(f"{h}: {why}")

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        return self.reads, self.failures


def test_migrate_under_reads_fs_and_back(tmp_path):
    web = FileServer(tmp_path / "b")
    srv = Server(tmp_path / "data", config(tmp_path, web.url)).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        blobs = upload_many(srv, 120, 1)
        readers = Readers(srv, blobs)
        time.sleep(0.5)
        r = run_migrate(srv, conf, "a", "b", "--dry-run")
        assert "120 blobs" in r.stdout and "would move" in r.stdout, r.stdout
        assert set(primaries(srv).values()) == {"a"}
        r = run_migrate(srv, conf, "a", "b", "--concurrency", "8")
        assert "moved 120 of 120" in r.stdout, r.stdout
        assert "verify" in r.stdout and "switch" in r.stdout
        # plain lines in a pipe, no carriage returns
        assert "\r" not in r.stderr
        assert set(primaries(srv).values()) == {"b"}
        time.sleep(3)  # old copies in a drain while reads go on (redirects to b's web server)
        r = run_migrate(srv, conf, "a", "b")
        assert "moved 0 of 0" in r.stdout and "120 already in b" in r.stdout, r.stdout
        r = run_migrate(srv, conf, "b", "a", "--verify", "size", "--rate", "50")
        assert "moved 120 of 120" in r.stdout, r.stdout
        time.sleep(3)
        reads, failures = readers.finish()
        assert reads > 500, reads
        assert failures == [], failures[:5]
        # drained: b holds no blob any more, a holds each once
        deadline = time.time() + 20
        while time.time() < deadline:
            left = [p for p in (tmp_path / "b" / "sha256").rglob("*") if p.is_file()]
            if not left:
                break
            time.sleep(0.2)
        assert left == [], left[:5]
        for h, data in blobs.items():
            assert (tmp_path / "a" / "sha256" / h[:2] / h[2:4] / h).read_bytes() == data
    finally:
        readers.stop.set()
        rc = srv.stop()
        web.close()
    assert rc == 0, srv.read_log()


def test_migrate_sigkill_and_rerun(tmp_path):
    web = FileServer(tmp_path / "b")
    srv = Server(tmp_path / "data", config(tmp_path, web.url)).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        blobs = upload_many(srv, 150, 2)
        readers = Readers(srv, blobs, n=2)
        rnd = random.Random(7)
        args = [str(BIN_DIR / "blobref"), "--server", srv.url, "migrate", "-c", str(conf),
                "--from", "a", "--to", "b", "--concurrency", "4", "--rate", "2"]
        # six killed runs, more (up to 20) while none has switched a blob yet: on a loaded
        # machine (parallel workers, ASan) a run can die before its first switch every time
        for run in range(20):
            p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rnd.uniform(0.05, 0.6) + 0.1 * max(0, run - 5))
            p.send_signal(signal.SIGKILL)
            p.wait()
            moved_before = sum(1 for s in primaries(srv).values() if s == "b")
            if run >= 5 and moved_before > 0:
                break
        assert moved_before < 150, moved_before
        # the job lives in the server: killing its follower does not stop it, and a rerun
        # follows the job in flight to its end (or starts one for what is left)
        r = run_migrate(srv, conf, "a", "b")
        m = re.search(r"moved (\d+) of (\d+) .*; (\d+) already in b", r.stdout)
        assert m and int(m[1]) == int(m[2]) and int(m[2]) + int(m[3]) == 150, r.stdout
        assert set(primaries(srv).values()) == {"b"}
        reads, failures = readers.finish()
        assert failures == [], failures[:5]
        for h, data in blobs.items():
            assert (tmp_path / "b" / "sha256" / h[:2] / h[2:4] / h).read_bytes() == data
            g = requests.get(f"{srv.url}/v1/blobs/{h}")
            assert g.status_code == 200 and hashlib.sha256(g.content).hexdigest() == h
    finally:
        readers.stop.set()
        rc = srv.stop()
        web.close()
    assert rc == 0, srv.read_log()


def test_migrate_fs_to_s3_and_back(tmp_path, rgw):
    bucket = rgw.make_bucket("migrate-fs-s3")
    web = FileServer(tmp_path / "b")
    s3 = f"""
[store c]
kind = s3
endpoint = {rgw.endpoint}
region = {rgw.region}
bucket = {bucket}
path_style = true
access_key = {rgw.access_key}
secret_key = {rgw.secret_key}
serve = redirect
"""
    srv = Server(tmp_path / "data", config(tmp_path, web.url, s3)).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        blobs = upload_many(srv, 60, 3)
        readers = Readers(srv, blobs, n=3)
        # a part verified by size (HEAD), the rest by reading the copies back from S3
        r = run_migrate(srv, conf, "a", "c", "--verify", "size", "--limit", "25")
        assert "moved 25 of 25" in r.stdout, r.stdout + r.stderr
        r = run_migrate(srv, conf, "a", "c", "--concurrency", "8")
        assert "moved 35 of 35" in r.stdout and "25 already in c" in r.stdout, r.stdout
        assert set(primaries(srv).values()) == {"c"}
        time.sleep(2.5)
        r = run_migrate(srv, conf, "c", "a", "--concurrency", "8")
        assert "moved 60 of 60" in r.stdout, r.stdout + r.stderr
        time.sleep(3)
        reads, failures = readers.finish()
        assert reads > 200, reads
        assert failures == [], failures[:5]
        deadline = time.time() + 20
        while time.time() < deadline:
            objs = rgw.client().list_objects_v2(Bucket=bucket).get("Contents", [])
            if not objs:
                break
            time.sleep(0.2)
        assert objs == [], [o["Key"] for o in objs][:5]
    finally:
        readers.stop.set()
        rc = srv.stop()
        web.close()
    assert rc == 0, srv.read_log()


def test_migrate_moves_quarantined_blobs_too(tmp_path):
    web = FileServer(tmp_path / "b")
    srv = Server(tmp_path / "data", config(tmp_path, web.url)).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        blobs = upload_many(srv, 5, 4)
        held = sorted(blobs)[0]
        assert requests.delete(f"{srv.url}/v1/blobs/{held}").status_code == 200
        r = run_migrate(srv, conf, "a", "b", "--limit", "3")
        assert "moved 3 of 3" in r.stdout, r.stdout
        r = run_migrate(srv, conf, "a", "b")
        assert "moved 2 of 2" in r.stdout and "3 already in b" in r.stdout, r.stdout
        assert set(primaries(srv).values()) == {"b"}
        assert requests.get(f"{srv.url}/v1/blobs/{held}").status_code == 410
        assert requests.post(f"{srv.url}/v1/blobs/{held}/restore").status_code == 200
        g = requests.get(f"{srv.url}/v1/blobs/{held}")
        assert g.status_code == 200 and g.content == blobs[held]
    finally:
        rc = srv.stop()
        web.close()
    assert rc == 0, srv.read_log()
