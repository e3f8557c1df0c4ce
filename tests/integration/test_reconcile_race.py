"""Reconcile racing uploads (issue 7, "Race-free"; PRODUCT.md invariants 1, 3, 6): back-to-back
runs with grace = 2 s and retention = 1 s while threads upload, deduplicate (PUT, POST and PUT
with Expect: 100-continue) and read blobs that no table references, so that those blobs keep
going live -> quarantined -> deleted -> uploaded again under the runs' feet.

Checked all along: a blob whose last acknowledged upload (200/201) is less than grace old reads
back byte-identical; an upload answered 2xx reads back at once; a 200 read always has the right
bytes; the blobs the table references are never touched; every run completes. At the end: the
same for every blob acknowledged within grace, and `blobrefd --fsck --verify` finds every index
entry's bytes. Each test runs for a bounded time (about 25 s with its setup)."""
import heapq
import json
import random
import threading
import time

import requests

from reconcile_util import Api, IceTable, blob, sha, start
from util_http import RawConn, fsck, request_head

GRACE = 2.0
RETENTION = 1.0
SLACK = 0.15  # for the time between the server's clock reading and ours


class Tracker:
    """What the clients saw: per blob, the send time of its latest acknowledged upload."""

    def __init__(self, data):
        self.data = data
        self.lock = threading.Lock()
        self.last_ack = {}
        self.bad = []
        self.stats = {"acks": 0, "created": 0, "dedup": 0, "try_again": 0, "reads": 0,
                      "reads_protected": 0, "gone_reads": 0, "quarantined_reads": 0}

    def ack(self, h, sent_at, status):
        with self.lock:
            self.last_ack[h] = max(self.last_ack.get(h, 0), sent_at)
            self.stats["acks"] += 1
            self.stats["created" if status == 201 else "dedup"] += 1

    def last(self, h):
        with self.lock:
            return self.last_ack.get(h)

    def fail(self, msg):
        with self.lock:
            if len(self.bad) < 50:
                self.bad.append(msg)

    def count(self, k, n=1):
        with self.lock:
            self.stats[k] += n


def put_expect(srv, h, data):
    """PUT with Expect: 100-continue: the body only if the server asks for it. Returns status."""
    c = RawConn(srv, timeout=30)
    try:
        c.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(len(data))),
                                                       ("Expect", "100-continue"),
                                                       ("Connection", "close")]))
        r = c.read_response()
        if r.status == 100:
            c.send(data)
            r = c.read_response()
        return r.status, r.body
    finally:
        c.close()


def upload_once(srv, session, h, data, how):
    if how == "put":
        r = session.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=30)
        return r.status_code, r.content
    if how == "post":
        r = session.post(f"{srv.url}/v1/blobs", data=data, timeout=30)
        return r.status_code, r.content
    return put_expect(srv, h, data)


def verify_read(tr, session, srv, h, must, what):
    """GETs h; a 200 must carry the bytes; `must` (a live blob expected) requires the 200."""
    r = session.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
    tr.count("reads")
    if r.status_code == 200:
        if r.content != tr.data[h]:
            tr.fail(f"{what}: {h[:12]} read {len(r.content)} bytes that are not its own")
    elif must:
        tr.fail(f"{what}: {h[:12]} answered {r.status_code} {r.text[:150]!r}")
    elif r.status_code == 404:
        tr.count("gone_reads")
    elif r.status_code == 410:
        tr.count("quarantined_reads")
    else:
        tr.fail(f"{what}: {h[:12]} answered {r.status_code} {r.text[:150]!r}")
    return r.status_code


def do_upload(tr, srv, session, h, how):
    sent = time.monotonic()
    try:
        status, body = upload_once(srv, session, h, tr.data[h], how)
    except (requests.RequestException, OSError, EOFError) as e:
        tr.fail(f"upload {how} {h[:12]}: {e!r}")
        return None
    if status in (200, 201):
        try:
            j = json.loads(body)
        except ValueError:
            j = {}
        if j.get("sha256") != h:
            tr.fail(f"upload {how} {h[:12]}: {status} {body[:150]!r}")
        tr.ack(h, sent, status)
        # Acknowledged: it must read back now.
        verify_read(tr, session, srv, h, True, f"read right after a {status} {how}")
    elif status == 503 and b"try_again" in body:
        tr.count("try_again")  # the blob changed state during the upload: not acknowledged
    else:
        tr.fail(f"upload {how} {h[:12]}: {status} {body[:150]!r}")
    return status


