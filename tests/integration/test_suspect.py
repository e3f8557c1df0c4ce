"""A proxied whole-blob read whose bytes do not hash to the blob lists the location as suspect
(issue 19): the connection was already cut and counted, but nothing remembered where the wrong
bytes came from, and `--fsck` without `--verify` (size only) called the store clean. Now the
location goes into DATA_DIR/suspect and fsck hashes every suspect location whatever `--verify`
says: a problem while its bytes are wrong, a note once they hash right again."""
from test_verify import blobs_of, faulty, metric, raw_get  # noqa: F401 (faulty: a fixture)
from util_http import fsck, get, sha

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
    assert status == 200 and len(body) < len(data)
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
