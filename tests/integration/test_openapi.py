"""conf/openapi.json, the API's OpenAPI 3.1 description: it matches the route table and the
error table both ways, a maintained validator (@seriousme/openapi-schema-validator, tests/js)
accepts it and refuses a broken copy, blobrefd serves it byte for byte at /v1/openapi.json
without a token, and its examples, replayed in order against the real server, get the
documented status and body shape."""
import copy
import hashlib
import json
import re
import shutil
import subprocess

import pytest
import requests

from conftest import JS_DIR, ROOT, Server
from test_error_codes import table as error_table

DOC_PATH = ROOT / "conf" / "openapi.json"
VALIDATE = ROOT / "tests" / "integration" / "openapi_validate.mjs"
METHODS = ("get", "put", "post", "delete", "head", "patch", "options")
SCOPES = {"BR_SCOPE_READ": "read", "BR_SCOPE_WRITE": "write", "BR_SCOPE_ADMIN": "admin",
          "0": None}
T = 30


def doc():
    return json.loads(DOC_PATH.read_text())


def route_table():
    """[(METHOD, pattern, scope)] of br_routes in server/http/routes.c."""
    src = (ROOT / "server" / "http" / "routes.c").read_text()
    body = src[src.index("const struct route br_routes[]"):]
    body = body[:body.index("};")]
    return [(m, p, SCOPES[s]) for m, p, s in re.findall(r'\{"(\w+)",\s*"([^"]+)",\s*(\w+),', body)]


def operations(d):
    for path, item in d["paths"].items():
        for m in item:   # in document order: the replay depends on it
            if m in METHODS:
                yield path, m, item[m], item.get("parameters", [])


def test_paths_match_the_route_table_both_ways():
    d = doc()
    table = route_table()
    described = {(m.upper(), p) for p, m, _, _ in operations(d) if m != "head"}
    routes = {(m, p) for m, p, _ in table}
    assert described - routes == set(), "described but not routed"
    assert routes - described == set(), "routed but not described"
    for p, m, o, _ in operations(d):   # HEAD is served by GET routes only
        if m == "head":
            assert ("GET", p) in routes, p
    scopes = {(m, p): s for m, p, s in table}
    for p, m, o, _ in operations(d):
        s = scopes[("GET" if m == "head" else m.upper(), p)]
        if s is None:
            assert o["security"] == [], (m, p, "a public route needs no token")
        else:
            assert o["x-scope"] == s, (m, p)
            assert {"bearer": []} in o["security"], (m, p)


def test_every_path_parameter_is_declared_and_used():
    for p, m, o, shared in operations(doc()):
        declared = {x["name"] for x in shared + o.get("parameters", []) if x["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", p)), (m, p)


def test_error_codes_match_the_error_table_both_ways():
    d = doc()
    t = error_table()
    assert sorted(d["components"]["schemas"]["ErrorCode"]["enum"]) == sorted(t)
    used = dict(d["x-router-error-codes"])
    for p, m, o, _ in operations(d):
        for status, resp in o["responses"].items():
            for code in resp.get("x-error-codes", []):
                assert t.get(code) == int(status), (m, p, status, code, t.get(code))
                used[code] = int(status)
            if int(status) >= 400:
                assert resp.get("x-error-codes"), (m, p, status, "an error without its codes")
    assert {c: s for c, s in d["x-router-error-codes"].items()} == \
        {c: t[c] for c in d["x-router-error-codes"]}
    assert sorted(used) == sorted(t), "codes of the table no response carries: " + \
        str(sorted(set(t) - set(used)))


def validate(path):
    if shutil.which("node") is None:
        pytest.fail("node is not installed (tools/install-deps.sh test)")
    r = subprocess.run(["node", str(VALIDATE), str(path)], capture_output=True, text=True,
                       timeout=120, cwd=JS_DIR)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_a_maintained_validator_accepts_it_and_refuses_a_broken_copy(tmp_path):
    res = validate(DOC_PATH)
    assert res["valid"] is True, json.dumps(res["errors"], indent=1)[:3000]
    assert res["version"] == "3.1"
    broken = copy.deepcopy(doc())
    del broken["paths"]["/v1/lookup"]["post"]["requestBody"]["content"]  # required there
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert validate(tmp_path / "broken.json")["valid"] is False


