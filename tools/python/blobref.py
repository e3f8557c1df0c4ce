"""blobref: a Python client for blobrefd's HTTP API v1 (standard library only, Python 3.9+).

    import blobref
    c = blobref.Client("http://127.0.0.1:8080", token=None)
    h = c.put(b"bytes")            # or a path, or a binary file object: hashed locally first
    data = c.get(h)                # verified against the hash
    from PIL import Image
    img = Image.open(c.open(h))    # seekable file object over HTTP Range: reads what PIL reads
    c.lookup([h, ...])             # {"found": [{"sha256","size","url"}], "missing": [...]}
    c.stat(h)                      # the index record (GET /v1/blobs/{hash}/meta)
    for rec in c.iter_blobs(): ... # GET /v1/blobs?after=HEX&limit=N, page by page
    c.fetch_many(hashes, workers=8)   # {hash: bytes}, each verified
    c.put_many(paths, workers=8)      # presigned PUTs straight to S3 where offered

Uploads send `Expect: 100-continue` and wait (briefly) for the server's verdict before sending
the body: blobrefd answers 200 at once for a blob it already has, so a known blob is never sent
again. Errors raise BlobrefError (or NotFound, Quarantined, DigestMismatch) carrying the API's
error code, the HTTP status and the server's message.
"""
import concurrent.futures
import hashlib
import http.client
import io
import json
import mimetypes
import os
import re
import select
import shutil
import tempfile
import threading
import time
import urllib.parse

__all__ = ["Client", "BlobFile", "BlobrefError", "NotFound", "Quarantined", "DigestMismatch",
           "sha256_hex"]
__version__ = "1.0"

_HEX_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
LOOKUP_BATCH = 10_000


MIN_PART = 5 << 20     # S3's smallest part: a store never offers single PUTs below it
PART_SIZE = 8 << 20    # the part size put_many hashes a file over MIN_PART at
MAX_PARTS = 10_000
HASHES_MAX = 20_000    # part hashes per negotiation (the server's too_many_hashes bound)


