"""GET /v1/blobs: the index in key order, page by page (after, limit, state), and bad input."""
import hashlib
import random

import pytest
import requests

from conftest import Server
from util_http import TIMEOUT, RFC3339_RE, assert_error, put, sha


def listing(srv, **params):
    return requests.get(f"{srv.url}/v1/blobs", params=params, timeout=TIMEOUT)


def all_pages(srv, limit, **params):
    seen, after, pages = [], None, 0
    while True:
        q = dict(params, limit=limit)
        if after:
            q["after"] = after
        r = listing(srv, **q)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"blobs", "next"}
        assert len(body["blobs"]) <= limit
        seen += body["blobs"]
        pages += 1
        if body["next"] is None:
            return seen, pages
        assert body["next"] == body["blobs"][-1]["sha256"] or not body["blobs"]
        after = body["next"]


def test_paging_covers_every_blob_once_in_key_order(server):
    rng = random.Random(7)
    blobs = {}
    for i in range(53):
        data = rng.randbytes(rng.randrange(0, 3000))
        blobs[sha(data)] = data
        r = put(server, data, headers={"Content-Type": f"image/x-{i}"})
        assert r.status_code in (200, 201)
    want = sorted(blobs)
    for limit in (1, 2, 10, 52, 53, 1000):
        seen, pages = all_pages(server, limit)
        assert [b["sha256"] for b in seen] == want, limit
        assert pages == -(-53 // limit)  # a full last page says next = null, no empty page
    # default limit (1000) answers everything in one page with next = null
    body = listing(server).json()
    assert [b["sha256"] for b in body["blobs"]] == want and body["next"] is None
    # each entry is the /meta view
    for b in body["blobs"][:5]:
        meta = requests.get(f"{server.url}/v1/blobs/{b['sha256']}/meta", timeout=TIMEOUT).json()
        assert b == meta
        assert b["size"] == len(blobs[b["sha256"]]) and b["state"] == "live"
        assert RFC3339_RE.match(b["created_at"]) and RFC3339_RE.match(b["last_upload_at"])
        assert b["locations"][0]["store"] == "local" and b["locations"][0]["role"] == "primary"
    # state filter: every blob is live here
    live, _ = all_pages(server, 10, state="live")
    assert [b["sha256"] for b in live] == want
    q = listing(server, state="quarantined").json()
    assert q == {"blobs": [], "next": None}
    # after = the last key: nothing follows; after = a key that does not exist: starts after it
    assert listing(server, after=want[-1]).json() == {"blobs": [], "next": None}
    mid = want[20][:63] + ("0" if want[20][63] != "0" else "1")
    got = [b["sha256"] for b in listing(server, after=mid).json()["blobs"]]
    assert got == [h for h in want if h > mid]
    assert [b["sha256"] for b in listing(server, after="sha256:" + want[9]).json()["blobs"]] == \
        want[10:]
    # limit 10000 is allowed
    assert listing(server, limit=10000).status_code == 200


@pytest.mark.parametrize("params,code", [
    ({"limit": "0"}, "bad_request"), ({"limit": "10001"}, "bad_request"),
    ({"limit": "-1"}, "bad_request"), ({"limit": "ten"}, "bad_request"),
    ({"limit": "5x"}, "bad_request"), ({"limit": ""}, "bad_request"),
    ({"limit": "99999999999999999999999"}, "bad_request"),
    ({"state": "deleted"}, "bad_request"), ({"state": ""}, "bad_request"),
    ({"after": "abc"}, "bad_hash"), ({"after": "A" * 64}, "bad_hash"),
    ({"after": "g" * 64}, "bad_hash"), ({"after": "0" * 65}, "bad_hash"),
])
def test_bad_input(server, params, code):
    assert_error(listing(server, **params), 400, code)


def test_listing_needs_read_scope(tmp_path):
    token = "br_" + "ab" * 32
    conf = ("[auth]\nanonymous = none\n[token w]\nsha256 = "
            f"{hashlib.sha256(token.encode()).hexdigest()}\nscopes = write\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        assert_error(listing(srv), 401, "unauthorized")
        r = requests.get(f"{srv.url}/v1/blobs", headers={"Authorization": f"Bearer {token}"},
                         timeout=TIMEOUT)
        assert_error(r, 403, "forbidden")
    finally:
        assert srv.stop() == 0
