"""blobrefd --export-index / --import-index: a single-node LMDB index moved into PostgreSQL and
back answers /meta byte-identical for every blob (live, quarantined, held, moved with a draining
copy) with its pending CDN purges; a corrupted file is refused before anything is written; an
import killed with -9 mid-way completes on a rerun with the right counts."""
import json
import os
import re
import subprocess
import time

import requests

from conftest import BIN_DIR, Server, free_port
from pgutil import wait_until
from reconcile_util import Api, IceTable, blob, recon_conf, sha
from test_move import key_of, move, place
from test_purge_durable import cdn_section, pending

TIMEOUT = 30


SERVER = "upload_store = a\ndrain_grace = 1h\ncache_size = 0\ndedup_touch_interval = 0s\n"


def stores(tmp_path):
    return (f"[server]\n{SERVER}"
            f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
            f"[store b]\nkind = fs\nroot = {tmp_path / 'b'}\n")


def pg_index(dsn):
    return f"[index]\nkind = postgres\ndsn = {dsn}\n"


def blobrefd(*args, data_dir, conf, timeout=120):
    """Runs blobrefd with args on data_dir and the config text conf; returns (rc, output)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "tool.conf"
    path.write_text(conf)
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")
    p = subprocess.run([str(BIN_DIR / "blobrefd"), *map(str, args), "-c", str(path), "--data",
                        str(data_dir)], capture_output=True, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def import_items(srv, root, blobs):
    """Writes blobs into store a's root and imports them; returns their hashes."""
    items = []
    for data in blobs:
        h = sha(data)
        place(root, key_of(h), data)
        items.append({"sha256": h, "size": len(data), "store": "a", "key": key_of(h)})
    for at in range(0, len(items), 1000):
        r = requests.post(f"{srv.url}/v1/import", json={"blobs": items[at:at + 1000]},
                          timeout=120)
        assert r.status_code == 200, r.text
    return [i["sha256"] for i in items]


def metas(srv, hashes):
    out = {}
    for h in hashes:
        r = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
        assert r.status_code == 200, (h, r.status_code, r.text)
        out[h] = r.content
    return out


