#!/usr/bin/python3
"""Scale benchmark (make bench-scale, not in CI): how cost grows with the index. One LMDB index is
bulk-loaded (tests/bench/scale_load.c: the writer's batch API, no HTTP) to each size in SIZES in
turn, and at each size, on the same box:

- index bytes per blob (data.mdb's size and allocated blocks over the records);
- HEAD (proxy store) and redirect (307, serve = redirect) on random hashes of the index: cold
  (the page cache dropped, `echo 3 > /proc/sys/vm/drop_caches`, and a fresh blobrefd) and warm
  (the same hashes again), rps and p99, with tests/bench/upload_load.c's keep-alive reads;
- batch lookup (POST /v1/lookup, 1,000 hashes a call, half of them missing) hashes/s;
- new 4 KiB uploads against the loaded index (upload_load -m put), uploads/s and p99;
- `blobref export` (the whole index as Parquet, paged) and `blobrefd --fsck` (every record, a
  stat of its file: each blob's file is a hard link to a sparse file of its size) wall times;
- a `--rebuild-index` estimate: the rate on a sample of real content-addressed files (upload_load
  -m gen: small files for the cost per object, large ones for the cost per byte) times n and the
  data set's mean size.

usage: tests/bench/scale_bench.py BIN_DIR SCALE_LOAD UPLOAD_LOAD
env:   SIZES="1000000 10000000"   index sizes, ascending (each load adds to the previous)
       DURATION=10 (seconds per warm measurement; cold ones: COLD=5)  CONNS=32
       FSCK_MAX=1000000 (the links and --fsck only up to that size: about 3k links/s on a loaded
         box; above it the table shows the largest measured size's cost per blob times n)  EXPORT_MAX=1000000 (likewise)  COLD_DROP=1 (0: no drop_caches)
       WORK=/tmp (the data directory's parent; removed at the end unless KEEP=1)
       OUT=build/bench/scale.md (raw JSON lines in scale.jsonl beside it)
Prints the table (also in OUT); every row carries the load average when it was measured."""
import http.client
import json
import math
import multiprocessing
import os
import pathlib
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = [int(x) for x in os.environ.get("SIZES", "1000000 10000000").split()]
DURATION = float(os.environ.get("DURATION", "10"))
COLD = float(os.environ.get("COLD", "5"))
CONNS = int(os.environ.get("CONNS", "32"))
FSCK_MAX = int(os.environ.get("FSCK_MAX", "1000000"))
EXPORT_MAX = int(os.environ.get("EXPORT_MAX", "1000000"))
COLD_DROP = os.environ.get("COLD_DROP", "1") == "1"
OUT = pathlib.Path(os.environ.get("OUT", ROOT / "build" / "bench" / "scale.md"))
BATCH = 1000
LIST = 100000  # hashes per request list (upload_load's -f limit)
SIZE_CLASSES = 1024  # scale_load.c's
assert SIZES == sorted(SIZES) and 0 < SIZES[0] and SIZES[-1] <= 1000000000, SIZES
assert 1 <= DURATION <= 600 and 1 <= COLD <= 600 and 1 <= CONNS <= 1024


