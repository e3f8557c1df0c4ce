"""Shared pytest fixtures: paths to the binaries under test, a real blobrefd on 127.0.0.1 and a
real S3 server (Ceph radosgw) for the S3 store."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

import pgutil

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("BLOBREF_BIN_DIR", ROOT / "bin"))
SHARED = ROOT.parent / "shared"
TESTDATA = SHARED / "testdata"
JS_DIR = ROOT / "tests" / "js"
S3_DIR = ROOT / "tests" / "s3"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A blobrefd process on a free loopback port with its own data directory."""

    def __init__(self, data_dir, config_text=None, extra_args=()):
        self.data_dir = pathlib.Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_text = config_text
        self.extra_args = list(extra_args)
        self.proc = None
        self.log_path = self.data_dir / "blobrefd.log"

    def start(self, timeout=20):
        args = [str(BIN_DIR / "blobrefd"), "--listen", f"127.0.0.1:{self.port}",
                "--data", str(self.data_dir)]
        config_text = self.config_text
        if os.environ.get("BLOBREF_TEST_INDEX") == "postgres" and \
                "[index]" not in (config_text or ""):
            # the suite against a PostgreSQL index: one database per data directory
            config_text = (config_text or "") + \
                f"\n[index]\nkind = postgres\ndsn = {pgutil.database_for(self.data_dir)}\n"
        if config_text is not None:
            conf = self.data_dir / "blobref.conf"
            conf.write_text(config_text)
            args += ["-c", str(conf)]
        args += self.extra_args
        env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"blobrefd exited {self.proc.returncode}:\n{self.read_log()}")
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("blobrefd did not become ready:\n" + self.read_log())

    def read_log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig=None):
        """Stops the server (SIGTERM by default) and returns its exit code."""
        if self.proc is None:
            return None
        if sig is None:
            self.proc.terminate()
        else:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        self.log.close()
        return rc

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def server(tmp_path):
    """A fresh blobrefd on its embedded default (fs store + LMDB under tmp_path/data)."""
    srv = Server(tmp_path / "data").start()
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive, "blobrefd died during the test:\n" + srv.read_log()
    assert rc == 0, f"blobrefd exited {rc} on SIGTERM:\n" + srv.read_log()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL 15 on a free port (pgutil.Postgres): .database() gives a fresh DSN."""
    if not pgutil.available():
        pytest.skip("PostgreSQL 15 is not installed")
    return pgutil.shared()


def need_testdata(*parts):
    """Returns the path under ../shared/testdata, or skips the test when it is absent."""
    p = TESTDATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent")
    return p


class Rgw:
    """A throwaway Ceph (monitor + in-memory OSD) and radosgw started by tests/s3/start-rgw.sh.

    Two users: `access_key`/`secret_key` (tester) and `access_key2`/`secret_key2` (tester2, who
    owns nothing of tester's). Objects live in the OSD's memory: kill()/restart() touch radosgw
    only, so everything stored before a kill is still there afterwards; stop() loses it all."""

    region = "us-east-1"

    def __init__(self, state_dir):
        self.dir = pathlib.Path(state_dir)
        self.access_key, self.secret_key = "TESTAK", "TESTSK"
        self.access_key2, self.secret_key2 = "TESTAK2", "TESTSK2"
        self.endpoint = None
        self.start_seconds = None

    def _run(self, *args, timeout=120):
        env = dict(os.environ, RGW_ACCESS_KEY=self.access_key, RGW_SECRET_KEY=self.secret_key,
                   RGW_ACCESS_KEY2=self.access_key2, RGW_SECRET_KEY2=self.secret_key2)
        t0 = time.monotonic()
        r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stderr}")
        return r.stdout.strip(), time.monotonic() - t0

    def start(self):
        self.endpoint, self.start_seconds = self._run(str(S3_DIR / "start-rgw.sh"), str(self.dir))
        return self

    def stop(self):
        self._run(str(S3_DIR / "stop-rgw.sh"), str(self.dir))

    def pid(self):
        """radosgw's pid, or None when it is not running."""
        try:
            lines = (self.dir / "pids").read_text().split("\n")
        except OSError:
            return None
        pids = [int(l.split()[1]) for l in lines if l.startswith("rgw ")]
        return pids[-1] if pids and _running(pids[-1]) else None

    def kill(self, sig=signal.SIGKILL, timeout=10):
        """Sends sig (SIGKILL: no clean-up at all) to radosgw and waits until it is gone; the
        monitor and the OSD keep running. Connections then get refused until restart()."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while _running(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"radosgw {pid} still running {timeout} s after signal {sig}")
            time.sleep(0.02)

    def restart(self):
        """Starts radosgw again on the same endpoint and cluster (mon and OSD are left alone) and
        returns once it answers a signed request, with the seconds it took (about 0.5 s after
        kill(); a radosgw still running is first stopped with SIGTERM, which takes up to 5 s)."""
        endpoint, took = self._run(str(S3_DIR / "start-rgw.sh"), "--rgw-only", str(self.dir))
        assert endpoint == self.endpoint, (endpoint, self.endpoint)
        return took

    def client(self, access_key=None, secret_key=None, **config):
        """A boto3 S3 client (path-style, SigV4) for tester, or for the keys given."""
        import boto3
        from botocore.config import Config
        cfg = dict(signature_version="s3v4", s3={"addressing_style": "path"},
                   retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30)
        cfg.update(config)
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=access_key or self.access_key,
                            aws_secret_access_key=secret_key or self.secret_key,
                            config=Config(**cfg))

    def make_bucket(self, name, client=None):
        """Creates bucket `name` (at least 3 characters) owned by the client's user (tester by
        default), empty: one left by an earlier test of the session is emptied. Returns name."""
        s3 = client or self.client()
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass  # radosgw answers 200 instead (the us-east-1 legacy): empty it in both cases
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
            for o in page.get("Versions", []) + page.get("DeleteMarkers", []):
                s3.delete_object(Bucket=name, Key=o["Key"], VersionId=o["VersionId"])
        for u in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        return name


def _running(pid):
    """True while pid exists and is not a zombie (radosgw is not our child: we cannot reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="session")
def rgw():
    """One radosgw for the whole session, started (about 2 s) by the first test that asks for it.
    Skips when radosgw is not installed (tools/install-deps.sh test installs it)."""
    if shutil.which("radosgw") is None:
        pytest.skip("radosgw is not installed (tools/install-deps.sh test installs it)")
    pytest.importorskip("boto3", reason="python3-boto3 is not installed")
    # short path: the daemons' admin sockets under it must fit in a sockaddr_un (107 bytes)
    state = tempfile.mkdtemp(prefix="blobref-rgw-", dir="/tmp")
    srv = Rgw(state)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(state, ignore_errors=True)
