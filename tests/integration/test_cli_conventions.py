"""CLI and operator conventions (issue 23): one version everywhere (binaries, /healthz, the
build_info metric, CHANGELOG), global options anywhere and as --opt=value, "did you mean",
documented exit codes (3 = refused by a guard), --json output checked with a JSON parser, man
pages that man(1) renders without a warning, a bash completion that completes, `make install`
into a DESTDIR, and every config key documented in conf/blobref.conf (and nothing more)."""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest
import requests

from conftest import BIN_DIR, Server
from reconcile_util import IceTable, recon_conf
from util_http import assert_error, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOBREF = str(BIN_DIR / "blobref")
BLOBREFD = str(BIN_DIR / "blobrefd")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def run(*args, input=None, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BLOBREF_")}
    full_env.update(env or {})
    return subprocess.run([BLOBREF, *map(str, args)], input=input, capture_output=True, text=True,
                          env=full_env, timeout=120)


def header_version():
    m = re.search(r'#define BLOBREF_VERSION "([0-9]+\.[0-9]+\.[0-9]+)"',
                  (ROOT / "include/blobref/version.h").read_text())
    assert m, "include/blobref/version.h has no BLOBREF_VERSION"
    return m.group(1)


# ---- one version --------------------------------------------------------------------------

def test_version_is_the_same_everywhere(server):
    v = header_version()
    heading = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert heading and heading.group(1) == v, \
        f"CHANGELOG's newest heading {heading and heading.group(0)!r} is not version {v}"
    p = run("--version")
    assert p.returncode == 0 and p.stdout == f"blobref {v}\n", (p.stdout, p.stderr)
    p = run("--json", "--version")
    assert p.returncode == 0 and json.loads(p.stdout) == {"version": v}, p.stdout
    d = subprocess.run([BLOBREFD, "--version"], capture_output=True, text=True, timeout=30)
    assert d.returncode == 0 and d.stdout == f"blobrefd {v}\n", (d.stdout, d.stderr)
    h = requests.get(server.url + "/healthz", timeout=10).json()
    assert h == {"status": "ok", "version": v}, h
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert f'blobref_build_info{{version="{v}"}} 1\n' in metrics
    assert "# TYPE blobref_build_info gauge\n" in metrics
    for page in ("blobref.1", "blobrefd.8", "blobref.conf.5"):
        th = (ROOT / "conf/man" / page).read_text()
        assert f'"blobref {v}"' in th, f"conf/man/{page} does not name version {v}"


# ---- global options and usage ---------------------------------------------------------------

def test_global_options_anywhere_and_with_equals(server):
    data = b"cli conventions: global options anywhere"
    h = sha(data)
    r = requests.put(f"{server.url}/v1/blobs/{h}", data=data, timeout=10)
    assert r.status_code == 201, r.text
    forms = [
        ["--server", server.url, "stat", h],
        [f"--server={server.url}", "stat", h],
        ["stat", h, "--server", server.url],
        ["stat", f"--server={server.url}", h],
    ]
    for args in forms:
        p = run(*args)
        assert p.returncode == 0, (args, p.stderr)
        assert json.loads(p.stdout)["sha256"] == h, (args, p.stdout)
    # The environment is the default; an explicit option wins over it.
    p = run("stat", h, env={"BLOBREF_SERVER": "http://127.0.0.1:1"})
    assert p.returncode == 1 and "127.0.0.1:1" in p.stderr, p.stderr
    p = run("stat", h, f"--server={server.url}", env={"BLOBREF_SERVER": "http://127.0.0.1:1"})
    assert p.returncode == 0, p.stderr
    # After a lone "--" nothing is a global option: it is the command's argument.
    p = run("--server", server.url, "stat", "--", "--json")
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)


def test_mistyped_options_get_a_suggestion(tmp_path):
    """A mistyped option names the closest one (the command's own, or a global), exit 2, and
    nothing is sent (no server is listening at port 1)."""
    f = tmp_path / "x.txt"
    f.write_text("x")
    srv = ["--server", "http://127.0.0.1:1"]
    cases = [(["put", "--jsn", f], "unknown option '--jsn'; did you mean --json?"),
             (["put", "--recrusive", f], "did you mean --recursive?"),
             (["get", "--outpt", "y", "0" * 64], "did you mean --output?"),
             (["ls", "--limt=3"], "did you mean --limit?"),
             (["token", "new", "--scpoes", "read"], "did you mean --scopes?"),
             (["put", "--zzzzzz", f], "unknown option '--zzzzzz' (see 'blobref put --help')"),
             (["put", f, "--jobs"], "--jobs needs a value")]
    for args, want in cases:
        p = run(*srv, *args)
        assert p.returncode == 2 and want in p.stderr, (args, p.returncode, p.stderr)
        assert "cannot reach" not in p.stderr and p.stdout == "", (args, p.stderr)
    p = run(*srv, "put", "--zzzzzz", f)
    assert "did you mean" not in p.stderr, p.stderr


