"""Helpers for the reconcile tests: an Iceberg table that grows snapshot by snapshot (append,
overwrite, row deletes, snapshot expiry), written the way test_iceberg_refs.py writes tables
(DuckDB-written Parquet, avsc-written manifests and manifest lists, metadata.json per the spec),
and a blobrefd configured with [table] and [reconcile] sections plus the calls the tests make."""
import hashlib
import json
import os
import pathlib
import subprocess
import time

import requests

from conftest import BIN_DIR, JS_DIR, ROOT, Server

WRITER = ROOT / "tests" / "integration" / "iceberg_write.mjs"
HASH_COLUMN = "image_sha256"


def sha(data):
    return hashlib.sha256(data).hexdigest()


def blob(tag, i, size=None):
    """Distinct deterministic bytes per (tag, i)."""
    base = f"reconcile-{tag}-{i}-".encode()
    n = size if size is not None else 40 + (i * 37) % 300
    return (base * (n // len(base) + 1))[:n]


def in_form(h, form, i):
    """One value of the hash column holding h, in the table's form (varied spellings)."""
    if form == "hex":
        return [h, h.upper(), "sha256:" + h][i % 3]
    if form == "url":
        return [f"https://cdn.example/img/sha256/{h[:2]}/{h[2:4]}/{h}",
                f"s3://bucket/ab/{h}.jpg?v=1", f"/srv/blobs/{h}"][i % 3]
    return h  # binary: the writer unhexes


def run_writer(job, job_path):
    job_path.write_text(json.dumps(job))
    subprocess.run(["node", str(WRITER), str(job_path)], cwd=JS_DIR, check=True, timeout=120,
                   env=dict(os.environ, NODE_PATH=str(JS_DIR / "node_modules")))


class IceTable:
    """An Iceberg table in a local folder whose files say they live under s3://warehouse/NAME
    (the [table] section maps that prefix back with `rewrite`). Every operation commits a new
    snapshot (or, for expire, a new metadata version) and points version-hint.text at it.

    Data files record their real size and row count in the manifests. Files are immutable: the
    helper never writes a data file twice unless a test asks for it (rewrite_data)."""

    def __init__(self, root, name=None, form="hex", column=HASH_COLUMN, version=2,
                 avro_codec="deflate"):
        self.root = pathlib.Path(root)
        self.name = name or self.root.name
        self.form, self.column, self.version, self.codec = form, column, version, avro_codec
        self.prefix = f"s3://warehouse/{self.name}"
        (self.root / "metadata").mkdir(parents=True)
        (self.root / "data").mkdir()
        self.files = {}       # data file name -> {"hashes", "size", "count", "content"}
        self.manifests = {}   # manifest name -> [(status, file name)]
        self.snapshots = []   # every snapshot ever committed: {"id", "manifests", "list"}
        self.retained = []    # ids of the snapshots the current metadata keeps
        self.meta_version = 0
        self.seq = 0
        self.count_override = {}  # manifest name -> (added, existing, deleted) for the list

    # --- configuration -------------------------------------------------------------------------
    def conf(self, location=None, name=None, column=None, form=None):
        """The [table] section (another name/column/form: a second section over this table)."""
        return (f"[table {name or self.name}]\nlocation = {location or self.root}\n"
                f"column = {column or self.column}\nform = {form or self.form}\n"
                f"rewrite = {self.prefix}/ => {self.root}/\n")

    def rec(self, rel):
        return f"{self.prefix}/{rel}"

    def data_path(self, name):
        return self.root / "data" / name

    def meta_path(self, name):
        return self.root / "metadata" / name

    # --- files ---------------------------------------------------------------------------------
    def write_data(self, files, codec="snappy", extra=(None,), columns=None):
        """files: {name: [hex hashes]}; writes each as a Parquet file (plus `extra` values, by
        default one null). columns: {column: (form, {name: [hex hashes]})} adds more columns to
        those files. Returns the names."""
        job = {"parquet": [], "avro": []}
        for name, hashes in files.items():
            vals = [in_form(h, self.form, i) for i, h in enumerate(hashes)] + list(extra)
            more = [{"column": col, "form": form,
                     "values": [in_form(h, form, i) for i, h in enumerate(per.get(name, []))]}
                    for col, (form, per) in (columns or {}).items()]
            job["parquet"].append({"path": str(self.data_path(name)), "column": self.column,
                                   "form": self.form, "values": vals, "codec": codec,
                                   "page_version": 1 + len(self.files) % 2,
                                   "extra_columns": more})
        run_writer(job, self.root.parent / f"{self.name}-data-job.json")
        for name, hashes in files.items():
            rows = max([len(hashes) + len(extra)] + [len(per.get(name, []))
                                                      for _, per in (columns or {}).values()])
            self.files[name] = {"hashes": list(hashes), "size": self.data_path(name).stat().st_size,
                                "count": rows, "content": 0}
        return list(files)

    def rewrite_data(self, name, hashes):
        """Writes data file `name` again with other hashes (what an immutable-file cache must not
        be fooled by: the manifest records the new size and count)."""
        del self.files[name]
        self.write_data({name: hashes})

    def delete_file(self, name, target):
        """Registers a position-delete file (content 1) that removes rows of `target`; reconcile
        ignores delete files, so the target's hashes stay referenced."""
        self.files[name] = {"hashes": [], "size": 100, "count": 1, "content": 1}
        return name

    # --- snapshots -----------------------------------------------------------------------------
    def live(self, sid):
        """Data files (content 0) live in snapshot sid."""
        snap = next(s for s in self.snapshots if s["id"] == sid)
        out = set()
        for m in snap["manifests"]:
            for status, f in self.manifests[m]:
                if status != 2 and self.files[f]["content"] == 0:
                    out.add(f)
        return out

    def live_files(self):
        """Data files live in any retained snapshot."""
        return set().union(*(self.live(s) for s in self.retained)) if self.retained else set()

    def referenced(self):
        """Hashes (hex, lowercase) that any retained snapshot references."""
        return {h for f in self.live_files() for h in self.files[f]["hashes"]}

    def current(self):
        return self.live(self.retained[-1]) if self.retained else set()

    def _new_manifest(self, entries):
        self.seq += 1
        name = f"m{self.seq}-{self.name}.avro"
        self.manifests[name] = entries
        return name

    def _commit(self, manifests, new_manifests):
        sid = len(self.snapshots) + 1
        lname = f"snap-{sid}-{self.name}.avro"
        job = {"parquet": [], "avro": []}
        for m in new_manifests:
            recs = []
            for status, f in self.manifests[m]:
                info = self.files[f]
                df = {"file_path": self.rec(f"data/{f}"),
                      "file_format": info.get("format", "PARQUET"),
                      "record_count": info["count"], "file_size_in_bytes": info["size"]}
                if self.version >= 2:
                    df["content"] = info["content"]
                recs.append({"status": status, "snapshot_id": sid, "data_file": df})
            job["avro"].append({"path": str(self.meta_path(m)), "kind": "manifest",
                                "version": self.version, "codec": self.codec,
                                "meta": {"format-version": str(self.version),
                                         "content": "deletes" if self._is_delete(m) else "data"},
                                "records": recs})
        recs = []
        for m in manifests:
            ents = self.manifests[m]
            counts = self.count_override.get(m) or (
                sum(1 for s, _ in ents if s == 1), sum(1 for s, _ in ents if s == 0),
                sum(1 for s, _ in ents if s == 2))
            r = {"manifest_path": self.rec(f"metadata/{m}"),
                 "manifest_length_of": str(self.meta_path(m)), "added_snapshot_id": sid}
            if self.version >= 2:
                r.update(content=1 if self._is_delete(m) else 0, sequence_number=sid,
                         min_sequence_number=1, added_files_count=counts[0],
                         existing_files_count=counts[1], deleted_files_count=counts[2])
            else:
                r.update(added_data_files_count=counts[0], existing_data_files_count=counts[1],
                         deleted_data_files_count=counts[2])
            recs.append(r)
        job["avro"].append({"path": str(self.meta_path(lname)), "kind": "list",
                            "version": self.version, "codec": self.codec, "records": recs})
        run_writer(job, self.root.parent / f"{self.name}-avro-job.json")
        self.snapshots.append({"id": sid, "manifests": list(manifests),
                               "list": self.rec(f"metadata/{lname}")})
        self.retained.append(sid)
        self.write_metadata()
        return sid

    def _is_delete(self, m):
        ents = self.manifests[m]
        return bool(ents) and all(self.files[f]["content"] != 0 for _, f in ents)

    def _prev_manifests(self):
        if not self.retained:
            return []
        return list(next(s for s in self.snapshots if s["id"] == self.retained[-1])["manifests"])

    def append(self, *files):
        """A snapshot that adds data (or delete) files: the previous manifests plus a new one."""
        m = self._new_manifest([(1, f) for f in files])
        return self._commit(self._prev_manifests() + [m], [m])

    def overwrite(self, remove=(), add=()):
        """A snapshot that removes whole data files and adds others: one new manifest holding the
        removed files as DELETED, the kept ones as EXISTING and the new ones as ADDED."""
        cur = self.current()
        missing = set(remove) - cur
        assert not missing, f"not live: {missing}"
        entries = [(2, f) for f in sorted(remove)] + [(0, f) for f in sorted(cur - set(remove))] + \
                  [(1, f) for f in add]
        m = self._new_manifest(entries)
        return self._commit([m], [m])

    def delete_rows(self, target, name=None):
        """A row-level delete: a position-delete file for target, in a delete manifest."""
        name = name or f"del-{len(self.files)}-{target}"
        self.delete_file(name, target)
        return self.append(name)

    def expire(self, keep):
        """Expires all but the newest `keep` retained snapshots (a new metadata version)."""
        self.retained = self.retained[-keep:] if keep else []
        self.write_metadata()

    def write_metadata(self):
        self.meta_version += 1
        snaps = []
        by_id = {s["id"]: s for s in self.snapshots}
        for sid in self.retained:
            s = {"snapshot-id": sid, "timestamp-ms": 1700000000000 + sid,
                 "summary": {"operation": "append"}, "manifest-list": by_id[sid]["list"]}
            if sid > 1:
                s["parent-snapshot-id"] = sid - 1
            if self.version >= 2:
                s["sequence-number"] = sid
            snaps.append(s)
        md = {"format-version": self.version, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
              "location": self.prefix, "last-updated-ms": 1700000000000 + self.meta_version,
              "last-column-id": 2,
              "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                  {"id": 1, "name": "id", "required": False, "type": "int"},
                  {"id": 2, "name": self.column, "required": False,
                   "type": "binary" if self.form == "binary" else "string"}]}],
              "current-schema-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
              "default-spec-id": 0, "properties": {},
              "current-snapshot-id": snaps[-1]["snapshot-id"] if snaps else -1,
              "snapshots": snaps}
        if self.version >= 2:
            md["last-sequence-number"] = len(self.snapshots)
        if self.version == 1:
            md["schema"] = md["schemas"][0]
            md["partition-spec"] = []
        path = self.meta_path(f"v{self.meta_version}.metadata.json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(md, indent=2))
        os.replace(tmp, path)
        (self.root / "metadata" / "version-hint.text").write_text(f"{self.meta_version}\n")
        return path


# --- the server -----------------------------------------------------------------------------

def recon_conf(*tables, grace="1s", retention="1h", max_fraction="1", interval="0",
               extra="", server_extra="dedup_touch_interval = 0s\n", lists=None):
    text = f"[server]\n{server_extra}"
    text += (f"[reconcile]\ninterval = {interval}\ngrace = {grace}\nretention = {retention}\n"
             f"max_fraction = {max_fraction}\n")
    if lists is not None:
        text += f"lists = {lists}\n"
    for t in tables:
        text += t if isinstance(t, str) else t.conf()
    return text + extra


def start(tmp_path, *tables, name="data", **kw):
    return Server(tmp_path / name, config_text=recon_conf(*tables, **kw)).start()


class Api:
    """The calls the tests make, against one server, optionally with a bearer token."""

    def __init__(self, srv, token=None):
        self.srv, self.url = srv, srv.url
        self.s = requests.Session()
        if token:
            self.s.headers["Authorization"] = f"Bearer {token}"

    def put(self, data, expect=(200, 201)):
        h = sha(data)
        r = self.s.put(f"{self.url}/v1/blobs/{h}", data=data, timeout=30)
        assert r.status_code in expect, (r.status_code, r.text)
        return h

    def post(self, data):
        r = self.s.post(f"{self.url}/v1/blobs", data=data, timeout=30)
        return r

    def get(self, h, **kw):
        return self.s.get(f"{self.url}/v1/blobs/{h}", timeout=30, **kw)

    def code(self, h):
        return self.get(h).status_code

    def meta(self, h):
        return self.s.get(f"{self.url}/v1/blobs/{h}/meta", timeout=30)

    def start_run(self, dry_run=False, force=False, full=False):
        params = {}
        if dry_run:
            params["dry_run"] = "1"
        if force:
            params["force"] = "1"
        if full:
            params["full"] = "1"
        return self.s.post(f"{self.url}/v1/reconcile", params=params, timeout=30)

    def report(self, rid):
        r = self.s.get(f"{self.url}/v1/reconcile/runs/{rid}", timeout=30)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def runs(self):
        r = self.s.get(f"{self.url}/v1/reconcile/runs", timeout=30)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()["runs"]

    def wait(self, rid, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            rep = self.report(rid)
            if rep["state"] != "running":
                return rep
            assert time.monotonic() < deadline, f"run {rid} still running: {rep}"
            time.sleep(0.02)

    def run(self, expect_state="done", **kw):
        """Starts a run, waits for it and returns its report (asserting its final state)."""
        r = self.start_run(**kw)
        assert r.status_code == 202, (r.status_code, r.text)
        body = r.json()
        assert body["state"] == "running" and isinstance(body["id"], int), body
        rep = self.wait(body["id"])
        assert rep["id"] == body["id"]
        if expect_state:
            assert rep["state"] == expect_state, json.dumps(rep, indent=1)
        return rep

    def delete(self, h, reason=None):
        params = {"reason": reason} if reason else {}
        return self.s.delete(f"{self.url}/v1/blobs/{h}", params=params, timeout=30)

    def restore(self, h):
        return self.s.post(f"{self.url}/v1/blobs/{h}/restore", timeout=30)

    def metrics(self):
        r = self.s.get(f"{self.url}/metrics", timeout=30)
        assert r.status_code == 200
        out = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out


def blob_path(srv, h):
    return srv.data_dir / "blobs" / "sha256" / h[:2] / h[2:4] / h


def cli(srv, *args, token=None, timeout=120):
    cmd = [str(BIN_DIR / "blobref"), "--server", srv.url]
    if token:
        cmd += ["--token", token]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)
