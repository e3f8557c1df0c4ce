"""Confinement of fs stores (issue 18, PRODUCT.md invariant 10): nothing outside a store's root is
read, written or deleted. The three attacks, against the real blobrefd: an import of a symlink
(or hard link, or tmp/) key; an imported file swapped for a symlink (or a hard link, or its
directory for a symlink) after the import; the drain of an old copy through a directory replaced
by a symlink."""
import hashlib
import os

import requests

from conftest import Server
from util_http import wait_until

CONFINED = "key leaves the store root or is a symlink"


def conf_text(tmp_path):
    return f"""[server]
upload_store = a
cache_size = 0
drain_grace = 2s
[store a]
kind = fs
root = {tmp_path / 'a'}
[store b]
kind = fs
root = {tmp_path / 'b'}
"""


def sha(data):
    return hashlib.sha256(data).hexdigest()


def write(p, data):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def import_keys(srv, items):
    """POSTs /v1/import of (key, bytes) in store a; returns {key: (result, message)}."""
    body = {"blobs": [{"sha256": sha(d), "size": len(d), "store": "a", "key": k}
                      for k, d in items]}
    r = requests.post(f"{srv.url}/v1/import", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return {x["key"]: (x["result"], x.get("message", "")) for x in r.json()["results"]}


def swap_for_symlink(path, target):
    """Atomically replaces path by a symbolic link to target."""
    tmp = path.with_name(path.name + ".swap")
    os.symlink(target, tmp)
    os.replace(tmp, path)


def test_import_of_symlink_hardlink_and_tmp_keys_is_refused(tmp_path):
    root, out = tmp_path / "a", tmp_path / "outside"
    secret = write(out / "secret.txt", b"root:$6$not-for-you:19000:0:99999:7:::\n")
    linked = write(out / "linked.bin", os.urandom(4000))
    srv = Server(tmp_path / "data", conf_text(tmp_path)).start()
    try:
        ok = os.urandom(3000)
        write(root / "images" / "ok.jpg", ok)
        os.symlink(secret, root / "images" / "evil.jpg")
        os.symlink(out, root / "lnk")
        os.link(linked, root / "images" / "hard.jpg")
        tmp_bytes = os.urandom(100)
        write(root / "tmp" / "up-1-0000", tmp_bytes)
        res = import_keys(srv, [("images/ok.jpg", ok), ("images/evil.jpg", secret.read_bytes()),
                                ("lnk/secret.txt", secret.read_bytes()),
                                ("images/hard.jpg", linked.read_bytes()),
                                ("tmp/up-1-0000", tmp_bytes)])
        assert res["images/ok.jpg"] == ("created", ""), res
        for key in ("images/evil.jpg", "lnk/secret.txt"):
            assert res[key][0] == "error" and CONFINED in res[key][1], res
        assert res["images/hard.jpg"][0] == "error" and "hard links" in res["images/hard.jpg"][1]
        assert res["tmp/up-1-0000"][0] == "error" and "tmp/ directory" in res["tmp/up-1-0000"][1]
        # nothing indexed, nothing served for them; the regular file is
        for data in (secret.read_bytes(), linked.read_bytes(), tmp_bytes):
            assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}/meta").status_code == 404
            assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}").status_code == 404
        g = requests.get(f"{srv.url}/v1/blobs/{sha(ok)}")
        assert g.status_code == 200 and g.content == ok
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_imported_file_swapped_after_the_import_is_not_served(tmp_path):
    root, out = tmp_path / "a", tmp_path / "outside"
    srv = Server(tmp_path / "data", conf_text(tmp_path)).start()
    try:
        blobs = {k: os.urandom(200_000) for k in ("images/x.bin", "dir2/y.bin", "images/z.bin")}
        for k, d in blobs.items():
            write(root / k, d)
        res = import_keys(srv, list(blobs.items()))
        assert all(r == ("created", "") for r in res.values()), res
        for d in blobs.values():
            g = requests.get(f"{srv.url}/v1/blobs/{sha(d)}")
            assert g.status_code == 200 and g.content == d
        # the same bytes outside the root: only confinement tells them apart
        x = blobs["images/x.bin"]
        swap_for_symlink(root / "images" / "x.bin", write(out / "x.bin", x))
        os.rename(root / "dir2", out / "dir2")
        os.symlink(out / "dir2", root / "dir2")
        z = blobs["images/z.bin"]
        os.link(write(out / "z.bin", z), root / "images" / "z.new")
        os.replace(root / "images" / "z.new", root / "images" / "z.bin")
        for key, data, why in (("images/x.bin", x, CONFINED),
                               ("dir2/y.bin", blobs["dir2/y.bin"], CONFINED),
                               ("images/z.bin", z, "hard links")):
            g = requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=30)
            assert g.status_code == 503 and g.content != data, (key, g.status_code)
            g = requests.get(f"{srv.url}/v1/blobs/{sha(data)}", headers={"Range": "bytes=0-9"})
            assert g.status_code == 503 and g.content != data[:10], (key, g.status_code)
            assert why in g.json()["error"]["message"], g.text
        # the files outside are untouched
        assert (out / "x.bin").read_bytes() == x and (out / "z.bin").read_bytes() == z
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_drain_through_a_directory_replaced_by_a_symlink_deletes_nothing_outside(tmp_path):
    root, out = tmp_path / "a", tmp_path / "outside"
    srv = Server(tmp_path / "data", conf_text(tmp_path)).start()
    try:
        data = os.urandom(5000)
        h = sha(data)
        r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data)
        assert r.status_code == 201, r.text
        key = f"sha256/{h[:2]}/{h[2:4]}/{h}"
        write(tmp_path / "b" / key, data)
        body = {"expect": {"store": "a", "key": key}, "to": {"store": "b", "key": key},
                "verify": "sha256"}
        r = requests.put(f"{srv.url}/v1/blobs/{h}/location", json=body)
        assert r.status_code == 200, r.text
        # before drain_grace (2 s) is over: a's sha256/<ab> goes outside, a symlink takes its place
        out.mkdir()
        os.rename(root / "sha256" / h[:2], out / h[:2])
        os.symlink(out / h[:2], root / "sha256" / h[:2])
        outside = out / h[:2] / h[2:4] / h
        assert outside.read_bytes() == data
        refused = f"deleting draining copy a:{key}: store a: delete {key}: {CONFINED}"
        deleted = f"draining copy a:{key} deleted"
        assert wait_until(lambda: refused in srv.read_log() or deleted in srv.read_log(),
                          timeout=15), srv.read_log()
        assert outside.exists(), "the drain deleted a file outside the store:\n" + srv.read_log()
        assert refused in srv.read_log()
        meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta").json()
        assert {(l["store"], l["role"]) for l in meta["locations"]} == {("b", "primary"),
                                                                       ("a", "draining")}
        g = requests.get(f"{srv.url}/v1/blobs/{h}")
        assert g.status_code == 200 and g.content == data
    finally:
        assert srv.stop() == 0, srv.read_log()