@pytest.fixture
def closed_server(tmp_path):
    """Anonymous clients may do nothing: the description must still be served."""
    digest = hashlib.sha256(b"secret").hexdigest()
    srv = Server(tmp_path / "data", config_text=f"[auth]\nanonymous = none\n[token t]\n"
                 f"sha256 = {digest}\nscopes = read\n").start()
    yield srv
    assert srv.stop() == 0, srv.read_log()


def test_served_at_v1_openapi_json_without_a_token(closed_server):
    url = closed_server.url + "/v1/openapi.json"
    r = requests.get(url, timeout=T)
    assert r.status_code == 200
    assert r.content == DOC_PATH.read_bytes()
    assert r.headers["Content-Type"] == "application/json"
    etag = r.headers["ETag"]
    assert etag == '"%s"' % hashlib.sha256(r.content).hexdigest()[:16]
    assert r.headers["Cache-Control"] == "no-cache"
    r = requests.get(url, headers={"If-None-Match": etag}, timeout=T)
    assert r.status_code == 304 and r.content == b""
    r = requests.head(url, timeout=T)
    assert r.status_code == 200 and r.headers["ETag"] == etag
    assert requests.get(closed_server.url + "/v1/blobs", timeout=T).status_code == 401


def shape_ok(example, actual):
    """True when actual has every key of the documented example, recursively, with values of
    the same JSON type (a list's first documented item against every actual item)."""
    if isinstance(example, dict):
        return isinstance(actual, dict) and all(k in actual and shape_ok(v, actual[k])
                                                for k, v in example.items())
    if isinstance(example, list):
        return isinstance(actual, list) and (not example or all(shape_ok(example[0], a)
                                                                for a in actual))
    if isinstance(example, bool) or example is None:
        return type(actual) is type(example) or example is None
    if isinstance(example, (int, float)):
        return isinstance(actual, (int, float)) and not isinstance(actual, bool)
    return isinstance(actual, type(example))


def replays(d):
    """Every documented example, in document order: (name, method, path, op, status, resp)."""
    for p, m, o, shared in operations(d):
        for status, resp in o["responses"].items():
            names = list(resp.get("x-examples", []))
            for media in resp.get("content", {}).values():
                names += list(media.get("examples", {}))
            for name in dict.fromkeys(names):
                yield name, m, p, o, shared, int(status), resp


def build_request(name, method, path, op, shared):
    url, query, headers, body = path, {}, {}, None
    for prm in shared + op.get("parameters", []):
        e = prm.get("examples", {}).get(name)
        if e is None:
            assert prm["in"] != "path", (name, method, path, prm["name"], "no example")
            continue
        v = e["value"]
        if prm["in"] == "path":
            url = url.replace("{%s}" % prm["name"], str(v))
        elif prm["in"] == "query":
            query[prm["name"]] = str(v)
        elif prm["in"] == "header":
            headers[prm["name"]] = str(v)
    for media, c in op.get("requestBody", {}).get("content", {}).items():
        e = c.get("examples", {}).get(name)
        if e is not None:
            headers.setdefault("Content-Type", media)
            body = json.dumps(e["value"]).encode() if media == "application/json" \
                else e["value"].encode()
    return url, query, headers, body


def test_the_documented_examples_replayed_against_the_server(server):
    d = doc()
    done = []
    for name, method, path, op, shared, status, resp in replays(d):
        url, query, headers, body = build_request(name, method, path, op, shared)
        r = requests.request(method.upper(), server.url + url, params=query, headers=headers,
                             data=body, timeout=T, allow_redirects=False)
        what = f"{method.upper()} {url} {query} (example {name!r})"
        assert r.status_code == status, f"{what}: {r.status_code} {r.text[:300]}"
        for media, c in resp.get("content", {}).items():
            e = c.get("examples", {}).get(name)
            if e is None or method == "head":
                continue
            assert r.headers["Content-Type"].split(";")[0] == media \
                or media == "application/octet-stream", (what, r.headers["Content-Type"])
            if media == "application/json":
                got = r.json()
                assert shape_ok(e["value"], got), f"{what}: {got} lacks {e['value']}"
                if "error" in got:
                    assert got["error"]["code"] == e["value"]["error"]["code"], (what, got)
            else:
                assert r.content == e["value"].encode(), (what, r.content[:100])
        done.append((method, path, name))
    assert len(done) >= 25, done
    described = {(m, p) for p, m, _, _ in operations(d)}
    with_examples = {(m, p) for m, p, _ in done}
    # every /v1 operation has at least one replayed example
    assert {x for x in described if x[1].startswith("/v1/") and x[1] != "/v1/openapi.json"} \
        <= with_examples, sorted(described - with_examples)
