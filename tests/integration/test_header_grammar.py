"""Input that reaches response headers is checked once, by one grammar (issue 18): a content type
is type/subtype with token or quoted-string parameters, on uploads and on POST /v1/import, so no
CR/LF ever reaches a header or a multipart/byteranges part; bad input is a 400 (a per-item error
for import) and nothing is stored."""
import pytest
import requests

from conftest import Server
from util_http import TIMEOUT, assert_error, get, parse_ranges, post, put, sha


@pytest.fixture
def two_stores(tmp_path):
    root = tmp_path / "a"
    root.mkdir()
    srv = Server(tmp_path / "data", config_text=(
        f"[server]\nupload_store = b\n[store a]\nkind = fs\nroot = {root}\n"
        f"[store b]\nkind = fs\nroot = {tmp_path / 'b'}\n")).start()
    yield srv, root
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


BAD_TYPES = ["text/html, text/plain", "text/plain; a=b c", "text/plain; charset",
             "text/plain; a=\"open", "text", "text/plain x", "text/pl@in", "text/plain\tx"]


@pytest.mark.parametrize("ctype", BAD_TYPES)
def test_upload_refuses_a_content_type_off_the_grammar(server, ctype):
    data = b"grammar " + ctype.encode()
    for send in (put, post):
        r = send(server, data, headers={"Content-Type": ctype})
        assert_error(r, 400, "bad_content_type")
        assert "Content-Type" in r.json()["error"]["message"]
    assert_error(get(server, sha(data)), 404, "not_found")


def test_upload_keeps_a_content_type_on_the_grammar(server):
    for ctype in ("text/plain; charset=\"utf-8\"", "multipart/mixed; boundary=----x-1",
                  "application/vnd.apache.parquet", "text/plain;format=flowed"):
        data = ctype.encode()
        assert put(server, data, headers={"Content-Type": ctype}).status_code == 201
        assert get(server, sha(data)).headers["Content-Type"] == ctype


def import_one(srv, key, size, ctype, digest):
    r = requests.post(f"{srv.url}/v1/import", timeout=TIMEOUT, json={"blobs": [
        {"sha256": digest, "size": size, "store": "a", "key": key, "content_type": ctype}]})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


@pytest.mark.parametrize("ctype", ["text/plain\r\nX-Evil: 1", "text/plain\nX-Evil: 1",
                                   "text/plain; x=\"\r\nX-Evil: 1\"",
                                   "a/" + "b" * 300])
def test_import_refuses_a_content_type_that_would_inject(two_stores, ctype):
    srv, root = two_stores
    data = b"0123456789" * 50
    (root / "imp").mkdir(exist_ok=True)
    (root / "imp" / "x").write_bytes(data)
    res = import_one(srv, "imp/x", len(data), ctype, sha(data))
    assert res["result"] == "error" and "bad_content_type" in res["message"], res
    assert_error(get(srv, sha(data)), 404, "not_found")  # nothing was indexed
    assert "bad_content_type" in srv.read_log()  # and the refusal is not silent


def test_multi_range_shows_no_injected_header(two_stores):
    """The reproduction of the injection: an import whose content_type carried CR/LF came back as
    headers of every multipart/byteranges part. Now it is refused; a good one is served."""
    srv, root = two_stores
    data = bytes(range(256)) * 4
    (root / "good").write_bytes(data)
    bad = b"evil" * 100
    (root / "bad").write_bytes(bad)
    assert import_one(srv, "bad", len(bad), "text/plain\r\nX-Evil: 1", sha(bad))["result"] == "error"
    assert import_one(srv, "good", len(data), "text/csv; header=present", sha(data))["result"] == \
        "created"
    for h, blob in ((sha(data), data), (sha(bad), None)):
        r = get(srv, h, headers={"Range": "bytes=0-9,100-109"})
        if blob is None:
            assert_error(r, 404, "not_found")
            continue
        assert "X-Evil" not in r.headers
        assert b"X-Evil" not in r.content
        parts = parse_ranges(206, r.headers, r.content)
        assert [p[3] for p in parts] == [data[0:10], data[100:110]]
        for p in parts:
            assert set(p[4]) == {"content-type", "content-range"}, p[4]
            assert p[4]["content-type"] == "text/csv; header=present"


def test_hold_reason_off_the_grammar_is_refused(server):
    """A hold reason is echoed in replies and logs: bounded by the same text rule. (A control
    character cannot arrive in a query at all: the front leaves %0D and the like escaped.)"""
    data = b"hold me"
    assert put(server, data).status_code == 201
    r = requests.delete(f"{server.url}/v1/blobs/{sha(data)}", params={"reason": "x" * 256},
                        timeout=TIMEOUT)
    assert_error(r, 400, "bad_request")
    assert "reason" in r.json()["error"]["message"]
    assert get(server, sha(data)).status_code == 200  # still live: nothing changed
    r = requests.delete(f"{server.url}/v1/blobs/{sha(data)}", params={"reason": "a\r\nX: 1"},
                        timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["quarantine"]["reason"] == "a%0D%0AX: 1", r.text