def _part_size_for(size, part_size=PART_SIZE):
    """The part size a file of size bytes is hashed at: part_size, or bigger (a MiB multiple) so
    that it has at most MAX_PARTS parts."""
    fit = -(-size // MAX_PARTS)
    return max(part_size, -(-fit // (1 << 20)) * (1 << 20))


def _describe_file(path, part_size=None):
    """{"sha256","size","content_type"} of a file (type guessed from its name), and for a file
    over MIN_PART (any file, with part_size) also "part_size" and "part_sha256" (one SHA-256 per
    part of PART_SIZE or part_size), hashed in the same pass: the server uses them when the
    blob is too big for a single presigned PUT."""
    h, size = hashlib.sha256(), 0
    ps = _part_size_for(os.path.getsize(path), part_size or PART_SIZE)
    parts, ph, in_part = [], hashlib.sha256(), 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(min(_CHUNK, ps - in_part))
            if not chunk:
                break
            h.update(chunk)
            ph.update(chunk)
            size += len(chunk)
            in_part += len(chunk)
            if in_part == ps:
                parts.append(ph.hexdigest())
                ph, in_part = hashlib.sha256(), 0
    if in_part:
        parts.append(ph.hexdigest())
    ct = mimetypes.guess_type(path, strict=False)[0] or "application/octet-stream"
    out = {"sha256": h.hexdigest(), "size": size, "content_type": ct}
    if (size > MIN_PART or part_size) and len(parts) == -(-size // ps):  # (unless it changed)
        out.update(part_size=ps, part_sha256=parts)
    return out


class BlobrefError(Exception):
    """An error answer of blobrefd (or a transport failure): `code` is the API error code
    (`not_found`, `quarantined`, `unauthorized`, `store_unavailable`, ...; `http_<status>` for a
    non-blobref error answer, `connection_error` when the server could not be reached,
    `bad_hash` for a malformed hash refused before any request), `status` the HTTP status (None
    when there was no answer) and `message` the server's explanation."""

    def __init__(self, code, status, message):
        super().__init__(f"{code} ({status}): {message}" if status else f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message


class NotFound(BlobrefError):
    """404: no such blob (or no such route: code `no_route`)."""


class Quarantined(BlobrefError):
    """410: the blob is quarantined (unreferenced; deleted after the retention period)."""


class DigestMismatch(BlobrefError):
    """The bytes received do not hash to the requested SHA-256 (code `digest_mismatch`); also
    raised by the server (400) when an upload's bytes do not match the hash in its URL."""


def _error_class(status, code):
    if status == 404:
        return NotFound
    if status == 410 or code == "quarantined":
        return Quarantined
    if code == "digest_mismatch":
        return DigestMismatch
    return BlobrefError


def sha256_hex(data):
    """The blob id of bytes: 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def _norm_hash(h):
    """64 lowercase hex digits from a hex string, `sha256:<hex>`, or 32 raw bytes."""
    if isinstance(h, (bytes, bytearray, memoryview)) and len(h) == 32:
        return bytes(h).hex()
    if isinstance(h, str):
        s = h.strip()
        if s[:7].lower() == "sha256:":
            s = s[7:]
        s = s.lower()
        if _HEX_RE.match(s):
            return s
    raise BlobrefError("bad_hash", None, f"not a SHA-256 (64 hex digits or sha256:<hex>): {h!r}")


def _max_age(cache_control):
    m = re.search(r"(?:^|[,\s])max-age\s*=\s*(\d+)", cache_control or "")
    return int(m.group(1)) if m else 0


class _Answer:
    """A complete HTTP answer: status, headers (an http.client.HTTPMessage) and body bytes."""
    __slots__ = ("status", "headers", "body", "url")

    def __init__(self, status, headers, body, url):
        self.status, self.headers, self.body, self.url = status, headers, body, url

    def json(self):
        return json.loads(self.body.decode("utf-8"))


class _Chained(io.RawIOBase):
    """A raw stream that yields `prefix` first, then reads from the buffered stream `rest`."""

    def __init__(self, prefix, rest):
        self._prefix, self._rest = prefix, rest

    def readable(self):
        return True

    def readinto(self, b):
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._rest.read1(len(b))
        b[:len(data)] = data
        return len(data)


class _SockShim:
    """What http.client.HTTPResponse needs of a socket: makefile() giving our buffered stream."""

    def __init__(self, fp):
        self._fp = fp

    def makefile(self, mode, *args, **kwargs):
        return self._fp


class Client:
    """A blobrefd client. `url` is the server's base URL (default: BLOBREF_SERVER, else
    http://127.0.0.1:8080), `token` a bearer token (default: BLOBREF_TOKEN, else none),
    `timeout` the socket timeout in seconds, `expect_timeout` how long an upload waits for
    `100 Continue` (or the final answer) before it sends the body anyway.

    Counters (for tests and curiosity): `bytes_sent` (upload body bytes actually sent),
    `bytes_received` (blob bytes received by get/open/fetch_many), `requests` (HTTP requests).
    A Client is safe to use from several threads: each thread keeps its own connections."""

    def __init__(self, url=None, token=None, timeout=60.0, expect_timeout=2.0, max_redirects=5):
        url = url or os.environ.get("BLOBREF_SERVER") or "http://127.0.0.1:8080"
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self._base_path = u.path.rstrip("/")
        self._origin = (u.scheme, u.hostname, u.port)
        self.token = token if token is not None else (os.environ.get("BLOBREF_TOKEN") or None)
        self.timeout = timeout
        self.expect_timeout = expect_timeout
        self.max_redirects = max_redirects
        self._local = threading.local()
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.requests = 0

    def __repr__(self):
        return f"blobref.Client({self.url!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- connections -------------------------------------------------------------------------

    def _count(self, sent=0, received=0, requests=0):
        with self._lock:
            self.bytes_sent += sent
            self.bytes_received += received
            self.requests += requests

    def _new_conn(self, origin):
        scheme, host, port = origin
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.timeout)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _conn(self, origin):
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        c = pool.get(origin)
        if c is None:
            c = pool[origin] = self._new_conn(origin)
        return c

    def _drop(self, origin):
        c = getattr(self._local, "pool", {}).pop(origin, None)
        if c is not None:
            c.close()

    def close(self):
        """Closes this thread's idle connections."""
        for c in getattr(self._local, "pool", {}).values():
            c.close()
        self._local.pool = {}

    def _headers(self, extra=None, origin=None):
        h = {"User-Agent": f"blobref-python/{__version__}"}
        if self.token and (origin is None or origin == self._origin):
            h["Authorization"] = f"Bearer {self.token}"   # never sent to a redirect's other host
        if extra:
            h.update(extra)
        return h

    def _request(self, method, path, body=None, headers=None, follow=True, sink=None):
        """One request with keep-alive, one retry on a stale reused connection, redirects
        followed for GET/HEAD. Returns an _Answer (body read completely, or streamed to sink)."""
        origin, target = self._origin, self._base_path + path
        for _ in range(self.max_redirects + 1):
            ans = self._once(origin, method, target, body, self._headers(headers, origin), sink)
            if follow and method in ("GET", "HEAD") and ans.status in (301, 302, 303, 307, 308):
                loc = ans.headers.get("Location")
                if not loc:
                    return ans
                base = f"{origin[0]}://{origin[1]}" + (f":{origin[2]}" if origin[2] else "")
                u = urllib.parse.urlsplit(urllib.parse.urljoin(base + target, loc))
                origin = (u.scheme, u.hostname, u.port)
                target = (u.path or "/") + (f"?{u.query}" if u.query else "")
                continue
            return ans
        raise BlobrefError("too_many_redirects", None, f"{method} {path}: over {self.max_redirects}")

    def _once(self, origin, method, target, body, headers, sink):
        for attempt in (0, 1):
            conn = self._conn(origin)
            reused = conn.sock is not None
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                self._count(requests=1)
                if sink is not None and 200 <= resp.status < 300:
                    n = 0
                    while True:
                        chunk = resp.read(_CHUNK)
                        if not chunk:
                            break
                        sink(chunk)
                        n += len(chunk)
                    data = b""
                else:
                    data = resp.read()
                if resp.will_close:
                    self._drop(origin)
                return _Answer(resp.status, resp.headers, data, target)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    http.client.BadStatusLine) as e:
                self._drop(origin)
                if attempt == 0 and reused and sink is None:
                    continue   # the server closed an idle keep-alive connection: once more
                raise BlobrefError("connection_error", None, f"{method} {target}: {e!r}") from e
            except OSError as e:
                self._drop(origin)
                raise BlobrefError("connection_error", None,
                                   f"{method} {origin[1]}:{origin[2]}{target}: {e}") from e
            except BaseException:
                self._drop(origin)
                raise

    @staticmethod
    def _raise(ans, what):
        code, msg = None, None
        ctype = ans.headers.get("Content-Type", "") if ans.headers else ""
        if ans.body and ctype.startswith("application/json"):
            try:
                err = ans.json().get("error") or {}
                code, msg = err.get("code"), err.get("message")
            except (ValueError, AttributeError):
                pass
        if not code:  # a HEAD, or an answer of something else than blobrefd (a proxy, a CDN)
            code = {404: "not_found", 410: "quarantined", 401: "unauthorized",
                    403: "forbidden"}.get(ans.status, f"http_{ans.status}")
            msg = ans.body[:200].decode("utf-8", "replace").strip() or http.client.responses.get(
                ans.status, "")
        raise _error_class(ans.status, code)(code, ans.status, f"{what}: {msg}")

    def _json(self, method, path, payload=None, ok=(200,)):
        body, headers = None, {"Accept": "application/json"}
        if payload is not None:
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        ans = self._request(method, path, body=body, headers=headers)
        if ans.status not in ok:
            self._raise(ans, f"{method} {path}")
        return ans.json()

    # ---- uploads -----------------------------------------------------------------------------

    def put(self, data, content_type=None, lease=None):
        """Uploads bytes, a path (str or os.PathLike) or a binary file object and returns the
        blob's SHA-256 (hex). The hash is computed locally first; the upload is
        `PUT /v1/blobs/{hash}` with `Expect: 100-continue`, so when the server already has the
        blob it answers before the body and nothing is sent. The result of the last put is in
        `self.last_put` (`{"sha256","size","dedup","url"}`). Without `content_type`, a path's
        type is guessed from its extension (`mimetypes`), anything else is sent as
        `application/octet-stream`."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            return self._put_stream(sha256_hex(data), len(data), io.BytesIO(data), content_type,
                                    lease)
        if isinstance(data, (str, os.PathLike)):
            if content_type is None:  # from the file name's extension, as `blobref put` does
                content_type = mimetypes.guess_type(os.fspath(data), strict=False)[0]
            with open(data, "rb") as f:
                return self.put(f, content_type, lease)
        if not hasattr(data, "read"):
            raise TypeError("put() takes bytes, a path or a binary file object")
        spool = None
        try:
            try:
                start = data.tell() if data.seekable() else None
            except (AttributeError, OSError):
                start = None
            src = data
            if start is None:  # not seekable: keep a copy while hashing, then send the copy
                spool = src = tempfile.TemporaryFile()
            h, size = hashlib.sha256(), 0
            while True:
                chunk = data.read(_CHUNK)
                if not chunk:
                    break
                if not isinstance(chunk, bytes):
                    raise TypeError("put() needs a binary file object (opened with 'rb')")
                h.update(chunk)
                size += len(chunk)
                if spool is not None:
                    spool.write(chunk)
            src.seek(0 if spool is not None else start)
            return self._put_stream(h.hexdigest(), size, src, content_type, lease)
        finally:
            if spool is not None:
                spool.close()

    def _put_stream(self, hexd, size, src, content_type, lease=None):
        target = f"{self._base_path}/v1/blobs/{hexd}"
        if lease:
            target += "?lease=" + urllib.parse.quote(lease, safe="")
        conn = self._new_conn(self._origin)   # its own connection: it may be closed early
        fp = None
        try:
            conn.connect()
            conn.putrequest("PUT", target, skip_accept_encoding=True)
            hdrs = self._headers({"Content-Type": content_type or "application/octet-stream",
                                  "Content-Length": str(size)})
            if size:   # nothing to save on an empty body: no waiting for a 100 either
                hdrs["Expect"] = "100-continue"
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()   # headers only: the body waits for the server's word
            self._count(requests=1)
            fp = conn.sock.makefile("rb")
            sent = 0
            interim = b""
            wait = self.expect_timeout if size else 0
            ready, _, _ = select.select([conn.sock], [], [], wait)
            if ready or getattr(conn.sock, "pending", lambda: 0)():
                line = fp.readline(65537)
                if not line:
                    raise http.client.RemoteDisconnected("closed before answering")
                parts = line.split(None, 2)
                if len(parts) >= 2 and parts[1] == b"100":
                    while fp.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass   # the interim answer's header lines
                    sent = self._send_body(conn, src, size)
                else:
                    interim = line   # a final answer before the body: nothing to send
            else:
                sent = self._send_body(conn, src, size)   # no word in time: send anyway
            self._count(sent=sent)
            stream = io.BufferedReader(_Chained(interim, fp)) if interim else fp
            resp = http.client.HTTPResponse(_SockShim(stream), method="PUT")
            resp.begin()
            ans = _Answer(resp.status, resp.headers, resp.read(), target)
        except BlobrefError:
            raise
        except (OSError, http.client.HTTPException) as e:
            raise BlobrefError("connection_error", None, f"PUT {target}: {e!r}") from e
        finally:
            if fp is not None:
                fp.close()
            conn.close()
        self.last_put_bytes_sent = sent
        if ans.status not in (200, 201):
            self._raise(ans, f"PUT /v1/blobs/{hexd}")
        self.last_put = ans.json()
        if self.last_put.get("sha256") != hexd:
            raise DigestMismatch("digest_mismatch", ans.status,
                                 f"server stored {self.last_put.get('sha256')}, expected {hexd}")
        return hexd

    def _send_body(self, conn, src, size):
        sent = 0
        try:
            while sent < size:
                chunk = src.read(min(_CHUNK, size - sent))
                if not chunk:
                    raise BlobrefError("short_body", None,
                                       f"the source ended after {sent} of {size} bytes")
                conn.sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server answered early (e.g. 413) and closed: read its answer
        return sent

    # ---- reads -------------------------------------------------------------------------------

    def get(self, h):
        """The blob's bytes, verified against its SHA-256 (DigestMismatch otherwise)."""
        hexd = _norm_hash(h)
        hasher, parts = hashlib.sha256(), []

        def sink(chunk):
            hasher.update(chunk)
            parts.append(chunk)

        ans = self._request("GET", f"/v1/blobs/{hexd}", sink=sink)
        if ans.status != 200:
            self._raise(ans, f"GET /v1/blobs/{hexd}")
        data = b"".join(parts)
        self._count(received=len(data))
        if hasher.hexdigest() != hexd:
            raise DigestMismatch("digest_mismatch", ans.status,
                                 f"GET {hexd}: received {len(data)} bytes hashing to "
                                 f"{hasher.hexdigest()}")
        return data

    def download(self, h, path):
        """Writes the blob to path (through a temp file renamed into place once verified)."""
        hexd = _norm_hash(h)
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".blobref-")
        try:
            hasher, n = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                def sink(chunk):
                    nonlocal n
                    hasher.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
                ans = self._request("GET", f"/v1/blobs/{hexd}", sink=sink)
            if ans.status != 200:
                self._raise(ans, f"GET /v1/blobs/{hexd}")
            self._count(received=n)
            if hasher.hexdigest() != hexd:
                raise DigestMismatch("digest_mismatch", ans.status, f"GET {hexd}: bytes differ")
            os.replace(tmp, path)
            tmp = None
        finally:
            if tmp:
                os.unlink(tmp)
        return path

    def open(self, h, buffer_size=65536):
        """A seekable, read-only binary file object over the blob (a BlobFile, an
        io.BufferedReader): every read the buffer cannot serve is one `Range` request of at least
        `buffer_size` bytes, so `PIL.Image.open(client.open(h))` costs the header, not the file.
        The first block is fetched now (errors are raised here). Reading the whole file in order
        verifies it (DigestMismatch at the end); other access patterns are not verified."""
        return BlobFile(_RangeReader(self, _norm_hash(h), buffer_size), buffer_size)

    def exists(self, h):
        """True when the server has the blob and serves it (HEAD: 200, or a redirect)."""
        hexd = _norm_hash(h)
        ans = self._request("HEAD", f"/v1/blobs/{hexd}", follow=False)
        if ans.status in (200, 307):
            return True
        if ans.status in (404, 410):
            return False
        self._raise(ans, f"HEAD /v1/blobs/{hexd}")

    def stat(self, h):
        """The index record: `{"sha256","size","content_type","created_at","last_upload_at",
        "state","locations":[...]}` (and `quarantine` for a quarantined blob)."""
        return self._json("GET", f"/v1/blobs/{_norm_hash(h)}/meta")

    def lookup(self, hashes, batch_size=LOOKUP_BATCH, lease=None):
        """Which of the hashes the server has: `{"found": [{"sha256","size","url"}],
        "missing": [hex, ...]}`, asked in batches of batch_size (10,000). With a lease id, the
        blobs found are attached to that lease."""
        found, missing = [], []
        batch = []
        path = "/v1/lookup" + ("?lease=" + urllib.parse.quote(lease, safe="") if lease else "")

        def flush():
            r = self._json("POST", path, {"hashes": batch})
            found.extend(r.get("found", []))
            missing.extend(r.get("missing", []))
            batch.clear()

        for h in hashes:
            batch.append(_norm_hash(h))
            if len(batch) >= batch_size:
                flush()
        if batch:
            flush()
        return {"found": found, "missing": missing}

    def put_many(self, paths, workers=8, batch_size=1000):
        """Uploads files: each is hashed locally, then `POST /v1/uploads` says per blob whether
        the server has it (`present`), where to PUT it straight to the store (`upload`: a
        presigned URL and its headers), in parts (`multipart`: a file over 5 MiB is hashed per
        8 MiB part in the same pass, each part PUT to its presigned URL and the commit names the
        ETags) or to send it through blobrefd (`via_server`). Direct uploads (and parts) go
        `workers` at a time and are registered by `POST /v1/uploads/commit`, in
        batches of batch_size. Returns `{"present", "uploaded", "via_server", "bytes",
        "hashes"}`: counts, body bytes sent, and the files' hashes in order. A commit that
        finds an object missing or not the blob raises BlobrefError with that status."""
        paths = [os.fspath(p) for p in paths]
        out = {"present": 0, "uploaded": 0, "via_server": 0, "bytes": 0, "hashes": []}
        pools = []

        def init():
            self._local.pool = {}
            pools.append(self._local.pool)

        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                       initializer=init) as pool:
                for i in range(0, len(paths), batch_size):
                    self._put_batch(pool, paths[i:i + batch_size], out)
        finally:
            for p in pools:
                for c in list(p.values()):
                    c.close()
        return out

    def _put_batch(self, pool, paths, out):
        items = list(pool.map(_describe_file, paths))
        out["hashes"].extend(it["sha256"] for it in items)
        group, nhashes = [], 0
        for path, it in zip(paths, items):   # at most HASHES_MAX part hashes a negotiation
            n = len(it.get("part_sha256", ()))
            if group and nhashes + n > HASHES_MAX:
                self._put_group(pool, group, out)
                group, nhashes = [], 0
            group.append((path, it))
            nhashes += n
        if group:
            self._put_group(pool, group, out)

    def _put_group(self, pool, group, out):
        acts = self._json("POST", "/v1/uploads", {"blobs": [it for _, it in group]})["blobs"]
        futs = []
        for (path, it), act in zip(group, acts):
            if act["status"] == "part_hashes":   # parts hashed at another size: once more
                it = _describe_file(path, act["part_size"])
                act = self._json("POST", "/v1/uploads", {"blobs": [it]})["blobs"][0]
            if act["status"] == "upload":
                futs.append(pool.submit(self._put_direct, path, it, act))
            elif act["status"] == "multipart":
                parts = [pool.submit(self._put_part, path, act["part_size"], p)
                         for p in act["parts"]]
                futs.append(pool.submit(self._put_multipart, it, act, parts))
            elif act["status"] == "present":
                out["present"] += 1
            else:  # via_server (or a plan this client does not follow)
                futs.append(pool.submit(self._put_via_server, path, it))
        direct = []
        for f in futs:
            kind, it, sent = f.result()
            out["bytes"] += sent
            if kind == "direct":
                it = {k: v for k, v in it.items() if k not in ("part_size", "part_sha256")}
                direct.append(it)
            else:
                out["via_server"] += 1
        if not direct:
            return
        for r in self._json("POST", "/v1/uploads/commit", {"blobs": direct})["blobs"]:
            if r["status"] == "created":
                out["uploaded"] += 1
            elif r["status"] == "present":
                out["present"] += 1
            else:
                raise BlobrefError(r["status"], 200,
                                   f"commit of {r['sha256']}: {r.get('message', r['status'])}")

    def _put_part(self, path, part_size, part):
        """PUTs one part of a multipart plan (its bytes read at its offset); (ETag, bytes)."""
        with open(path, "rb") as f:
            f.seek((part["part_number"] - 1) * part_size)
            data = f.read(part_size)
        ans = self._store_put(part["url"], part.get("method", "PUT"), part["headers"], data)
        if not 200 <= ans.status < 300 or not ans.headers.get("ETag"):
            raise BlobrefError("direct_upload_failed", ans.status,
                               f"PUT of part {part['part_number']} to the store: {ans.status} "
                               f"{ans.body[:300].decode('utf-8', 'replace')}")
        self._count(sent=len(data))
        return ans.headers["ETag"], len(data)

    def abort_upload(self, sha256, upload_id):
        """Gives up a multipart plan: `DELETE /v1/uploads/{upload_id}?sha256=` aborts the
        store's upload (its parts are freed) and blobrefd forgets the plan."""
        q = urllib.parse.quote(upload_id, safe="")
        return self._json("DELETE", f"/v1/uploads/{q}?sha256={sha256}")

    def _put_multipart(self, it, act, parts):
        """Waits for the parts of a multipart plan; the commit item names upload_id and ETags.
        When a part fails the plan is aborted (`abort_upload`) before the error is raised.
        (Runs on the pool after its parts were queued, so it never waits on its own slot.)"""
        try:
            done = [f.result() for f in parts]
        except BaseException:
            for f in parts:
                f.cancel()
            concurrent.futures.wait(parts)
            try:
                self.abort_upload(it["sha256"], act["upload_id"])
            except (BlobrefError, OSError):
                pass  # the server's sweep aborts it after direct_upload_grace
            raise
        return ("direct", dict(it, upload_id=act["upload_id"], parts=[e for e, _ in done]),
                sum(n for _, n in done))

    def _store_put(self, url, method, headers, data):
        u = urllib.parse.urlsplit(url)
        headers = dict(headers, **{"Content-Length": str(len(data)),
                                   "User-Agent": f"blobref-python/{__version__}"})
        return self._once((u.scheme, u.hostname, u.port), method, u.path + "?" + u.query, data,
                          headers, None)

    def _put_direct(self, path, it, act):
        with open(path, "rb") as f:
            data = f.read()   # at most the store's part size: the server offers no bigger PUT
        ans = self._store_put(act["url"], act.get("method", "PUT"), act["headers"], data)
        if ans.status == 412:   # If-None-Match: another client's PUT of the same blob landed
            return "direct", it, 0
        if not 200 <= ans.status < 300:
            raise BlobrefError("direct_upload_failed", ans.status,
                               f"PUT {it['sha256']} to the store: {ans.status} "
                               f"{ans.body[:300].decode('utf-8', 'replace')}")
        self._count(sent=len(data))
        return "direct", it, len(data)

    def _put_via_server(self, path, it):
        self.put(path, it["content_type"])
        return "server", it, it["size"]

    def lease(self, name, ttl="2h"):
        """A new upload lease (`POST /v1/leases`), as a context manager that releases it on
        exit: `with client.lease("flink-job-42", ttl="2h") as l: l.put(b"...")`, then commit the
        table inside the block. Blobs put or looked up through it are never quarantined by
        reconcile while it lives."""
        return Lease(self, self._json("POST", "/v1/leases", {"ttl": ttl, "name": name},
                                      ok=(201,)))

    def iter_blobs(self, state=None, after=None, limit=1000):
        """Every blob the index holds, in key order, as the listing's records
        (`GET /v1/blobs?after=HEX&limit=N[&state=live|quarantined]`, page by page: each answer is
        `{"blobs": [...], "next": hex or null}`). `after` starts past that hash."""
        cursor = _norm_hash(after) if after else None
        while True:
            q = {"limit": str(limit)}
            if cursor:
                q["after"] = cursor
            if state:
                q["state"] = state
            page = self._json("GET", "/v1/blobs?" + urllib.parse.urlencode(q))
            yield from page.get("blobs", [])
            cursor = page.get("next")
            if not cursor:
                return

    def fetch_many(self, hashes, workers=8, skip_missing=False):
        """`{hash: bytes}` for the hashes (duplicates fetched once), each verified, `workers`
        GETs in flight. With skip_missing, blobs that are not found or are quarantined are left
        out; any other error (and those, without it) is raised after cancelling what has not
        started."""
        todo = list(dict.fromkeys(_norm_hash(h) for h in hashes))
        out = {}
        if not todo:
            return out
        pools = []   # each worker's connections (kept alive across its GETs), closed at the end

        def init():
            self._local.pool = {}
            pools.append(self._local.pool)

        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                       initializer=init) as pool:
                self._fetch_all(pool, todo, out, skip_missing)
        finally:
            for p in pools:
                for c in list(p.values()):
                    c.close()
        return out

    def _fetch_all(self, pool, todo, out, skip_missing):
        futs = {pool.submit(self.get, h): h for h in todo}
        try:
            for fut in concurrent.futures.as_completed(futs):
                h = futs[fut]
                try:
                    out[h] = fut.result()
                except (NotFound, Quarantined):
                    if not skip_missing:
                        raise
        except BaseException:
            for f in futs:
                f.cancel()
            raise


class _RangeReader(io.RawIOBase):
    """The raw stream under BlobFile: readinto(b) at the current position is one ranged GET
    (redirects followed, their target reused for as long as their max-age allows)."""

    def __init__(self, client, hexd, block):
        super().__init__()
        self._c = client
        self.sha256 = hexd
        self._pos = 0
        self.bytes_fetched = 0
        self.requests = 0
        self._loc = None           # (origin, target, expiry) of a redirect still valid
        self._hasher = hashlib.sha256()
        self._hashed = 0
        self.verified = False
        self.content_type = None
        self._first = self._fetch(0, block - 1)   # size, errors and the first block, at once
        self._first_off = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, "negative seek position")
        self._pos = pos
        return pos

    def _fetch(self, start, end):
        """Bytes start..end (inclusive, clipped to the blob); sets size on the first call."""
        c, hexd = self._c, self.sha256
        hdrs = {"Range": f"bytes={start}-{end}"}
        now = time.monotonic()
        if self._loc and self._loc[2] > now:
            origin, target = self._loc[0], self._loc[1]
        else:
            origin, target = c._origin, f"{c._base_path}/v1/blobs/{hexd}"
        for _ in range(c.max_redirects + 1):
            ans = c._once(origin, "GET", target, None, c._headers(hdrs, origin), None)
            self.requests += 1
            if ans.status in (301, 302, 303, 307, 308) and ans.headers.get("Location"):
                base = f"{origin[0]}://{origin[1]}" + (f":{origin[2]}" if origin[2] else "")
                u = urllib.parse.urlsplit(urllib.parse.urljoin(base + target, ans.headers["Location"]))
                origin = (u.scheme, u.hostname, u.port)
                target = (u.path or "/") + (f"?{u.query}" if u.query else "")
                age = _max_age(ans.headers.get("Cache-Control"))
                self._loc = (origin, target, time.monotonic() + age) if age else None
                continue
            break
        else:
            raise BlobrefError("too_many_redirects", None, f"GET /v1/blobs/{hexd}")
        body = ans.body
        if ans.status == 206:
            m = re.match(r"bytes (\d+)-(\d+)/(\d+)", ans.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != start:
                raise BlobrefError("bad_answer", 206, f"GET {hexd}: Content-Range "
                                   f"{ans.headers.get('Content-Range')!r} for bytes={start}-{end}")
            self.size = int(m.group(3))
        elif ans.status == 200:   # the whole blob (a server or origin ignoring Range)
            self.size = len(body)
            body = body[start:end + 1]
        elif ans.status == 416 and start == 0:   # an empty blob
            m = re.match(r"bytes \*/(\d+)", ans.headers.get("Content-Range", ""))
            self.size = int(m.group(1)) if m else 0
            body = b""
        else:
            Client._raise(ans, f"GET /v1/blobs/{hexd} (bytes={start}-{end})")
        if self.content_type is None:
            self.content_type = ans.headers.get("Content-Type")
        self.bytes_fetched += len(body)
        c._count(received=len(body))
        return body

    def readinto(self, b):
        n = len(b)
        if n == 0 or self._pos >= self.size:
            self._check_end()
            return 0
        pos, end = self._pos, min(self._pos + n, self.size)
        first = self._first
        if first is not None and self._first_off <= pos < self._first_off + len(first):
            data = first[pos - self._first_off:end - self._first_off]
        else:
            self._first = None   # the prefetched block is used once the reader moves past it
            data = self._fetch(pos, end - 1)
            if len(data) != end - pos:
                raise BlobrefError("short_read", 206, f"GET {self.sha256}: asked "
                                   f"{end - pos} bytes at {pos}, got {len(data)}")
        k = len(data)
        b[:k] = data
        if pos == 0 and self._hashed and not self.verified:   # reading again from the start
            self._hasher, self._hashed = hashlib.sha256(), 0
        if pos == self._hashed:
            self._hasher.update(data)
            self._hashed += k
        self._pos = pos + k
        if self._pos >= self.size:
            self._check_end()
        return k

    def readall(self):
        """The rest of the blob in one request (RawIOBase's default would ask 8 KiB at a time)."""
        parts = []
        while self._pos < self.size:
            buf = bytearray(self.size - self._pos)
            n = self.readinto(buf)
            if not n:
                break
            parts.append(bytes(buf[:n]))
        self._check_end()
        return b"".join(parts)

    def _check_end(self):
        if self._hashed == self.size and not self.verified:
            if self._hasher.hexdigest() != self.sha256:
                raise DigestMismatch("digest_mismatch", 206,
                                     f"{self.sha256}: the bytes read hash to "
                                     f"{self._hasher.hexdigest()}")
            self.verified = True


class BlobFile(io.BufferedReader):
    """A read-only, seekable file over a blob (from Client.open). Besides the file API:
    `sha256`, `size`, `content_type`, `bytes_fetched` (bytes received so far), `requests`
    (ranged GETs so far, redirects included) and `verified` (True once the whole blob was read
    in order and matched its hash)."""

    def __init__(self, raw, buffer_size):
        super().__init__(raw, buffer_size)

    sha256 = property(lambda self: self.raw.sha256)
    size = property(lambda self: self.raw.size)
    content_type = property(lambda self: self.raw.content_type)
    bytes_fetched = property(lambda self: self.raw.bytes_fetched)
    requests = property(lambda self: self.raw.requests)
    verified = property(lambda self: self.raw.verified)

    def __repr__(self):
        return f"<blobref.BlobFile {self.sha256} size={self.size}>"


def _main(argv=None):
    """python3 blobref.py [--server URL] put FILE... | get HASH > FILE | stat HASH"""
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="blobref.py", description=_main.__doc__)
    p.add_argument("--server")
    p.add_argument("--token")
    p.add_argument("command", choices=["put", "get", "stat"])
    p.add_argument("args", nargs="+")
    a = p.parse_args(argv)
    c = Client(a.server, a.token)
    try:
        if a.command == "put":
            for f in a.args:
                print(c.put(f))
        elif a.command == "get":
            with c.open(a.args[0], buffer_size=_CHUNK) as f:
                shutil.copyfileobj(f, sys.stdout.buffer, _CHUNK)
        else:
            print(json.dumps(c.stat(a.args[0]), indent=2))
    except BlobrefError as e:
        print(f"blobref.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())


class Lease:
    """An upload lease of a Client (Client.lease): put and lookup attach their blobs to it;
    release() (or leaving the with block) ends it. `info` is the server's record."""

    def __init__(self, client, info):
        self.client, self.info, self.id = client, info, info["id"]

    def put(self, data, content_type=None):
        return self.client.put(data, content_type, lease=self.id)

    def lookup(self, hashes):
        return self.client.lookup(hashes, lease=self.id)

    def release(self):
        """Ends the lease (a lease already ended or expired is not an error)."""
        try:
            self.client._json("DELETE", f"/v1/leases/{self.id}")
        except BlobrefError as e:
            if e.code != "lease_not_found":
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False
