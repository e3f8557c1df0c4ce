"""Driver of tests/bench/direct-bench.sh: N new 1 MiB blobs uploaded with W workers three ways
against one radosgw: the Python client's put_many with direct uploads (presigned PUTs straight to
the bucket, then a commit), the same put_many against a blobrefd with direct_uploads = off (every
byte through blobrefd), and `curl --aws-sigv4 -T` per file straight to radosgw. Prints a Markdown
table: seconds, MiB/s, ratio to curl, and blobrefd's CPU seconds per GiB (utime + stime from
/proc/PID/stat)."""
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
                return p, url
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError("blobrefd did not become ready")


def main():
    bin_dir = pathlib.Path(sys.argv[1]).resolve()
    n, workers = int(os.environ.get("BLOBS", 2000)), int(os.environ.get("WORKERS", 8))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="blobref-db-", dir="/tmp"))
    env = dict(os.environ, RGW_ACCESS_KEY=AK, RGW_SECRET_KEY=SK, RGW_ACCESS_KEY2=AK + "2",
               RGW_SECRET_KEY2=SK + "2")
    endpoint = subprocess.run([str(ROOT / "tests/s3/start-rgw.sh"), str(tmp / "rgw")], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
    procs = []
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=AK,
                          aws_secret_access_key=SK)
        rows = []
        for mode in ("direct", "server", "curl"):
            s3.create_bucket(Bucket=f"bench-{mode}")
            files = []
            d = tmp / f"files-{mode}"   # new bytes for every mode: nothing is a dedup hit
            d.mkdir()
            for i in range(n):
                f = d / f"{i:05d}.bin"
                f.write_bytes(os.urandom(1 << 20))
                files.append(f)
            pid, cpu0 = None, 0.0
            if mode != "curl":
                p, url = start_blobrefd(bin_dir, tmp, endpoint, f"bench-{mode}",
                                        "auto" if mode == "direct" else "off")
                procs.append(p)
                pid, cpu0 = p.pid, cpu_seconds(p.pid)
            t0 = time.monotonic()
            if mode == "curl":
                def one(f):   # curl 7.88 signs an uploaded file wrongly without the header
                    h = hashlib.sha256(f.read_bytes()).hexdigest()
                    subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-T", str(f),
                                    "-H", f"x-amz-content-sha256: {h}",
                                    "--aws-sigv4", f"aws:amz:{REGION}:s3", "--user", f"{AK}:{SK}",
                                    f"{endpoint}/bench-curl/{f.name}"], check=True)
                with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                    list(pool.map(one, files))
            else:
                res = blobref.Client(url).put_many(files, workers=workers)
                key = "uploaded" if mode == "direct" else "via_server"
                assert res[key] == n, res
            secs = time.monotonic() - t0
            cpu = cpu_seconds(pid) - cpu0 if pid else None
            rows.append((mode, secs, cpu))
            for f in files:
                f.unlink()
        curl_secs = rows[2][1]
        gib = n / 1024
        print(f"| {n} x 1 MiB, {workers} workers | seconds | MiB/s | speed vs curl | "
              f"blobrefd CPU s/GiB |\n|---|---|---|---|---|")
        for mode, secs, cpu in rows:
            print(f"| {mode} | {secs:.1f} | {n / secs:.0f} | {curl_secs / secs:.2f}x | "
                  f"{'-' if cpu is None else f'{cpu / gib:.2f}'} |")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        subprocess.run([str(ROOT / "tests/s3/stop-rgw.sh"), str(tmp / "rgw")],
                       capture_output=True)
        subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()