def test_usage_errors_exit_2_with_a_suggestion():
    p = run("recnocile")
    assert p.returncode == 2 and "did you mean 'reconcile'?" in p.stderr, p.stderr
    p = run("sta", "x")
    assert p.returncode == 2 and "did you mean 'stat'?" in p.stderr, p.stderr
    p = run("extract-parqet")
    assert p.returncode == 2 and "did you mean 'extract-parquet'?" in p.stderr, p.stderr
    p = run("frobnicate")
    assert p.returncode == 2 and "did you mean" not in p.stderr and "frobnicate" in p.stderr
    p = run("--server")
    assert p.returncode == 2 and "--server needs a value" in p.stderr, p.stderr
    p = run()
    assert p.returncode == 2 and "usage: blobref" in p.stderr
    p = run("--help")
    assert p.returncode == 0 and "exit status: 0 ok, 1 failure, 2 usage, 3 refused" in p.stdout
    p = run("--bogus", "stat")
    assert p.returncode == 2 and "--bogus" in p.stderr, p.stderr


# ---- --json ----------------------------------------------------------------------------------

def test_json_output_of_put_lookup_token(server, tmp_path):
    a, b = b"json put one", b"json put two"
    fa = tmp_path / "a.bin"
    fa.write_bytes(a)
    p = run("--server", server.url, "put", fa, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"sha256": sha(a), "size": len(a), "dedup": False}, p.stdout
    p = run("--server", server.url, "--json", "put", fa)
    assert json.loads(p.stdout) == {"sha256": sha(a), "size": len(a), "dedup": True}, p.stdout
    p = run("--server", server.url, "lookup", sha(a), sha(b), "--json")
    assert p.returncode == 1, p.stderr  # one is missing
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert lines == [{"sha256": sha(a), "found": True, "size": len(a)},
                     {"sha256": sha(b), "found": False}], p.stdout
    p = run("token", "new", "--scopes", "write,read", "--name=ci-json", "--json")
    assert p.returncode == 0, p.stderr
    tok = json.loads(p.stdout)
    assert re.fullmatch(r"br_[0-9a-f]{64}", tok["token"]), tok
    assert tok["name"] == "ci-json" and tok["scopes"] == ["read", "write"], tok
    assert tok["sha256"] == hashlib.sha256(tok["token"].encode()).hexdigest()
    assert tok["config"] == f"[token ci-json]\nsha256 = {tok['sha256']}\nscopes = read, write\n" \
        or tok["config"].startswith("[token ci-json]\n"), tok["config"]


