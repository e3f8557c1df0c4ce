"""The auth matrix (issue 9): every route of br_routes x (no token, unknown token, read, write,
admin token) with `[auth] anonymous = read` and `= none`, asserting 2xx / 401 / 403 exactly; and
with no [token] configured, every client may do everything.

Scopes are independent bits (README "Security"): a token has exactly the scopes it lists, plus
the anonymous scopes, which every client has as a floor. The admin token here lists only admin."""
import hashlib
import os
import pathlib
import re
import time

import pytest
import requests

from conftest import ROOT, Server
from util_http import TIMEOUT, sha

# (method, pattern, scope) for every entry of br_routes in server/http/routes.c
ROUTES = [
    ("PUT", "/v1/blobs/{hash}", "write"),
    ("GET", "/v1/blobs/{hash}", "read"),
    ("POST", "/v1/blobs", "write"),
    ("GET", "/v1/blobs", "read"),
    ("GET", "/v1/blobs/{hash}/meta", "read"),
    ("GET", "/v1/blobs/{hash}/preview", "admin"),
    ("GET", "/v1/blobs/{hash}/refs", "read"),
    ("DELETE", "/v1/blobs/{hash}", "admin"),
    ("POST", "/v1/blobs/{hash}/restore", "admin"),
    ("PUT", "/v1/blobs/{hash}/location", "admin"),
    ("POST", "/v1/import", "admin"),
    ("POST", "/v1/reconcile", "admin"),
    ("GET", "/v1/reconcile/runs", "read"),
    ("GET", "/v1/reconcile/runs/{id}", "read"),
    ("POST", "/v1/jobs", "admin"),
    ("GET", "/v1/jobs", "admin"),
    ("GET", "/v1/jobs/{id}", "admin"),
    ("POST", "/v1/jobs/{id}/cancel", "admin"),
    ("POST", "/v1/lookup", "read"),
    ("POST", "/v1/uploads", "write"),
    ("POST", "/v1/uploads/commit", "write"),
    ("DELETE", "/v1/uploads/{upload_id}", "write"),
    ("GET", "/v1/reconcile/runs/{id}/blobs", "read"),
    ("POST", "/v1/leases", "write"),
    ("GET", "/v1/leases", "write"),
    ("GET", "/v1/leases/{lease}", "write"),
    ("DELETE", "/v1/leases/{lease}", "write"),
    ("GET", "/healthz", None),
    ("GET", "/readyz", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/openapi.json", None),
    ("GET", "/ui", None),
    ("GET", "/ui/{file}", None),
]
SCOPE_C = {"BR_SCOPE_WRITE": "write", "BR_SCOPE_READ": "read", "BR_SCOPE_ADMIN": "admin",
           "0": None}

TOKENS = {"read": "read", "write": "write", "admin": "admin"}
CALLERS = ["none", "unknown", "read", "write", "admin"]


def test_routes_list_matches_the_route_table():
    src = (ROOT / "server" / "http" / "routes.c").read_text()
    table = src[src.index("const struct route br_routes[]"):]
    table = table[:table.index("};")]
    entries = re.findall(r'\{"(\w+)",\s*"([^"]+)",\s*(\w+),', table)
    assert [(m, p, SCOPE_C[s]) for m, p, s in entries] == ROUTES


def conf(anonymous):
    text = f"[auth]\nanonymous = {anonymous}\n"
    for name, scopes in TOKENS.items():
        digest = hashlib.sha256(f"secret-{name}".encode()).hexdigest()
        text += f"[token {name}]\nsha256 = {digest}\nscopes = {scopes}\n"
    return text


def headers_for(caller):
    if caller == "none":
        return {}
    if caller == "unknown":
        return {"Authorization": "Bearer not-a-configured-token"}
    return {"Authorization": f"Bearer secret-{caller}"}


def send(srv, method, pattern, caller, known):
    """One request on the route that succeeds when authorized."""
    h = headers_for(caller)
    if pattern == "/v1/blobs/{hash}" and method == "PUT":
        data = os.urandom(64)
        return requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, headers=h,
                            timeout=TIMEOUT)
    if pattern == "/v1/blobs" and method == "POST":
        return requests.post(f"{srv.url}/v1/blobs", data=os.urandom(64), headers=h,
                             timeout=TIMEOUT)
    if pattern == "/v1/lookup":
        return requests.post(f"{srv.url}/v1/lookup", json={"hashes": [known, "0" * 64]},
                             headers=h, timeout=TIMEOUT)
    if pattern == "/v1/uploads/{upload_id}":  # an abort: no such upload is no error
        return requests.delete(f"{srv.url}/v1/uploads/2~none?sha256={known}", headers=h,
                               timeout=TIMEOUT)
    if pattern.startswith("/v1/uploads"):  # the known blob: present either way
        return requests.post(srv.url + pattern, json={"blobs": [{"sha256": known, "size": 500}]},
                             headers=h, timeout=TIMEOUT)
    if pattern == "/v1/leases" and method == "POST":
        return requests.post(f"{srv.url}/v1/leases", json={"ttl": "1h", "name": "auth"},
                             headers=h, timeout=TIMEOUT)
    if pattern == "/v1/leases/{lease}":  # the write token's lease: its own, or an admin's view
        lease = requests.post(f"{srv.url}/v1/leases", json={"ttl": "1h"},
                              headers=headers_for("write"), timeout=TIMEOUT).json()["id"]
        return requests.request(method, f"{srv.url}/v1/leases/{lease}", headers=h,
                                timeout=TIMEOUT)
    if pattern == "/v1/reconcile/runs/{id}/blobs":
        return requests.get(f"{srv.url}/v1/reconcile/runs/1/blobs?action=pending", headers=h,
                            timeout=TIMEOUT)
    if method == "DELETE" or pattern.endswith("/restore"):
        # a blob of its own (the shared one must stay readable for the other routes)
        own = fresh_blob(srv)
        return requests.request(method, srv.url + pattern.replace("{hash}", own), headers=h,
                                timeout=TIMEOUT)
    if pattern.endswith("/location"):  # a "move" onto the same place: verified, switched
        loc = requests.get(f"{srv.url}/v1/blobs/{known}/meta", headers=headers_for("read"),
                           timeout=TIMEOUT).json()["locations"][0]
        here = {"store": loc["store"], "key": loc["key"]}
        return requests.put(f"{srv.url}/v1/blobs/{known}/location", headers=h, timeout=TIMEOUT,
                            json={"expect": here, "to": here, "verify": "size"})
    if pattern == "/v1/import":
        return requests.post(f"{srv.url}/v1/import", json={"blobs": []}, headers=h,
                             timeout=TIMEOUT)
    if pattern == "/v1/reconcile":  # one run at a time: wait out a 409 from the previous caller
        for _ in range(100):
            r = requests.post(f"{srv.url}/v1/reconcile?dry_run=1", headers=h, timeout=TIMEOUT)
            if r.status_code != 409:
                return r
            time.sleep(0.05)
        return r
    if pattern == "/v1/jobs" and method == "POST":  # one job per store: wait out a 409
        for _ in range(100):
            r = requests.post(f"{srv.url}/v1/jobs", headers=h, timeout=TIMEOUT,
                              json={"kind": "import", "store": "local", "source": "none/"})
            if r.status_code != 409:
                return r
            time.sleep(0.05)
        return r
    if pattern.startswith("/v1/jobs/{id}"):  # job 1: made by first_run
        return requests.request(method, srv.url + pattern.replace("{id}", "1"), headers=h,
                                timeout=TIMEOUT)
    if pattern == "/v1/reconcile/runs/{id}":
        return requests.get(f"{srv.url}/v1/reconcile/runs/1", headers=h, timeout=TIMEOUT)
    if pattern.startswith("/ui"):  # the console's files: /ui redirects to /ui/ (followed)
        return requests.get(srv.url + pattern.replace("{file}", ""), headers=h, timeout=TIMEOUT)
    path = pattern.replace("{hash}", known)
    return requests.request(method, srv.url + path, headers=h, timeout=TIMEOUT)


