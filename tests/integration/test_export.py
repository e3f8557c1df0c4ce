"""blobref export: the index as Parquet, read by DuckDB with proper types, paged through the
listing, and joined with a table's hash column (the README example)."""
import os
import random
import subprocess

import requests

from conftest import BIN_DIR, free_port
from test_parquet_read import duck
from util_http import TIMEOUT, put, sha

BLOBREF = str(BIN_DIR / "blobref")


def blobref(srv_url, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOBREF_")}
    return subprocess.run([BLOBREF, "--server", srv_url, *map(str, args)], capture_output=True,
                          env=env, timeout=300)


def lit(p):
    return "'" + str(p).replace("'", "''") + "'"


def test_export_types_values_and_paging(server, tmp_path):
    rng = random.Random(3)
    blobs = {}
    for i in range(137):
        data = rng.randbytes(rng.randrange(1, 5000))
        blobs[sha(data)] = data
        assert put(server, data, headers={"Content-Type": f"image/t{i % 4}"}).status_code == 201
    out = tmp_path / "index.parquet"
    r = blobref(server.url, "export", "-o", out, "--page", "10")
    assert r.returncode == 0, r.stderr.decode()
    assert b"exported 137 blobs" in r.stderr
    assert [x for x in os.listdir(tmp_path) if x.startswith(".")] == []
    types = {c["name"]: c["type"] for c in duck("read", out)["columns"]}
    assert types == {"sha256": "VARCHAR", "size": "BIGINT", "content_type": "VARCHAR",
                     "created_at": "TIMESTAMP WITH TIME ZONE",
                     "last_upload_at": "TIMESTAMP WITH TIME ZONE", "state": "VARCHAR",
                     "reason": "VARCHAR", "store": "VARCHAR", "key": "VARCHAR",
                     "locations": "INTEGER"}
    rows = duck("query", f"SELECT sha256 || '|' || size || '|' || content_type || '|' || state || '|' "
                         f"|| coalesce(reason, '-') || '|' || store || '|' || key || '|' || locations "
                         f"|| '|' || epoch_ms(created_at) || '|' || epoch_ms(last_upload_at) "
                         f"FROM read_parquet({lit(out)})")
    assert [x.split("|")[0] for x in rows] == sorted(blobs)  # key order, each once
    s = requests.Session()
    for line in rows[:20]:
        h, size, ctype, state, reason, store, key, nloc, created, uploaded = line.split("|")
        meta = s.get(f"{server.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
        assert int(size) == len(blobs[h]) == meta["size"] and ctype == meta["content_type"]
        assert state == "live" and reason == "-" and nloc == "1"
        assert store == "local" and key == meta["locations"][0]["key"]
        assert abs(int(created) - int(uploaded)) < 60000 and int(created) > 1.7e12
    # the README example: which rows of a table point at quarantined or missing blobs
    table = tmp_path / "table.parquet"
    known = sorted(blobs)[:5]
    duck("sql", f"COPY (SELECT * FROM (VALUES (1, '{known[0]}'), (2, '{known[1]}'), "
                f"(3, '{'0' * 64}'), (4, NULL)) t(id, image_sha256)) TO {lit(table)} (FORMAT parquet)")
    bad = duck("query", f"""SELECT t.id::VARCHAR || ':' || coalesce(i.state, 'missing')
        FROM read_parquet({lit(table)}) t LEFT JOIN read_parquet({lit(out)}) i
          ON i.sha256 = t.image_sha256
        WHERE t.image_sha256 IS NOT NULL AND (i.sha256 IS NULL OR i.state <> 'live')
        ORDER BY t.id""")
    assert bad == ["3:missing"]
    # state filter and an empty export
    r = blobref(server.url, "export", "-o", tmp_path / "q.parquet", "--state", "quarantined")
    assert r.returncode == 0 and b"exported 0 blobs" in r.stderr
    assert duck("query", f"SELECT count(*) FROM read_parquet({lit(tmp_path / 'q.parquet')})") == ["0"]


def test_export_errors(server, tmp_path):
    out = tmp_path / "x.parquet"
    assert blobref(server.url, "export").returncode == 2
    assert blobref(server.url, "export", "-o", out, "--state", "gone").returncode == 2
    assert blobref(server.url, "export", "-o", out, "--page", "0").returncode == 2
    r = blobref(f"http://127.0.0.1:{free_port()}", "export", "-o", out)
    assert r.returncode == 1 and b"cannot reach" in r.stderr and not out.exists()
    assert [x for x in os.listdir(tmp_path) if x.startswith(".")] == []
