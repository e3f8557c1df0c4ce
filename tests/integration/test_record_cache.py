"""The index's record cache (issue 20's speed goals): its size is `[index] record_cache` entries
(refused out of range, shown by /metrics), and it is set-associative: a key lives in one set of 4
slots chosen by the digest's first 8 bytes (little-endian) modulo the number of sets, and a fill
into a full set evicts the set's least recently used record, not a hot one."""
import hashlib
import re

import pytest
import requests

from conftest import Server

TIMEOUT = 30
WAYS = 4


def sha(data):
    return hashlib.sha256(data).hexdigest()


def metric(srv, name, labels=""):
    text = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(rf"^{re.escape(name + labels)} (\d+)$", text, re.M)
    assert m, f"{name}{labels} missing from /metrics"
    return int(m.group(1))


def hits(srv):
    return metric(srv, "blobref_index_record_cache_total", '{result="hit"}')


@pytest.mark.parametrize("value,message", [
    ("10", r"record_cache: 10 is out of range"),
    ("16777217", r"record_cache: 16777217 is out of range"),
    ("lots", r"record_cache: 'lots' is not a whole number"),
])
def test_bad_sizes_are_refused(tmp_path, value, message):
    srv = Server(tmp_path / "d", f"[index]\nrecord_cache = {value}\n")
    with pytest.raises(RuntimeError, match=message):
        srv.start(timeout=10)


@pytest.mark.parametrize("value,entries", [(None, 65536), ("100", 128), ("4096", 4096)])
def test_size_is_shown_rounded_to_a_power_of_two(tmp_path, value, entries):
    text = f"[index]\nrecord_cache = {value}\n" if value else "[server]\n"
    srv = Server(tmp_path / "d", text).start()
    try:
        assert metric(srv, "blobref_index_record_cache_entries") == entries
    finally:
        assert srv.stop() == 0, srv.read_log()


def same_set(nsets, want, count):
    """count blob bodies whose digests fall in set `want` of nsets."""
    out, i = [], 0
    while len(out) < count:
        body = b"set-%d" % i
        i += 1
        if int.from_bytes(hashlib.sha256(body).digest()[:8], "little") % nsets == want:
            out.append(body)
    return out


def test_a_full_set_evicts_its_least_recently_used(tmp_path):
    """64 entries: 16 sets of 4. Five blobs of one set: the four read last stay cached (a
    direct-mapped cache would keep one of them), the one not read since goes."""
    srv = Server(tmp_path / "d", "[index]\nrecord_cache = 64\n").start()
    try:
        blobs = same_set(64 // WAYS, 3, WAYS + 1)
        for b in blobs:
            r = requests.put(f"{srv.url}/v1/blobs/{sha(b)}", data=b, timeout=TIMEOUT)
            assert r.status_code == 201, r.text

        def head(b):
            before = hits(srv)
            r = requests.head(f"{srv.url}/v1/blobs/{sha(b)}", timeout=TIMEOUT)
            assert r.status_code == 200
            return hits(srv) - before  # 1: answered from the record cache

        for b in blobs[:WAYS]:  # fill the set
            head(b)
        assert [head(b) for b in blobs[:WAYS]] == [1] * WAYS  # all four cached together
        for b in blobs[1:WAYS]:  # blobs[0] is now the set's least recently used
            assert head(b) == 1
        assert head(blobs[WAYS]) == 0  # a miss: filled, evicting blobs[0]
        assert [head(b) for b in blobs[1:]] == [1] * WAYS
        assert head(blobs[0]) == 0
    finally:
        assert srv.stop() == 0, srv.read_log()
