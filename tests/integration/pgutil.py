"""A throwaway PostgreSQL 15 for tests: initdb + pg_ctl in a temp dir, on a free port on
127.0.0.1 (as root the server runs as the postgres user), with a fresh database per test."""
import atexit
import hashlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

PG_BIN = pathlib.Path(os.environ.get("BLOBREF_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available():
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists()


class Postgres:
    """One PostgreSQL server; stop() ends it and removes its files."""

    def __init__(self, options=""):
        self.options = options  # more server options (-c name=value ...)
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="blobref-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(PG_BIN / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")
        self.started = False
        self.start()
        self._n = 0

    def _run(self, *args, check=True, timeout=120):
        cmd = [str(a) for a in args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)

    def start(self):
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                f"-c max_connections=300 -c shared_buffers=32MB {self.options}")
        self._run(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.dir / "log", "-w", "-t", "60",
                  "-o", opts, "start")
        self.started = True

    def stop(self, mode="fast"):
        """Stops the server (it can be start()ed again)."""
        if self.started:
            self._run(PG_BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False)
            self.started = False

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def dsn(self, dbname="postgres"):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def psql(self, sql, dbname="postgres"):
        """Runs sql and returns its rows as lists of strings."""
        p = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-v",
                            "ON_ERROR_STOP=1", "-d", self.dsn(dbname), "-c", sql],
                           capture_output=True, text=True, timeout=60)
        if p.returncode:
            raise RuntimeError(f"psql: {p.stderr}")
        return [line.split("\t") for line in p.stdout.splitlines() if line]

    def database(self, name=None):
        """Creates a database (a fresh one when name is None; name: once) and returns its DSN."""
        if name is None:
            self._n += 1
            name = f"t{os.getpid()}_{self._n}"
        if not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"):
            self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)


_shared = None


def shared():
    """This process's PostgreSQL, started on first use and removed at exit."""
    global _shared
    if _shared is None:
        _shared = Postgres()
        atexit.register(_shared.destroy)
    return _shared


def database_for(data_dir):
    """The database of a data directory: the same for every server started on it (an LMDB index
    lives there too), fresh for a new one."""
    name = "d" + hashlib.sha256(str(pathlib.Path(data_dir).resolve()).encode()).hexdigest()[:24]
    return shared().database(name)


def wait_until(cond, timeout=30.0, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return cond()
