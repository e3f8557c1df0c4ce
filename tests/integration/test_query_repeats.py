"""A query parameter given twice is a 400 on every route (issue 18): ?dry_run=1&dry_run=0 used to
run a real reconcile (the handler kept the last value); now nothing runs, nothing changes, and the
JSON message names the parameter."""
import os

import pytest
import requests

from conftest import Server
from reconcile_util import IceTable, recon_conf
from util_http import TIMEOUT, assert_error, put, sha


@pytest.fixture
def recon_server(tmp_path):
    table = IceTable(tmp_path / "t")
    table.write_data({"f1.parquet": []})
    table.append("f1.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(table, grace="1s")).start()
    yield srv
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


def assert_repeated(r, name):
    assert_error(r, 400, "bad_request")
    assert f"'{name}'" in r.json()["error"]["message"], r.text


def test_repeated_dry_run_runs_nothing(recon_server):
    srv = recon_server
    data = os.urandom(500)  # unreferenced: a real run past grace would quarantine it
    assert put(srv, data).status_code == 201
    for q in ("dry_run=1&dry_run=0", "dry_run=0&dry_run=1", "dry_run&dry_run=0",
              "dry%5Frun=1&dry_run=0", "force=1&dry_run=1&force=1"):
        r = requests.post(f"{srv.url}/v1/reconcile?{q}", timeout=TIMEOUT)
        assert_repeated(r, "force" if q.startswith("force") else "dry_run")
    runs = requests.get(f"{srv.url}/v1/reconcile/runs", timeout=TIMEOUT).json()["runs"]
    assert runs == [], runs
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 200
    assert "given more than once" in srv.read_log()
    # distinct parameters are still fine
    r = requests.post(f"{srv.url}/v1/reconcile?dry_run=1&force=1", timeout=TIMEOUT)
    assert r.status_code == 202, r.text


def test_repeated_parameters_on_other_routes(server):
    data = b"repeat me"
    h = sha(data)
    assert put(server, data).status_code == 201
    r = requests.get(f"{server.url}/v1/blobs?limit=1&limit=1000", timeout=TIMEOUT)
    assert_repeated(r, "limit")
    r = requests.get(f"{server.url}/v1/blobs?after={'0' * 64}&state=live&after={'f' * 64}",
                     timeout=TIMEOUT)
    assert_repeated(r, "after")
    r = requests.delete(f"{server.url}/v1/blobs/{h}?reason=a&reason=b", timeout=TIMEOUT)
    assert_repeated(r, "reason")
    assert requests.get(f"{server.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200  # live
    r = requests.get(f"{server.url}/v1/blobs/{h}?x=1&x=2", timeout=TIMEOUT)
    assert_repeated(r, "x")
    # once each: answered as before
    assert requests.get(f"{server.url}/v1/blobs?limit=1", timeout=TIMEOUT).status_code == 200
    assert requests.delete(f"{server.url}/v1/blobs/{h}?reason=a", timeout=TIMEOUT).status_code == 200
