"""Helpers for the s3/http store tests: configs for a blobrefd over radosgw, a server that may start
unready, bucket checks (content keys, staging objects, incomplete multipart uploads), and a TCP
forwarder to radosgw that counts or throttles what passes."""
import os
import socket
import subprocess
import threading
import time

import requests

from conftest import BIN_DIR, Server
from util_http import object_key


def s3_store_conf(rgw, bucket, name="lake", secret_key=None, **keys):
    """A [store NAME] section of kind s3 over rgw (path style, tester's keys); keys add or
    override (serve=proxy by default, like the fs store)."""
    kv = {"kind": "s3", "endpoint": rgw.endpoint, "region": rgw.region, "bucket": bucket,
          "path_style": "true", "access_key": rgw.access_key,
          "secret_key": secret_key or rgw.secret_key, "serve": "proxy"}
    kv.update({k: v for k, v in keys.items() if v is not None})
    return f"[store {name}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())


def s3_conf(rgw, bucket, server="", **keys):
    """A whole config whose only (hence upload) store is s3 bucket `bucket`."""
    return "[server]\n" + server + "\n" + s3_store_conf(rgw, bucket, **keys)


class LazyServer(Server):
    """A Server that can also be started without waiting for /readyz 200 (a store that fails its
    health check keeps it at 503)."""

    def start_unready(self, timeout=20):
        args = [str(BIN_DIR / "blobrefd"), "--listen", f"127.0.0.1:{self.port}",
                "--data", str(self.data_dir)]
        conf = self.data_dir / "blobref.conf"
        conf.write_text(self.config_text)
        args += ["-c", str(conf)]
        env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"blobrefd exited {self.proc.returncode}:\n{self.read_log()}")
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("blobrefd did not start:\n" + self.read_log())


def stop_checked(srv):
    alive = srv.alive()
    rc = srv.stop()
    assert alive, "blobrefd died during the test:\n" + srv.read_log()
    assert rc == 0, f"blobrefd exited {rc} on SIGTERM:\n" + srv.read_log()


def keys(s3, bucket, prefix=""):
    """Every object key in the bucket (under prefix) -> size."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def multipart_uploads(s3, bucket):
    return [(u["Key"], u["UploadId"]) for u in
            s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def head_size(s3, bucket, key):
    """The object's size, or None when it does not exist."""
    from botocore.exceptions import ClientError
    try:
        return s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    except ClientError as e:
        if e.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return None
        raise


def get_bytes(s3, bucket, key):
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def assert_clean_bucket(s3, bucket, prefix=""):
    """Only content-addressed objects in the bucket, and no incomplete multipart upload."""
    assert multipart_uploads(s3, bucket) == []
    bad = [k for k in keys(s3, bucket) if ".staging/" in k or not k.startswith(prefix + "sha256/")]
    assert bad == [], bad


def content_key(h, prefix=""):
    return object_key(h, prefix)


class Forwarder:
    """A TCP forwarder to radosgw (SigV4 signs the Host header as sent, so a plain byte pipe in
    between changes nothing). `down` counts the bytes radosgw sends back; `rate`, when set, holds
    the bytes towards radosgw to at most that many per second per connection (a slow uplink) and
    may be changed (None: unthrottled) while it runs. `stall(pred)` holds every request whose
    first packet (request line and headers) pred accepts until `release()` (each counted in
    `stalled`)."""

    def __init__(self, target_port, rate=None, count=()):
        self.rate = rate
        self.down = 0
        self.stall_pred = None
        self.stalled = 0
        self.go = threading.Event()
        self.go.set()
        # how often each of the byte strings in count went towards radosgw (e.g. b"POST /b?delete")
        self.hits = {pat: 0 for pat in count}
        self.lock = threading.Lock()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.target = ("127.0.0.1", target_port)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, False), daemon=True).start()

    def _pipe(self, src, dst, upward):
        keep = max((len(p) for p in self.hits), default=1) - 1
        tail = b""
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                if upward and self.stall_pred and self.stall_pred(d):
                    with self.lock:
                        self.stalled += 1
                    self.go.wait(60)  # bounded: a test that forgets to release still ends
                if upward and self.hits:
                    seen = tail + d  # tail is shorter than any pattern: nothing counted twice
                    with self.lock:
                        for pat in self.hits:
                            self.hits[pat] += seen.count(pat)
                    tail = seen[len(seen) - keep:] if keep else b""
                if not upward:
                    with self.lock:
                        self.down += len(d)
                dst.sendall(d)
                rate = self.rate
                if upward and rate:
                    time.sleep(len(d) / rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stall(self, pred):
        """From now on holds each request whose first packet pred(bytes) accepts."""
        self.stall_pred = pred
        self.go.clear()

    def release(self):
        self.go.set()
        self.stall_pred = None

    def close(self):
        self.release()
        self.lsock.close()
