"""kill -9 during hundreds of concurrent uploads, round after round on the same data dir: every
acknowledged (200/201) blob survives byte-identical and fsck --verify finds no index entry
without its bytes (PRODUCT.md invariant 1)."""
import hashlib
import os
import random
import threading
import time

import pytest
import requests

from conftest import Server
from util_http import fsck, post, put, sha
from util_strace import (SYNC_CALLS, WRITE_CALLS, Tracer, ack_order_problems,
                          parse)

ROUNDS = 10
UPLOADS = 500
SPREAD = 1.5  # seconds over which a round's uploads start
TIME_BUDGET = 170  # seconds for the whole test on the sanitizer build


def blob(seed, size):
    return random.Random(seed).randbytes(size)


def upload(url, kind, data, ack, lock, key, go, delay):
    h = sha(data)
    go.wait()
    time.sleep(delay)  # spread the uploads so the kill finds them at every stage
    try:
        if kind == "put":
            r = requests.put(f"{url}/v1/blobs/{h}", data=data, timeout=30)
        elif kind == "put_chunked":
            def gen():
                for i in range(0, len(data), 16384):
                    yield data[i:i + 16384]
            r = requests.put(f"{url}/v1/blobs/sha256:{h}", data=gen(), timeout=30)
        elif kind == "post_typed":
            r = requests.post(f"{url}/v1/blobs", data=data, timeout=30,
                              headers={"Content-Type": "image/webp"})
        else:
            r = requests.post(f"{url}/v1/blobs", data=data, timeout=30)
    except Exception:  # noqa: BLE001 - refused/reset/aborted: not acknowledged (requests'
        return         # chunked path can raise urllib3 errors unwrapped)
    if r.status_code in (200, 201):
        try:
            body = r.json()
        except ValueError:
            body = r.text[:200]
        ok = isinstance(body, dict) and body.get("sha256") == h and body.get("size") == len(data)
        with lock:
            ack[key] = r.status_code if ok else ("bad body", r.status_code, body)
    else:
        with lock:
            ack[key] = ("unexpected", r.status_code, r.text[:200])


def kill9(srv):
    srv.proc.kill()
    srv.proc.wait()
    srv.proc = None
    srv.log.close()


