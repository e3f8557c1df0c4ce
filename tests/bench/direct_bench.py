"""Driver of tests/bench/direct-bench.sh: BLOBS new 1 MiB blobs per variant uploaded with WORKERS
workers against one radosgw, the variants alternated round by round (ROUNDS, each BLOBS / ROUNDS
new blobs per variant, the order rotated each round) so that the machine's load falls on all
alike: the Python client's put_many with direct uploads on radosgw under auto (its probe finds
x-amz-content-sha256 enforced: a commit is a HEAD), the same with direct_uploads = on (every
commit re-hashes the object with one GET), the same through a proxy that enforces
x-amz-checksum-sha256 (tests/integration/checksum_proxy.py, in a process of its own: the probe
finds it enforced and a commit is a HEAD), put_many against a blobrefd with
direct_uploads = off (every byte through blobrefd), and `curl --aws-sigv4 -T` per file straight
to radosgw. BIN_BEFORE=DIR adds the direct variant on another build (before/after in one run, named
BEFORE_LABEL);
PERF_OUT=FILE records one blobrefd with perf: the first variant whose name starts with PERF_VARIANT
(default "direct": the first of them).
Prints the load average and a Markdown table: seconds, MiB/s, speed against curl, blobrefd's CPU
seconds per GiB (utime + stime from /proc/PID/stat) and how many times less than through the
server."""
import concurrent.futures
import hashlib
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import boto3
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
import blobref  # noqa: E402

AK, SK, REGION = "BENCHAK", "BENCHSK", "us-east-1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_blobrefd(bin_dir, tmp, endpoint, bucket, direct):
    data = tmp / f"data-{bucket}"
    data.mkdir()
    conf = data / "blobref.conf"
    conf.write_text(f"[server]\n[store lake]\nkind = s3\nendpoint = {endpoint}\nregion = {REGION}\n"
                    f"bucket = {bucket}\npath_style = true\naccess_key = {AK}\nsecret_key = {SK}\n"
                    f"serve = proxy\ndirect_uploads = {direct}\n")
    port = free_port()
    log = open(data / "blobrefd.log", "ab")
    p = subprocess.Popen([str(bin_dir / "blobrefd"), "--listen", f"127.0.0.1:{port}", "--data",
                          str(data), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if requests.get(url + "/readyz", timeout=1).status_code == 200:
                return p, url, data / "blobrefd.log"
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError("blobrefd did not become ready")


def start_proxy(endpoint):
    """The enforcing proxy in a process of its own (not competing for this one's GIL)."""
    p = subprocess.Popen([sys.executable, str(ROOT / "tests/integration/checksum_proxy.py"),
                          endpoint], stdout=subprocess.PIPE, text=True)
    return p, p.stdout.readline().strip()


def curl_put(endpoint, f):
    h = hashlib.sha256(f.read_bytes()).hexdigest()  # curl 7.88 signs a -T file wrongly without it
    subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-T", str(f), "-H",
                    f"x-amz-content-sha256: {h}", "--aws-sigv4", f"aws:amz:{REGION}:s3",
                    "--user", f"{AK}:{SK}", f"{endpoint}/bench-curl/{f.name}"], check=True)