def lmdb_with_states(tmp_path):
    """A server on LMDB with 300 blobs: 240 live, 30 quarantined by reconcile, 15 held by an
    admin, 15 moved to store b (their copy in a draining), purges pending (the edge is down).
    Returns (server, config text, hashes, expected state by hash)."""
    t = IceTable(tmp_path / "table")
    blobs = [blob("move", i) for i in range(300)]
    referenced = [sha(b) for b in blobs[:240] + blobs[270:]]
    t.write_data({"f1.parquet": referenced})
    t.append("f1.parquet")
    dead = f"http://127.0.0.1:{free_port()}"
    conf = recon_conf(t, grace="1s", server_extra=SERVER) + cdn_section(dead)
    conf += stores(tmp_path).split("\n", len(SERVER.splitlines()) + 1)[-1]
    srv = Server(tmp_path / "lmdb", conf).start()
    hashes = import_items(srv, tmp_path / "a", blobs)
    api = Api(srv)
    # runs until the 30 unreferenced blobs are past the grace (1 s) and quarantined
    done = 0
    deadline = time.monotonic() + 30
    while done < 30 and time.monotonic() < deadline:
        rep = api.run()
        done += rep["blobs"]["quarantined"]
    assert done == 30, rep
    for h in hashes[255:270]:
        assert requests.delete(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200
    for data in blobs[285:]:
        h = sha(data)
        place(tmp_path / "b", key_of(h), data)
        r = move(srv, h, ("a", key_of(h)), ("b", key_of(h)), verify="size")
        assert r.status_code == 200, r.text
    return srv, conf, hashes


def states(meta):
    """Each /meta's state, "held" for an admin's quarantine."""
    def one(m):
        j = json.loads(m)
        return "held" if j.get("quarantine", {}).get("by") == "admin" else j["state"]
    return sorted(one(m) for m in meta.values())


def test_lmdb_to_postgres_and_back_is_identical(tmp_path, postgres):
    srv, conf, hashes = lmdb_with_states(tmp_path)
    try:
        before = metas(srv, hashes)
        purges = pending(srv)
        assert purges >= 30, purges
        # export beside the serving server (read-only, no lock); import into its DATA_DIR refused
        rc, out = blobrefd("--export-index", tmp_path / "one.idx", data_dir=srv.data_dir,
                           conf=conf)
        assert rc == 0, out
        assert f"export: 300 records, {purges} pending purges from the lmdb index" in out, out
        rc, out = blobrefd("--import-index", tmp_path / "one.idx", data_dir=srv.data_dir,
                           conf=conf)
        assert rc == 2 and "in use by another blobrefd" in out, out
    finally:
        assert srv.stop() == 0, srv.read_log()
    assert not (tmp_path / "one.idx.tmp").exists()
    st = states(before)
    assert st.count("quarantined") == 15 and st.count("held") == 15, st
    assert any(b'"draining"' in m for m in before.values()), before[hashes[-1]]

    dsn = postgres.database()
    pg_conf = conf + pg_index(dsn)
    rc, out = blobrefd("--import-index", tmp_path / "one.idx", data_dir=tmp_path / "pg",
                       conf=pg_conf)
    assert rc == 0, out
    assert "300 inserted, 0 present already, 0 conflicting" in out, out
    assert "300 of 300 records are in the postgres index as in the file: complete" in out, out
    db = dsn.split("dbname=")[1]
    owners = postgres.psql("SELECT count(*) FROM blobref_owners", dbname=db)
    assert owners == [["315"]], owners  # one per location: 15 moved blobs have two

    pg = Server(tmp_path / "pg", pg_conf).start()
    try:
        assert metas(pg, hashes) == before
        assert pending(pg) == purges
        for i, h in enumerate(hashes):
            r = requests.get(f"{pg.url}/v1/blobs/{h}", timeout=TIMEOUT)
            want = 410 if 240 <= i < 270 else 200
            assert r.status_code == want, (i, r.status_code)
            if want == 200:
                assert r.content == blob("move", i)
        rc, out = blobrefd("--export-index", tmp_path / "two.idx", data_dir=tmp_path / "pg2",
                           conf=pg_conf)
        assert rc == 0, out
    finally:
        assert pg.stop() == 0, pg.read_log()
    # the same records and purges in the same order: the same file
    assert (tmp_path / "two.idx").read_bytes() == (tmp_path / "one.idx").read_bytes()

    rc, out = blobrefd("--import-index", tmp_path / "two.idx", data_dir=tmp_path / "back",
                       conf=conf)
    assert rc == 0 and "300 of 300 records are in the lmdb index" in out, out
    back = Server(tmp_path / "back", conf).start()
    try:
        assert metas(back, hashes) == before
        assert pending(back) == purges
        # a record changed in the target since: a rerun reports it and changes nothing
        assert requests.delete(f"{back.url}/v1/blobs/{hashes[0]}",
                               timeout=TIMEOUT).status_code == 200
        changed = requests.get(f"{back.url}/v1/blobs/{hashes[0]}/meta", timeout=TIMEOUT).content
    finally:
        assert back.stop() == 0, back.read_log()
    rc, out = blobrefd("--import-index", tmp_path / "two.idx", data_dir=tmp_path / "back",
                       conf=conf)
    assert rc == 1, out
    assert f"{hashes[0]}: present with a different record" in out, out
    assert "0 inserted, 299 present already, 1 conflicting" in out, out
    back = Server(tmp_path / "back", conf).start()
    try:
        assert requests.get(f"{back.url}/v1/blobs/{hashes[0]}/meta",
                            timeout=TIMEOUT).content == changed
    finally:
        assert back.stop() == 0, back.read_log()


def small_export(tmp_path, n):
    conf = stores(tmp_path)
    srv = Server(tmp_path / "src", conf).start()
    try:
        hashes = import_items(srv, tmp_path / "a", [blob("kill", i, 50) for i in range(n)])
    finally:
        assert srv.stop() == 0, srv.read_log()
    path = tmp_path / "src.idx"
    rc, out = blobrefd("--export-index", path, data_dir=tmp_path / "src", conf=conf)
    assert rc == 0 and f"export: {n} records, 0 pending purges" in out, out
    return conf, path, hashes


def test_corrupted_file_is_refused_before_anything_is_written(tmp_path, postgres):
    conf, path, _ = small_export(tmp_path, 20)
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    bad = tmp_path / "bad.idx"
    for content, why in ((bytes(flipped), "SHA-256 mismatch"), (good[:-5], "truncated"),
                         (good[:40], "truncated"), (b"not an export\n", "not an index export")):
        bad.write_bytes(content)
        rc, out = blobrefd("--import-index", bad, data_dir=tmp_path / "lm", conf=conf)
        assert rc == 2 and why in out and "nothing was written" in out, out
        assert not (tmp_path / "lm" / "index").exists()
    dsn = postgres.database()
    rc, out = blobrefd("--import-index", bad, data_dir=tmp_path / "pgd", conf=conf + pg_index(dsn))
    assert rc == 2 and "refusing to import" in out, out
    db = dsn.split("dbname=")[1]
    assert postgres.psql("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'blobref%'",
                         dbname=db) == [["0"]]


def test_import_killed_mid_way_completes_on_a_rerun(tmp_path, postgres):
    n = 3000
    conf, path, hashes = small_export(tmp_path, n)
    dsn = postgres.database()
    pg_conf = conf + pg_index(dsn)
    db = dsn.split("dbname=")[1]
    (tmp_path / "pg").mkdir()
    (tmp_path / "pg" / "tool.conf").write_text(pg_conf)
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")
    proc = subprocess.Popen([str(BIN_DIR / "blobrefd"), "--import-index", str(path), "-c",
                             str(tmp_path / "pg" / "tool.conf"), "--data", str(tmp_path / "pg")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def rows():
        try:
            got = postgres.psql("SELECT count(*) FROM blobref_blobs", dbname=db)
            return int(got[0][0])
        except Exception:  # the schema is not there yet
            return 0
    try:
        assert wait_until(lambda: rows() > 0, timeout=60, step=0.01)
    finally:
        proc.kill()
        proc.wait()
    done = rows()
    assert 0 < done < n, f"the kill came too late ({done} of {n} imported)"
    rc, out = blobrefd("--import-index", path, data_dir=tmp_path / "pg", conf=pg_conf)
    assert rc == 0, out
    m = re.search(r"(\d+) inserted, (\d+) present already, 0 conflicting", out)
    assert m and int(m.group(2)) == done and int(m.group(1)) == n - done, out
    assert f"{n} of {n} records are in the postgres index as in the file: complete" in out, out
    assert rows() == n
