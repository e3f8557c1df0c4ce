"""Direct uploads that never finish leave nothing behind (issue 21): the plan journal
(DATA_DIR/direct-plans.log) survives a kill -9, the sweep deletes an uncommitted object and
aborts an expired multipart upload once direct_upload_grace has passed, never an object a
record owns; DELETE /v1/uploads/{upload_id} aborts a plan at once; a negotiation whose client
went away before the answer leaks nothing (LeakSanitizer at the stop). On a PostgreSQL index the
plans are rows in the database: another node sweeps those of a node that never came back."""
import os
import signal
import socket
import json
import urllib.parse

import pytest
import requests

from cluster_util import index_section
from conftest import Server
from s3util import content_key, keys, multipart_uploads, s3_conf, stop_checked
from test_direct_uploads import (MiB, bucket_for, commit, direct,  # noqa: F401 (fixture)
                                 direct_put, item, metric, negotiate, python_client)
from util_http import TIMEOUT, assert_error, sha, wait_until

# test-short graces: what a plan left is swept 6 s after it was handed out, its URLs live 5 s
# (time for a negotiation, PUTs and a commit under ASan on a loaded machine: 1 s URLs expired);
# SHORT is for a config that must be refused
GRACE, TTL = "direct_upload_grace = 6s\n", "5s"
SHORT = "direct_upload_grace = 2s\n"
SWEPT = 60  # seconds to wait for a sweep (a pass every 500 ms; the machine is loaded)


def pending(srv):
    return metric(srv, "blobref_direct_plans_pending")


def multipart_plan(srv, data, ps=5 * MiB):
    parts = [sha(data[i:i + ps]) for i in range(0, len(data), ps)]
    a = negotiate(srv, [dict(item(data), part_size=ps, part_sha256=parts)])[0]
    assert a["status"] == "multipart", a
    return a


def test_kill9_between_put_and_commit_object_swept_after_grace(rgw, direct):
    srv, b = direct(server=GRACE, presign_ttl=TTL)
    s3 = rgw.client()
    data = os.urandom(3000)
    a = negotiate(srv, [item(data)])[0]
    assert a["status"] == "upload"
    assert pending(srv) == 1
    assert direct_put(a, data).status_code == 200
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=10)
    srv.proc = None
    srv.log.close()
    srv.start()
    # the plan came back from the journal; its object goes once the grace is over
    assert wait_until(lambda: content_key(sha(data)) not in keys(s3, b), timeout=SWEPT), \
        srv.read_log()
    assert pending(srv) == 0
    assert metric(srv, "blobref_direct_plans_swept_total") == 1
    assert "never committed, deleted" in srv.read_log()
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).status_code == 404
    assert commit(srv, [item(data)])[0]["status"] == "missing"


def test_sweep_never_deletes_an_object_a_record_owns(rgw, direct):
    """Three plans past their grace: one committed (forgotten at the commit), one whose blob
    another client PUT through blobrefd meanwhile (the record owns the key: kept), and one never
    committed (deleted, which shows that the sweep ran past the other two)."""
    srv, b = direct(server=GRACE, presign_ttl=TTL)
    s3 = rgw.client()
    done, other, lost = os.urandom(1000), os.urandom(2000), os.urandom(3000)
    acts = negotiate(srv, [item(done), item(other), item(lost)])
    assert [x["status"] for x in acts] == ["upload"] * 3
    for a, data in zip(acts, (done, other, lost)):
        assert direct_put(a, data).status_code == 200
    assert commit(srv, [item(done)])[0]["status"] == "created"
    assert pending(srv) == 2
    # another client sends the same blob through blobrefd: a record now owns the key
    r = requests.put(f"{srv.url}/v1/blobs/{sha(other)}", data=other, timeout=TIMEOUT)
    assert r.status_code in (200, 201), r.text
    assert wait_until(lambda: content_key(sha(lost)) not in keys(s3, b), timeout=SWEPT), \
        srv.read_log()
    assert wait_until(lambda: pending(srv) == 0, timeout=SWEPT)
    left = keys(s3, b)
    assert content_key(sha(done)) in left and content_key(sha(other)) in left
    for data in (done, other):
        assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).content == data


