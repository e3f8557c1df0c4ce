#!/usr/bin/python3
"""Cluster benchmark (make bench-cluster): one LMDB node vs one and two PostgreSQL nodes, side by
side in one run, on 127.0.0.1: new 4 KiB uploads, cached HEAD, redirect (307) and batch lookup
(POST /v1/lookup, 1,000 hashes a call, hashes/s). Each setup gets a fresh fs store (redirect
mode; the two PostgreSQL nodes share its directory, as they would share a bucket) and a fresh
database. The load of the two-node setup is split over both nodes (one client each, at once).

usage: tests/bench/cluster_bench.py [BIN_DIR [BIN_DIR2]]
env:   DURATION=8 (seconds per measurement)  N=20000 (blobs)  CONNS=32  LOOKUP_CLIENTS=4
       N1M=1000 (new 1 MiB blobs, 16 connections per node; 0: none)
       OUT=build/bench/cluster.md  SETUPS="lmdb pg1 pg2"  PHASES="uploads reads lookup"
       (PHASES=uploads: the new uploads alone, for quick comparisons; "uploads1m" adds the
       1 MiB uploads, on by default)
       STATEMENTS=1: pg_stat_statements on; each phase's statements a request, to stderr
       ROUNDS=1: every setup (with every bin dir) run again this many times, in turn; the table
       gives each figure's median and the median of its ratios to LMDB, each round's to stderr
The batch lookup is measured twice where wrk is installed: Python clients, then wrk (C).
Prints a markdown table (also written to OUT) with each PostgreSQL figure's ratio to LMDB. With
two bin dirs (e.g. main's and a branch's) every setup runs with each in turn, alternating, and the
table has a column per setup and bin dir, each ratio against the LMDB node of the same bin dir;
each node's record-cache hits and misses and the writer's round trips go to stderr."""
import http.client
import json
import multiprocessing
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
BINS = [pathlib.Path(a).resolve() for a in sys.argv[1:3]] or [(ROOT / "bin").resolve()]
os.environ["BLOBREF_BIN_DIR"] = str(BINS[0])

import conftest  # noqa: E402
import pgutil  # noqa: E402
from conftest import Server  # noqa: E402

DURATION = float(os.environ.get("DURATION", "8"))
N = int(os.environ.get("N", "20000"))
CONNS = int(os.environ.get("CONNS", "32"))
LOOKUP_CLIENTS = int(os.environ.get("LOOKUP_CLIENTS", "4"))
BATCH = 1000
STATEMENTS = os.environ.get("STATEMENTS") == "1"
ROUNDS = int(os.environ.get("ROUNDS", "1"))
WRK = shutil.which("wrk") is not None
SETUPS = os.environ.get("SETUPS", "lmdb pg1 pg2").split()
PHASES = os.environ.get("PHASES", "uploads uploads1m reads lookup").split()
N1M = int(os.environ.get("N1M", "1000")) if "uploads1m" in PHASES else 0
OUT = pathlib.Path(os.environ.get("OUT", ROOT / "build" / "bench" / "cluster.md"))


def conf(root, dsn):
    text = (f"[server]\n\n[store local]\nkind = fs\nroot = {root}\n"
            "serve = redirect\npublic_url = http://cdn.example/b\n")
    if dsn:
        text += f"\n[index]\nkind = postgres\ndsn = {dsn}\n"
    return text


def kv(line):
    return dict(p.split("=", 1) for p in line.split() if "=" in p)


def upload_load(ul, args):
    out = subprocess.run([str(ul)] + [str(a) for a in args], capture_output=True, text=True,
                         timeout=DURATION + 300)
    if out.returncode:
        raise RuntimeError(f"upload_load {args}: {out.stderr}")
    return kv(out.stdout.strip().splitlines()[-1])


def parallel(ul, per_node_args):
    """Runs one upload_load per node at once; the summed rps and the requests that failed."""
    procs = [subprocess.Popen([str(ul)] + [str(a) for a in a_], stdout=subprocess.PIPE, text=True)
             for a_ in per_node_args]
    outs = [kv(p.communicate(timeout=DURATION + 300)[0].strip().splitlines()[-1]) for p in procs]
    return (sum(float(o["rps"]) for o in outs), sum(int(o["errors"]) for o in outs),
            sum(int(o["ok"]) for o in outs))


def lookup_client(args):
    port, hexes, duration, seed = args
    rnd = random.Random(seed)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
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
        body = r.read()
        if r.status != 200 or b'"found"' not in body:
            bad += 1
        n += 1
    return n, bad, time.monotonic() - t0


