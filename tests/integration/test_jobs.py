"""Server-side jobs (issue 26): POST /v1/jobs runs migrate and import inside blobrefd, with
progress in GET /v1/jobs[/{id}], cancel, one job per source store (409 job_conflict), bad bodies
refused with the field named, and jobs that resume after a restart (SIGTERM or SIGKILL) and end
with every blob readable and `blobrefd --fsck --verify` clean."""
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import time

import pytest
import requests

from conftest import BIN_DIR, Server

TIMEOUT = 30


def config(tmp_path, extra=""):
    return f"""[server]
upload_store = a
drain_grace = 1s
max_blob_size = 100KiB
cache_size = 0

[store a]
kind = fs
root = {tmp_path / 'a'}

[store b]
kind = fs
root = {tmp_path / 'b'}
{extra}"""


def upload_many(srv, n, seed, size=20_000):
    rnd = random.Random(seed)
    blobs = {}
    for i in range(n):
        data = rnd.randbytes(size) + i.to_bytes(4, "big")
        h = hashlib.sha256(data).hexdigest()
        r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT)
        assert r.status_code in (200, 201), r.text
        blobs[h] = data
    return blobs


def primaries(srv):
    out, after = {}, ""
    while True:
        j = requests.get(f"{srv.url}/v1/blobs", params={"after": after, "limit": 500},
                         timeout=TIMEOUT).json()
        for b in j["blobs"]:
            out[b["sha256"]] = [l["store"] for l in b["locations"] if l["role"] == "primary"][0]
        if j["next"] is None:
            return out
        after = j["next"]


def start_job(srv, **spec):
    r = requests.post(f"{srv.url}/v1/jobs", json=spec, timeout=TIMEOUT)
    assert r.status_code == 202, r.text
    return r.json()