def empty(s3, bucket):
    """Deletes every object of bucket (between runs, outside the timings)."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})


def main():
    bin_dir = pathlib.Path(sys.argv[1]).resolve()
    before = os.environ.get("BIN_BEFORE")
    n, workers = int(os.environ.get("BLOBS", 2000)), int(os.environ.get("WORKERS", 8))
    rounds = max(1, int(os.environ.get("ROUNDS", 4)))
    per = max(1, n // rounds)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="blobref-db-", dir="/tmp"))
    env = dict(os.environ, RGW_ACCESS_KEY=AK, RGW_SECRET_KEY=SK, RGW_ACCESS_KEY2=AK + "2",
               RGW_SECRET_KEY2=SK + "2")
    endpoint = subprocess.run([str(ROOT / "tests/s3/start-rgw.sh"), str(tmp / "rgw")], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
    procs = []
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=AK,
                          aws_secret_access_key=SK)
        proxy, proxied = start_proxy(endpoint)
        procs.append(proxy)
        # variant -> (blobrefd bin dir, store endpoint, direct_uploads); curl has no blobrefd
        variants = {"direct (radosgw, auto: HEAD)": (bin_dir, endpoint, "auto"),
                    "direct (radosgw, on: re-hash)": (bin_dir, endpoint, "on"),
                    "direct (enforcing proxy: HEAD)": (bin_dir, proxied, "auto"),
                    "through blobrefd": (bin_dir, None, "off"),
                    "curl straight to radosgw": None}
        if before:
            label = os.environ.get("BEFORE_LABEL", "BIN_BEFORE")
            variants[f"direct (radosgw, auto), {label}"] = (
                pathlib.Path(before).resolve(), endpoint, "auto")
        servers, buckets = {}, {}
        for i, (name, v) in enumerate(variants.items()):
            bucket = buckets[name] = f"bench-{i}" if v else "bench-curl"
            s3.create_bucket(Bucket=bucket)
            if v:
                p, url, log = start_blobrefd(v[0], tmp, v[1] or endpoint, bucket, v[2])
                procs.append(p)
                servers[name] = (p, url, log)
        for name, (_, _, log) in servers.items():
            probe = [ln for ln in log.read_text().splitlines() if "direct uploads:" in ln]
            what = probe[0].split('direct uploads: ', 1)[1] if probe else 'no probe'
            print(f"<!-- {name}: {what} -->")
        perf = None
        if os.environ.get("PERF_OUT"):   # one blobrefd, recorded over the whole run
            watched = [v for v in servers if v.startswith(os.environ.get("PERF_VARIANT", "direct"))]
            perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-o",
                                     os.environ["PERF_OUT"], "-p", str(servers[watched[0]][0].pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        load0 = os.getloadavg()
        secs = dict.fromkeys(variants, 0.0)
        cpu = dict.fromkeys(servers, 0.0)
        names = list(variants)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                d = tmp / f"files-{r}-{names.index(name)}"   # new bytes: never a dedup hit
                d.mkdir()
                files = []
                for i in range(per):
                    f = d / f"{r:02d}{i:05d}.bin"
                    f.write_bytes(os.urandom(1 << 20))
                    files.append(f)
                pid = servers[name][0].pid if name in servers else None
                c0 = cpu_seconds(pid) if pid else 0.0
                t0 = time.monotonic()
                if pid is None:
                    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                        list(pool.map(lambda f: curl_put(endpoint, f), files))
                else:
                    res = blobref.Client(servers[name][1]).put_many(files, workers=workers)
                    key = "via_server" if variants[name][2] == "off" else "uploaded"
                    assert res[key] == per, (name, res)
                secs[name] += time.monotonic() - t0
                if pid:
                    cpu[name] += cpu_seconds(pid) - c0
                for f in files:
                    f.unlink()
                d.rmdir()
                empty(s3, buckets[name])   # radosgw's in-memory OSD holds 4 GiB
        load1 = os.getloadavg()
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=60)
        total, gib = per * rounds, per * rounds / 1024
        curl_secs = secs["curl straight to radosgw"]
        server_cpu = cpu["through blobrefd"] / gib
        print(f"load average (1, 5, 15 min): {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before, "
              f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after; {rounds} rounds, "
              f"{total} x 1 MiB per variant, {workers} workers\n")
        print("| variant | seconds | MiB/s | speed vs curl | blobrefd CPU s/GiB | "
              "CPU vs through blobrefd |\n|---|---|---|---|---|---|")
        for name in names:
            c = cpu[name] / gib if name in cpu else None
            print(f"| {name} | {secs[name]:.1f} | {total / secs[name]:.0f} | "
                  f"{curl_secs / secs[name]:.2f}x | {'-' if c is None else f'{c:.3f}'} | "
                  f"{'-' if not c or name == 'through blobrefd' else f'{server_cpu / c:.1f}x less'} |")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        subprocess.run([str(ROOT / "tests/s3/stop-rgw.sh"), str(tmp / "rgw")],
                       capture_output=True)
        subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()
