"""`blobref refs` on Iceberg tables generated here: Parquet written by DuckDB (every codec, both
page versions), manifests and manifest lists written by avsc with the spec's Avro schemas, and
metadata.json per the spec (v1 and v2). Expected hashes are the ones written."""
import gzip
import hashlib
import json
import os
import subprocess

import pytest

from conftest import BIN_DIR, JS_DIR, ROOT

WRITER = ROOT / "tests" / "integration" / "iceberg_write.mjs"
PREFIX = "s3://warehouse/db/t"  # where the tables say they live


def sha(i, salt="x"):
    return hashlib.sha256(f"{salt}-{i}".encode()).hexdigest()


def in_form(h, form, i=0):
    if form == "hex":
        return [h, h.upper(), "sha256:" + h][i % 3]
    if form == "url":
        return [f"https://cdn.example/img/sha256/{h[:2]}/{h[2:4]}/{h}",
                f"s3://bucket/ab/{h}.jpg?v=1"][i % 2]
    return h  # binary: the writer unhexes


class Table:
    """Collects a table's files, then writes them through the node helper."""

    def __init__(self, root, version=2, avro_codec="deflate", form="hex", column="image_sha256"):
        self.root, self.version, self.codec, self.form, self.column = root, version, avro_codec, form, column
        (root / "metadata").mkdir(parents=True)
        (root / "data").mkdir()
        self.job = {"parquet": [], "avro": []}
        self.hashes = {}  # data file name -> hashes written

    def rec(self, rel):
        return f"{PREFIX}/{rel}"

    def data(self, name, hashes, codec="snappy", page_version=1, extra=()):
        vals = [in_form(h, self.form, i) for i, h in enumerate(hashes)] + list(extra)
        self.job["parquet"].append({"path": str(self.root / "data" / name), "column": self.column,
                                    "form": self.form, "values": vals, "codec": codec,
                                    "page_version": page_version})
        self.hashes[name] = set(hashes)
        return name

    def manifest(self, name, entries, meta=None):
        """entries: (status, data file name or path, content, format)."""
        recs = []
        for status, f, *rest in entries:
            content = rest[0] if rest else 0
            fmt = rest[1] if len(rest) > 1 else "PARQUET"
            df = {"file_path": self.rec(f"data/{f}"), "file_format": fmt,
                  "column_sizes": [[1, 10], [2, 20]], "lower_bounds": [[2, "abc"]]}
            if self.version >= 2:
                df["content"] = content
            recs.append({"status": status, "snapshot_id": 1, "data_file": df})
        self.job["avro"].append({"path": str(self.root / "metadata" / name), "kind": "manifest",
                                 "version": self.version, "codec": self.codec,
                                 "meta": meta if meta is not None else
                                 {"format-version": str(self.version)}, "records": recs})
        return name, len(entries), content_of(entries)

    def manifest_list(self, name, manifests, counts=True):
        recs = []
        for mname, n, content in manifests:
            r = {"manifest_path": self.rec(f"metadata/{mname}"), "added_snapshot_id": 1}
            if self.version >= 2:
                r.update(content=content, sequence_number=1, min_sequence_number=1,
                         added_files_count=n if counts else 0, existing_files_count=0,
                         deleted_files_count=0)
            else:
                r.update(added_data_files_count=n if counts else None,
                         existing_data_files_count=0 if counts else None,
                         deleted_data_files_count=0 if counts else None)
            recs.append(r)
        self.job["avro"].append({"path": str(self.root / "metadata" / name), "kind": "list",
                                 "version": self.version, "codec": self.codec, "records": recs})
        return self.rec(f"metadata/{name}")

    def metadata(self, n, snapshots, gz=False, name=None):
        """snapshots: (id, manifest-list path) or (id, [manifest names]) for v1 inline."""
        snaps = []
        for sid, ml in snapshots:
            s = {"snapshot-id": sid, "timestamp-ms": 1700000000000 + sid, "summary": {"operation": "append"}}
            if isinstance(ml, list):
                s["manifests"] = [self.rec(f"metadata/{m[0]}") for m in ml]
            else:
                s["manifest-list"] = ml
            if self.version >= 2:
                s["sequence-number"] = sid
            snaps.append(s)
        md = {"format-version": self.version, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
              "location": PREFIX, "last-updated-ms": 1700000000000, "last-column-id": 2,
              "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                  {"id": 1, "name": "id", "required": False, "type": "int"},
                  {"id": 2, "name": self.column, "required": False,
                   "type": "binary" if self.form == "binary" else "string"}]}],
              "current-schema-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
              "default-spec-id": 0, "properties": {},
              "current-snapshot-id": snaps[-1]["snapshot-id"] if snaps else -1,
              "snapshots": snaps}
        if self.version >= 2:
            md["last-sequence-number"] = len(snaps)
        data = json.dumps(md, indent=2).encode()
        name = name or (f"v{n}.gz.metadata.json" if gz else f"v{n}.metadata.json")
        (self.root / "metadata" / name).write_bytes(gzip.compress(data) if gz else data)
        return self.root / "metadata" / name

    def hint(self, text):
        (self.root / "metadata" / "version-hint.text").write_text(text)

    def write(self):
        job = self.root.parent / (self.root.name + "-job.json")
        job.write_text(json.dumps(self.job))
        subprocess.run(["node", str(WRITER), str(job)], cwd=JS_DIR, check=True, timeout=120,
                       env=dict(os.environ, NODE_PATH=str(JS_DIR / "node_modules")))

    def expect(self, *names):
        return sorted(set().union(*(self.hashes[n] for n in names)))


