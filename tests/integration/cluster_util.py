"""The cluster-mode harness: a PostgreSQL 15 primary with a synchronous standby, HAProxy rendered
from conf/haproxy.cfg, and N blobrefd nodes sharing one S3 bucket (radosgw) and one [index]."""
import csv
import hashlib
import io
import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import requests

from conftest import ROOT, Server, free_port
from s3util import s3_store_conf

PG_BIN = pathlib.Path(os.environ.get("BLOBREF_PG_BIN", "/usr/lib/postgresql/15/bin"))
HAPROXY_TEMPLATE = ROOT / "conf" / "haproxy.cfg"
STANDBY_NAME = "standby1"


def wait_for(pred, timeout, what, step=0.02):
    """Polls pred() until it returns a true value (returned) or raises after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def pid_running(pid):
    """True while pid exists and is not a zombie (daemons started by pg_ctl are not our children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def children_of(pid):
    """The pids whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _as_postgres(args, timeout=120, check=True):
    """Runs a PostgreSQL tool as the postgres user when we are root (initdb refuses root)."""
    cmd = [str(a) for a in args]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


class PgInstance:
    """One PostgreSQL 15 server in its own directory on a free 127.0.0.1 port (trust auth for
    local connections only: a throwaway test database)."""

    def __init__(self, base, name):
        self.name = name
        self.dir = pathlib.Path(base) / name
        self.log_path = pathlib.Path(base) / f"{name}.log"
        self.port = free_port()

    def conf_lines(self):
        return [f"port = {self.port}", "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.dir}'", "wal_level = replica",
                "max_wal_senders = 8", "max_replication_slots = 8", "hot_standby = on",
                "synchronous_commit = on", "max_connections = 200", "shared_buffers = 32MB",
                "wal_keep_size = 128MB", "fsync = on", "log_min_messages = warning",
                "log_line_prefix = '%m [%p] '"]

    def start(self):
        _as_postgres([PG_BIN / "pg_ctl", "-D", self.dir, "-l", self.log_path, "-w", "-t", "60",
                      "start"])
        return self

    def postmaster_pid(self):
        try:
            return int((self.dir / "postmaster.pid").read_text().split("\n")[0])
        except (OSError, ValueError):
            return None

    def kill9(self, timeout=10):
        """SIGKILL to the postmaster and every backend at once (the machine is gone: no
        shutdown checkpoint, no goodbye to clients), and waits until none of them runs."""
        pid = self.postmaster_pid()
        if pid is None or not pid_running(pid):
            return
        victims = [pid] + children_of(pid)
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not any(pid_running(p) for p in victims), timeout,
                 f"{self.name}'s processes to die")

    def stop(self):
        pid = self.postmaster_pid()
        if pid is not None and pid_running(pid):
            _as_postgres([PG_BIN / "pg_ctl", "-D", self.dir, "-m", "immediate", "-w", "stop"],
                         check=False)

    def sql(self, query, db="postgres", timeout=30):
        """Runs query with psql (unaligned, tuples only) and returns its output stripped."""
        r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                            "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
                            "-c", query], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"psql on {self.name}: {query!r}: {r.stderr}")
        return r.stdout.strip()

    def try_sql(self, query, db="postgres"):
        try:
            return self.sql(query, db, timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return None

    def in_recovery(self):
        return self.try_sql("SELECT pg_is_in_recovery()")


class PgPair:
    """A primary and one synchronous standby (streaming replication over a physical slot,
    synchronous_standby_names = standby1, synchronous_commit = on): a commit is acknowledged only
    once the standby has flushed it. After promote() the new primary runs alone (its
    synchronous_standby_names is empty, as Patroni's synchronous_mode would leave it with no
    standby left), so writes resume."""

    def __init__(self, base=None):
        # not under pytest's tmp_path: the postgres user must be able to reach it
        self.base = pathlib.Path(base or tempfile.mkdtemp(prefix="blobref-pg-", dir="/tmp"))
        self.primary = PgInstance(self.base, "primary")
        self.standby = PgInstance(self.base, "standby")
        self.promote_seconds = None

    def start(self):
        t0 = time.monotonic()
        if os.geteuid() == 0:
            os.chmod(self.base, 0o755)
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        p = self.primary
        _as_postgres([PG_BIN / "initdb", "-D", p.dir, "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        with open(p.dir / "postgresql.conf", "a") as f:
            f.write("\n".join(p.conf_lines()) + "\n")
        (p.dir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
            "host replication all 127.0.0.1/32 trust\n")
        p.start()
        p.sql(f"SELECT pg_create_physical_replication_slot('{STANDBY_NAME}')")
        s = self.standby
        _as_postgres([PG_BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", p.port, "-U", "postgres",
                      "-D", s.dir, "-X", "stream", "-c", "fast", "-S", STANDBY_NAME, "--no-sync"])
        with open(s.dir / "postgresql.conf", "a") as f:
            f.write("\n".join(s.conf_lines()) + "\n")
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={p.port} user=postgres "
                    f"application_name={STANDBY_NAME}'\nprimary_slot_name = '{STANDBY_NAME}'\n")
        _as_postgres(["touch", s.dir / "standby.signal"])
        s.start()
        # only now: a primary waiting for a standby that is not there would block every commit
        p.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        p.sql("SELECT pg_reload_conf()")
        wait_for(lambda: p.try_sql("SELECT sync_state FROM pg_stat_replication WHERE "
                                   f"application_name = '{STANDBY_NAME}'") == "sync",
                 30, "the standby to be synchronous")
        self.start_seconds = time.monotonic() - t0
        return self

    def create_database(self, name):
        self.primary.sql(f'CREATE DATABASE "{name}"')
        return name

    def dsn(self, db):
        """A multi-host libpq conninfo: whichever of the two is writable."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
                f"dbname={db} user=postgres target_session_attrs=read-write connect_timeout=2")

    def kill_primary(self):
        self.primary.kill9()

    def promote_standby(self, timeout=30):
        """pg_ctl promote, then waits until the standby accepts writes; returns the seconds."""
        t0 = time.monotonic()
        _as_postgres([PG_BIN / "pg_ctl", "-D", self.standby.dir, "-w", "-t", str(timeout),
                      "promote"])
        wait_for(lambda: self.standby.in_recovery() == "f", timeout, "the standby's promotion")
        self.promote_seconds = time.monotonic() - t0
        return self.promote_seconds

    def stop(self):
        for inst in (self.standby, self.primary):
            inst.stop()

    def remove(self):
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def render_haproxy(template, listen_port, nodes, stats_socket, tag_responses=True):
    """conf/haproxy.cfg with the test's addresses: the `bind` line listens on listen_port, the
    `server` lines become one per node (name nodeI, the template's options kept), a stats socket
    is added under `global`, and (for the tests) each response says which node answered in an
    X-Blobref-Node header."""
    out, server_opts, servers_done = [], None, False
    for line in template.splitlines():
        s = line.strip()
        if s == "global":
            out += [line, f"    stats socket {stats_socket} mode 600 level admin"]
            continue
        if s.startswith("bind "):
            out.append(re.sub(r"bind \S+", f"bind 127.0.0.1:{listen_port}", line))
            continue
        if s.startswith("server "):
            if server_opts is None:
                server_opts = s.split(None, 3)[3] if len(s.split(None, 3)) > 3 else ""
            if not servers_done:
                indent = line[: len(line) - len(line.lstrip())]
                if tag_responses:
                    out.append(f"{indent}http-response set-header X-Blobref-Node %s")
                for i, n in enumerate(nodes):
                    out.append(f"{indent}server node{i + 1} 127.0.0.1:{n.port} {server_opts}")
                servers_done = True
            continue
        out.append(line)
    assert servers_done, "the template has no server line"
    return "\n".join(out) + "\n"


