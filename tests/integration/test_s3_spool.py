"""The S3 upload spool is bounded: an upload whose parts S3 takes slower than the client sends
is paused at two unsent parts (its client waits, nothing is lost), a store whose spool reached
spool_max refuses new uploads with 503 spool_full (JSON, Retry-After), and blobref_spool_bytes
shows the bytes waiting. S3 is radosgw behind a forwarder that throttles what is sent to it."""
import re
import socket
import threading
import time

import pytest
import requests

from s3util import LazyServer, s3_conf, stop_checked
from util_http import TIMEOUT, assert_error, sha, wait_until

MiB = 1 << 20
PART = 5 * MiB


class ThrottledForwarder:
    """A TCP forwarder to radosgw: bytes towards radosgw at most `rate` bytes/s per connection
    (None: unthrottled), its answers as they come (a slow uplink to S3)."""

    def __init__(self, target_port, rate):
        self.rate = rate
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

    def _pipe(self, src, dst, throttle):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                dst.sendall(d)
                rate = self.rate
                if throttle and rate:
                    time.sleep(len(d) / rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.lsock.close()


@pytest.fixture
def slow_lake(rgw, tmp_path, request):
    """Factory: slow_lake(**store_keys) -> (server, forwarder) over a fresh bucket behind a
    forwarder throttled to 1 MiB/s."""
    made = []

    def make(**store_keys):
        bucket = "spool-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
        rgw.make_bucket(bucket)
        fwd = ThrottledForwarder(int(rgw.endpoint.rsplit(":", 1)[1]), rate=1 * MiB)
        srv = LazyServer(tmp_path / "data", config_text=s3_conf(
            rgw, bucket, endpoint=f"http://127.0.0.1:{fwd.port}", part_size="5MiB",
            stall_timeout="60s", **store_keys))
        made.append((srv, fwd))
        return srv.start(), fwd

    yield make
    for srv, fwd in made:
        fwd.rate = None
        if srv.proc is not None:
            stop_checked(srv)
        fwd.close()


def spool_disk_bytes(srv):
    """Disk blocks held by the spool files (sent parts are punched out of them)."""
    total = 0
    for p in (srv.data_dir / "spool" / "lake").iterdir():
        try:
            total += p.stat().st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def spool_metric(srv):
    """blobref_spool_bytes, or None when /metrics has no such line."""
    text = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(r"^blobref_spool_bytes (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def start_upload(srv, data, results):
    def run():
        try:
            results.append(requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, timeout=300))
        except requests.RequestException as e:
            results.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def blob(n, seed):
    import random
    return random.Random(seed).randbytes(n)


def test_uploads_pause_at_two_unsent_parts(slow_lake):
    """Defaults: three 40 MiB uploads into an S3 taking 1 MiB/s hold about two parts each in the
    spool (120 MiB before), and all three complete once S3 catches up."""
    srv, fwd = slow_lake()
    blobs = [blob(40 * MiB, i) for i in range(3)]
    results = []
    threads = [start_upload(srv, b, results) for b in blobs]
    # all three reach their bound (two parts less 1 MiB of slack) ...
    assert wait_until(lambda: spool_disk_bytes(srv) >= 3 * (2 * PART - MiB), timeout=60,
                      step=0.1), spool_disk_bytes(srv)
    # ... and stay there while S3 crawls (before: the spool took the whole 120 MiB in seconds)
    peak_disk, metrics = 0, []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        peak_disk = max(peak_disk, spool_disk_bytes(srv))
        metrics.append(spool_metric(srv))
        time.sleep(0.1)
    assert peak_disk <= 3 * (2 * PART + MiB), peak_disk
    assert None not in metrics and 3 * (2 * PART - MiB) <= max(metrics) <= 3 * (2 * PART + MiB), \
        metrics
    fwd.rate = None  # S3 catches up: every paused upload goes on
    for t in threads:
        t.join(timeout=240)
    assert len(results) == 3, results
    assert all(isinstance(r, requests.Response) and r.status_code == 201 for r in results), \
        [getattr(r, "text", r) for r in results]
    for b in blobs:
        m = requests.get(f"{srv.url}/v1/blobs/{sha(b)}/meta", timeout=TIMEOUT)
        assert m.status_code == 200 and m.json()["size"] == len(b)
    assert wait_until(lambda: spool_metric(srv) == 0 and spool_disk_bytes(srv) == 0, timeout=10)


def test_full_spool_refuses_new_uploads(slow_lake):
    """spool_max = two parts: one paused upload fills it; the next upload is refused at once with
    503 spool_full, a JSON body and Retry-After, keeps nothing, and is taken once S3 caught up."""
    srv, fwd = slow_lake(spool_max="10MiB")
    big = blob(30 * MiB, 7)
    results = []
    t = start_upload(srv, big, results)
    assert wait_until(lambda: spool_disk_bytes(srv) >= 2 * PART - MiB, timeout=60, step=0.1)
    small = b"refused while the spool is full"
    t0 = time.monotonic()
    r = requests.put(f"{srv.url}/v1/blobs/{sha(small)}", data=small, timeout=TIMEOUT)
    took = time.monotonic() - t0
    body = assert_error(r, 503, "spool_full")
    assert "spool" in body["error"]["message"], body
    assert r.headers.get("Retry-After") == "1", r.headers
    assert took < 2, took
    assert "upload refused" in srv.read_log()
    assert spool_disk_bytes(srv) <= 2 * PART + MiB
    assert requests.get(f"{srv.url}/v1/blobs/{sha(small)}/meta", timeout=TIMEOUT).status_code == 404
    fwd.rate = None
    t.join(timeout=240)
    assert len(results) == 1 and results[0].status_code == 201, results
    r = requests.put(f"{srv.url}/v1/blobs/{sha(small)}", data=small, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
