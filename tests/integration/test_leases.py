"""Upload leases (issue 22): a blob attached to a live lease (PUT/POST ?lease=, lookup ?lease=)
is never quarantined by reconcile whatever its age, until the lease expires or is released; then
the next run quarantines it. Unknown and other tokens' leases are 404 `lease_not_found` (an upload
refused before its body), leases survive a restart, bounds are checked, metrics count them."""
import datetime
import hashlib
import time

import requests

from reconcile_util import Api, IceTable, blob, recon_conf, sha, start
from conftest import Server

GRACE = 1.0
MARGIN = 0.3


def parse_ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)


def new_lease(api, ttl, name="job"):
    r = api.s.post(f"{api.url}/v1/leases", json={"ttl": ttl, "name": name}, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()


def pending(api, rid):
    r = api.s.get(f"{api.url}/v1/reconcile/runs/{rid}/blobs", params={"action": "pending"},
                  timeout=30)
    assert r.status_code == 200, r.text
    return {e["sha256"]: e["eligible_at"] for e in r.json()["blobs"]}


def quarantined(api, rid):
    r = api.s.get(f"{api.url}/v1/reconcile/runs/{rid}/blobs", params={"action": "quarantined"},
                  timeout=30)
    return sorted(e["sha256"] for e in r.json()["blobs"])


def test_leased_blobs_survive_until_the_lease_ends(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        keep = api.put(b"referenced")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        old = api.put(b"present before the lease")  # attached by a lookup
        ctl = api.put(b"never leased")
        # 15 s: the lease outlives a run and a restart on a loaded machine
        lease = new_lease(api, "15s", "flink-job-42")
        assert lease["blobs"] == 0 and lease["name"] == "flink-job-42"
        put_b = blob("put", 0)
        r = api.s.put(f"{api.url}/v1/blobs/{sha(put_b)}", params={"lease": lease["id"]},
                      data=put_b, timeout=30)
        assert r.status_code == 201, r.text
        post_b = blob("post", 0)
        r = api.s.post(f"{api.url}/v1/blobs", params={"lease": lease["id"]}, data=post_b,
                       timeout=30)
        assert r.status_code == 201, r.text
        r = api.s.post(f"{api.url}/v1/lookup", params={"lease": lease["id"]},
                       json={"hashes": [old, "0" * 64]}, timeout=30)
        assert r.status_code == 200 and [f["sha256"] for f in r.json()["found"]] == [old], r.text
        leased = sorted([old, sha(put_b), sha(post_b)])
        r = api.s.get(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.status_code == 200 and r.json()["blobs"] == 3, r.text
        m = api.metrics()
        assert m["blobref_leases"] == 1 and m["blobref_leased_blobs"] == 3, m

        time.sleep(GRACE + MARGIN)  # every blob is past grace now
        rep = api.run()
        assert quarantined(api, rep["id"]) == [ctl], rep
        p = pending(api, rep["id"])
        assert sorted(p) == leased and set(p.values()) == {lease["expires_at"]}, p
        for h in leased:
            assert api.code(h) == 200

        srv.stop()  # leases are durable
        srv.start()
        r = api.s.get(f"{api.url}/v1/leases", timeout=30)
        assert [x["id"] for x in r.json()["leases"]] == [lease["id"]], r.text
        rep = api.run()
        assert quarantined(api, rep["id"]) == [] and sorted(pending(api, rep["id"])) == leased

        wait = (parse_ts(lease["expires_at"]) -
                datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        time.sleep(max(0, wait) + 0.1)
        assert api.s.get(f"{api.url}/v1/leases/{lease['id']}",
                         timeout=30).json()["error"]["code"] == "lease_not_found"
        rep = api.run()  # the lease ended: quarantined by the next run
        assert quarantined(api, rep["id"]) == leased, rep
        assert api.metrics()["blobref_leases"] == 0
    finally:
        srv.stop()


def test_released_lease_protects_no_more(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        keep = api.put(b"referenced")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        lease = new_lease(api, "1h")
        b = blob("r", 0)
        r = api.s.put(f"{api.url}/v1/blobs/{sha(b)}", params={"lease": lease["id"]}, data=b,
                      timeout=30)
        assert r.status_code == 201
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert quarantined(api, rep["id"]) == [] and list(pending(api, rep["id"])) == [sha(b)]
        r = api.s.delete(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.status_code == 200 and r.json()["released"] is True, r.text
        r = api.s.delete(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        rep = api.run()
        assert quarantined(api, rep["id"]) == [sha(b)]
    finally:
        srv.stop()


def test_unknown_and_bad_leases(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t)
    api = Api(srv)
    try:
        b = blob("u", 0)
        for params in ({"lease": "0" * 32}, {"lease": "nope"}):
            r = api.s.put(f"{api.url}/v1/blobs/{sha(b)}", params=params, data=b, timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found", r.text
            r = api.s.post(f"{api.url}/v1/blobs", params=params, data=b, timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found", r.text
            r = api.s.post(f"{api.url}/v1/lookup", params=params, json={"hashes": []},
                           timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        assert api.code(sha(b)) == 404  # nothing was stored
        for body in ({"ttl": "8d"}, {"ttl": "0s"}, {"ttl": "soon"}, {}, {"ttl": "1h", "x": 1},
                     {"ttl": "1h", "name": "n" * 129}, {"ttl": "1h", "name": "a\nb"},
                     {"ttl": 3600}):
            r = api.s.post(f"{api.url}/v1/leases", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (body,
                                                                                         r.text)
        assert api.s.get(f"{api.url}/v1/leases", timeout=30).json()["leases"] == []
    finally:
        srv.stop()


def test_another_tokens_lease_is_not_found(tmp_path):
    tokens = {"a": "read, write", "b": "read, write", "boss": "write, admin"}
    text = recon_conf(IceTable(tmp_path / "t"))
    for name, scopes in tokens.items():
        text += (f"[token {name}]\nsha256 = {hashlib.sha256(f'secret-{name}'.encode()).hexdigest()}"
                 f"\nscopes = {scopes}\n")
    srv = Server(tmp_path / "data", config_text=text).start()
    try:
        a, b, boss = (Api(srv, token=f"secret-{n}") for n in ("a", "b", "boss"))
        la = new_lease(a, "1h", "a-job")
        assert la["owner"] == "a"
        data = blob("tok", 0)
        r = b.s.put(f"{srv.url}/v1/blobs/{sha(data)}", params={"lease": la["id"]}, data=data,
                    timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        mine = b.put(blob("b's own", 0))  # present: a lookup would attach it
        r = b.s.post(f"{srv.url}/v1/blobs", params={"lease": la["id"]}, data=data, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        r = b.s.post(f"{srv.url}/v1/lookup", params={"lease": la["id"]},
                     json={"hashes": [mine]}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        assert b.code(sha(data)) == 404  # nothing was stored
        r = a.s.get(f"{srv.url}/v1/leases/{la['id']}", timeout=30)
        assert r.status_code == 200 and r.json()["blobs"] == 0, r.text  # nothing attached
        for method in ("GET", "DELETE"):
            r = b.s.request(method, f"{srv.url}/v1/leases/{la['id']}", timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found"
        assert b.s.get(f"{srv.url}/v1/leases", timeout=30).json()["leases"] == []
        assert [x["id"] for x in a.s.get(f"{srv.url}/v1/leases",
                                         timeout=30).json()["leases"]] == [la["id"]]
        assert [x["id"] for x in boss.s.get(f"{srv.url}/v1/leases",
                                            timeout=30).json()["leases"]] == [la["id"]]
        r = a.s.put(f"{srv.url}/v1/blobs/{sha(data)}", params={"lease": la["id"]}, data=data,
                    timeout=30)
        assert r.status_code == 201, r.text
    finally:
        srv.stop()


def test_python_client_lease_context_manager(tmp_path):
    """`with client.lease(...) as l: l.put(...)`: attached while the block runs, released after."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "tools" / "python"))
    import blobref

    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        keep = api.put(b"referenced")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        old = api.put(b"old one")
        c = blobref.Client(srv.url)
        with c.lease("py-job", ttl="1h") as lease:
            h = lease.put(b"under a lease")
            assert [f["sha256"] for f in lease.lookup([old])["found"]] == [old]
            info = api.s.get(f"{srv.url}/v1/leases/{lease.id}", timeout=30).json()
            assert info["name"] == "py-job" and info["blobs"] == 2, info
            time.sleep(GRACE + MARGIN)
            rep = api.run()
            assert quarantined(api, rep["id"]) == [] and sorted(pending(api, rep["id"])) == \
                sorted([h, old])
        assert api.s.get(f"{srv.url}/v1/leases", timeout=30).json()["leases"] == []
        lease.release()  # twice: not an error
        rep = api.run()
        assert quarantined(api, rep["id"]) == sorted([h, old])
    finally:
        srv.stop()


def test_lease_that_expires_mid_run(tmp_path, monkeypatch):
    """A lease live when a run marks its tables and ended before the sweep still holds the blob
    for that run (its pipeline's commit could be the one the mark missed); the next run
    quarantines it. The run waits between mark and sweep on a FIFO (BLOBREF_TEST_RECONCILE_PAUSE)
    until the lease has ended."""
    import errno
    import os
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    monkeypatch.setenv("BLOBREF_TEST_RECONCILE_PAUSE", str(fifo))
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)

    def at_pause(timeout=60):
        """Waits until a run reached the pause (it opened the FIFO); returns the writer's fd."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                assert e.errno == errno.ENXIO and time.monotonic() < deadline, e
                time.sleep(0.02)

    try:
        keep = api.put(b"referenced")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        lease = new_lease(api, "4s", "short-job")
        data = blob("mid-run", 0)
        r = api.s.put(f"{api.url}/v1/blobs/{sha(data)}", params={"lease": lease["id"]},
                      data=data, timeout=30)
        assert r.status_code == 201, r.text
        h = sha(data)
        time.sleep(GRACE + MARGIN)  # past grace: only the lease holds it
        r = api.start_run()
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        fd = at_pause()
        deadline = time.monotonic() + 30
        while api.s.get(f"{api.url}/v1/leases/{lease['id']}", timeout=30).status_code != 404:
            assert time.monotonic() < deadline, "the lease never ended"
            time.sleep(0.05)
        os.close(fd)  # the lease has ended: the run sweeps now
        rep = api.wait(rid)
        assert rep["state"] == "done", rep
        assert parse_ts(rep["started_at"]) < parse_ts(lease["expires_at"]), \
            "the run must start while the lease is live (a loaded machine: retry)"
        assert quarantined(api, rid) == [] and list(pending(api, rid)) == [h], rep
        assert api.code(h) == 200

        r = api.start_run()
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        os.close(at_pause())
        api.wait(rid)
        assert quarantined(api, rid) == [h]
        assert api.code(h) == 410
    finally:
        srv.stop()


def test_leased_uploads_never_sync_on_the_network_thread(tmp_path):
    """PUT and POST ?lease= and POST /v1/lookup?lease= attach their blobs to the lease durably (an
    LMDB commit: fdatasync) on a finisher thread: the thread that answers the request
    (libmicrohttpd's) never syncs. A PUT dedup hit with Expect: 100-continue still gets its answer
    before any body."""
    import pytest
    from util_strace import SYNC_CALLS, Tracer
    if not Tracer.available():
        pytest.skip("strace is not installed")
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1h")
    api = Api(srv)
    try:
        lease = new_lease(api, "1h", "traced")
        present = api.put(blob("present", 0))
        found = api.put(blob("found", 0))
        with Tracer(srv.proc.pid, tmp_path / "strace.txt") as tr:
            assert tr.attached >= 2, "strace did not attach to the server threads"
            new_b, post_b = blob("traced-put", 0), blob("traced-post", 0)
            r = api.s.put(f"{api.url}/v1/blobs/{sha(new_b)}", params={"lease": lease["id"]},
                          data=new_b, timeout=30)
            assert r.status_code == 201, r.text
            r = api.s.post(f"{api.url}/v1/blobs", params={"lease": lease["id"]}, data=post_b,
                           timeout=30)
            assert r.status_code == 201, r.text
            r = api.s.put(f"{api.url}/v1/blobs/{present}", params={"lease": lease["id"]},
                          data=blob("present", 0), headers={"Expect": "100-continue"},
                          timeout=30)
            assert r.status_code == 200, r.text
            r = api.s.post(f"{api.url}/v1/lookup", params={"lease": lease["id"]},
                           json={"hashes": [found, "0" * 64]}, timeout=30)
            assert r.status_code == 200 and [f["sha256"] for f in r.json()["found"]] == [found]
        calls = tr.calls()
        answering = {c.pid for c in calls if c.name in ("sendto", "sendmsg", "writev", "write")
                     and "HTTP/1.1 20" in c.args}
        assert answering, "no answer seen in the trace"
        syncs = [c for c in calls if c.name in SYNC_CALLS]
        assert syncs, "the attaches must be durable"
        assert not [c for c in syncs if c.pid in answering], (answering, syncs)
        r = api.s.get(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.json()["blobs"] == 4, r.text
    finally:
        srv.stop()


def test_lease_attaches_survive_kill9(tmp_path):
    """Every attach acknowledged (PUT, POST, a lookup's found blobs: each made durable on a
    finisher before its answer) is still on the lease after kill -9 and a restart, and holds its
    blob against a run past grace; a lookup under a lease that ended is 404 lease_not_found and
    attaches nothing."""
    import signal
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        keep = api.put(b"referenced")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        found = [api.put(blob("found", i)) for i in range(3)]
        ctl = api.put(b"not leased")
        lease = new_lease(api, "1h", "killed")
        put_b, post_b = blob("put", 0), blob("post", 0)
        r = api.s.put(f"{api.url}/v1/blobs/{sha(put_b)}", params={"lease": lease["id"]},
                      data=put_b, timeout=30)
        assert r.status_code == 201, r.text
        r = api.s.post(f"{api.url}/v1/blobs", params={"lease": lease["id"]}, data=post_b,
                       timeout=30)
        assert r.status_code == 201, r.text
        r = api.s.post(f"{api.url}/v1/lookup", params={"lease": lease["id"]},
                       json={"hashes": found + ["0" * 64]}, timeout=30)
        assert r.status_code == 200 and len(r.json()["found"]) == 3, r.text
        leased = sorted(found + [sha(put_b), sha(post_b)])
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        srv.start()
        r = api.s.get(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.status_code == 200 and r.json()["blobs"] == 5, r.text
        time.sleep(GRACE + MARGIN)  # every blob is past grace now
        rep = api.run()
        assert quarantined(api, rep["id"]) == [ctl], rep
        assert sorted(pending(api, rep["id"])) == leased
        r = api.s.delete(f"{api.url}/v1/leases/{lease['id']}", timeout=30)
        assert r.status_code == 200, r.text
        r = api.s.post(f"{api.url}/v1/lookup", params={"lease": lease["id"]},
                       json={"hashes": found}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lease_not_found", r.text
    finally:
        srv.stop()
