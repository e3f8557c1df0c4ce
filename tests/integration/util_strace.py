"""Attach strace to a running blobrefd and parse the system calls into ordered records, so tests
can check what happened on disk before an answer was sent."""
import os
import re
import shutil
import subprocess
import threading
import time

TRACED = ("openat,open,creat,fsync,fdatasync,sync_file_range,msync,syncfs,sync,rename,renameat,"
          "renameat2,link,linkat,unlink,unlinkat,sendto,sendmsg,writev,write,pwrite64,pwritev,"
          "pwritev2,close,mkdir,mkdirat")

LINE_RE = re.compile(r"^(\d+)\s+(.*)$")
CALL_RE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(.*)$", re.S)


class Call:
    def __init__(self, pid, name, args, ret, entry, exit_):
        self.pid, self.name, self.args, self.ret = pid, name, args, ret
        self.entry, self.exit = entry, exit_
        self.path = None  # for fd calls: the path of the fd at the time, when known
        self.src = self.dst = None  # for renames: full paths

    def fd(self):
        m = re.match(r"^(-?\d+)", self.args)
        return int(m.group(1)) if m else None

    def __repr__(self):
        return f"<{self.entry}-{self.exit} {self.pid} {self.name}({self.args[:80]}) = {self.ret}>"


class Tracer:
    """strace -f -p PID for the duration of a with-block."""

    def __init__(self, pid, out):
        self.pid, self.out = pid, str(out)
        self.proc = None
        self.fds0 = {}

    @staticmethod
    def available():
        return shutil.which("strace") is not None

    def __enter__(self):
        self.fds0 = fd_paths(self.pid)
        self.proc = subprocess.Popen(["strace", "-f", "-p", str(self.pid), "-s", "48", "-e",
                                      "trace=" + TRACED, "-o", self.out],
                                     stderr=subprocess.PIPE)
        # strace tells "Process N attached" per thread on stderr; wait until every thread is.
        self.lines = []
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()
        nthreads = len(os.listdir(f"/proc/{self.pid}/task"))
        deadline = time.time() + 10
        while self.attached < nthreads and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
        self.nthreads = nthreads
        return self

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def attached(self):
        """Threads attached so far ("Process N attached with K threads" or one line each)."""
        n = 0
        for line in list(self.lines):
            m = re.search(rb"attached with (\d+) threads", line)
            n += int(m.group(1)) if m else (1 if b"attached" in line else 0)
        return n

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(10)
        self.reader.join(5)
        # Wait until the kernel shows the process untraced (LeakSanitizer refuses to run under
        # ptrace at exit).
        deadline = time.time() + 5
        while time.time() < deadline and tracer_pid(self.pid) != 0:
            time.sleep(0.02)
        return False

    def calls(self):
        return parse(open(self.out, errors="replace").read(), self.fds0)


def tracer_pid(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fd_paths(pid):
    out = {}
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(f)] = os.readlink(f"/proc/{pid}/fd/{f}")
        except OSError:
            pass
    return out


