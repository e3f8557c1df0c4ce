"""Import and location switch jobs across a cluster (issue 20, "work that must run once"): two
blobrefd nodes over one PostgreSQL index and two shared fs stores. A migrate job on node A is cut
short by kill -9 of A mid-way; the same migrate on node B moves what is left, B drains every old
copy (A's included), and every blob reads back from B, its one copy in the target store; the same
switch raced on both nodes is done once; an import killed with A is finished by B, each file
indexed once. Jobs are kept in the node's --data: another node finishes them when the same job
is started there, it does not take them over by itself."""
import hashlib
import random
import re
import signal
import subprocess

import requests

from cluster_util import wait_for
from conftest import BIN_DIR, Server

TIMEOUT = 30
N = 30


def sha(data):
    return hashlib.sha256(data).hexdigest()


def key_of(h):
    return f"sha256/{h[:2]}/{h[2:4]}/{h}"


def node(tmp_path, name, dsn):
    conf = (f"[server]\nupload_store = a\ndrain_grace = 1s\ncache_size = 0\n"
            f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
            f"[store b]\nkind = fs\nroot = {tmp_path / 'b'}\n"
            f"[index]\nkind = postgres\ndsn = {dsn}\n")
    return Server(tmp_path / name, conf)


def locations(srv, blobs):
    """{hash: sorted (store, role) of its locations} as srv's index has them."""
    out = {}
    with requests.Session() as s:
        for h in blobs:
            meta = s.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
            out[h] = sorted((loc["store"], loc["role"]) for loc in meta["locations"])
    return out


def migrate(srv, *extra):
    return [str(BIN_DIR / "blobref"), "--server", srv.url, "migrate", "--from", "a", "--to", "b",
            *extra]


def test_migrate_cut_short_by_a_killed_node_is_finished_on_the_other(tmp_path, postgres):
    dsn = postgres.database()
    a, b = node(tmp_path, "na", dsn), node(tmp_path, "nb", dsn)
    a.start()
    b.start()
    killed = False
    try:
        rnd = random.Random(20)
        blobs = {}
        with requests.Session() as s:
            for i in range(N):
                d = rnd.randbytes(rnd.choice([500, 20_000, 100_000])) + i.to_bytes(4, "big")
                blobs[sha(d)] = d
                assert s.put(f"{a.url}/v1/blobs/{sha(d)}", data=d,
                             timeout=TIMEOUT).status_code == 201
        # A's job, slowed down (0.5 MB/s), is killed with A once it has switched a few blobs
        follower = subprocess.Popen(migrate(a, "--rate", "0.5", "--concurrency", "2"),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def moved():
            return sum(1 for locs in locations(b, blobs).values() if ("b", "primary") in locs)

        wait_for(lambda: moved() >= 3, 60, "A's job to switch a few blobs", step=0.05)
        a.stop(signal.SIGKILL)
        killed = True
        follower.kill()
        follower.wait()
        before = moved()
        assert before < N, "A's job ended before the kill: nothing was proved"
        r = subprocess.run(migrate(b), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"moved (\d+) of (\d+) .*; (\d+) already in b", r.stdout)
        assert m and int(m[1]) == int(m[2]) and int(m[2]) + int(m[3]) == N, r.stdout
        # B drains every old copy, those of A's switches too: one copy left, in b
        wait_for(lambda: all(locs == [("b", "primary")] for locs in
                             locations(b, blobs).values()), 60, "B to drain every old copy")
        with requests.Session() as s:
            for h, d in blobs.items():
                assert not (tmp_path / "a" / key_of(h)).exists(), h
                assert (tmp_path / "b" / key_of(h)).read_bytes() == d
                g = s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT)
                assert g.status_code == 200 and g.content == d
        print(f"\nA killed after {before} of {N} switches; B's migrate: {m[0]}")
    finally:
        alive = b.alive()
        rc = b.stop()
        if not killed:
            a.stop()
    assert alive and rc == 0, b.read_log()[-3000:]