def content_of(entries):
    return 1 if entries and all((e[2] if len(e) > 2 else 0) != 0 for e in entries) else 0


def refs(table, *args, rewrite=True):
    cmd = [str(BIN_DIR / "blobref"), "refs", str(table)]
    if rewrite:
        cmd += ["--rewrite", f"{PREFIX}/={table if os.path.isdir(table) else table.parent.parent}/"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120)


def build_history(tmp_path, version=2, form="hex", avro_codec="deflate"):
    """Four snapshots: append f1,f2; append f3; overwrite (f1 DELETED, f4 added, a position-delete
    file); append f5. Metadata v1..v4 hold 1..4 snapshots; v5 expires S1 and S2."""
    t = Table(tmp_path / f"t{version}{form}", version=version, avro_codec=avro_codec, form=form)
    codecs = ["snappy", "gzip", "zstd", "uncompressed", "brotli", "lz4"]
    for i in range(1, 6):
        t.data(f"f{i}.parquet", [sha(i * 100 + j, form) for j in range(5 + i)],
               codec=codecs[i % len(codecs)], page_version=1 + i % 2, extra=[None])
    m1 = t.manifest("m1.avro", [(1, "f1.parquet"), (1, "f2.parquet")])
    m2 = t.manifest("m2.avro", [(1, "f3.parquet")])
    m3 = t.manifest("m3.avro", [(2, "f1.parquet"), (0, "f2.parquet")])
    m4 = t.manifest("m4.avro", [(1, "f4.parquet")])
    if version >= 2:
        md = t.manifest("md.avro", [(1, "f4-deletes.parquet", 1)])
        m_over = [m3, m2, m4, md]
    else:
        m_over = [m3, m2, m4]
    m6 = t.manifest("m6.avro", [(1, "f5.parquet")])
    l1 = t.manifest_list("snap-1.avro", [m1])
    l2 = t.manifest_list("snap-2.avro", [m1, m2])
    l3 = t.manifest_list("snap-3.avro", m_over)
    l4 = t.manifest_list("snap-4.avro", m_over + [m6])
    t.write()
    hist = [(1, l1), (2, l2), (3, l3), (4, l4)]
    for n in range(1, 5):
        t.metadata(n, hist[:n])
    t.metadata(5, hist[2:])
    return t