def job(srv, jid):
    r = requests.get(f"{srv.url}/v1/jobs/{jid}", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def wait_job(srv, jid, until=lambda j: j["state"] not in ("queued", "running"), timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = job(srv, jid)
        if until(j):
            return j
        time.sleep(0.05)
    raise AssertionError(f"job {jid} still {job(srv, jid)} after {timeout} s")


def all_readable(srv, blobs):
    for h, data in blobs.items():
        r = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == data, (h, r.status_code)


def fsck_clean(srv):
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=0")
    r = subprocess.run([str(BIN_DIR / "blobrefd"), "--fsck", "--verify", "--data",
                        str(srv.data_dir), "-c", str(srv.data_dir / "blobref.conf")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def two_stores(tmp_path):
    srv = Server(tmp_path / "data", config(tmp_path)).start()
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive and rc == 0, srv.read_log()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    """One server for the refusals: none of them may leave a job behind."""
    tmp = tmp_path_factory.mktemp("refusals")
    srv = Server(tmp / "data", config(tmp)).start()
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive and rc == 0, srv.read_log()


def test_migrate_job_moves_everything_with_progress(two_stores):
    srv = two_stores
    blobs = upload_many(srv, 30, 1)
    # 30 x 20 kB at 0.2 MB/s: about 3 s, so that progress shows while it runs
    j = start_job(srv, kind="migrate", **{"from": "a"}, to="b", rate=0.2, concurrency=2)
    assert j["state"] in ("queued", "running") and j["kind"] == "migrate"
    mid = wait_job(srv, j["id"], lambda x: x["state"] != "queued" and 0 < x["items_done"])
    assert mid["state"] == "running" and mid["items_total"] == 30, mid
    assert mid["items_done"] < 30 and mid["rate_bytes_per_s"] > 0 and mid["eta_s"] > 0, mid
    listed = requests.get(f"{srv.url}/v1/jobs", timeout=TIMEOUT).json()["jobs"]
    assert [x["id"] for x in listed] == [j["id"]]
    end = wait_job(srv, j["id"])
    assert end["state"] == "done" and end["items_done"] == 30, end
    assert end["bytes_done"] == sum(len(d) for d in blobs.values()), end
    assert end["items_failed"] == 0 and end["errors"] == [], end
    assert set(end["steps"]) == {"copy_ms", "verify_ms", "switch_ms"}
    assert set(primaries(srv).values()) == {"b"}
    all_readable(srv, blobs)
    assert "job 1: done: 30 items" in srv.read_log()


def test_second_job_on_the_same_source_is_409_then_cancel(two_stores):
    srv = two_stores
    upload_many(srv, 20, 2)
    j = start_job(srv, kind="migrate", **{"from": "a"}, to="b", rate=0.05, concurrency=1)
    r = requests.post(f"{srv.url}/v1/jobs", json={"kind": "import", "store": "a"},
                      timeout=TIMEOUT)
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_conflict", r.text
    assert f"job {j['id']}" in r.json()["error"]["message"]
    wait_job(srv, j["id"], lambda x: x["items_done"] >= 1)
    r = requests.post(f"{srv.url}/v1/jobs/{j['id']}/cancel", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    end = wait_job(srv, j["id"], timeout=30)
    assert end["state"] == "cancelled" and 1 <= end["items_done"] < 20, end
    moved = list(primaries(srv).values())
    assert moved.count("b") == end["items_done"], (moved, end)
    # the source store is free again: a new job starts (and finishes the move)
    j2 = start_job(srv, kind="migrate", **{"from": "a"}, to="b")
    assert wait_job(srv, j2["id"])["state"] == "done"
    assert set(primaries(srv).values()) == {"b"}
    r = requests.post(f"{srv.url}/v1/jobs/999/cancel", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert requests.get(f"{srv.url}/v1/jobs/999", timeout=TIMEOUT).status_code == 404


@pytest.mark.parametrize("body,field", [
    ({"kind": "copy"}, "kind"),
    ({"from": "a", "to": "b"}, "kind"),
    ({"kind": "migrate", "to": "b"}, "from"),
    ({"kind": "migrate", "from": "nope", "to": "b"}, "from"),
    ({"kind": "migrate", "from": "a", "to": "a"}, "to"),
    ({"kind": "migrate", "from": "a", "to": "b", "verify": "md5"}, "verify"),
    ({"kind": "migrate", "from": "a", "to": "b", "concurrency": 0}, "concurrency"),
    ({"kind": "migrate", "from": "a", "to": "b", "concurrency": "4"}, "concurrency"),
    ({"kind": "migrate", "from": "a", "to": "b", "rate": -1}, "rate"),
    ({"kind": "migrate", "from": "a", "to": "b", "limit": 0}, "limit"),
    ({"kind": "migrate", "from": "a", "to": "b", "dry_run": "yes"}, "dry_run"),
    ({"kind": "migrate", "from": "a", "to": "b", "store": "a"}, "store"),
    ({"kind": "import"}, "store"),
    ({"kind": "import", "store": "a", "mode": "move"}, "mode"),
    ({"kind": "import", "store": "a", "source": 3}, "source"),
    ({"kind": "import", "store": "a", "source": "/etc"}, "source"),
    ({"kind": "import", "store": "a", "source": "../x"}, "source"),
])
def test_bad_bodies_are_400_with_the_field_named(refusing, body, field):
    srv = refusing
    r = requests.post(f"{srv.url}/v1/jobs", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "bad_request" and err["field"] == field, err
    assert requests.get(f"{srv.url}/v1/jobs", timeout=TIMEOUT).json()["jobs"] == []
    assert "POST /v1/jobs refused" in srv.read_log()


def test_not_json_is_400(two_stores):
    r = requests.post(f"{two_stores.url}/v1/jobs", data=b"[1,", timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json", r.text


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_job_resumes_after_a_restart(tmp_path, sig):
    srv = Server(tmp_path / "data", config(tmp_path)).start()
    try:
        blobs = upload_many(srv, 40, 3)
        j = start_job(srv, kind="migrate", **{"from": "a"}, to="b", rate=0.2, concurrency=2)
        wait_job(srv, j["id"], lambda x: x["items_done"] >= 5)
        assert srv.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        srv.start()
        assert "resumed after a restart" in srv.read_log()
        end = wait_job(srv, j["id"])
        assert end["state"] == "done" and end["items_failed"] == 0, end
        # kill -9 may lose the count of the items in flight, never a blob
        assert 40 - 2 <= end["items_done"] + end["items_skipped"] <= 40, end
        assert set(primaries(srv).values()) == {"b"}
        all_readable(srv, blobs)
    finally:
        alive = srv.alive()
        rc = srv.stop()
    assert alive and rc == 0, srv.read_log()
    fsck_clean(srv)


def test_import_jobs_in_place_and_copy(two_stores, tmp_path):
    srv = two_stores
    folder = tmp_path / "a" / "photos" / "2019"
    folder.mkdir(parents=True)
    files = {}
    for i in range(12):
        data = os.urandom(1000 + i)
        (folder / f"p{i}.jpg").write_bytes(data)
        files[hashlib.sha256(data).hexdigest()] = (f"photos/2019/p{i}.jpg", data)
    j = start_job(srv, kind="import", store="a", source=str(tmp_path / "a" / "photos"))
    assert j["params"]["prefix"] == "photos/" and j["params"]["mode"] == "in-place"
    end = wait_job(srv, j["id"])
    assert end["state"] == "done" and end["items_done"] == 12, end
    for h, (key, data) in files.items():
        meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
        assert [(l["store"], l["key"]) for l in meta["locations"]] == [("a", key)]
        assert requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data
    # again: everything is indexed already, nothing changes
    again = wait_job(srv, start_job(srv, kind="import", store="a", source="photos/")["id"])
    assert again["items_done"] == 0 and again["items_skipped"] == 12, again
    # copy: into the content-addressed layout of store b, from a key prefix there
    other = tmp_path / "b" / "incoming"
    other.mkdir(parents=True)
    copied = {}
    for i in range(5):
        data = os.urandom(2000 + i)
        (other / f"f{i}").write_bytes(data)
        copied[hashlib.sha256(data).hexdigest()] = data
    (other / "bad").write_bytes(os.urandom(200_000))  # over max_blob_size: one error, the rest go on
    c = wait_job(srv, start_job(srv, kind="import", store="b", source="incoming/",
                                mode="copy")["id"])
    assert c["state"] == "done" and c["items_done"] == 5 and c["items_failed"] == 1, c
    assert c["errors"][0]["item"] == "incoming/bad" and c["errors"][0]["message"], c
    for h, data in copied.items():
        meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
        key = meta["locations"][0]["key"]
        assert meta["locations"][0]["store"] == "b" and h in key and "sha256/" in key, meta
        assert requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data
    assert (other / "f0").exists()  # a copy leaves the source alone
    fsck_clean(srv)


def cli(srv, *args, timeout=120):
    return subprocess.run([str(BIN_DIR / "blobref"), "--server", srv.url, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_cli_migrate_detach_jobs_cancel_and_ctrl_c(two_stores):
    srv = two_stores
    upload_many(srv, 20, 5)
    r = cli(srv, "migrate", "--from", "a", "--to", "b", "--rate", "0.05", "--detach")
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stdout + r.stderr
    jid = int(r.stdout)
    r = cli(srv, "jobs", str(jid), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r.stdout
    r = cli(srv, "jobs")
    assert r.returncode == 0 and f"{jid} " in r.stdout and "a -> b" in r.stdout, r.stdout
    r = cli(srv, "jobs", "cancel", str(jid))
    assert r.returncode == 0 and "cancel asked for" in r.stdout, r.stdout + r.stderr
    assert wait_job(srv, jid)["state"] == "cancelled"
    assert cli(srv, "jobs", "cancel").returncode == 2
    assert cli(srv, "jobs", "999").returncode == 1
    # Ctrl-C detaches: the job goes on in the server and ends done
    p = subprocess.Popen([str(BIN_DIR / "blobref"), "--server", srv.url, "migrate", "--from",
                          "a", "--to", "b", "--rate", "0.05"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()  # the first progress line: it follows the job
    assert "migrate: job" in line, line
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1 and "detached: job" in err, (p.returncode, err)
    jid2 = int(re.search(r"detached: job (\d+)", err)[1])
    assert job(srv, jid2)["state"] in ("queued", "running")
    # a second `migrate` of the same stores follows the job in flight to its end
    r = cli(srv, "migrate", "--from", "a", "--to", "b")
    assert r.returncode == 0 and f"job {jid2} is already moving" in r.stderr, r.stderr
    assert re.search(r"job \d+ done: moved (\d+) of \1 blobs", r.stdout), r.stdout
    assert set(primaries(srv).values()) == {"b"}


def test_cli_import_runs_as_a_job_with_a_folder_or_a_prefix(two_stores, tmp_path):
    srv = two_stores
    for sub in ("x", "y"):
        (tmp_path / "a" / sub).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "a" / sub / f"{i}").write_bytes(os.urandom(500) + sub.encode())
    r = cli(srv, "import", str(tmp_path / "a" / "x"), "--store", "a")
    assert r.returncode == 0 and "3 created" in r.stdout and "a:x/" in r.stdout, r.stdout + r.stderr
    r = cli(srv, "import", "y/", "--store", "a")
    assert r.returncode == 0 and "3 created" in r.stdout, r.stdout + r.stderr
    r = cli(srv, "import", "y/", "--store", "a")
    assert r.returncode == 0 and "0 created, 3 already indexed" in r.stdout, r.stdout
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = cli(srv, "import", str(outside), "--store", "a")
    assert r.returncode == 1 and "not under the store's root" in r.stderr, r.stderr
    assert "-c CONFIG --copy" in r.stderr


def test_sighup_adds_a_store_then_imports_a_folder_in_place(two_stores, tmp_path):
    srv = two_stores
    existing = tmp_path / "archive" / "2018"
    existing.mkdir(parents=True)
    files = {}
    for i in range(4):
        data = os.urandom(700 + i)
        (existing / f"doc{i}").write_bytes(data)
        files[hashlib.sha256(data).hexdigest()] = data
    r = requests.post(f"{srv.url}/v1/jobs", json={"kind": "import", "store": "archive"},
                      timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["field"] == "store"
    conf = srv.data_dir / "blobref.conf"
    # a new store, and a change to an existing one (which needs a restart and says so)
    text = conf.read_text().replace(f"root = {tmp_path / 'b'}", f"root = {tmp_path / 'b2'}")
    conf.write_text(text + f"\n[store archive]\nkind = fs\nroot = {tmp_path / 'archive'}\n")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "[store archive] (fs) added" not in srv.read_log():
        assert time.monotonic() < deadline, srv.read_log()
        time.sleep(0.05)
    assert "[store] sections (changed or removed; new ones are added) changed but needs a " \
           "restart" in srv.read_log()
    j = start_job(srv, kind="import", store="archive", source=str(tmp_path / "archive"))
    end = wait_job(srv, j["id"])
    assert end["state"] == "done" and end["items_done"] == 4, end
    for h, data in files.items():
        r = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == data
        meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
        assert meta["locations"][0]["store"] == "archive"
    # a second SIGHUP adds nothing again
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while srv.read_log().count("SIGHUP: reloading") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert srv.read_log().count("[store archive] (fs) added") == 1


def test_migrate_job_fs_to_s3_with_a_restart(tmp_path, rgw):
    bucket = rgw.make_bucket("jobs-fs-s3")
    s3 = f"""
[store c]
kind = s3
endpoint = {rgw.endpoint}
region = {rgw.region}
bucket = {bucket}
path_style = true
access_key = {rgw.access_key}
secret_key = {rgw.secret_key}
"""
    srv = Server(tmp_path / "data", config(tmp_path, s3)).start()
    try:
        blobs = upload_many(srv, 30, 6)
        j = start_job(srv, kind="migrate", **{"from": "a"}, to="c", rate=0.2, concurrency=4)
        mid = wait_job(srv, j["id"], lambda x: x["items_done"] >= 5)
        assert mid["state"] == "running" and mid["items_total"] == 30, mid
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        srv.start()
        end = wait_job(srv, j["id"])
        assert end["state"] == "done" and end["items_failed"] == 0, end
        assert set(primaries(srv).values()) == {"c"}
        all_readable(srv, blobs)
        keys = {o["Key"] for o in rgw.client().list_objects_v2(Bucket=bucket).get("Contents", [])}
        assert {k.rsplit("/", 1)[-1] for k in keys} >= set(blobs), keys
    finally:
        alive = srv.alive()
        rc = srv.stop()
    assert alive and rc == 0, srv.read_log()
    fsck_clean(srv)
