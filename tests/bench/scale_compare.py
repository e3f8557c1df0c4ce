#!/usr/bin/python3
"""scale_compare: two builds side by side on one loaded index, alternating round by round (issue 25).

usage: tests/bench/scale_compare.py WORK REF_BIN NEW_BIN start|export|rebuild...
  WORK holds data/ (an LMDB index loaded by scale_load: `scale_load load WORK/data 0 N`),
  blobs/ (the fs store's root, may be empty) and upload_load (for rebuild's sample).
  start:   blobrefd's start after drop_caches until /readyz (and blobref_index_full_walks_total)
  export:  `blobref export` of the whole index (wall, client CPU)
  rebuild: --rebuild-index of 2,000 x 4 KiB content-addressed files, cold cache
env: ROUNDS=2. Prints one JSON line per figure with the load average when it was taken; run as
root (drop_caches)."""
import json, os, shutil, subprocess, sys, time, urllib.request, resource
W = sys.argv[1]
BINS = {"ref": sys.argv[2], "new": sys.argv[3]}
PORT = 18611
ROUNDS = int(os.environ.get("ROUNDS", "2"))
def la(): return float(open("/proc/loadavg").read().split()[0])
def drop():
    subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3\n")
def conf(data, root):
    p = f"{W}/bench.conf"
    open(p, "w").write(f"[server]\nlisten = 127.0.0.1:{PORT}\ndata_dir = {data}\n\n[store local]\nkind = fs\nroot = {root}\n")
    return p
def start(v, data):
    log = open(f"{W}/bench-{v}.log", "a")
    t0 = time.monotonic()
    p = subprocess.Popen([f"{BINS[v]}/blobrefd", "-c", conf(data, f"{W}/blobs")], stdout=log, stderr=log)
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=5).status == 200: break
        except Exception: pass
        assert p.poll() is None, "blobrefd died"
        time.sleep(0.02)
    return p, time.monotonic() - t0
def metric(name):
    for line in urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode().splitlines():
        if line.startswith(name + " "): return float(line.split()[1])
    return None
def proc_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def stop(p):
    p.terminate(); p.wait(timeout=120)
def timed(args):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t0 = time.monotonic()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic() - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
what = sys.argv[4:]
out = []
if "start" in what:
    for r in range(ROUNDS):
        for v in ("ref", "new"):
            drop(); l = la()
            p, secs = start(v, f"{W}/data")
            walks = metric("blobref_index_full_walks_total")
            stop(p)
            out.append({"what": "start_cold", "v": v, "round": r, "s": round(secs, 2), "load": l, "full_walks": walks})
            print(json.dumps(out[-1]), flush=True)
if "export" in what:
    for r in range(ROUNDS):
        for v in ("ref", "new"):
            p, _ = start(v, f"{W}/data")
            l = la()
            s0 = proc_cpu(p.pid)
            secs, cpu = timed([f"{BINS[v]}/blobref", "--server", f"http://127.0.0.1:{PORT}", "export", "-o", f"{W}/{v}.parquet"])
            scpu = proc_cpu(p.pid) - s0
            stop(p)
            out.append({"what": "export", "v": v, "round": r, "s": round(secs, 2), "client_cpu_s": round(cpu, 2), "server_cpu_s": round(scpu, 2), "load": l})
            print(json.dumps(out[-1]), flush=True)
if "rebuild" in what:
    src = f"{W}/rb-blobs"
    if not os.path.exists(src):
        subprocess.run([f"{W}/upload_load", "-m", "gen", "-o", src, "-s", "4096", "-n", "2000", "-S", "scale-small"], check=True, stdout=subprocess.DEVNULL)
    for r in range(ROUNDS):
        for v in ("ref", "new"):
            d = f"{W}/rb-data-{v}"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
            c = f"{W}/rb.conf"
            open(c, "w").write(f"[server]\nlisten = 127.0.0.1:9\ndata_dir = {d}\n\n[store local]\nkind = fs\nroot = {src}\n")
            drop(); l = la()
            secs, cpu = timed([f"{BINS[v]}/blobrefd", "--rebuild-index", "-c", c])
            out.append({"what": "rebuild_2000x4k", "v": v, "round": r, "s": round(secs, 2), "cpu_s": round(cpu, 2), "load": l})
            print(json.dumps(out[-1]), flush=True)
json.dump(out, open(f"{W}/bench-{'-'.join(what)}.json", "w"))