def fresh_blob(srv):
    data = os.urandom(64)
    r = requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, headers=headers_for("write")
                     if "write" in TOKENS else {}, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    return sha(data)


def first_run(srv, admin, reader):
    """Reconcile run 1 exists (it fails at once: no [table]), for GET /v1/reconcile/runs/1, and
    job 1, for GET /v1/jobs/1."""
    r = requests.post(f"{srv.url}/v1/jobs", headers=admin, timeout=TIMEOUT,
                      json={"kind": "import", "store": "local", "source": "none/"})
    assert r.status_code == 202 and r.json()["id"] == 1, r.text
    r = requests.post(f"{srv.url}/v1/reconcile?dry_run=1", headers=admin, timeout=TIMEOUT)
    assert r.status_code == 202 and r.json()["id"] == 1, r.text
    for _ in range(200):
        if requests.get(f"{srv.url}/v1/reconcile/runs/1", headers=reader,
                        timeout=TIMEOUT).json()["state"] != "running":
            return
        time.sleep(0.05)


def expected(scope, caller, anonymous):
    if scope is None:
        return "2xx"  # public: no token is looked at
    if caller == "unknown":
        return 401
    granted = {"read"} if anonymous == "read" else set()
    if caller in TOKENS:
        granted |= {TOKENS[caller]}
    if scope in granted:
        return "2xx"
    return 401 if caller == "none" else 403


@pytest.fixture(scope="module", params=["read", "none"])
def authsrv(request, tmp_path_factory):
    anonymous = request.param
    srv = Server(tmp_path_factory.mktemp(f"auth-{anonymous}") / "data",
                 config_text=conf(anonymous)).start()
    known = os.urandom(500)
    r = requests.put(f"{srv.url}/v1/blobs/{sha(known)}", data=known,
                     headers=headers_for("write"), timeout=TIMEOUT)
    assert r.status_code == 201
    first_run(srv, headers_for("admin"), headers_for("read"))
    yield srv, anonymous, sha(known)
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("method,pattern,scope", ROUTES + [("HEAD", "/v1/blobs/{hash}", "read")])
def test_auth_matrix(authsrv, method, pattern, scope, caller):
    srv, anonymous, known = authsrv
    r = send(srv, method, pattern, caller, known)
    want = expected(scope, caller, anonymous)
    if want == "2xx":
        assert 200 <= r.status_code < 300, (r.status_code, r.text)
    else:
        assert r.status_code == want, (r.status_code, r.text)
        if method != "HEAD":
            code = "unauthorized" if want == 401 else "forbidden"
            assert r.json()["error"]["code"] == code
        if want == 401:
            assert r.headers.get("WWW-Authenticate") == "Bearer"


@pytest.fixture(scope="module")
def opensrv(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("auth-open") / "data").start()
    known = os.urandom(500)
    assert requests.put(f"{srv.url}/v1/blobs/{sha(known)}", data=known,
                        timeout=TIMEOUT).status_code == 201
    first_run(srv, {}, {})
    yield srv, sha(known)
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("method,pattern,scope", ROUTES + [("HEAD", "/v1/blobs/{hash}", "read")])
def test_no_tokens_configured_everyone_may_do_everything(opensrv, method, pattern, scope, caller):
    srv, known = opensrv
    r = send(srv, method, pattern, caller, known)
    assert 200 <= r.status_code < 300, (r.status_code, r.text)