def test_expired_multipart_plan_is_aborted(rgw, direct):
    # URLs that live long enough for an 11 MiB negotiation and a part PUT under ASan and load
    srv, b = direct(server="direct_upload_grace = 6s\n", presign_ttl="6s", part_size="5MiB",
                    spool_max="16MiB")
    s3 = rgw.client()
    data = os.urandom(11 * MiB)
    a = multipart_plan(srv, data)
    p = a["parts"][0]
    r = requests.put(p["url"], data=data[:5 * MiB], headers=p["headers"], timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert [u for _, u in multipart_uploads(s3, b)] == [a["upload_id"]]
    assert wait_until(lambda: not multipart_uploads(s3, b), timeout=SWEPT), srv.read_log()
    assert wait_until(lambda: pending(srv) == 0, timeout=SWEPT)
    assert "expired multipart upload" in srv.read_log()


def test_client_aborts_a_multipart_plan(rgw, direct):
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    s3 = rgw.client()
    data = os.urandom(11 * MiB)
    a = multipart_plan(srv, data)
    assert pending(srv) == 1 and multipart_uploads(s3, b)
    u = f"{srv.url}/v1/uploads/{urllib.parse.quote(a['upload_id'], safe='')}"
    assert_error(requests.delete(u, timeout=TIMEOUT), 400, "bad_hash")
    assert_error(requests.delete(u + "?sha256=xyz", timeout=TIMEOUT), 400, "bad_hash")
    assert_error(requests.delete(f"{srv.url}/v1/uploads/a%20b?sha256={sha(data)}",
                                 timeout=TIMEOUT), 400, "bad_request")
    assert pending(srv) == 1 and multipart_uploads(s3, b)  # bad input changed nothing
    r = requests.delete(u + f"?sha256={sha(data)}", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json() == {"upload_id": a["upload_id"], "sha256": sha(data), "aborted": True}
    assert not multipart_uploads(s3, b)
    assert pending(srv) == 0
    # a second abort of the same upload is no error (the store no longer knows it)
    assert requests.delete(u + f"?sha256={sha(data)}", timeout=TIMEOUT).status_code == 200


def test_python_put_many_aborts_when_a_part_fails(rgw, direct, tmp_path, monkeypatch):
    blobref = python_client()
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    s3 = rgw.client()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * MiB))
    real = blobref.Client._store_put

    def failing(self, url, method, headers, data):
        if "partNumber=2" in url:
            url = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")  # the store refuses it
        return real(self, url, method, headers, data)

    monkeypatch.setattr(blobref.Client, "_store_put", failing)
    with pytest.raises(blobref.BlobrefError, match="PUT of part 2"):
        blobref.Client(srv.url).put_many([big], workers=2)
    assert not multipart_uploads(s3, b)
    assert pending(srv) == 0


def test_negotiation_whose_client_went_away_leaks_nothing(rgw, direct):
    """The answer a negotiation's finisher built for a client that closed its connection is
    freed with the request (LeakSanitizer fails the stop otherwise)."""
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    data = os.urandom(11 * MiB)
    ps = 5 * MiB
    parts = [sha(data[i:i + ps]) for i in range(0, len(data), ps)]
    n = 20  # 20 CreateMultipartUpload round trips: the answer comes after the close
    blobs = [dict(item(data), part_size=ps, part_sha256=parts)] * n
    body = json.dumps({"blobs": blobs}).encode()
    host, port = srv.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        s.sendall(b"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert wait_until(lambda: pending(srv) == n, timeout=SWEPT)  # the job ran to its end
    assert wait_until(lambda: "client went away" in srv.read_log() or
                      metric(srv, "blobref_pool_jobs{pool=\"slow\"}") == 0, timeout=SWEPT)
    stop_checked(srv)  # exit status 0: no leak reported
    assert "LeakSanitizer" not in srv.read_log()


def test_presign_ttl_longer_than_the_grace_stops_startup(rgw, tmp_path):
    srv = Server(tmp_path / "bad", config_text=s3_conf(rgw, "nobucket", server=SHORT,
                                                       direct_uploads="auto", presign_ttl="5s"))
    with pytest.raises(RuntimeError, match=r"presign_ttl is longer than \[server\] "
                                           r"direct_upload_grace"):
        srv.start()


def test_plans_of_a_dead_pg_node_are_swept_by_another(rgw, postgres, tmp_path, request):
    """Two nodes over one PostgreSQL index and one bucket: three plans handed out by node A,
    each object PUT, then A is killed -9 and never returns. Node B sees A's plans (they are in
    the database, not in A's journal); one is committed through B meanwhile (forgotten), one
    blob is PUT through B (a record owns the key: kept); B sweeps the third once the grace has
    passed, and only it."""
    dsn = postgres.database()
    bucket = rgw.make_bucket(bucket_for(request))
    # a grace that outlasts the PUTs, the kill and the commit below on a loaded machine
    conf = s3_conf(rgw, bucket, server="direct_upload_grace = 4s\n", direct_uploads="auto",
                   presign_ttl="2s") + "\n" + index_section(dsn)
    a = Server(tmp_path / "a", config_text=conf).start()
    bnode = Server(tmp_path / "b", config_text=conf).start()
    try:
        s3 = rgw.client()
        lost, kept, owned = os.urandom(3000), os.urandom(4000), os.urandom(5000)
        acts = negotiate(a, [item(lost), item(kept), item(owned)])
        assert [x["status"] for x in acts] == ["upload"] * 3, acts
        for act, data in zip(acts, (lost, kept, owned)):
            assert direct_put(act, data).status_code == 200
        assert pending(bnode) == 3  # A's plans, as B sees them
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=10)
        a.proc = None
        a.log.close()
        assert commit(bnode, [item(kept)])[0]["status"] == "created"
        r = requests.put(f"{bnode.url}/v1/blobs/{sha(owned)}", data=owned, timeout=TIMEOUT)
        assert r.status_code in (200, 201), r.text
        assert pending(bnode) == 2  # the commit forgot its plan, whichever node made it
        assert wait_until(lambda: content_key(sha(lost)) not in keys(s3, bucket),
                          timeout=SWEPT), bnode.read_log()
        assert wait_until(lambda: pending(bnode) == 0, timeout=SWEPT), bnode.read_log()
        assert "never committed, deleted" in bnode.read_log()
        assert metric(bnode, "blobref_direct_plans_swept_total") == 1
        left = keys(s3, bucket)
        assert content_key(sha(kept)) in left and content_key(sha(owned)) in left
        for data in (kept, owned):
            got = requests.get(f"{bnode.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
            assert got.status_code == 200 and got.content == data
        assert requests.get(f"{bnode.url}/v1/blobs/{sha(lost)}/meta",
                            timeout=TIMEOUT).status_code == 404
        assert not (tmp_path / "b" / "direct-plans.log").exists()  # no journal on PostgreSQL
    finally:
        stop_checked(bnode)
