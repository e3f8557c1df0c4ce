"""Move checks run on a pool of their own (issue 19): `PUT /v1/blobs/{hash}/location` reads the
new copy back and hashes it, and did so on the 32 upload finisher threads, so a migration over a
slow store (its copies' reads blocked) held every finisher and no upload was acknowledged until
the store answered again. Now those reads run on the slow pool: uploads get their 201 while every
slow-pool thread waits on the store, and the moves still complete once it answers.

The slow store is an http store over test_verify's CorruptingOrigin with its gate closed (GETs
wait for it, HEADs answer)."""
import os
import threading

import requests

from conftest import Server
from test_verify import CorruptingOrigin, key_of, metric
from util_http import TIMEOUT, get, put, sha, wait_until

MOVES = 48  # more than the 32 finisher threads
SLOW_THREADS = 8


def pool_jobs(srv, pool):
    text = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    for line in text.splitlines():
        if line.startswith(f'blobref_pool_jobs{{pool="{pool}"}} '):
            return int(line.split()[1])
    raise AssertionError(f"no blobref_pool_jobs{{pool={pool}}} in /metrics")


def test_uploads_are_acknowledged_while_moves_wait_on_a_blocked_store(tmp_path):
    site = tmp_path / "site"
    blobs = [os.urandom(3000) for _ in range(MOVES)]
    for b in blobs:  # the copies a migration made, already at the target
        p = site / key_of(sha(b))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b)
    origin = CorruptingOrigin(site)
    conf = (f"[server]\nupload_store = a\ncache_size = 0\ndrain_grace = 1h\n"
            f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
            f"[store slow]\nkind = http\nurl = {origin.url}\nserve = proxy\n"
            f"stall_timeout = 2m\ntimeout = 5m\n")
    srv = Server(tmp_path / "data", conf).start()
    gate = threading.Event()
    try:
        for b in blobs:
            assert put(srv, b).status_code == 201
        origin.gate = gate  # closed: the copies' reads wait
        results = [None] * MOVES

        def move(i):
            h = sha(blobs[i])
            body = {"expect": {"store": "a", "key": key_of(h)},
                    "to": {"store": "slow", "key": key_of(h)}}
            try:
                results[i] = requests.put(f"{srv.url}/v1/blobs/{h}/location", json=body,
                                          timeout=120).status_code
            except requests.RequestException as e:
                results[i] = repr(e)

        threads = [threading.Thread(target=move, args=(i,)) for i in range(MOVES)]
        for t in threads:
            t.start()
        # every move handed to the slow pool, each of its threads waiting on the store
        assert wait_until(lambda: origin.waiting == SLOW_THREADS
                          and pool_jobs(srv, "slow") == MOVES, 30), \
            (origin.waiting, pool_jobs(srv, "slow"))
        # uploads are acknowledged meanwhile (each needs a finisher thread)
        fresh = [os.urandom(5000) for _ in range(20)]
        for b in fresh:
            r = put(srv, b)
            assert r.status_code == 201, r.text
        assert pool_jobs(srv, "finish") == 0
        assert origin.waiting == SLOW_THREADS and not any(results)  # the moves still wait
        gate.set()
        for t in threads:
            t.join(150)
        assert results == [200] * MOVES, results
        for b in fresh + blobs:
            assert requests.get(f"{srv.url}/v1/blobs/{sha(b)}", timeout=TIMEOUT).content == b
        assert metric(srv, "blobref_read_digest_mismatch_total") == 0
    finally:
        gate.set()
        assert srv.stop() == 0
        origin.close()


def same_stripe_pair():
    """Two blobs whose hashes share their first byte (the stripe, when there were 256) but not
    the next 4 bits (apart with 4096 stripes)."""
    first = os.urandom(2000)
    while True:
        other = os.urandom(2000)
        a, b = bytes.fromhex(sha(first)), bytes.fromhex(sha(other))
        if a[0] == b[0] and (a[1] & 0xF) != (b[1] & 0xF):
            return first, other


def test_an_upload_does_not_wait_for_another_blobs_move_on_its_stripe(tmp_path):
    """A move holds its blob's stripe while it checks the new copy is still there (a HEAD on an
    http store). With 256 stripes by the hash's first byte, an upload of an unrelated blob with
    the same first byte waited for that HEAD; with 4096 it does not."""
    moved, fresh = same_stripe_pair()
    h = sha(moved)
    site = tmp_path / "site"
    (site / key_of(h)).parent.mkdir(parents=True)
    (site / key_of(h)).write_bytes(moved)
    origin = CorruptingOrigin(site)
    conf = (f"[server]\nupload_store = a\ncache_size = 0\ndrain_grace = 1h\n"
            f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
            f"[store slow]\nkind = http\nurl = {origin.url}\nserve = proxy\n"
            f"stall_timeout = 2m\ntimeout = 5m\n")
    srv = Server(tmp_path / "data", conf).start()
    gate = threading.Event()
    try:
        assert put(srv, moved).status_code == 201
        origin.head_gate = [key_of(h), 1, gate]  # the hash's HEAD passes, the stripe's waits
        result = []
        body = {"expect": {"store": "a", "key": key_of(h)},
                "to": {"store": "slow", "key": key_of(h)}}
        t = threading.Thread(target=lambda: result.append(requests.put(
            f"{srv.url}/v1/blobs/{h}/location", json=body, timeout=120).status_code))
        t.start()
        assert wait_until(lambda: origin.waiting == 1, 30)  # the move holds its stripe
        r = put(srv, fresh)
        assert r.status_code == 201, r.text
        assert not result and origin.waiting == 1
        gate.set()
        t.join(60)
        assert result == [200]
        assert get(srv, h).content == moved and get(srv, sha(fresh)).content == fresh
    finally:
        gate.set()
        assert srv.stop() == 0
        origin.close()