class Runner(threading.Thread):
    """Back-to-back reconcile runs until stopped; collects the reports."""

    def __init__(self, srv, tr, stop):
        super().__init__(daemon=True)
        self.api, self.tr, self.stop = Api(srv), tr, stop
        self.reports = []

    def run(self):
        while not self.stop.is_set():
            try:
                r = self.api.start_run()
                if r.status_code == 409:
                    time.sleep(0.01)
                    continue
                if r.status_code != 202:
                    self.tr.fail(f"POST /v1/reconcile: {r.status_code} {r.text[:200]}")
                    time.sleep(0.1)
                    continue
                rep = self.api.wait(r.json()["id"], timeout=60)
            except (requests.RequestException, AssertionError) as e:
                self.tr.fail(f"runner: {e!r}")
                return
            self.reports.append(rep)
            if rep["state"] != "done" or rep["errors"]:
                self.tr.fail(f"run {rep['id']}: {rep['state']} {rep['errors']}")

    def total(self, k):
        return sum(r["blobs"][k] for r in self.reports)


def checker(srv, tr, pool, referenced, stop):
    """Reads every blob over and over: the referenced ones and those acknowledged within grace
    must be there."""
    s = requests.Session()
    rng = random.Random(7)
    while not stop.is_set():
        for h in rng.sample(pool, len(pool)):
            if stop.is_set():
                break
            last = tr.last(h)
            verify_read_timed(tr, s, srv, h, last)
        for h in referenced:
            verify_read(tr, s, srv, h, True, "referenced blob")


def verify_read_timed(tr, s, srv, h, last):
    """A read whose requirement depends on when it was answered: protected if the blob's last
    acknowledged upload was sent less than grace before the answer arrived."""
    r = s.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
    got = time.monotonic()
    tr.count("reads")
    protected = last is not None and got - last < GRACE - SLACK
    if protected:
        tr.count("reads_protected")
    if r.status_code == 200:
        if r.content != tr.data[h]:
            tr.fail(f"checker: {h[:12]} read bytes that are not its own")
    elif protected:
        tr.fail(f"checker: {h[:12]} acknowledged {got - last:.3f} s before the answer, "
                f"grace {GRACE} s, answered {r.status_code} {r.text[:150]!r}")
    elif r.status_code not in (404, 410):
        tr.fail(f"checker: {h[:12]} answered {r.status_code} {r.text[:150]!r}")
    else:
        tr.count("gone_reads" if r.status_code == 404 else "quarantined_reads")


def start_pool(tmp_path, npool, tag, sizes):
    t = IceTable(tmp_path / "t")
    ref_data = {sha(blob(f"{tag}-ref", i)): blob(f"{tag}-ref", i) for i in range(10)}
    t.write_data({"ref.parquet": list(ref_data)})
    t.append("ref.parquet")
    srv = start(tmp_path, t, grace=f"{GRACE:g}s", retention=f"{RETENTION:g}s")
    api = Api(srv)
    for b in ref_data.values():
        api.put(b)
    rng = random.Random(11)
    data = {}
    for i in range(npool):
        b = blob(tag, i, size=rng.choice(sizes))
        data[sha(b)] = b
    data.update(ref_data)
    return srv, api, data, list(ref_data)


def final_checks(srv, api, tr, runner, referenced, pool):
    s = requests.Session()
    for h in referenced:
        verify_read(tr, s, srv, h, True, "referenced blob at the end")
    for h in pool:
        verify_read_timed(tr, s, srv, h, tr.last(h))
    assert not tr.bad, "\n".join(tr.bad)
    assert runner.reports, "no run completed"
    assert all(r["state"] == "done" for r in runner.reports)
    alive = srv.alive()
    rc = srv.stop()
    assert alive and rc == 0, srv.read_log()[-3000:]
    code, n, problems, out = fsck(srv.data_dir, config=srv.data_dir / "blobref.conf", verify=True)
    assert code == 0 and problems == 0, out