def test_same_location_switch_raced_on_two_nodes_is_done_once(tmp_path, postgres):
    """The switch's expectation is checked in the database under the blob's lock, not in a node's
    cache: the same switch (expect a, to b) sent to both nodes at once, for blobs both nodes have
    just served, is done by one (200) and refused by the other (409 location_changed), and the
    blob ends with one primary in b and one draining copy in a."""
    import threading
    dsn = postgres.database()
    a, b = node(tmp_path, "na", dsn), node(tmp_path, "nb", dsn)
    a.start()
    b.start()
    try:
        for i in range(10):
            d = random.Random(i).randbytes(3000) + b"race"
            h, k = sha(d), key_of(sha(d))
            assert requests.put(f"{a.url}/v1/blobs/{h}", data=d, timeout=TIMEOUT).status_code \
                == 201
            for n in (a, b):  # both have it cached with its location in a
                assert requests.get(f"{n.url}/v1/blobs/{h}", timeout=TIMEOUT).content == d
            p = tmp_path / "b" / k
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(d)
            body = {"expect": {"store": "a", "key": k}, "to": {"store": "b", "key": k},
                    "verify": "sha256"}
            gate, out = threading.Barrier(2), [None, None]

            def switch(j, n):
                gate.wait()
                out[j] = requests.put(f"{n.url}/v1/blobs/{h}/location", json=body,
                                      timeout=TIMEOUT)

            ts = [threading.Thread(target=switch, args=(j, n)) for j, n in enumerate((a, b))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            codes = sorted(r.status_code for r in out)
            assert codes == [200, 409], [(r.status_code, r.text) for r in out]
            lost = [r for r in out if r.status_code == 409][0]
            assert lost.json()["error"]["code"] == "location_changed", lost.text
            locs = locations(b, [h])[h]
            assert ("b", "primary") in locs and sum(1 for s, _ in locs if s == "a") <= 1, locs
    finally:
        rcs = [n.stop() for n in (a, b)]
    assert rcs == [0, 0], a.read_log()[-2000:] + b.read_log()[-2000:]


def test_import_cut_short_by_a_killed_node_is_finished_on_the_other(tmp_path, postgres):
    """An in-place import job on node A, killed -9 with A once it has indexed some files, is
    finished by the same import on node B: every file ends indexed once, at its own key, and
    the files A indexed are skipped (not indexed twice)."""
    dsn = postgres.database()
    a, b = node(tmp_path, "na", dsn), node(tmp_path, "nb", dsn)
    folder = tmp_path / "a" / "photos"
    folder.mkdir(parents=True)
    files = {}
    for i in range(400):
        data = random.Random(i).randbytes(30_000) + i.to_bytes(4, "big")
        (folder / f"p{i:03d}.jpg").write_bytes(data)
        files[sha(data)] = (f"photos/p{i:03d}.jpg", data)
    a.start()
    b.start()
    killed = False
    try:
        r = requests.post(f"{a.url}/v1/jobs", json={"kind": "import", "store": "a",
                                                    "source": "photos/"}, timeout=TIMEOUT)
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        wait_for(lambda: requests.get(f"{a.url}/v1/jobs/{jid}", timeout=TIMEOUT)
                        .json()["items_done"] >= 10 or None, 60, "A's import to index some files",
                        step=0.01)
        a.stop(signal.SIGKILL)
        killed = True
        indexed = sum(1 for h in files if requests.head(f"{b.url}/v1/blobs/{h}",
                                                        timeout=TIMEOUT).status_code == 200)
        assert 0 < indexed < len(files), f"{indexed} indexed at the kill: nothing was proved"
        r = requests.post(f"{b.url}/v1/jobs", json={"kind": "import", "store": "a",
                                                    "source": "photos/"}, timeout=TIMEOUT)
        assert r.status_code == 202, r.text
        jb = r.json()["id"]
        end = wait_for(lambda: (lambda j: j if j["state"] not in ("queued", "running") else None)(
            requests.get(f"{b.url}/v1/jobs/{jb}", timeout=TIMEOUT).json()), 120,
            "B's import to end", step=0.1)
        assert end["state"] == "done", end
        assert end["items_done"] + end["items_skipped"] == len(files), end
        assert end["items_skipped"] >= indexed, (end, indexed)
        with requests.Session() as s:
            for h, (key, data) in files.items():
                meta = s.get(f"{b.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
                assert [(loc["store"], loc["key"]) for loc in meta["locations"]] == [("a", key)]
                assert s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data
        print(f"\nA killed with {indexed} of {len(files)} indexed; B's import: "
              f"{end['items_done']} done, {end['items_skipped']} skipped")
    finally:
        alive = b.alive()
        rc = b.stop()
        if not killed:
            a.stop()
    assert alive and rc == 0, b.read_log()[-3000:]