def parse(text, fds0):
    """Returns the completed calls in order of completion, each with entry/exit line positions and
    the path its fd argument referred to (tracked through openat/close)."""
    pending = {}
    calls = []
    fds = dict(fds0)
    dirfd_paths = dict(fds0)
    for pos, line in enumerate(text.splitlines()):
        m = LINE_RE.match(line)
        if not m:
            continue
        pid, rest = int(m.group(1)), m.group(2)
        if rest.endswith("<unfinished ...>"):
            pending[pid] = (rest[: -len("<unfinished ...>")].rstrip(), pos)
            continue
        entry = pos
        r = re.match(r"^<\.\.\. (\w+) resumed>\s?(.*)$", rest, re.S)
        if r:
            start, entry = pending.pop(pid, ("", pos))
            rest = start + r.group(2)
        c = CALL_RE.match(rest)
        if not c:
            continue
        ret = int(c.group(3)) if c.group(3) != "?" else None
        call = Call(pid, c.group(1), c.group(2), ret, entry, pos)
        if call.name in ("openat", "open", "creat") and ret is not None and ret >= 0:
            pm = re.search(r'"([^"]*)"', call.args)
            path = pm.group(1) if pm else "?"
            base = None
            if call.name == "openat":
                d = call.args.split(",", 1)[0].strip()
                if d != "AT_FDCWD":
                    base = dirfd_paths.get(int(d))
            full = os.path.normpath(os.path.join(base, path)) if base else path
            call.path = full
            fds[ret] = full
            dirfd_paths[ret] = full
        elif call.name == "close":
            call.path = fds.pop(call.fd(), None)
            dirfd_paths.pop(call.fd(), None)
        elif call.name in ("rename", "renameat", "renameat2"):
            parts = [p.strip() for p in call.args.split(",")]
            pairs = ([("AT_FDCWD", parts[0]), ("AT_FDCWD", parts[1])] if call.name == "rename"
                     else [(parts[0], parts[1]), (parts[2], parts[3])])
            full = []
            for d, p in pairs:
                p = p.strip('"')
                if d == "AT_FDCWD" or p.startswith("/"):
                    full.append(p)
                else:
                    full.append(os.path.normpath(os.path.join(dirfd_paths.get(int(d), "?"), p)))
            call.src, call.dst = full
        else:
            fd = call.fd()
            if fd is not None and call.name not in ("mkdir", "mkdirat", "unlinkat", "linkat"):
                call.path = fds.get(fd)
        calls.append(call)
    return calls


WRITE_CALLS = ("write", "pwrite64", "pwritev", "pwritev2", "writev")
SYNC_CALLS = ("fsync", "fdatasync")
SEND_CALLS = ("sendmsg", "sendto", "writev", "write")


def ack_order_problems(calls, final, size, status=201):
    """PRODUCT.md order for an acknowledged upload: temp file written and fsynced, renamed to
    `final`, its directory fsynced, the index (LMDB data.mdb) synced, and only then the answer.
    Returns what is wrong (an empty list when the order holds)."""
    renames = [c for c in calls if c.name.startswith("rename") and c.dst == final]
    if len(renames) != 1:
        return [f"{len(renames)} renames to {final}"]
    rn = renames[0]
    tmp = rn.src
    opens = [c for c in calls if c.name in ("openat", "open", "creat") and c.path == tmp
             and c.exit < rn.entry]
    if not opens:
        return [f"no open of {tmp} before the rename"]
    op = opens[-1]
    problems = []
    writes = [c for c in calls if c.name in WRITE_CALLS and c.path == tmp and c.entry > op.exit
              and c.exit < rn.entry]
    if sum(c.ret or 0 for c in writes) != size:
        problems.append(f"writes to {tmp} before the rename add up to "
                        f"{sum(c.ret or 0 for c in writes)}, not {size}")
    if "O_SYNC" not in op.args and "O_DSYNC" not in op.args:
        last = writes[-1].exit if writes else op.exit
        if not [c for c in calls if c.name in SYNC_CALLS and c.path == tmp and c.ret == 0
                and last < c.entry and c.exit < rn.entry]:
            problems.append(f"{tmp} renamed without an fsync after its last write")
    answers = [c for c in calls if c.name in SEND_CALLS and f"HTTP/1.1 {status}" in c.args]
    if len(answers) != 1:
        return problems + [f"{len(answers)} answers with status {status}"]
    answer = answers[0]
    if not rn.exit < answer.entry:
        problems.append("answered before the rename")
    objdir = os.path.dirname(final)
    dsyncs = [c for c in calls if c.name in SYNC_CALLS and c.path == objdir and c.ret == 0
              and c.entry > rn.exit and c.exit < answer.entry]
    if not dsyncs:
        return problems + [f"directory {objdir} not fsynced between the rename and the answer"]
    if not [c for c in calls if c.exit < answer.entry and c.entry > dsyncs[0].exit and
            ((c.name in SYNC_CALLS and (c.path or "").endswith("/index/data.mdb"))
             or c.name == "msync")]:
        problems.append("no index (LMDB) sync between the directory fsync and the answer")
    return problems