def test_dedup_hits_and_uploads_vs_back_to_back_runs(tmp_path):
    """Three uploaders (PUT, POST, PUT with Expect: 100-continue) over 80 blobs, most requests on
    a hot group that moves every 2 s (so the others go cold, get quarantined, deleted, and come
    back), a reader checking every blob all the time, and reconcile runs back to back."""
    duration = 22.0
    srv, api, data, referenced = start_pool(tmp_path, 80, "dedup", [100, 3000, 20000, 70000, 150000])
    pool = [h for h in data if h not in referenced]
    tr = Tracker(data)
    stop = threading.Event()
    runner = Runner(srv, tr, stop)
    t0 = time.monotonic()

    def uploader(seed, hows):
        rng = random.Random(seed)
        s = requests.Session()
        groups = [pool[i::8] for i in range(8)]
        while not stop.is_set():
            hot = groups[int((time.monotonic() - t0) / 2.0) % 8]
            h = rng.choice(hot) if rng.random() < 0.6 else rng.choice(pool)
            do_upload(tr, srv, s, h, rng.choice(hows))
            time.sleep(rng.uniform(0, 0.02))

    threads = [threading.Thread(target=uploader, args=(1, ["put"]), daemon=True),
               threading.Thread(target=uploader, args=(2, ["post", "put"]), daemon=True),
               threading.Thread(target=uploader, args=(3, ["expect"]), daemon=True),
               threading.Thread(target=checker, args=(srv, tr, pool, referenced, stop),
                                daemon=True)]
    try:
        for th in threads:
            th.start()
        runner.start()
        time.sleep(duration)
    finally:
        stop.set()
        for th in threads + [runner]:
            th.join(60)
    print(f"\n{len(runner.reports)} runs; quarantined {runner.total('quarantined')}, restored "
          f"{runner.total('restored')}, deleted {runner.total('deleted')}; {tr.stats}")
    final_checks(srv, api, tr, runner, referenced, pool)
    # The race was run: blobs really went through quarantine and deletion and came back.
    assert len(runner.reports) >= 10
    assert runner.total("quarantined") > 0 and runner.total("deleted") > 0
    assert tr.stats["created"] > len(pool), tr.stats  # re-uploads after deletion
    assert tr.stats["reads_protected"] > 100


def test_reuploads_vs_deletes(tmp_path):
    """200 blobs each re-uploaded every 2.5-5 s (random): the re-uploads land while the blob is
    live, quarantined, being deleted or gone. Every 2xx upload must leave the blob readable."""
    duration = 22.0
    srv, api, data, referenced = start_pool(tmp_path, 200, "reup", [10, 500, 4000, 90000])
    pool = [h for h in data if h not in referenced]
    tr = Tracker(data)
    stop = threading.Event()
    runner = Runner(srv, tr, stop)
    rng = random.Random(5)
    now = time.monotonic()
    heap = [(now + rng.uniform(0, 2), h) for h in pool]
    heapq.heapify(heap)
    hl = threading.Lock()

    def uploader(seed):
        r = random.Random(seed)
        s = requests.Session()
        while not stop.is_set():
            with hl:
                when, h = heapq.heappop(heap)
            d = when - time.monotonic()
            if d > 0:
                time.sleep(min(d, 0.5))
                if d > 0.5:
                    with hl:
                        heapq.heappush(heap, (when, h))
                    continue
            do_upload(tr, srv, s, h, r.choice(["put", "put", "post", "expect"]))
            with hl:
                heapq.heappush(heap, (time.monotonic() + r.uniform(2.5, 5.0), h))

    threads = [threading.Thread(target=uploader, args=(i,), daemon=True) for i in range(4)]
    threads.append(threading.Thread(target=checker, args=(srv, tr, pool, referenced, stop),
                                    daemon=True))
    try:
        for th in threads:
            th.start()
        runner.start()
        time.sleep(duration)
    finally:
        stop.set()
        for th in threads + [runner]:
            th.join(60)
    print(f"\n{len(runner.reports)} runs; quarantined {runner.total('quarantined')}, restored "
          f"{runner.total('restored')}, deleted {runner.total('deleted')}; {tr.stats}")
    final_checks(srv, api, tr, runner, referenced, pool)
    assert runner.total("deleted") > 50 and tr.stats["created"] > len(pool) + 50, tr.stats
    assert tr.stats["quarantined_reads"] > 0 and tr.stats["gone_reads"] > 0, tr.stats


