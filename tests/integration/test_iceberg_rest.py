"""`blobref refs rest:URI#ns.table` against a small Iceberg REST catalog fixture on 127.0.0.1
(GET /v1/config and GET /v1/{prefix}/namespaces/{ns}/tables/{table}, bearer token)."""
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest

from conftest import BIN_DIR
from test_iceberg_refs import PREFIX, build_history

TOKEN = "s3cr3t-token"


class Catalog:
    """Serves the tables in `tables` ({(namespace tuple, name): metadata path}) under a prefix."""

    def __init__(self, prefix="wh1"):
        self.prefix, self.tables, self.requests = prefix, {}, []
        catalog = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                catalog.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.reply(401, {"error": {"message": "Not authorized", "type":
                                                      "NotAuthorizedException", "code": 401}})
                if self.path == "/v1/config":
                    return self.reply(200, {"defaults": {"prefix": "wrong"},
                                            "overrides": {"prefix": catalog.prefix}})
                parts = self.path.split("/")
                # /v1/{prefix}/namespaces/{ns}/tables/{table}
                if (len(parts) == 7 and parts[1] == "v1" and parts[2] == catalog.prefix
                        and parts[3] == "namespaces" and parts[5] == "tables"):
                    ns = tuple(unquote(parts[4]).split("\x1f"))
                    key = (ns, unquote(parts[6]))
                    if key in catalog.tables:
                        path = catalog.tables[key]
                        return self.reply(200, {"metadata-location": f"{PREFIX}/metadata/{path.name}",
                                                "metadata": json.loads(path.read_text()),
                                                "config": {}})
                    return self.reply(404, {"error": {"message": f"Table does not exist: {key}",
                                                      "type": "NoSuchTableException", "code": 404}})
                return self.reply(404, {"error": {"message": "no route", "code": 404}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def catalog():
    c = Catalog()
    yield c
    c.close()


def run(*args, env=None):
    return subprocess.run([str(BIN_DIR / "blobref"), "refs", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_rest_catalog_refs(tmp_path, catalog):
    t = build_history(tmp_path, 2, "hex")
    catalog.tables[(("lake", "media"), "images")] = t.root / "metadata" / "v5.metadata.json"
    rw = ["--rewrite", f"{PREFIX}/={t.root}/", "--column", "image_sha256"]
    res = run(f"rest:{catalog.url}#lake.media.images", *rw, "--token", TOKEN)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")
    assert "/v1/config" in catalog.requests
    assert "/v1/wh1/namespaces/lake%1Fmedia/tables/images" in catalog.requests
    # The token may come from the environment instead.
    import os
    env = dict(os.environ, BLOBREF_CATALOG_TOKEN=TOKEN)
    res = run(f"rest:{catalog.url}/#lake.media.images", *rw, env=env)
    assert res.returncode == 0, res.stderr


def test_rest_catalog_errors(tmp_path, catalog):
    t = build_history(tmp_path, 2, "hex")
    catalog.tables[(("lake",), "images")] = t.root / "metadata" / "v5.metadata.json"
    rw = ["--rewrite", f"{PREFIX}/={t.root}/", "--column", "image_sha256"]
    res = run(f"rest:{catalog.url}#lake.images", *rw, "--token", "wrong")
    assert res.returncode == 1 and "HTTP 401" in res.stderr and res.stdout == ""
    res = run(f"rest:{catalog.url}#lake.nope", *rw, "--token", TOKEN)
    assert res.returncode == 1 and "HTTP 404" in res.stderr and "Table does not exist" in res.stderr
    # No rewrite: the recorded s3:// paths have no opener and REST tables have no local folder.
    res = run(f"rest:{catalog.url}#lake.images", "--column", "image_sha256", "--token", TOKEN)
    assert res.returncode == 1 and "s3://warehouse/db/t/metadata/snap-" in res.stderr
    res = run(f"rest:{catalog.url}#images", "--column", "c", "--token", TOKEN)
    assert res.returncode == 1 and "namespace.table" in res.stderr
    catalog.close()
    res = run(f"rest:{catalog.url}#lake.images", *rw, "--token", TOKEN)
    assert res.returncode == 1 and res.stdout == ""
