"""GET /v1/reconcile/runs names the next periodic run (`next_run_at`, issue 23): with an interval,
the first run is due between half an interval and one interval after the start; with none it is
null."""
import datetime
import time

import requests

from conftest import Server
from reconcile_util import IceTable, recon_conf
from util_http import TIMEOUT


def next_run(srv):
    r = requests.get(f"{srv.url}/v1/reconcile/runs", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["next_run_at"]


def test_next_run_at(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": []})
    t.append("f.parquet")
    before = time.time()
    srv = Server(tmp_path / "d1", config_text=recon_conf(t, interval="1h")).start()
    try:
        when = next_run(srv)
        assert when and when.endswith("Z"), when
        due = datetime.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        assert before + 1800 - 1 <= due <= time.time() + 3600 + 1, (before, when)
    finally:
        assert srv.stop() == 0, srv.read_log()
    srv = Server(tmp_path / "d2", config_text=recon_conf(t, interval="0")).start()
    try:
        assert next_run(srv) is None
    finally:
        assert srv.stop() == 0, srv.read_log()
