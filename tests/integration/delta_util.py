"""A Delta Lake table written by the tests: Parquet data files through DuckDB (the Iceberg
writer's parquet jobs), JSON commits written here, checkpoints (classic, multi-part, v2) written
by DuckDB with the nested add/remove/protocol structs of the protocol."""
import json
import os
import pathlib
import subprocess
import urllib.parse

from conftest import JS_DIR
from reconcile_util import HASH_COLUMN, in_form, run_writer

HERE = pathlib.Path(__file__).resolve().parent
DUCK = HERE / "parquet_duck.mjs"

ADD_T = "STRUCT(path VARCHAR, partitionValues MAP(VARCHAR, VARCHAR), size BIGINT, " \
        "modificationTime BIGINT, dataChange BOOLEAN, stats VARCHAR)"
REMOVE_T = "STRUCT(path VARCHAR, deletionTimestamp BIGINT, dataChange BOOLEAN)"
PROTOCOL_T = "STRUCT(minReaderVersion INTEGER, minWriterVersion INTEGER, " \
             "readerFeatures VARCHAR[], writerFeatures VARCHAR[])"
SIDECAR_T = "STRUCT(path VARCHAR, sizeInBytes BIGINT, modificationTime BIGINT)"


def duck_sql(sql):
    r = subprocess.run(["node", str(DUCK), "sql", sql], capture_output=True, timeout=300,
                       cwd=JS_DIR)
    assert r.returncode == 0, r.stderr.decode()


def lit(s):
    return "'" + str(s).replace("'", "''") + "'"


def log_name(v, suffix="json"):
    return f"{v:020d}.{suffix}"