def log(msg):
    print(f"[bench-scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    return os.getloadavg()[0]


def kv(line):
    return dict(p.split("=", 1) for p in line.split() if "=" in p)


def run(args, **kw):
    """Runs args; (seconds, stdout, children's user+sys CPU seconds). Fails on a non-zero exit
    unless ok_codes says otherwise."""
    ok = kw.pop("ok_codes", (0,))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    kw.setdefault("stdout", subprocess.PIPE)
    p = subprocess.run([str(a) for a in args], text=True, **kw)
    secs = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in ok:
        raise SystemExit(f"{args[0]} exited {p.returncode}: {(p.stdout or '')[-2000:]}")
    return secs, p.stdout or "", (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches():
    if not COLD_DROP:
        return
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Server:
    """blobrefd on DATA with the fs store ROOT, proxy or redirect; stopped by stop()."""

    def __init__(self, bin_dir, data, root, redirect):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.conf = data.parent / ("redirect.conf" if redirect else "proxy.conf")
        extra = "serve = redirect\npublic_url = http://127.0.0.1:9/\n" if redirect else ""
        self.conf.write_text(f"[server]\nlisten = 127.0.0.1:{self.port}\ndata_dir = {data}\n"
                             f"\n[store local]\nkind = fs\nroot = {root}\nallow_hardlinks = true\n"
                             f"{extra}")
        self.log = open(data.parent / "blobrefd.log", "a")
        t0 = time.monotonic()
        self.proc = subprocess.Popen([str(bin_dir / "blobrefd"), "-c", str(self.conf)],
                                     stdout=self.log, stderr=self.log)
        deadline = t0 + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"blobrefd exited {self.proc.returncode} (see {self.log.name})")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("blobrefd not ready in 600 s")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - t0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def reqs(ul, url, lst, secs, conns=CONNS):
    """upload_load's keep-alive read load over the request list lst for secs seconds."""
    la = loadavg()
    _, out, _ = run([ul, "-m", "reqs", "-u", url, "-f", lst, "-c", conns, "-t", 2, "-d", secs])
    r = kv(out.strip().splitlines()[-1])
    bad = [s for s in r.get("status", "").split(",") if s and not s.startswith(("200:", "307:"))]
    assert int(r["errors"]) == 0 and not bad, ("read load failed", r)
    return {"rps": float(r["rps"]), "p99_ms": float(r["p99_ms"]), "requests": int(r["requests"]),
            "load": la}


def lookup_client(args):
    port, hexes, duration, seed = args
    rnd = random.Random(seed)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    bodies = []
    for _ in range(8):
        pick = [hexes[rnd.randrange(len(hexes))] for _ in range(BATCH // 2)]
        pick += ["%064x" % rnd.getrandbits(256) for _ in range(BATCH - len(pick))]  # missing
        bodies.append(json.dumps({"hashes": pick}).encode())
    n = bad = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < duration:
        c.request("POST", "/v1/lookup", body=bodies[n % len(bodies)],
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        if r.status != 200 or len(body["found"]) != BATCH // 2:
            bad += 1
        n += 1
    return n, bad, time.monotonic() - t0


def lookup_rate(port, hexes, clients=2):
    la = loadavg()
    jobs = [(port, hexes, DURATION, k) for k in range(clients)]
    with multiprocessing.Pool(clients) as pool:
        res = pool.map(lookup_client, jobs)
    assert sum(r[1] for r in res) == 0, "lookup answers were wrong"
    return {"hashes_s": sum(r[0] for r in res) * BATCH / max(r[2] for r in res), "load": la}


def hash_list(sl, n, k, seed, path, fmt):
    _, out, _ = run([sl, "hashes", n, k, seed])
    hexes = out.split()
    pathlib.Path(path).write_text("".join(fmt % h for h in hexes))
    return hexes


def class_size(c):
    return round(20000.0 * 400.0 ** (c / (SIZE_CLASSES - 1)))


MEAN_SIZE = sum(class_size(c) for c in range(SIZE_CLASSES)) / SIZE_CLASSES


def rebuild_sample(bin_dir, ul, work):
    """--rebuild-index on two samples of real files: (seconds per object, seconds per byte)."""
    out = {}
    for name, size, n in (("small", 4096, 2000), ("large", 4 << 20, 16)):
        d = work / f"rebuild-{name}"
        (d / "data").mkdir(parents=True)
        run([ul, "-m", "gen", "-o", d / "blobs", "-s", size, "-n", n, "-S", f"scale-{name}"],
            stdout=subprocess.DEVNULL)
        conf = d / "blobref.conf"
        conf.write_text(f"[server]\nlisten = 127.0.0.1:9\ndata_dir = {d / 'data'}\n\n"
                        f"[store local]\nkind = fs\nroot = {d / 'blobs'}\n")
        drop_caches()
        la = loadavg()
        secs, _, cpu = run([bin_dir / "blobrefd", "--rebuild-index", "-c", conf],
                           stderr=subprocess.DEVNULL)
        out[name] = {"n": n, "size": size, "seconds": secs, "cpu_s": cpu, "load": la}
        shutil.rmtree(d)
    small, large = out["small"], out["large"]
    per_obj = small["seconds"] / small["n"]
    per_byte = max(large["seconds"] / large["n"] - per_obj, 0) / large["size"]
    return {"samples": out, "per_object_s": per_obj, "per_byte_s": per_byte}


def measure(n, bin_dir, sl, ul, work, data, root, prev, rebuild):
    res = {"blobs": n}
    fsck = n <= FSCK_MAX
    log(f"loading the index to {n} blobs")
    la = loadavg()
    secs, out, cpu = run([sl, "load", data, prev, n])
    load = json.loads(out)
    assert load["applied"] == n - prev and load["other"] == 0, load
    res["load"] = dict(load, wall_s=secs, cpu_s=cpu, loadavg=la)
    # the records include the new uploads of the previous sizes' measurements
    res["bytes_per_blob"] = load["file_bytes"] / load["entries"]
    res["alloc_per_blob"] = load["file_alloc_bytes"] / load["entries"]
    if fsck:
        log(f"hard links for blobs {prev}..{n} (fsck stats real paths)")
        _, out, _ = run([sl, "links", root, prev, n])
        res["links"] = json.loads(out)

    seed = 1000 + n
    head_a = work / "head.list"
    hash_list(sl, n, LIST, seed, head_a, "HEAD /v1/blobs/%s\n")
    red_b = work / "redirect.list"
    hash_list(sl, n, LIST, seed + 1, red_b, "GET /v1/blobs/%s\n")
    look = hash_list(sl, n, 20000, seed + 2, work / "lookup.hex", "%s\n")

    log("HEAD cold and warm (proxy store)")
    drop_caches()
    srv = Server(bin_dir, data, root, redirect=False)
    res["start_cold_s"] = srv.start_seconds
    try:
        res["head_cold"] = reqs(ul, srv.url, head_a, COLD)
        res["head_warm"] = reqs(ul, srv.url, head_a, DURATION)
        log("batch lookup")
        res["lookup"] = lookup_rate(srv.port, look)
        log("new 4 KiB uploads")
        la = loadavg()
        _, out, _ = run([ul, "-m", "put", "-u", f"{srv.url}/v1/blobs", "-s", 4096, "-n", 20000,
                         "-S", f"scale-new-{n}", "-c", 64, "-d", DURATION])
        r = kv(out.strip().splitlines()[-1])
        assert int(r["errors"]) == 0, r
        res["upload"] = {"rps": float(r["rps"]), "p99_ms": float(r["p99_ms"]), "ok": int(r["ok"]),
                         "load": la}
        if n <= EXPORT_MAX:
            log("blobref export")
            pq = work / "export.parquet"
            la = loadavg()
            secs, _, cpu = run([bin_dir / "blobref", "--server", srv.url, "export", "-o", pq],
                               stderr=subprocess.DEVNULL)
            res["export"] = {"seconds": secs, "cpu_s": cpu, "bytes": pq.stat().st_size,
                             "load": la}
            pq.unlink()
    finally:
        srv.stop()

    log("redirect cold and warm")
    drop_caches()
    srv = Server(bin_dir, data, root, redirect=True)
    try:
        res["redirect_cold"] = reqs(ul, srv.url, red_b, COLD)
        res["redirect_warm"] = reqs(ul, srv.url, red_b, DURATION)
    finally:
        srv.stop()

    if fsck:
        log("blobrefd --fsck (cold)")
        drop_caches()
        la = loadavg()
        secs, out, cpu = run([bin_dir / "blobrefd", "--fsck", "-c", data.parent / "proxy.conf"],
                             stderr=subprocess.DEVNULL, ok_codes=(0, 1))
        problems = [ln for ln in out.splitlines() if ln.strip()]
        res["fsck"] = {"seconds": secs, "cpu_s": cpu, "lines": len(problems),
                       "first": problems[:3], "load": la}
    res["rebuild_estimate_s"] = n * (rebuild["per_object_s"] + rebuild["per_byte_s"] * MEAN_SIZE)
    res["disk_free_gib"] = shutil.disk_usage(data).free / 2**30
    return res


def fmt_rate(x):
    return f"{x / 1000:,.1f}k" if x >= 1000 else f"{x:,.0f}"


def fmt_s(x):
    return f"{x:,.1f} s" if x < 600 else f"{x / 60:,.0f} min"


def table(results, rebuild):
    cols = [r["blobs"] for r in results]
    head = "| per size | " + " | ".join(f"{c / 1e6:g}M blobs" for c in cols) + " |"
    lines = [head, "|---|" + "---:|" * len(cols)]

    def row(name, f):
        lines.append(f"| {name} | " + " | ".join(f(r) for r in results) + " |")

    row("bulk load (records/s, load avg)", lambda r: f"{(r['load']['to'] - r['load']['from']) / r['load']['seconds']:,.0f} ({r['load']['loadavg']:.1f})")
    row("index bytes / blob (file; allocated)", lambda r: f"{r['bytes_per_blob']:.0f}; {r['alloc_per_blob']:.0f}")
    row("blobrefd start, cold cache", lambda r: f"{r['start_cold_s']:.2f} s")
    for key, name in (("head_cold", "HEAD cold"), ("head_warm", "HEAD warm"),
                      ("redirect_cold", "redirect cold"), ("redirect_warm", "redirect warm")):
        row(f"{name}: req/s, p99 (load avg)",
            lambda r, k=key: f"{fmt_rate(r[k]['rps'])}, {r[k]['p99_ms']:.2f} ms ({r[k]['load']:.1f})")
    row("batch lookup hashes/s (load avg)", lambda r: f"{fmt_rate(r['lookup']['hashes_s'])} ({r['lookup']['load']:.1f})")
    row("new 4 KiB uploads/s, p99 (load avg)", lambda r: f"{fmt_rate(r['upload']['rps'])}, {r['upload']['p99_ms']:.1f} ms ({r['upload']['load']:.1f})")
    ex = [r for r in results if "export" in r]
    if ex:
        pe = ex[-1]["export"]["seconds"] / ex[-1]["blobs"]
        row("`blobref export` (µs / blob; load avg)", lambda r: f"{fmt_s(r['export']['seconds'])} ({r['export']['seconds'] / r['blobs'] * 1e6:.1f}; {r['export']['load']:.1f})" if "export" in r else f"est. {fmt_s(pe * r['blobs'])}")
    fs = [r for r in results if "fsck" in r]
    if fs:
        per = fs[-1]["fsck"]["seconds"] / fs[-1]["blobs"]
        row("`blobrefd --fsck` cold (µs / blob; load avg)", lambda r: f"{fmt_s(r['fsck']['seconds'])} ({r['fsck']['seconds'] / r['blobs'] * 1e6:.1f}; {r['fsck']['load']:.1f})" if "fsck" in r else f"est. {fmt_s(per * r['blobs'])}")
    row("`--rebuild-index` estimate", lambda r: fmt_s(r["rebuild_estimate_s"]))
    s, lg = rebuild["samples"]["small"], rebuild["samples"]["large"]
    notes = [
        "",
        f"Rebuild estimate: n × ({rebuild['per_object_s'] * 1e6:.0f} µs an object + "
        f"{rebuild['per_byte_s'] * 1e9:.2f} ns a byte × the mean size {MEAN_SIZE / 1e6:.2f} MB), "
        f"from --rebuild-index on {s['n']} files of {s['size']} B ({s['seconds']:.1f} s, load "
        f"{s['load']:.1f}) and {lg['n']} of {lg['size'] >> 20} MiB ({lg['seconds']:.1f} s, load "
        f"{lg['load']:.1f}), cold cache.",
    ]
    return "\n".join(lines + notes) + "\n"


def main():
    bin_dir = pathlib.Path(sys.argv[1]).resolve()
    sl, ul = pathlib.Path(sys.argv[2]).resolve(), pathlib.Path(sys.argv[3]).resolve()
    base = pathlib.Path(os.environ.get("WORK", tempfile.gettempdir()))
    work = pathlib.Path(tempfile.mkdtemp(prefix="blobref-scale.", dir=base))
    data, root = work / "data", work / "blobs"
    data.mkdir()
    root.mkdir()
    raw = []
    OUT.parent.mkdir(parents=True, exist_ok=True)
    jsonl = OUT.with_suffix(".jsonl")
    try:
        log(f"work directory {work}; disk free {shutil.disk_usage(work).free / 2**30:.0f} GiB")
        log("--rebuild-index samples")
        rebuild = rebuild_sample(bin_dir, ul, work)
        raw.append({"step": "rebuild", **rebuild})
        prev = 0
        results = []
        for n in SIZES:
            r = measure(n, bin_dir, sl, ul, work, data, root, prev, rebuild)
            results.append(r)
            raw.append({"step": "size", **r})
            jsonl.write_text("".join(json.dumps(x) + "\n" for x in raw))
            log(json.dumps(r))
            prev = n
            write_table(results, rebuild)
    finally:
        if os.environ.get("KEEP") == "1":
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def write_table(results, rebuild):
    """The table so far, printed and written to OUT (after each size: a late size may not end)."""
    if True:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                    if ln.startswith("model name")), "?")
        text = (f"Scale benchmark, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
                f"{os.cpu_count()} cores ({cpu}); HEAD/redirect: {CONNS} connections, cold "
                f"{COLD:g} s after drop_caches and a fresh blobrefd, warm {DURATION:g} s over the "
                f"same {LIST} hashes\n\n" + table(results, rebuild))
        OUT.write_text(text)
        print(text, flush=True)


if __name__ == "__main__":
    main()