def test_kill9_during_uploads(tmp_path):
    t0 = time.time()
    data_dir = tmp_path / "data"
    acked = {}  # hash -> (seed, size), over all rounds
    rng = random.Random(1234)
    srv = Server(data_dir).start()
    total_acked = total_lost = 0
    seed = 0
    rounds_done = 0
    for rnd in range(ROUNDS):
        tasks = []
        for _ in range(UPLOADS):
            seed += 1
            size = rng.randrange(2048, 300 * 1024)
            kind = rng.choice(["put", "put", "put_chunked", "post", "post_typed"])
            tasks.append((kind, seed, size))
        # A few re-uploads of blobs acknowledged earlier: dedup must survive the crash too.
        for h, (s, size) in list(acked.items())[:20]:
            tasks.append((rng.choice(["put", "post"]), s, size))
        rng.shuffle(tasks)
        ack, lock, go = {}, threading.Lock(), threading.Event()
        threads = [threading.Thread(target=upload, daemon=True,
                                    args=(srv.url, kind, blob(s, size), ack, lock, i, go,
                                          rng.uniform(0, SPREAD)))
                   for i, (kind, s, size) in enumerate(tasks)]
        for t in threads:
            t.start()
        go.set()
        time.sleep(rng.uniform(0.2, 0.8) * SPREAD)
        kill9(srv)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "upload threads hang after kill -9"
        bad = {k: v for k, v in ack.items() if v not in (200, 201)}
        assert not bad, f"round {rnd}: non-2xx answers {list(bad.items())[:5]}"
        this_round = {}
        for i in ack:
            kind, s, size = tasks[i]
            this_round[sha(blob(s, size))] = (s, size)
        total_acked += len(ack)
        total_lost += len(tasks) - len(ack)
        acked.update(this_round)

        # Offline check of the crashed state: no index entry without its bytes.
        rc, n, problems, out = fsck(data_dir, verify=True)
        assert rc == 0 and problems == 0, f"round {rnd}: fsck after kill -9:\n{out}"
        assert n is not None and n >= len(acked), f"round {rnd}: {n} < {len(acked)}\n{out}"

        srv = Server(data_dir).start()
        s = requests.Session()
        for h, (sd, size) in this_round.items():
            r = s.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
            assert r.status_code == 200, f"round {rnd}: acknowledged {h} -> {r.status_code}"
            assert len(r.content) == size and hashlib.sha256(r.content).hexdigest() == h
        r = s.post(f"{srv.url}/v1/lookup", json={"hashes": list(acked)}, timeout=60)
        assert r.status_code == 200
        assert r.json()["missing"] == [], f"round {rnd}: acknowledged blobs lost"
        # Uploads work again, new and dedup.
        fresh = blob(10 ** 9 + rnd, 5000)
        assert post(srv, fresh).status_code == 201
        acked[sha(fresh)] = (10 ** 9 + rnd, 5000)
        if acked:
            h, (sd, size) = next(iter(acked.items()))
            assert put(srv, blob(sd, size)).status_code == 200
        s.close()
        rounds_done += 1
        if time.time() - t0 > TIME_BUDGET:
            break

    alive = srv.alive()
    assert srv.stop() == 0, srv.read_log()
    assert alive
    rc, n, problems, out = fsck(data_dir, verify=True)
    assert rc == 0 and problems == 0, out
    print(f"crash test: {rounds_done} rounds, {total_acked} acknowledged, {total_lost} cut off, "
          f"{len(acked)} distinct blobs, {time.time() - t0:.0f}s")
    assert rounds_done >= 10, f"only {rounds_done} rounds in the time budget"
    # The kills really hit uploads in flight: some acknowledged, some cut off.
    assert total_acked >= 100 and total_lost >= 100, (total_acked, total_lost)


def test_fsck_detects_damage(tmp_path):
    """The crash test trusts fsck: prove it sees a missing, a truncated and a corrupted object."""
    srv = Server(tmp_path / "data").start()
    blobs = [blob(900 + i, 20000 + i) for i in range(3)]
    for b in blobs:
        assert put(srv, b).status_code == 201
    assert srv.stop() == 0, srv.read_log()
    d = tmp_path / "data"
    paths = [d / "blobs" / "sha256" / sha(b)[0:2] / sha(b)[2:4] / sha(b) for b in blobs]
    assert fsck(d, verify=True)[:3] == (0, 3, 0)

    paths[0].write_bytes(blobs[0][:-1])  # wrong size
    rc, n, problems, out = fsck(d)
    assert (rc, n, problems) == (1, 3, 1), out
    assert sha(blobs[0]) in out
    paths[0].write_bytes(blobs[0])

    paths[1].write_bytes(b"\x00" + blobs[1][1:])  # right size, wrong bytes
    assert fsck(d)[:3] == (0, 3, 0)
    rc, n, problems, out = fsck(d, verify=True)
    assert (rc, n, problems) == (1, 3, 1), out
    assert sha(blobs[1]) in out
    paths[1].write_bytes(blobs[1])

    paths[2].unlink()
    rc, n, problems, out = fsck(d, verify=True)
    assert (rc, n, problems) == (1, 3, 1), out
    assert sha(blobs[2]) in out


def traced_upload(tmp_path, send):
    """Starts a server, uploads under strace; returns (server data dir, calls, response)."""
    if not Tracer.available():
        pytest.skip("strace is not installed")
    srv = Server(tmp_path / "data").start()
    try:
        warm = blob(77, 1000)
        assert post(srv, warm).status_code == 201  # first-use setup (dirs, libs) out of the way
        with Tracer(srv.proc.pid, tmp_path / "strace.txt") as tr:
            assert tr.attached >= 2, "strace did not attach to the server threads"
            r = send(srv)
            time.sleep(0.3)
        calls = tr.calls()
    finally:
        assert srv.stop() == 0, srv.read_log()
    return srv, calls, r