class DeltaTable:
    """Files live under root; commits are appended with commit(); the test decides which log
    files survive (delete_commit) and which checkpoints exist."""

    def __init__(self, root, form="hex", column=HASH_COLUMN, reader=1, features=None):
        self.root = pathlib.Path(root)
        self.form, self.column = form, column
        self.log = self.root / "_delta_log"
        self.log.mkdir(parents=True)
        self.version = -1
        self.hashes = {}   # recorded path -> hashes its file holds
        self.sizes = {}
        self.live = set()  # recorded paths live at the latest version
        self.protocol = {"minReaderVersion": reader, "minWriterVersion": 2}
        if features is not None:
            self.protocol = {"minReaderVersion": 3, "minWriterVersion": 7,
                             "readerFeatures": features, "writerFeatures": features}

    def conf(self, name="images", fmt="delta"):
        f = f"format = {fmt}\n" if fmt else ""
        return (f"[table {name}]\nlocation = {self.root}\ncolumn = {self.column}\n"
                f"form = {self.form}\n{f}")

    def write_data(self, files, extra=(None,)):
        """files: {recorded path (percent-encoded, relative): [hex hashes]}."""
        job = {"parquet": [], "avro": []}
        for rec, hashes in files.items():
            vals = [in_form(h, self.form, i) for i, h in enumerate(hashes)] + list(extra)
            local = self.local(rec)
            local.parent.mkdir(parents=True, exist_ok=True)
            job["parquet"].append({"path": str(local), "column": self.column, "form": self.form,
                                   "values": vals, "codec": "snappy", "page_version": 1,
                                   "extra_columns": []})
        run_writer(job, self.root.parent / f"{self.root.name}-job.json")
        for rec, hashes in files.items():
            self.hashes[rec] = list(hashes)
            self.sizes[rec] = self.local(rec).stat().st_size

    def local(self, rec):
        p = urllib.parse.unquote(rec)
        return pathlib.Path(p[len("file://"):]) if p.startswith("file://") else self.root / p

    def commit(self, add=(), remove=(), cdc=(), extra_lines=()):
        """Writes the next commit N.json; returns N."""
        self.version += 1
        lines = [{"commitInfo": {"timestamp": 1700000000000 + self.version}}]
        if self.version == 0:
            lines.append({"protocol": self.protocol})
            lines.append({"metaData": {"id": "t", "format": {"provider": "parquet"},
                                       "schemaString": json.dumps({"type": "struct", "fields": [
                                           {"name": self.column, "type": "string",
                                            "nullable": True, "metadata": {}}]}),
                                       "partitionColumns": [], "configuration": {}}})
        for p in remove:
            lines.append({"remove": {"path": p, "deletionTimestamp": 1, "dataChange": True}})
            self.live.discard(p)
        for p in add:
            lines.append({"add": {"path": p, "partitionValues": {}, "size": self.sizes[p],
                                  "modificationTime": 1, "dataChange": True}})
            self.live.add(p)
        for p in cdc:
            lines.append({"cdc": {"path": p, "partitionValues": {}, "size": self.sizes[p],
                                  "dataChange": False}})
        text = "".join(json.dumps(x) + "\n" for x in lines) + "".join(extra_lines)
        (self.log / log_name(self.version)).write_text(text)
        return self.version

    def delete_commit(self, v):
        os.remove(self.log / log_name(v))

    def _rows_sql(self, live, protocol=True, sidecars=()):
        """SELECT of checkpoint rows: the protocol, one add per live path, sidecar rows."""
        rows = []
        if protocol:
            feats = self.protocol.get("readerFeatures")
            fl = "NULL" if feats is None else "[" + ", ".join(lit(f) for f in feats) + "]"
            rows.append(f"SELECT {{'minReaderVersion': {self.protocol['minReaderVersion']}, "
                        f"'minWriterVersion': {self.protocol['minWriterVersion']}, "
                        f"'readerFeatures': {fl}, 'writerFeatures': {fl}}}::{PROTOCOL_T} AS protocol, "
                        f"NULL::{ADD_T} AS add, NULL::{REMOVE_T} AS remove, "
                        f"NULL::{SIDECAR_T} AS sidecar")
        for p in live:
            rows.append(f"SELECT NULL::{PROTOCOL_T} AS protocol, {{'path': {lit(p)}, "
                        f"'partitionValues': MAP {{}}, 'size': {self.sizes[p]}, "
                        f"'modificationTime': 1, 'dataChange': false, 'stats': NULL}}::{ADD_T} "
                        f"AS add, NULL::{REMOVE_T} AS remove, NULL::{SIDECAR_T} AS sidecar")
        for s, size in sidecars:
            rows.append(f"SELECT NULL::{PROTOCOL_T} AS protocol, NULL::{ADD_T} AS add, "
                        f"NULL::{REMOVE_T} AS remove, {{'path': {lit(s)}, 'sizeInBytes': {size}, "
                        f"'modificationTime': 1}}::{SIDECAR_T} AS sidecar")
        return " UNION ALL ".join(rows)

    def checkpoint(self, name=None, live=None, protocol=True, sidecars=()):
        """A Parquet checkpoint of the latest version (classic name unless given)."""
        live = sorted(self.live if live is None else live)
        path = self.log / (name or log_name(self.version, "checkpoint.parquet"))
        duck_sql(f"COPY ({self._rows_sql(live, protocol, sidecars)}) TO {lit(path)} "
                 f"(FORMAT PARQUET)")
        return path

    def multipart_checkpoint(self, nparts):
        """The latest version's checkpoint in nparts parts (the protocol in part 1)."""
        live = sorted(self.live)
        paths = []
        for i in range(nparts):
            part = live[i::nparts]
            name = log_name(self.version, f"checkpoint.{i + 1:010d}.{nparts:010d}.parquet")
            paths.append(self.checkpoint(name, live=part, protocol=i == 0))
        return paths

    def v2_checkpoint(self, uuid, kind="json", nsidecars=2):
        """A v2 checkpoint (UUID-named, JSON or Parquet) whose adds are in sidecar files."""
        live = sorted(self.live)
        (self.log / "_sidecars").mkdir(exist_ok=True)
        sidecars = []
        for i in range(nsidecars):
            sc = self.log / "_sidecars" / f"{uuid[:8]}-sidecar-{i}.parquet"
            self.checkpoint(str(sc), live=live[i::nsidecars], protocol=False)
            sidecars.append((sc.name, sc.stat().st_size))
        name = log_name(self.version, f"checkpoint.{uuid}.{kind}")
        if kind == "parquet":
            return self.checkpoint(name, live=[], sidecars=sidecars)
        lines = [{"checkpointMetadata": {"version": self.version}}, {"protocol": self.protocol}]
        lines += [{"sidecar": {"path": s, "sizeInBytes": n, "modificationTime": 1}}
                  for s, n in sidecars]
        (self.log / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
        return self.log / name
