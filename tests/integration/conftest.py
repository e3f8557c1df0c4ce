"""Shared pytest fixtures: paths to the binaries under test and a real blobrefd on 127.0.0.1."""
import os
import pathlib
import socket
import subprocess
import tempfile
import time

import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("BLOBREF_BIN_DIR", ROOT / "bin"))
SHARED = ROOT.parent / "shared"
TESTDATA = SHARED / "testdata"
JS_DIR = ROOT / "tests" / "js"


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
        if self.config_text is not None:
            conf = self.data_dir / "blobref.conf"
            conf.write_text(self.config_text)
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


def need_testdata(*parts):
    """Returns the path under ../shared/testdata, or skips the test when it is absent."""
    p = TESTDATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent")
    return p
