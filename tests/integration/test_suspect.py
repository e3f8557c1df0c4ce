"""A proxied whole-blob read whose bytes do not hash to the blob lists the location as suspect
(issue 19): the connection was already cut and counted, but nothing remembered where the wrong
bytes came from, and `--fsck` without `--verify` (size only) called the store clean. Now the
location goes into DATA_DIR/suspect and fsck hashes every suspect location whatever `--verify`
says: a problem while its bytes are wrong, a note once they hash right again. An in-place file
that moved since it was hashed is hashed again on open, and listed when it is another blob."""
import json
import os
import time

import requests

from conftest import Server
from test_verify import blobs_of, faulty, metric, raw_get  # noqa: F401 (faulty: a fixture)
from util_http import TIMEOUT, assert_error, fsck, get, sha

KiB = 1024


def test_a_proxied_mismatch_marks_the_location_suspect_for_fsck(faulty):  # noqa: F811
    data, other = blobs_of(21, [300 * KiB, 200 * KiB])
    h = sha(data)
    srv, origin = faulty([data, other])
    conf = srv.data_dir / "blobref.conf"
    rc, count, problems, out = fsck(srv.data_dir, conf)
    assert rc == 0 and problems == 0 and "suspect" not in out, out
    origin.corrupt = True
    status, headers, body = raw_get(srv, f"/v1/blobs/{h}")
    # as in test_verify: a 200 cut short, or a 503 when the origin's whole answer landed before
    # the reply's headers went out (a loaded box); never the whole corrupted body
    assert status in (200, 503), (status, headers)
    if status == 200:
        assert len(body) < len(data), "a corrupted body went out complete"
    else:
        assert json.loads(body)["error"], body
    assert metric(srv, "blobref_read_digest_mismatch_total") == 1
    lines = (srv.data_dir / "suspect").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{h} ") and lines[0].endswith(
        f" origin sha256/{h[:2]}/{h[2:4]}/{h}"), lines
    # the store still sends wrong bytes: fsck (size only) hashes the suspect location anyway
    rc, count, problems, out = fsck(srv.data_dir, conf)
    assert rc == 1 and problems == 1 and count == 2, out
    assert h in out and "SHA-256 mismatch" in out and "suspect since" in out, out
    assert sha(other) not in out  # only the suspect location was hashed
    # the store heals: the suspect location hashes right, a note, no problem
    origin.corrupt = False
    rc, count, problems, out = fsck(srv.data_dir, conf)
    assert rc == 0 and problems == 0, out
    assert f"{h}: origin:" in out and "note: suspect" in out, out
    assert get(srv, h).content == data


def test_an_inplace_file_that_moved_is_hashed_again_on_open(tmp_path):
    """An in-place file whose mtime/ctime moved past its verified_at used to be a 503 until an
    admin verified it again, even when only touched. Now it is hashed again on open: the same
    bytes are served; other bytes are a 503, counted and listed as suspect (fsck reports it)."""
    conf = (f"[server]\ncache_size = 0\n"
            f"[store local]\nkind = fs\nroot = {tmp_path / 'root'}\n")
    srv = Server(tmp_path / "data", conf).start()
    try:
        data = os.urandom(3 * 1024 * 1024)  # past the read cache: read from the file
        h, key = sha(data), "in/big.bin"
        p = tmp_path / "root" / key
        p.parent.mkdir(parents=True)
        p.write_bytes(data)
        r = requests.post(f"{srv.url}/v1/import", timeout=TIMEOUT, json={"blobs": [
            {"sha256": h, "size": len(data), "store": "local", "key": key}]})
        assert r.json()["results"][0]["result"] == "created", r.text
        later = time.time() + 5
        os.utime(p, (later, later))  # touched: mtime and ctime move, bytes the same
        r = get(srv, h)
        assert r.status_code == 200 and r.content == data, (r.status_code, r.text[:200])
        r = get(srv, h, headers={"Range": "bytes=100-199"})
        assert r.status_code == 206 and r.content == data[100:200]
        assert metric(srv, "blobref_read_digest_mismatch_total") == 0
        with open(p, "r+b") as f:  # other bytes, same size
            f.seek(len(data) // 2)
            f.write(bytes([data[len(data) // 2] ^ 0xFF]))
        assert_error(get(srv, h), 503, "store_unavailable")
        assert "hashes to another blob now" in srv.read_log()
        assert metric(srv, "blobref_read_digest_mismatch_total") == 1
        assert (srv.data_dir / "suspect").read_text().split()[3] == key
        rc, count, problems, out = fsck(srv.data_dir, srv.data_dir / "blobref.conf")
        assert rc == 1 and problems == 1 and "suspect since" in out, out
        p.write_bytes(data)  # the right bytes again
        assert get(srv, h).content == data
    finally:
        assert srv.stop() == 0