@pytest.mark.parametrize("version,form", [(2, "hex"), (2, "binary"), (2, "url"), (1, "hex")])
def test_refs_history_and_expiry(tmp_path, version, form):
    t = build_history(tmp_path, version, form)
    col = ["--column", "image_sha256", "--form", form]
    # The folder: no hint -> the highest version (v5): S1, S2 expired, f1 no longer referenced.
    res = refs(t.root, *col)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")
    assert res.stderr == ""
    # v4 still retains S1/S2, so f1's hashes are referenced.
    res = refs(t.root / "metadata" / "v4.metadata.json", *col)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect(*[f"f{i}.parquet" for i in range(1, 6)])
    # A hint pins v3 (and nothing newer than v3 is consecutive... v4 and v5 exist: Hadoop rule
    # follows them, so the result is v5's).
    t.hint("3\n")
    assert refs(t.root, *col).stdout.split() == t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")
    res = refs(t.root, *col, "--count")
    assert res.returncode == 0 and res.stdout.strip() == str(len(t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")))


def test_files_per_snapshot(tmp_path):
    t = build_history(tmp_path, 2, "hex")
    res = refs(t.root / "metadata" / "v4.metadata.json", "--files")
    assert res.returncode == 0, res.stderr
    d = f"{t.root}/data/"
    want = sorted([f"1\t{d}f1.parquet", f"1\t{d}f2.parquet",
                   f"2\t{d}f1.parquet", f"2\t{d}f2.parquet", f"2\t{d}f3.parquet",
                   f"3\t{d}f2.parquet", f"3\t{d}f3.parquet", f"3\t{d}f4.parquet",
                   f"4\t{d}f2.parquet", f"4\t{d}f3.parquet", f"4\t{d}f4.parquet", f"4\t{d}f5.parquet"])
    assert res.stdout.splitlines() == want


def test_rewrite_required_for_s3_paths(tmp_path):
    t = build_history(tmp_path, 2, "hex")
    # Pointing at a metadata file: the auto-mapping of the table location still applies...
    res = refs(t.root / "metadata" / "v5.metadata.json", "--column", "image_sha256", rewrite=False)
    assert res.returncode == 0, res.stderr
    # ...but a rewrite to the wrong place fails closed, naming the path it could not open.
    res = subprocess.run([str(BIN_DIR / "blobref"), "refs", str(t.root), "--column", "image_sha256",
                          "--rewrite", f"{PREFIX}/=/nonexistent/"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == ""
    assert "/nonexistent/metadata/snap-" in res.stderr and len(res.stderr.splitlines()) == 1
    # A rewrite to another scheme without an opener: a clear error.
    res = subprocess.run([str(BIN_DIR / "blobref"), "refs", str(t.root), "--files",
                          "--rewrite", f"{PREFIX}/=s3://other/"], capture_output=True, text=True)
    assert res.returncode == 1 and "s3://other/metadata/snap-" in res.stderr


def test_v1_inline_manifests_and_gzip_metadata(tmp_path):
    t = Table(tmp_path / "v1", version=1, avro_codec="null")
    t.data("a.parquet", [sha(i, "a") for i in range(3)], codec="gzip")
    t.data("b.parquet", [sha(i, "b") for i in range(4)], codec="zstd", page_version=2)
    ma = t.manifest("ma.avro", [(1, "a.parquet")], meta={})  # no Iceberg header keys at all
    mb = t.manifest("mb.avro", [(1, "b.parquet")])
    t.write()
    t.metadata(1, [(10, [ma])])
    t.metadata(2, [(10, [ma]), (11, [ma, mb])], gz=True)
    t.hint("")  # empty hint: the highest version, here the gzip'd one
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect("a.parquet", "b.parquet")


def test_numbered_metadata_names(tmp_path):
    t = Table(tmp_path / "num", version=2)
    t.data("a.parquet", [sha(i, "n") for i in range(3)])
    t.data("b.parquet", [sha(i, "m") for i in range(3)])
    ma = t.manifest("ma.avro", [(1, "a.parquet")])
    mb = t.manifest("mb.avro", [(1, "b.parquet")])
    la = t.manifest_list("la.avro", [ma])
    lb = t.manifest_list("lb.avro", [mb])
    t.write()
    t.metadata(0, [(1, la)], name="00001-0b8c2a4e-aaaa-4bbb-8ccc-000000000001.metadata.json")
    t.metadata(0, [(2, lb)], name="00010-0b8c2a4e-aaaa-4bbb-8ccc-000000000002.metadata.json")
    t.metadata(0, [(1, la)], name="00009-0b8c2a4e-aaaa-4bbb-8ccc-000000000003.metadata.json")
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect("b.parquet")


def test_invalid_values_warn_or_fail(tmp_path):
    t = Table(tmp_path / "bad", version=2)
    good = [sha(i, "g") for i in range(4)]
    t.data("a.parquet", good, extra=["not-a-hash", "sha256:" + "0" * 63, None])
    ma = t.manifest("ma.avro", [(1, "a.parquet")])
    l = t.manifest_list("l.avro", [ma])
    t.write()
    t.metadata(1, [(1, l)])
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == sorted(good)
    assert "warning: 2 of 6 values" in res.stderr and "not-a-hash" in res.stderr
    res = refs(t.root, "--column", "image_sha256", "--strict")
    assert res.returncode == 1 and res.stdout == "" and "not-a-hash" in res.stderr
    # A column that does not exist is an error, not zero references.
    res = refs(t.root, "--column", "nope")
    assert res.returncode == 1 and "no column 'nope'" in res.stderr


def test_fail_closed_on_damage(tmp_path):
    t = build_history(tmp_path, 2, "hex")
    col = ["--column", "image_sha256"]
    # A live data file the manifest calls ORC that is not one (the manifest's format is trusted;
    # ORC files themselves are read: test_orc_iceberg.py): error.
    t2 = Table(tmp_path / "orc", version=2)
    t2.data("a.parquet", [sha(1, "o")])
    mo = t2.manifest("mo.avro", [(1, "a.parquet", 0, "ORC")])
    l = t2.manifest_list("l.avro", [mo])
    t2.write()
    t2.metadata(1, [(1, l)])
    res = refs(t2.root, *col)
    assert res.returncode == 1 and "a.parquet: not an ORC file" in res.stderr
    # A truncated manifest, a missing data file, a damaged Parquet file: errors, never output.
    m4 = t.root / "metadata" / "m4.avro"
    raw = m4.read_bytes()
    m4.write_bytes(raw[:-5])
    res = refs(t.root, *col)
    assert res.returncode == 1 and res.stdout == "" and "m4.avro" in res.stderr
    m4.write_bytes(raw)
    (t.root / "data" / "f5.parquet").rename(t.root / "data" / "f5.moved")
    res = refs(t.root, *col)
    assert res.returncode == 1 and res.stdout == "" and "f5.parquet" in res.stderr
    (t.root / "data" / "f5.moved").rename(t.root / "data" / "f5.parquet")
    p = t.root / "data" / "f3.parquet"
    p.write_bytes(p.read_bytes()[:-30])
    res = refs(t.root, *col)
    assert res.returncode == 1 and res.stdout == "" and "f3.parquet" in res.stderr


def test_manifest_count_mismatch_is_an_error(tmp_path):
    """A manifest list that promises more entries than the manifest holds (e.g. a manifest cut at
    a block boundary) fails the walk."""
    t = Table(tmp_path / "cnt", version=2)
    t.data("a.parquet", [sha(1, "c")])
    ma = t.manifest("ma.avro", [(1, "a.parquet")])
    t.write()
    t.job = {"parquet": [], "avro": []}
    l = t.manifest_list("l.avro", [(ma[0], 2, 0)])
    t.write()
    t.metadata(1, [(1, l)])
    res = refs(t.root, "--files")
    assert res.returncode == 1 and "manifest list says 2" in res.stderr


def test_usage_errors(tmp_path):
    b = str(BIN_DIR / "blobref")
    assert subprocess.run([b, "refs"], capture_output=True).returncode == 2
    assert subprocess.run([b, "refs", str(tmp_path)], capture_output=True).returncode == 2
    r = subprocess.run([b, "refs", str(tmp_path), "--column", "c", "--form", "base64"],
                       capture_output=True)
    assert r.returncode == 2
    r = subprocess.run([b, "refs", str(tmp_path), "--column", "c"], capture_output=True, text=True)
    assert r.returncode == 1 and "metadata" in r.stderr
