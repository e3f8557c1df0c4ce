"""Iceberg tables whose data files are ORC (written here by orc_write.py: DIRECT_V2 strings or
binary, nulls, several stripes, NONE or ZLIB): `blobref refs` reads their hash column by the
manifest's file_format (or the file's magic when it names another format), a damaged ORC data
file fails closed, and a reconcile run keeps exactly the blobs the ORC files reference."""
import json
import subprocess
import time

from conftest import BIN_DIR
from orc_write import KIND_BINARY, KIND_STRING, NONE, ZLIB, orc_file
from reconcile_util import Api, IceTable, blob, in_form, sha, start


class OrcTable(IceTable):
    """An IceTable that can also hold ORC data files."""

    def write_orc(self, files, codec=ZLIB, stripe_rows=7, extra=(None,), fmt="ORC", rle=2):
        for name, hashes in files.items():
            vals = [in_form(h, self.form, i) for i, h in enumerate(hashes)] + list(extra)
            if self.form == "binary":
                vals = [bytes.fromhex(v) if v is not None else None for v in vals]
            kind = KIND_BINARY if self.form == "binary" else KIND_STRING
            self.data_path(name).write_bytes(orc_file(self.column, vals, kind, codec, stripe_rows,
                                                              rle))
            self.files[name] = {"hashes": list(hashes), "size": self.data_path(name).stat().st_size,
                                "count": len(vals), "content": 0, "format": fmt}
        return list(files)


def refs(t, *args):
    cmd = [str(BIN_DIR / "blobref"), "refs", str(t.root), "--column", t.column, "--form", t.form,
           "--rewrite", f"{t.prefix}/={t.root}/"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120)


def hashes(tag, n):
    return [sha(f"{tag}-{i}".encode()) for i in range(n)]


def test_refs_reads_orc_data_files(tmp_path):
    """ORC files (zlib and none, several stripes, nulls) beside a Parquet file in one table."""
    t = OrcTable(tmp_path / "orc_t")
    a, b, c = hashes("a", 20), hashes("b", 3), hashes("c", 5)
    t.write_orc({"a.orc": a}, codec=ZLIB, stripe_rows=6)
    t.write_orc({"b.orc": b}, codec=NONE, extra=(None, None))
    v1 = hashes("v1", 300)  # DIRECT with RLE v1 lengths (ORC 0.11), 3 stripes
    t.write_orc({"v1.orc": v1}, codec=ZLIB, stripe_rows=130, rle=1)
    t.write_data({"c.parquet": c})
    t.append("a.orc", "c.parquet")
    t.append("b.orc", "v1.orc")
    res = refs(t)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == sorted(set(a + b + c + v1))
    res = refs(t, "--files")
    assert res.returncode == 0, res.stderr
    assert f"{t.root}/data/a.orc" in res.stdout and f"{t.root}/data/b.orc" in res.stdout


def test_refs_binary_orc_column(tmp_path):
    t = OrcTable(tmp_path / "bin_t", form="binary", column="digest")
    d = hashes("d", 9)
    t.write_orc({"d.orc": d}, stripe_rows=4)
    t.append("d.orc")
    res = refs(t)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == sorted(d)


def test_format_falls_back_to_the_magic(tmp_path):
    """A manifest that names another format: an ORC file is still read by its magic; a file
    that is neither Parquet nor ORC fails closed with a clear error."""
    t = OrcTable(tmp_path / "magic_t")
    e = hashes("e", 4)
    t.write_orc({"e.dat": e}, fmt="UNKNOWN")
    t.append("e.dat")
    res = refs(t)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == sorted(e)
    t.data_path("x.avro").write_bytes(b"Obj\x01" + b"\x00" * 64)
    t.files["x.avro"] = {"hashes": [], "size": 68, "count": 1, "content": 0, "format": "AVRO"}
    t.append("x.avro")
    res = refs(t)
    assert res.returncode == 1 and res.stdout == ""
    assert "x.avro: live data file is neither Parquet nor ORC" in res.stderr


def test_damaged_orc_data_file_fails_closed(tmp_path):
    t = OrcTable(tmp_path / "bad_t")
    t.write_orc({"f.orc": hashes("f", 5)})
    t.append("f.orc")
    p = t.data_path("f.orc")
    raw = bytearray(p.read_bytes())
    raw[-1] = 0xFF  # the postscript length
    p.write_bytes(bytes(raw))
    res = refs(t)
    assert res.returncode == 1 and res.stdout == ""
    assert "f.orc" in res.stderr and "postscript" in res.stderr
    res = refs(t, "--column", "nope")  # a column the file does not have
    assert res.returncode == 1


def test_reconcile_with_orc_data_files(tmp_path):
    """Blobs referenced only from ORC data files stay live, unreferenced ones are quarantined;
    when the ORC file leaves the table (overwrite, expiry) its blobs are quarantined too."""
    t = OrcTable(tmp_path / "images")
    srv = start(tmp_path, t, grace="1s", retention="1h")
    api = Api(srv)
    try:
        data = {}

        def up(tag, n):
            out = []
            for i in range(n):
                bb = blob(tag, i)
                out.append(api.put(bb))
                data[out[-1]] = bb
            return out

        A, B, D = up("A", 6), up("B", 3), up("D", 4)
        t0 = time.monotonic()  # after the last upload, however long they took under load
        t.write_orc({"a.orc": A}, codec=ZLIB, stripe_rows=4)
        t.write_data({"b.parquet": B})
        t.append("a.orc", "b.parquet")
        left = t0 + 1.3 - time.monotonic()  # past the configured grace of 1 s
        if left > 0:
            time.sleep(left)
        rep = api.run()
        assert rep["blobs"]["quarantined"] == len(D), json.dumps(rep)
        assert rep["references"] == len(A + B) and rep["errors"] == []
        for h in A + B:
            assert api.code(h) == 200
        for h in D:
            assert api.code(h) == 410

        t.overwrite(remove=["a.orc"])
        t.expire(keep=1)
        rep = api.run()
        assert rep["blobs"]["quarantined"] == len(A), json.dumps(rep)
        for h in A + D:
            assert api.code(h) == 410
        for h in B:
            assert api.code(h) == 200
    finally:
        srv.stop()