def lookup_rate(nodes, hexes):
    """Hashes/s over all nodes: LOOKUP_CLIENTS clients per node, each BATCH hashes a call."""
    jobs = [(n.port, hexes, DURATION, i * 7 + k) for i, n in enumerate(nodes)
            for k in range(LOOKUP_CLIENTS)]
    with multiprocessing.Pool(len(jobs)) as pool:
        res = pool.map(lookup_client, jobs)
    calls = sum(r[0] for r in res)
    bad = sum(r[1] for r in res)
    secs = max(r[2] for r in res)
    return calls * BATCH / secs, bad


TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid, children=False):
    """A process's CPU seconds (all its threads; with children, its waited-for children's too)."""
    try:
        f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    t = int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if children else 0)
    return t / TICK


def pg_cpu_s(pg):
    """The CPU seconds of the bench's PostgreSQL: its postmaster, the backends it has reaped and
    those alive (the bench's server serves one setup at a time)."""
    pm = int((pg.data / "postmaster.pid").read_text().split()[0])
    kids = [int(c) for c in pathlib.Path(f"/proc/{pm}/task/{pm}/children").read_text().split()]
    return cpu_s(pm, children=True) + sum(cpu_s(k) for k in kids)


def metric(nodes, name):
    """The sum over nodes of the metric lines that start with name."""
    total = 0.0
    for n in nodes:
        with urllib.request.urlopen(f"{n.url}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name):
                    total += float(line.rsplit(" ", 1)[1])
    return total


class Phase:
    """A phase's statements (pg_stat_statements, when STATEMENTS=1) and the nodes' record-cache
    hits and misses, printed to stderr at its end with the number of requests it made."""

    def __init__(self, label, pg, db, nodes):
        self.label, self.pg, self.db, self.nodes = label, pg, db, nodes

    def __enter__(self):
        if STATEMENTS and self.db:
            self.pg.psql("SELECT pg_stat_statements_reset()", self.db)
        self.hits = metric(self.nodes, 'blobref_index_record_cache_total{result="hit"}')
        self.miss = metric(self.nodes, 'blobref_index_record_cache_total{result="miss"}')
        self.trips = metric(self.nodes, "blobref_index_writer_round_trips_total")
        self.cpu = [sum(cpu_s(n.proc.pid) for n in self.nodes), pg_cpu_s(self.pg) if self.db else 0]
        self.requests = 0
        return self

    def __exit__(self, *exc):
        if exc[0]:
            return False
        hits = metric(self.nodes, 'blobref_index_record_cache_total{result="hit"}') - self.hits
        miss = metric(self.nodes, 'blobref_index_record_cache_total{result="miss"}') - self.miss
        trips = metric(self.nodes, "blobref_index_writer_round_trips_total") - self.trips
        req = max(self.requests, 1)
        node_cpu = sum(cpu_s(n.proc.pid) for n in self.nodes) - self.cpu[0]
        pg_cpu = (pg_cpu_s(self.pg) if self.db else 0) - self.cpu[1]
        self.cpu_us = (node_cpu * 1e6 / req, pg_cpu * 1e6 / req)
        print(f"  {self.label}: {self.requests} requests; record cache {hits / req:.2f} hits and "
              f"{miss / req:.2f} misses a request; writer round trips {trips / req:.3f} a request; "
              f"CPU a request: nodes {self.cpu_us[0]:.0f} us, PostgreSQL {self.cpu_us[1]:.0f} us",
              file=sys.stderr)
        if STATEMENTS and self.db:
            rows = self.pg.psql("SELECT calls, round(mean_exec_time::numeric, 3), "
                                "left(regexp_replace(query, '\\s+', ' ', 'g'), 90) "
                                "FROM pg_stat_statements "
                                "WHERE query NOT LIKE '%pg_stat_statements%' "
                                "ORDER BY calls DESC LIMIT 12", self.db)
            for calls, ms, q in rows:
                print(f"    {int(calls) / req:8.3f} a request, {ms} ms: {q}", file=sys.stderr)
        return False


WRK_LUA = """
local bodies, n = {}, 0
function init(args)
  for i = 1, #args do
    local f = assert(io.open(args[i], "rb"))
    bodies[i] = f:read("*a")
    f:close()
  end
end
function request()
  n = n % #bodies + 1
  return wrk.format("POST", "/v1/lookup", {["Content-Type"] = "application/json"}, bodies[n])
end
"""


def lookup_rate_wrk(nodes, hexes, work):
    """Hashes/s over all nodes with wrk (C, 2 threads, LOOKUP_CLIENTS connections per node), the
    same bodies as lookup_client's: a check that the Python clients are not the cap."""
    script = work / "lookup.lua"
    script.write_text(WRK_LUA)
    rnd = random.Random(11)
    files = []
    for k in range(8):
        pick = [hexes[rnd.randrange(len(hexes))] for _ in range(BATCH // 2)]
        pick += ["%064x" % rnd.getrandbits(256) for _ in range(BATCH - len(pick))]
        f = work / f"lookup{k}.json"
        f.write_text(json.dumps({"hashes": pick}))
        files.append(str(f))
    procs = [subprocess.Popen(["wrk", "-t2", f"-c{LOOKUP_CLIENTS}", f"-d{DURATION:g}s",
                               "-s", str(script), n.url, "--"] + files,
                              stdout=subprocess.PIPE, text=True) for n in nodes]
    rate, bad = 0.0, 0
    for p in procs:
        out = p.communicate(timeout=DURATION + 60)[0]
        rate += float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)) * BATCH
        m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        bad += int(m.group(1)) if m else 0
    return rate, bad


def run_setup(name, work, ul, gen_list, hexes, pg, bin_dir, gen_1m):
    d = work / f"{name}-{bin_dir.parent.name}-{len(list(work.glob(name + '-*')))}"
    root = d / "blobs"
    root.mkdir(parents=True)
    db = f"bench_{d.name.replace('-', '_').replace('.', '_')}"
    dsn = pg.database(db) if name != "lmdb" else None
    if not dsn:
        db = None
    elif STATEMENTS:
        pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", db)
    nnodes = 2 if name == "pg2" else 1
    conftest.BIN_DIR = bin_dir
    nodes = [Server(d / f"node{i + 1}", conf(root, dsn)).start(timeout=60) for i in range(nnodes)]
    res = {}
    try:
        # new uploads: the generated blobs split over the nodes
        lists = []
        lines = gen_list.read_text().splitlines()
        for i in range(nnodes):
            p = d / f"up{i}.list"
            p.write_text("\n".join(lines[i::nnodes]) + "\n")
            lists.append(p)
        t0 = time.monotonic()
        with Phase("uploads", pg, db, nodes) as ph:
            rps, errs, ok = parallel(ul, [["-m", "put", "-u", f"{n.url}/v1/blobs", "-f", lists[i],
                                           "-c", CONNS, "-d", 600]
                                          for i, n in enumerate(nodes)])
            ph.requests = ok
        assert errs == 0 and ok == len(lines), (name, "uploads", errs, ok)
        res["uploads/s (4 KiB, new)"] = len(lines) / (time.monotonic() - t0)
        res["CPU µs an upload (nodes + PostgreSQL)"] = sum(ph.cpu_us)
        if gen_1m:
            lines = gen_1m.read_text().splitlines()
            for i in range(nnodes):
                lists[i].write_text("\n".join(lines[i::nnodes]) + "\n")
            t0 = time.monotonic()
            with Phase("uploads 1 MiB", pg, db, nodes) as ph:
                rps, errs, ok = parallel(ul, [["-m", "put", "-u", f"{n.url}/v1/blobs", "-f",
                                               lists[i], "-c", 16, "-d", 600]
                                              for i, n in enumerate(nodes)])
                ph.requests = ok
            assert errs == 0 and ok == len(lines), (name, "uploads 1 MiB", errs, ok)
            res["uploads/s (1 MiB, new)"] = len(lines) / (time.monotonic() - t0)
            res["CPU µs a 1 MiB upload (nodes + PostgreSQL)"] = sum(ph.cpu_us)
        for sc, method in (("HEAD req/s", "HEAD"), ("redirect req/s (307)", "GET")):
            if "reads" not in PHASES:
                break
            reqs = d / f"{method}.reqs"
            reqs.write_text("".join(f"{method} /v1/blobs/{h}\n" for h in hexes))
            for n in nodes:  # warm the caches once
                upload_load(ul, ["-m", "reqs", "-u", n.url, "-f", reqs, "-c", CONNS, "-d", 2])
            with Phase(method, pg, db, nodes) as ph:
                rps, errs, ok = parallel(ul, [["-m", "reqs", "-u", n.url, "-f", reqs, "-c", CONNS,
                                               "-d", DURATION] for n in nodes])
                ph.requests = ok
            assert errs == 0, (name, sc, errs)
            res[sc] = rps
        if "lookup" not in PHASES:
            return res
        with Phase("lookup (per hash)", pg, db, nodes) as ph:
            rate, bad = lookup_rate(nodes, hexes)
            ph.requests = int(rate * DURATION)
        assert bad == 0, (name, "lookup", bad)
        res["batch lookup hashes/s"] = rate
        if WRK:
            rate, bad = lookup_rate_wrk(nodes, hexes, d)
            assert bad == 0, (name, "lookup (wrk)", bad)
            res["batch lookup hashes/s (wrk)"] = rate
    finally:
        for n in nodes:
            n.stop()
    return res


def median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def main():
    work = pathlib.Path(tempfile.mkdtemp(prefix="blobref-cbench-"))
    ul = work / "upload_load"
    subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-o", str(ul),
                    str(ROOT / "tests" / "bench" / "upload_load.c"), "-lcrypto", "-lpthread"],
                   check=True)
    gen = subprocess.run([str(ul), "-m", "gen", "-s", "4096", "-n", str(N), "-S",
                          f"cb{os.getpid()}", "-o", str(work / "files")], capture_output=True,
                         text=True, check=True).stdout
    gen_list = work / "gen.list"
    gen_list.write_text(gen)
    hexes = [line.split()[0] for line in gen.splitlines()]
    gen_1m = None
    if N1M:
        gen_1m = work / "gen1m.list"
        gen_1m.write_text(subprocess.run(
            [str(ul), "-m", "gen", "-s", str(1 << 20), "-n", str(N1M), "-S", f"cm{os.getpid()}",
             "-o", str(work / "files1m")], capture_output=True, text=True, check=True).stdout)
    pg = pgutil.Postgres("-c shared_preload_libraries=pg_stat_statements" if STATEMENTS else "")
    rounds = []  # per round: (setup, bin dir's index) -> figures
    loads = []  # the 1-minute load average after each round
    try:
        for rnd in range(ROUNDS):
            results = {}
            for s in SETUPS:
                for b, bin_dir in enumerate(BINS):
                    t0 = time.monotonic()
                    print(f"round {rnd + 1}: {s} with {bin_dir}:", file=sys.stderr)
                    results[s, b] = run_setup(s, work, ul, gen_list, hexes, pg, bin_dir, gen_1m)
                    print(f"round {rnd + 1}: {s} with {bin_dir}: {time.monotonic() - t0:.0f} s "
                          f"{results[s, b]}", file=sys.stderr)
            rounds.append(results)
            loads.append(os.getloadavg()[0])
            print(f"round {rnd + 1}: load average {loads[-1]:.1f}; ratios to LMDB: " + "; ".join(
                f"{s} ({b}) {sc} {results[s, b][sc] / results['lmdb', b][sc]:.2f}x"
                for s, b in results if s != "lmdb" and ("lmdb", b) in results
                for sc in results[s, b]), file=sys.stderr)
    finally:
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    results = rounds[0]
    head = {"lmdb": "1 LMDB node", "pg1": "1 PG node", "pg2": "2 PG nodes"}
    cols = [(s, b) for s in SETUPS for b in range(len(BINS))]
    names = [f" ({p.parent.name})" if len(BINS) > 1 else "" for p in BINS]
    lines = ["| scenario | " + " | ".join(head[s] + names[b] for s, b in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for sc in next(iter(results.values())):
        cells = []
        for s, b in cols:
            v = median([r[s, b][sc] for r in rounds])
            cell = f"{v:,.0f}"
            if s != "lmdb" and ("lmdb", b) in results:
                cell += f" ({median([r[s, b][sc] / r['lmdb', b][sc] for r in rounds]):.2f}x)"
            cells.append(cell)
        lines.append(f"| {sc} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{cores} cores shared by the nodes, PostgreSQL 15 and the clients "
                 f"(load average {load:.1f} at the end); {N} blobs, {DURATION:g} s a measurement, "
                 f"{CONNS} connections per node, lookup: {LOOKUP_CLIENTS} clients per node, "
                 f"{BATCH} hashes a call (half present)"
                 + (", each setup with each bin dir in turn" if len(BINS) > 1 else "")
                 + (f"; medians of {ROUNDS} rounds (load average after each: "
                    + ", ".join(f"{x:.1f}" for x in loads) + ")" if ROUNDS > 1 else "") + ".")
    table = "\n".join(lines)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