def test_leases_vs_back_to_back_runs(tmp_path):
    """Leases under the runs' feet (issue 22): two pipelines each take a 3 s lease, attach 10
    blobs with `POST /v1/lookup?lease=` (the present ones, long past grace, which the runs are
    quarantining at the same time) and re-upload the missing ones with `PUT ?lease=`, over and
    over. A blob reported found, or acknowledged, under a lease must read back until that lease
    ends, whatever its age; the blobs nobody leases go through quarantine and deletion."""
    duration = 14.0
    srv, api, data, referenced = start_pool(tmp_path, 60, "lease", [100, 3000, 20000])
    pool = [h for h in data if h not in referenced]
    for h in pool:
        api.put(data[h])
    tr = Tracker(data)
    tr.stats.update({"lease_found": 0, "lease_uploads": 0, "lease_protected_reads": 0})
    stop = threading.Event()
    runner = Runner(srv, tr, stop)
    until = {}  # blob -> monotonic time up to which a lease holds it (conservative)
    ul = threading.Lock()
    ttl = 3.0

    def hold(h, t):
        with ul:
            until[h] = max(until.get(h, 0), t)

    def pipeline(seed):
        rng = random.Random(seed)
        s = requests.Session()
        while not stop.is_set():
            sent = time.monotonic()
            r = s.post(f"{srv.url}/v1/leases", json={"ttl": f"{ttl:g}s", "name": f"p{seed}"},
                       timeout=30)
            if r.status_code != 201:
                tr.fail(f"POST /v1/leases: {r.status_code} {r.text[:150]}")
                return
            lid, end = r.json()["id"], sent + ttl - SLACK
            batch = rng.sample(pool, 10)
            r = s.post(f"{srv.url}/v1/lookup", params={"lease": lid}, json={"hashes": batch},
                       timeout=30)
            if r.status_code != 200:
                tr.fail(f"lookup ?lease: {r.status_code} {r.text[:150]}")
                continue
            for f in r.json()["found"]:
                hold(f["sha256"], end)
                tr.count("lease_found")
                verify_read(tr, s, srv, f["sha256"], True, "found under a lease")
            for h in r.json()["missing"]:
                r2 = s.put(f"{srv.url}/v1/blobs/{h}", params={"lease": lid}, data=data[h],
                           timeout=30)
                if r2.status_code in (200, 201):
                    hold(h, end)
                    tr.ack(h, time.monotonic(), r2.status_code)
                    tr.count("lease_uploads")
                    verify_read(tr, s, srv, h, True, "uploaded under a lease")
                elif (r2.status_code == 404 and b"lease_not_found" in r2.content
                      and time.monotonic() > end):
                    break  # a loaded machine outlived the lease: its end is what was asked
                elif not (r2.status_code == 503 and b"try_again" in r2.content):
                    tr.fail(f"PUT ?lease {h[:12]}: {r2.status_code} {r2.text[:150]}")
            time.sleep(rng.uniform(0.2, 1.0))

    def lease_checker():
        s = requests.Session()
        while not stop.is_set():
            for h in pool:
                with ul:  # only a hold answered before the GET is sent binds its answer
                    held_until = until.get(h, 0)
                r = s.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
                got = time.monotonic()
                if held_until > got:
                    tr.count("lease_protected_reads")
                    if r.status_code != 200:
                        tr.fail(f"{h[:12]} leased until {held_until - got:.2f} s from now, "
                                f"answered {r.status_code} {r.text[:150]!r}")
                if r.status_code == 200 and r.content != data[h]:
                    tr.fail(f"{h[:12]} read bytes that are not its own")

    threads = [threading.Thread(target=pipeline, args=(i,), daemon=True) for i in (1, 2)]
    threads.append(threading.Thread(target=lease_checker, daemon=True))
    try:
        for th in threads:
            th.start()
        runner.start()
        time.sleep(duration)
    finally:
        stop.set()
        for th in threads + [runner]:
            th.join(60)
    print(f"\n{len(runner.reports)} runs; quarantined {runner.total('quarantined')}, deleted "
          f"{runner.total('deleted')}; {tr.stats}")
    final_checks(srv, api, tr, runner, referenced, pool)
    assert runner.total("quarantined") > 0 and tr.stats["lease_found"] > 20, tr.stats
    assert tr.stats["lease_protected_reads"] > 100, tr.stats