@pytest.mark.parametrize("method", ["PUT", "POST", "PUT-chunked"])
def test_ack_after_fsync_rename_dirsync_commit(tmp_path, method):
    """PRODUCT.md: bytes fsynced, renamed, directory fsynced, then index committed, then 201.
    (kill -9 cannot lose page-cache writes, so the crash test alone would not see a missing
    fsync: this checks the order of the system calls.)"""
    data = blob(4242, 123457)
    h = sha(data)

    def send(srv):
        if method == "PUT":
            return put(srv, data)
        if method == "POST":
            return post(srv, data)
        return put(srv, iter([data[i:i + 10000] for i in range(0, len(data), 10000)]), hexd=h)

    srv, calls, r = traced_upload(tmp_path, send)
    assert r.status_code == 201, r.text
    final = os.path.realpath(srv.data_dir / "blobs" / "sha256" / h[0:2] / h[2:4] / h)
    assert ack_order_problems(calls, final, len(data)) == []


GOOD_TRACE = """\
10 openat(6, "tmp/up-1", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 13
10 write(13, "abc"..., 100) = 100
11 fsync(13) = 0
11 renameat(6, "tmp/up-1", 6, "sha256/ab/cd/abcd") = 0
11 openat(6, "sha256/ab/cd", O_RDONLY|O_CLOEXEC|O_DIRECTORY) = 14
11 fsync(14) = 0
12 writev(4, [{iov_base="x", iov_len=4096}], 1) = 4096
12 fdatasync(4) = 0
10 sendmsg(15, {msg_iov=[{iov_base="HTTP/1.1 201 Created\\r\\n"}]}, MSG_NOSIGNAL) = 300
"""


@pytest.mark.parametrize("drop,expect", [
    (None, None), ("11 fsync(13) = 0", "without an fsync"), ("11 fsync(14) = 0", "directory"),
    ("12 fdatasync(4) = 0", "index"),
])
def test_ack_order_checker_catches_bad_orders(drop, expect):
    """The strace check above must be able to fail: a missing step is reported."""
    fds0 = {4: "/d/index/data.mdb", 6: "/d/blobs"}
    text = GOOD_TRACE if drop is None else GOOD_TRACE.replace(drop + "\n", "")
    problems = ack_order_problems(parse(text, fds0), "/d/blobs/sha256/ab/cd/abcd", 100)
    if expect is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expect in problems[0], problems
    # Answer moved before the index sync: reported too.
    if drop is None:
        lines = GOOD_TRACE.splitlines()
        moved = "\n".join(lines[:6] + [lines[8]] + lines[6:8]) + "\n"
        problems = ack_order_problems(parse(moved, fds0), "/d/blobs/sha256/ab/cd/abcd", 100)
        assert len(problems) == 1 and "index" in problems[0], problems


def test_dedup_writes_nothing_syscalls(tmp_path):
    data = blob(4343, 50000)

    def send(srv):
        assert put(srv, data).status_code == 201
        time.sleep(0.2)
        return put(srv, data)

    srv, calls, r = traced_upload(tmp_path, send)
    assert r.status_code == 200
    answers = [c for c in calls if c.name in ("sendmsg", "sendto", "writev", "write")
               and "HTTP/1.1 " in c.args]
    assert [("201" in c.args, "200" in c.args) for c in answers] == [(True, False), (False, True)]
    first_done, second = answers[0].exit, answers[1]
    between = [c for c in calls if first_done < c.entry < second.entry]
    assert not [c for c in between if c.name.startswith("rename") or "O_CREAT" in c.args
                or c.name in SYNC_CALLS or c.name == "msync"
                or (c.name in WRITE_CALLS and (c.path or "").startswith(str(srv.data_dir)))], \
        between