class Haproxy:
    """HAProxy 2.6 on a free port in front of the nodes, from conf/haproxy.cfg."""

    def __init__(self, work_dir, nodes):
        self.dir = pathlib.Path(work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.nodes = nodes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a unix socket path has at most 97 bytes in HAProxy, and pytest-xdist's tmp paths are
        # longer: the socket gets a short directory of its own under /tmp
        self.sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="brhap-", dir="/tmp"))
        self.stats = self.sock_dir / "stats.sock"
        self.cfg = self.dir / "haproxy.cfg"
        self.log_path = self.dir / "haproxy.log"
        self.proc = None

    def start(self, timeout=20):
        self.cfg.write_text(render_haproxy(HAPROXY_TEMPLATE.read_text(), self.port, self.nodes,
                                           self.stats))
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_servers(["UP"] * len(self.nodes), timeout)
        return self

    def command(self, cmd):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.stats))
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode()

    def server_states(self):
        """[status of node1, node2, ...] from `show stat` (UP, DOWN, 'UP 1/2', ...), or None."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError("haproxy exited:\n" + self.log_path.read_text(errors="replace"))
        try:
            text = self.command("show stat")
        except OSError:
            return None
        rows = list(csv.reader(io.StringIO(text.lstrip("# "))))
        head = rows[0]
        states = {}
        for r in rows[1:]:
            if len(r) == len(head):
                d = dict(zip(head, r))
                if d["pxname"] == "blobrefd" and d["svname"].startswith("node"):
                    states[d["svname"]] = d["status"]
        return [states.get(f"node{i + 1}") for i in range(len(self.nodes))]

    def wait_servers(self, want, timeout):
        wait_for(lambda: self.server_states() == want, timeout, f"haproxy's servers {want}")

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def index_section(dsn):
    return f"[index]\nkind = postgres\ndsn = {dsn}\n"


def node_config(rgw, bucket, dsn=None, server=""):
    """One node's config: [server], the shared s3 store over bucket (proxy reads) and, with a
    dsn, the shared PostgreSQL index; without one each node keeps its own LMDB index."""
    text = "[server]\n" + server + "\n" + s3_store_conf(rgw, bucket)
    if dsn is not None:
        text += "\n" + index_section(dsn)
    return text


UNSUPPORTED_MARKERS = ("unknown section [index]", "[index]: unknown key")


def postgres_index_supported(bin_dir, work_dir):
    """Whether this blobrefd knows `[index] kind = postgres` (pgindex's backend), asked by
    starting it on such a config pointing at nothing: a binary without the backend refuses the
    section at once; one with it gets past the config (and fails or waits on the connection)."""
    work = pathlib.Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    conf = work / "probe.conf"
    conf.write_text(index_section("host=127.0.0.1 port=1 dbname=none connect_timeout=1"))
    try:
        r = subprocess.run([str(pathlib.Path(bin_dir) / "blobrefd"), "-c", str(conf), "--data",
                            str(work / "data"), "--listen", f"127.0.0.1:{free_port()}"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3)
        out = r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    low = out.lower()
    return not any(m.lower() in low for m in UNSUPPORTED_MARKERS) and "unknown index kind" not in low


class Cluster:
    """N blobrefd nodes (each its own --data) over one bucket and, when dsn is given, one
    PostgreSQL index, behind HAProxy."""

    def __init__(self, work_dir, rgw, bucket, n, dsn=None, server=""):
        self.dir = pathlib.Path(work_dir)
        self.nodes = [Server(self.dir / f"node{i + 1}", node_config(rgw, bucket, dsn, server))
                      for i in range(n)]
        self.haproxy = None

    def start(self):
        for n in self.nodes:
            n.start(timeout=30)
        self.haproxy = Haproxy(self.dir / "haproxy", self.nodes).start()
        return self

    @property
    def url(self):
        return self.haproxy.url

    def stop(self):
        """Stops HAProxy and the nodes still running; returns {node index: exit code}."""
        if self.haproxy is not None:
            self.haproxy.stop()
        return {i: n.stop() for i, n in enumerate(self.nodes) if n.proc is not None}


class UploadLoad:
    """Threads uploading new random blobs through url until stop(): every acknowledged (200/201)
    hash is kept, with the times of the failures, to measure an outage window."""

    def __init__(self, url, threads=4, size=4096, seed=0):
        self.url = url
        self.threads = threads
        self.size = size
        self.seed = seed
        self.acked = {}          # hex -> bytes
        self.statuses = {}       # status (or exception name) -> count
        self.fail_times = []     # monotonic times of the requests that were not acknowledged
        self.ack_times = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers = []

    def _run(self, k):
        rnd = hashlib.sha256(f"{self.seed}/{k}".encode()).digest()
        i = 0
        with requests.Session() as s:
            while not self._stop.is_set():
                data = rnd + i.to_bytes(8, "big") + os.urandom(self.size)
                i += 1
                h = hashlib.sha256(data).hexdigest()
                try:
                    r = s.put(f"{self.url}/v1/blobs/{h}", data=data, timeout=15)
                    key = r.status_code
                except requests.RequestException as e:
                    key = type(e).__name__
                now = time.monotonic()
                with self._lock:
                    self.statuses[key] = self.statuses.get(key, 0) + 1
                    if key in (200, 201):
                        self.acked[h] = data
                        self.ack_times.append(now)
                    else:
                        self.fail_times.append(now)
                if key not in (200, 201):
                    time.sleep(0.02)  # a failing cluster is polled, not hammered

    def start(self):
        for k in range(self.threads):
            t = threading.Thread(target=self._run, args=(k,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def acked_count(self):
        with self._lock:
            return len(self.acked)

    def stop(self):
        self._stop.set()
        for t in self._workers:
            t.join(timeout=30)

    def outage_window(self, since):
        """Seconds from `since` (the fault) until writes are acknowledged again for good: to the
        first acknowledgement after the last failure (0 when nothing failed after since)."""
        with self._lock:
            fails = [t for t in self.fail_times if t >= since]
            if not fails:
                return 0.0
            last = max(fails)
            acks = [t for t in self.ack_times if t > last]
            return (min(acks) if acks else time.monotonic()) - since

    def failures_since(self, since):
        with self._lock:
            return sum(1 for t in self.fail_times if t >= since)


PATRONI_TEMPLATE = ROOT / "conf" / "patroni" / "patroni.yml"


def _chown_postgres(path):
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


class Etcd:
    """Three etcd members on 127.0.0.1 (the DCS that Patroni's leader lease lives in)."""

    def __init__(self, base, n=3):
        self.base = pathlib.Path(base)
        self.members = [{"name": f"etcd{i + 1}", "client": free_port(), "peer": free_port()}
                        for i in range(n)]
        self.procs = []

    @property
    def hosts(self):
        return ",".join(f"127.0.0.1:{m['client']}" for m in self.members)

    def start(self, timeout=60):
        cluster = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)
        token = f"blobref-{os.getpid()}-{self.members[0]['client']}"  # the same for all three
        for m in self.members:
            d = self.base / m["name"]
            log = open(self.base / f"{m['name']}.log", "ab")
            self.procs.append(subprocess.Popen(
                ["etcd", "--name", m["name"], "--data-dir", str(d),
                 "--listen-client-urls", f"http://127.0.0.1:{m['client']}",
                 "--advertise-client-urls", f"http://127.0.0.1:{m['client']}",
                 "--listen-peer-urls", f"http://127.0.0.1:{m['peer']}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{m['peer']}",
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", token],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

        def healthy():
            for m in self.members:
                try:
                    r = requests.get(f"http://127.0.0.1:{m['client']}/health", timeout=1)
                    if r.status_code != 200 or r.json().get("health") != "true":
                        return False
                except (requests.RequestException, ValueError):
                    return False
            return True

        wait_for(healthy, timeout, "three healthy etcd members", step=0.1)
        return self

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


class PatroniMember:
    """One Patroni (run as postgres, in its own session so that kill9() takes Patroni and its
    PostgreSQL down together, as a lost machine would) managing one PostgreSQL 15."""

    def __init__(self, base, name, etcd_hosts, passwords, ttl=10, loop_wait=1, retry_timeout=4):
        self.name = name
        self.dir = pathlib.Path(base) / name
        self.dir.mkdir(parents=True)
        _chown_postgres(self.dir)
        self.pg_port, self.rest_port = free_port(), free_port()
        self.cfg = self.dir / "patroni.yml"
        values = {"NAME": name, "HOST": "127.0.0.1", "REST_PORT": self.rest_port,
                  "PG_PORT": self.pg_port, "ETCD_HOSTS": etcd_hosts,
                  "DATA_DIR": self.dir / "pgdata", "SOCKET_DIR": self.dir, "BIN_DIR": PG_BIN,
                  "PGPASS": self.dir / "pgpass",
                  "TTL": ttl, "LOOP_WAIT": loop_wait, "RETRY_TIMEOUT": retry_timeout,
                  "SUPERUSER_PASSWORD": passwords[0], "REPLICATION_PASSWORD": passwords[1]}
        import string
        text = string.Template(PATRONI_TEMPLATE.read_text()).substitute(
            {k: str(v) for k, v in values.items()})
        self.cfg.write_text(text)
        _chown_postgres(self.cfg)
        self.log_path = pathlib.Path(base) / f"{name}.log"
        self.proc = None
        self.rest = f"http://127.0.0.1:{self.rest_port}"

    def start(self):
        cmd = ["patroni", str(self.cfg)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def role(self):
        """Patroni's own word: 'primary' when GET /primary answers 200, else 'replica' or None."""
        try:
            r = requests.get(self.rest + "/primary", timeout=1)
        except requests.RequestException:
            return None
        return "primary" if r.status_code == 200 else "replica"

    def postmaster_pid(self):
        try:
            return int((self.dir / "pgdata" / "postmaster.pid").read_text().split("\n")[0])
        except (OSError, ValueError):
            return None

    def kill9(self, timeout=10):
        """SIGKILL to Patroni and to its PostgreSQL (which Patroni starts detached, in a session
        of its own) with every backend, at once; waits until none of them runs."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        victims = [int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pgid]
        pm = self.postmaster_pid()
        if pm is not None and pid_running(pm):
            victims += [pm] + children_of(pm)
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout)
        wait_for(lambda: not any(pid_running(p) for p in victims), timeout,
                 f"{self.name}'s processes to die")
        self.proc = None
        self.log.close()

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill9()
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything Patroni left behind
        except ProcessLookupError:
            pass
        self.proc = None
        self.log.close()


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class PatroniCluster:
    """Three etcd members and two Patroni members (synchronous_mode) over PostgreSQL 15, all on
    127.0.0.1, from conf/patroni/patroni.yml."""

    def __init__(self, base=None, ttl=10, loop_wait=1, retry_timeout=4):
        self.base = pathlib.Path(base or tempfile.mkdtemp(prefix="blobref-patroni-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        _chown_postgres(self.base)
        self.password = hashlib.sha256(os.urandom(16)).hexdigest()[:24]
        self.etcd = Etcd(self.base / "etcd-dirs")
        (self.base / "etcd-dirs").mkdir()
        self.members = []
        self.timing = dict(ttl=ttl, loop_wait=loop_wait, retry_timeout=retry_timeout)

    def start(self, timeout=120):
        t0 = time.monotonic()
        self.etcd.start()
        pw = (self.password, self.password + "r")
        self.members = [PatroniMember(self.base, f"pg{i + 1}", self.etcd.hosts, pw, **self.timing)
                        for i in range(2)]
        self.members[0].start()
        wait_for(lambda: self.members[0].role() == "primary", timeout, "pg1 to bootstrap",
                 step=0.2)
        self.members[1].start()
        wait_for(self.synchronous, timeout, "pg2 to be the synchronous standby", step=0.2)
        self.start_seconds = time.monotonic() - t0
        return self

    def cluster_state(self):
        for m in self.members:
            try:
                return requests.get(m.rest + "/cluster", timeout=1).json()
            except (requests.RequestException, ValueError):
                continue
        return None

    def synchronous(self):
        st = self.cluster_state()
        if not st:
            return False
        roles = sorted((x.get("role"), x.get("state")) for x in st.get("members", []))
        return roles == [("leader", "running"), ("sync_standby", "streaming")] or \
            roles == [("leader", "running"), ("sync_standby", "running")]

    def leader(self):
        for m in self.members:
            if m.proc is not None and m.role() == "primary":
                return m
        return None

    def dsn(self, db="postgres"):
        hosts = ",".join("127.0.0.1" for _ in self.members)
        ports = ",".join(str(m.pg_port) for m in self.members)
        return (f"host={hosts} port={ports} dbname={db} user=postgres password={self.password} "
                "target_session_attrs=read-write connect_timeout=2")

    def stop(self):
        for m in self.members:
            m.stop()
        self.etcd.stop()

    def remove(self, keep_logs=None):
        """Stops everything and deletes the directory, copying the logs to keep_logs first."""
        self.stop()
        if keep_logs is not None:
            for f in list(self.base.glob("*.log")) + list(self.base.glob("etcd-dirs/*.log")):
                shutil.copy(f, pathlib.Path(keep_logs) / f.name)
        shutil.rmtree(self.base, ignore_errors=True)


PG_HAPROXY_TEMPLATE = ROOT / "conf" / "patroni" / "haproxy-postgres.cfg"


class PrimaryProxy:
    """HAProxy from conf/patroni/haproxy-postgres.cfg: one port leading to whichever Patroni
    member answers GET /primary with 200."""

    def __init__(self, work_dir, members):
        self.dir = pathlib.Path(work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cfg = self.dir / "haproxy-postgres.cfg"
        out, done = [], False
        for line in PG_HAPROXY_TEMPLATE.read_text().splitlines():
            s = line.strip()
            if s.startswith("bind "):
                line = re.sub(r"bind \S+", f"bind 127.0.0.1:{self.port}", line)
            elif s.startswith("server "):
                if done:
                    continue
                indent = line[: len(line) - len(line.lstrip())]
                opts = s.split(None, 3)[3]
                opts = re.sub(r"port \d+", "port {rest}", opts)
                out += [f"{indent}server {m.name} 127.0.0.1:{m.pg_port} "
                        + opts.format(rest=m.rest_port) for m in members]
                done = True
                continue
            out.append(line)
        self.cfg.write_text("\n".join(out) + "\n")
        self.log_path = self.dir / "haproxy-postgres.log"
        self.proc = None

    def start(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.cfg)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
            self.log.close()