def test_reconcile_refused_by_max_fraction_exits_3_and_json(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": []})
    t.append("f.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(t, grace="1s",
                                                            max_fraction="0.5")).start()
    try:
        for i in range(4):  # none referenced: 4 of 4 would go, over max_fraction 0.5
            data = f"refused {i}".encode()
            assert requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data,
                                timeout=10).status_code == 201
        # Wait (by dry runs) until the blobs are past their grace: the dry run would quarantine 4.
        deadline = time.time() + 30
        while True:
            p = run("--server", srv.url, "reconcile", "--dry-run", "--force", "--wait", "--json")
            assert p.returncode == 0, (p.stdout, p.stderr)
            if json.loads(p.stdout)["blobs"]["quarantined"] == 4:
                break
            assert time.time() < deadline, p.stdout
            time.sleep(0.2)
        p = run("--server", srv.url, "reconcile", "--wait")
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        assert "refused:" in p.stdout, p.stdout
        p = run("--server", srv.url, "reconcile", "--wait", "--json")
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        rep = json.loads(p.stdout)
        assert isinstance(rep["refused"], str) and rep["blobs"]["quarantined"] == 0, rep
        # Without --wait: a sentence naming the run, or with --json the server's reply.
        p = run("--server", srv.url, "reconcile", "--dry-run")
        assert p.returncode == 0 and re.match(r"reconcile run \d+ started \(dry run\)", p.stdout), \
            p.stdout
        p = run("--server", srv.url, "reconcile", "--dry-run", "--json")
        body = json.loads(p.stdout)
        assert p.returncode == 0 and isinstance(body["id"], int), p.stdout
        # restore --json prints the record.
        h = sha(b"refused 0")
        # The two dry runs above may still be running: a start meanwhile is refused (409), so
        # start until the server takes it.
        def started():
            r = requests.post(f"{srv.url}/v1/reconcile?force=1", timeout=10)
            if r.status_code != 202:
                assert_error(r, 409, "reconcile_running")
            return r.status_code == 202

        assert wait_until(started, timeout=30, step=0.1), "the forced run was never started"
        deadline = time.time() + 30
        while requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=10).json()["state"] == "live":
            assert time.time() < deadline
            time.sleep(0.1)
        p = run("--server", srv.url, "restore", h, "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["state"] == "live", p.stdout
    finally:
        srv.stop()


# ---- man pages, completion, install -------------------------------------------------------------

@pytest.mark.parametrize("page", ["blobref.1", "blobrefd.8", "blobref.conf.5"])
def test_man_page_renders_without_warnings(page):
    if not shutil.which("man"):
        pytest.skip("man is not installed")
    p = subprocess.run(["man", "--warnings", "-l", str(ROOT / "conf/man" / page)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8", MANPAGER="cat",
                                PAGER="cat"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "NAME" in p.stdout and "SEE ALSO" in p.stdout


def test_man_page_warnings_are_seen(tmp_path):
    """The check above can fail: a page with an unknown macro makes man warn."""
    if not shutil.which("man"):
        pytest.skip("man is not installed")
    bad = tmp_path / "bad.1"
    bad.write_text(".TH BAD 1\n.SH NAME\nbad \\- page\n.NOSUCHMACRO\n")
    p = subprocess.run(["man", "--warnings", "-l", str(bad)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, MANPAGER="cat", PAGER="cat"))
    assert "NOSUCHMACRO" in p.stderr, p.stderr


def test_man_page_lists_every_command():
    page = (ROOT / "conf/man/blobref.1").read_text()
    usage = run("--help").stdout
    commands = re.findall(r"^  ([a-z][a-z-]+) ", usage, re.M)
    assert len(commands) >= 12, usage
    for c in commands:
        roff = c.replace("-", "\\-")  # a hyphen is written \- in roff
        assert re.search(r"^\.B " + re.escape(roff) + r"(\s|$)", page, re.M), \
            f"blobref(1) does not describe '{c}'"


def complete(words):
    """What the bash completion offers for a command line (the last word being completed)."""
    script = (f"source {ROOT / 'conf/blobref.bash-completion'}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
              f"COMP_CWORD={len(words) - 1}\n_blobref\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    p = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    return set(p.stdout.split())


def test_bash_completion():
    usage = run("--help").stdout
    commands = set(re.findall(r"^  ([a-z][a-z-]+) ", usage, re.M))
    assert complete(["blobref", ""]) >= commands
    assert complete(["blobref", "rec"]) == {"reconcile"}
    assert complete(["blobref", "--server", "http://x", "re"]) == {"refs", "reconcile", "restore"}
    assert complete(["blobref", "reconcile", "--"]) >= {"--dry-run", "--force", "--full",
                                                         "--wait", "--json"}
    assert complete(["blobref", "refs", "t", "--form", ""]) == {"hex", "binary", "url"}


def test_make_install_into_destdir(tmp_path):
    dest = tmp_path / "root"
    p = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "install",
                        f"DESTDIR={dest}", "PREFIX=/opt/blobref"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    pre = dest / "opt/blobref"
    for rel in ("bin/blobrefd", "bin/blobref", "share/man/man1/blobref.1",
                "share/man/man5/blobref.conf.5", "share/man/man8/blobrefd.8",
                "lib/systemd/system/blobrefd.service",
                "share/bash-completion/completions/blobref", "share/doc/blobref/blobref.conf"):
        assert (pre / rel).is_file(), rel
    assert os.access(pre / "bin/blobref", os.X_OK)
    v = subprocess.run([str(pre / "bin/blobref"), "--version"], capture_output=True, text=True)
    assert v.stdout == f"blobref {header_version()}\n", v
    unit = (pre / "lib/systemd/system/blobrefd.service").read_text()
    assert "ExecStart=/opt/blobref/bin/blobrefd -c /etc/blobref/blobref.conf" in unit, unit
    conf = dest / "etc/blobref/blobref.conf"
    assert conf.read_text() == (ROOT / "conf/blobref.conf").read_text()
    # A second install never overwrites the operator's config.
    conf.write_text("[server]\nlisten = 127.0.0.1:9999\n")
    p = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "install",
                        f"DESTDIR={dest}", "PREFIX=/opt/blobref"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert conf.read_text() == "[server]\nlisten = 127.0.0.1:9999\n"


# ---- config keys -----------------------------------------------------------------------------

def test_every_config_key_is_documented_and_nothing_else():
    src = (ROOT / "server/base/config.c").read_text()
    keys = set(re.findall(r'\{"([a-z_0-9]+)", KEY_[A-Z_]+', src))
    assert len(keys) > 40, "the key tables of config.c were not found"
    conf = (ROOT / "conf/blobref.conf").read_text()
    documented = set(re.findall(r"^[;#]?\s*([a-z_0-9]+)\s*=", conf, re.M))
    assert not keys - documented, f"keys not in conf/blobref.conf: {sorted(keys - documented)}"
    assert not documented - keys, f"conf/blobref.conf keys config.c does not know: " \
        f"{sorted(documented - keys)}"


# ---- commands people reached curl for -----------------------------------------------------------

def test_put_many_files_and_a_tree(server, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    files = {tree / "a.jpg": b"\xff\xd8 jpeg-ish", tree / "b.txt": b"plain text",
             tree / "sub" / "c.bin": b"no extension known" * 100,
             tree / "sub" / "deeper" / "d.PNG": b"\x89PNG not really"}
    for p, data in files.items():
        p.write_bytes(data)
    (tree / "link.jpg").symlink_to(tree / "a.jpg")  # never followed nor uploaded
    (tree / "b-copy.txt").write_bytes(b"plain text")  # a duplicate of b.txt
    p = run("--server", server.url, "put", "-r", tree, "--jobs=3")
    assert p.returncode == 0, p.stderr
    lines = dict(reversed(line.split("  ", 1)) for line in p.stdout.splitlines())
    expect = {str(k): sha(v) for k, v in files.items()}
    expect[str(tree / "b-copy.txt")] = sha(b"plain text")
    assert lines == expect, p.stdout
    summary = p.stderr.strip().splitlines()[-1]
    # b.txt and b-copy.txt race: one uploads, the other finds it (or both upload before either
    # is indexed); 5 files in all, none failed.
    m = re.match(r"blobref put: 5 files: (\d) uploaded, (\d) already present, 0 failed; (\d+) "
                 r"bytes, (\d+) sent$", summary)
    assert m and int(m.group(1)) + int(m.group(2)) == 5 and int(m.group(1)) >= 4, summary
    assert int(m.group(3)) == sum(len(v) for v in files.values()) + len(b"plain text"), summary
    # Types from the extension (case-insensitive); unknown: octet-stream, which the server
    # replaces with the type it detects in the bytes (c.bin is text).
    types = {"a.jpg": "image/jpeg", "b.txt": "text/plain", "c.bin": "text/plain",
             "d.PNG": "image/png"}
    for p_, data in files.items():
        meta = requests.get(f"{server.url}/v1/blobs/{sha(data)}/meta", timeout=10).json()
        assert meta["content_type"] == types[p_.name], (p_.name, meta)
    # A second run sends nothing: every blob is already present.
    p = run("--server", server.url, "put", "--recursive", tree, "--json")
    assert p.returncode == 0, p.stderr
    objs = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(objs) == 5 and all(o["dedup"] is True and o["path"] in expect for o in objs), objs
    assert p.stderr.strip().endswith("0 uploaded, 5 already present, 0 failed; "
                                     f"{int(m.group(3))} bytes, 0 sent"), p.stderr
    # Several files without -r: a directory among them is an error, the others still go.
    p = run("--server", server.url, "put", tree / "a.jpg", tree / "sub")
    assert p.returncode == 1 and "is a directory" in p.stderr, p.stderr
    assert p.stdout == f"{sha(files[tree / 'a.jpg'])}  {tree / 'a.jpg'}\n", p.stdout
    p = run("--server", server.url, "put", "--sha256", "0" * 64, tree / "a.jpg", tree / "b.txt")
    assert p.returncode == 2, p.stderr
    p = run("--server", server.url, "put", "--jobs", "0", tree / "a.jpg")
    assert p.returncode == 2, p.stderr


def test_ls_hold_restore_and_reconcile_runs(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": []})
    t.append("f.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(t, grace="1h")).start()
    try:
        blobs = sorted((sha(d), d) for d in (f"ls blob {i}".encode() for i in range(2500)))
        s = requests.Session()
        for h, d in blobs:
            assert s.put(f"{srv.url}/v1/blobs/{h}", data=d, timeout=10).status_code == 201
        p = run("--server", srv.url, "ls")  # 3 pages of 1000
        assert p.returncode == 0, p.stderr
        rows = [line.split(" ") for line in p.stdout.splitlines()]
        assert [r[0] for r in rows] == [h for h, _ in blobs]
        assert all(r[1] == str(len(d)) and r[2] == "live" and r[3] == "text/plain"
                   for r, (_, d) in zip(rows, blobs)), rows[:3]
        p = run("--server", srv.url, "ls", "--limit=1001", "--json")
        objs = [json.loads(line) for line in p.stdout.splitlines()]
        assert [o["sha256"] for o in objs] == [h for h, _ in blobs[:1001]]
        h0 = blobs[7][0]
        p = run("--server", srv.url, "hold", h0, "--reason", "legal hold: case 42")
        assert p.returncode == 0 and p.stdout == f"{h0} quarantined\n", (p.stdout, p.stderr)
        meta = requests.get(f"{srv.url}/v1/blobs/{h0}/meta", timeout=10).json()
        assert meta["state"] == "quarantined", meta
        assert "legal hold: case 42" in json.dumps(meta), meta
        p = run("--server", srv.url, "ls", "--state", "quarantined")
        assert p.stdout.split() [:3] == [h0, str(len(blobs[7][1])), "quarantined"], p.stdout
        assert len(p.stdout.splitlines()) == 1
        p = run("--server", srv.url, "ls", "--state", "held")
        assert p.returncode == 2, p.stderr
        p = run("--server", srv.url, "restore", h0)
        assert p.returncode == 0 and p.stdout == f"{h0} live\n", p.stdout
        p = run("--server", srv.url, "hold", "nothex")
        assert p.returncode == 2, p.stderr
        # Reconcile runs: the list and one report, as text and as JSON.
        p = run("--server", srv.url, "reconcile", "--dry-run", "--wait")
        assert p.returncode == 0, p.stderr
        rid = int(re.match(r"run (\d+) ", p.stdout).group(1))
        p = run("--server", srv.url, "reconcile", "runs")
        assert p.returncode == 0, p.stderr
        header, first = p.stdout.splitlines()[:2]
        assert header.split()[:3] == ["ID", "STATE", "STARTED"], header
        assert first.split()[0] == str(rid) and first.split()[3] == "yes", first
        p = run("--server", srv.url, "--json", "reconcile", "runs")
        assert json.loads(p.stdout)["runs"][0]["id"] == rid
        p = run("--server", srv.url, "reconcile", "show", str(rid))
        assert p.returncode == 0 and p.stdout.startswith(f"run {rid} "), p.stdout
        p = run("--server", srv.url, "reconcile", "show", str(rid), "--json")
        assert json.loads(p.stdout)["id"] == rid
        p = run("--server", srv.url, "reconcile", "show", "999")
        assert p.returncode == 1 and "not_found" in p.stderr, p.stderr
        p = run("--server", srv.url, "reconcile", "show", "x")
        assert p.returncode == 2, p.stderr
    finally:
        srv.stop()


# ---- docs that stay true -----------------------------------------------------------------------

def test_readme_points_inside_the_repository_and_its_contents_resolve():
    readme = (ROOT / "README.md").read_text()
    outside = [m.group(0) for m in re.finditer(r"\.\./shared/[\w./-]*", readme)
               if not m.group(0).startswith("../shared/testdata")]
    assert not outside, f"README points outside the clone: {outside}"
    slugs = set()
    for h in re.findall(r"^#{2,3} (.+)$", readme, re.M):
        slug = re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
        slugs.add(slug)
    anchors = re.findall(r"\]\(#([\w-]+)\)", readme)
    assert len(anchors) >= 10, anchors
    assert not [a for a in anchors if a not in slugs], [a for a in anchors if a not in slugs]
    for rel in re.findall(r"`((?:tests|tools|conf|server|include)/[\w./-]+\.(?:sh|md|c|h|py|conf))`",
                          readme):
        if re.search(r"[A-Z]{3,}", rel):  # a placeholder such as server/store/KIND.c
            continue
        assert (ROOT / rel).exists(), f"README names {rel}, which does not exist"
