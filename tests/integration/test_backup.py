"""Backing up the index online (README "Back up and restore the index"): `mdb_copy -c` of
DATA_DIR/index while uploads go on gives a consistent copy; a second blobrefd started on it has
every blob acknowledged before the copy began, and `blobrefd --fsck` finds it clean. Also holds
the sizing figure the README gives (index bytes per blob)."""
import os
import shutil
import subprocess
import threading

import pytest
import requests

from conftest import BIN_DIR, Server
from util_http import TIMEOUT, sha

# README "Sizing" says about 410 bytes per one-location blob (20,000 blobs); a few hundred blobs
# also pay for the B-trees' first pages
BYTES_PER_BLOB_MAX = 600


@pytest.mark.skipif(shutil.which("mdb_copy") is None, reason="mdb_copy (lmdb-utils) is absent")
def test_online_backup_under_upload_load(tmp_path):
    first = Server(tmp_path / "data").start()
    acked, errors = [], []
    stop = threading.Event()

    def upload(seed):
        s = requests.Session()
        i = 0
        while not stop.is_set():
            data = f"backup {seed} {i} ".encode() + os.urandom(64)
            i += 1
            try:
                r = s.post(f"{first.url}/v1/blobs", data=data, timeout=TIMEOUT)
            except requests.RequestException as e:
                errors.append(repr(e))
                return
            if r.status_code != 201:
                errors.append(r.text)
                return
            acked.append((sha(data), data))

    workers = [threading.Thread(target=upload, args=(n,)) for n in range(3)]
    backup = tmp_path / "backup"
    try:
        for w in workers:
            w.start()
        while len(acked) < 300 and not errors and all(w.is_alive() for w in workers):
            threading.Event().wait(0.02)  # the load has to be there before the copy starts
        before = list(acked)  # acknowledged before the copy began
        (backup / "index").mkdir(parents=True)
        p = subprocess.run(["mdb_copy", "-c", str(first.data_dir / "index"),
                            str(backup / "index")], capture_output=True, text=True, timeout=120)
        during = len(acked) - len(before)
        assert p.returncode == 0, p.stderr
    finally:
        stop.set()
        for w in workers:
            w.join()
        assert first.stop() == 0, first.read_log()
    assert not errors, errors[:3]
    assert len(before) >= 300 and during > 0, (len(before), during)  # it copied under load

    conf = f"[store local]\nkind = fs\nroot = {first.data_dir / 'blobs'}\n"
    second = Server(backup, config_text=conf).start()
    try:
        s = requests.Session()
        for h, data in before:
            r = s.get(f"{second.url}/v1/blobs/{h}", timeout=TIMEOUT)
            assert r.status_code == 200 and r.content == data, (h, r.status_code)
    finally:
        assert second.stop() == 0, second.read_log()
    p = subprocess.run([str(BIN_DIR / "blobrefd"), "-c", str(backup / "blobref.conf"), "--data",
                        str(backup), "--fsck", "--verify"], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    assert p.returncode == 0, p.stdout + p.stderr

    # sizing: the compacted copy holds at least `before` blobs
    size = (backup / "index" / "data.mdb").stat().st_size
    per_blob = size / len(before)
    print(f"index: {size} bytes for {len(before)}..{len(acked)} blobs: {per_blob:.0f} bytes/blob")
    assert per_blob < BYTES_PER_BLOB_MAX, per_blob
