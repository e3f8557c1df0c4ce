"""blobref_fsspec: an fsspec filesystem for `blobref://<sha256>` over blobref.Client.

    import fsspec
    with fsspec.open("blobref://<hash>", block_size=65536) as f:   # server: BLOBREF_SERVER
        Image.open(f)                                               # reads ranges, not the file
    fs = fsspec.filesystem("blobref", server="http://host:8080", token="...")
    fs.ls("")                       # the listing (GET /v1/blobs), page by page
    fs.info(h)                      # GET /v1/blobs/{hash}/meta
    fs.pipe("blobref://" + h, data) # PUT /v1/blobs/{hash}; the path must be the data's hash,
    fs.pipe("blobref://", data)     # or empty: the hash is computed here (fs.last_put has it)
    fs.cat(h)                       # the whole blob, verified against its SHA-256

Installing the package (`pip install ./tools/python`) registers the protocol through the
`fsspec.specs` entry point; importing this module registers it too. Paths are the 64 hex
digits of a blob (or `sha256:<hex>`); the root (`""`) lists every blob. A missing or
quarantined blob is FileNotFoundError; bytes that do not match the hash are
blobref.DigestMismatch.
"""
import hashlib

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

import blobref

__all__ = ["BlobrefFileSystem", "BlobrefFile"]


def _not_found(path, err):
    e = FileNotFoundError(2, f"{err.code}: {err.message}", path)
    e.__cause__ = err
    return e


class BlobrefFileSystem(AbstractFileSystem):
    """Blobs of one blobrefd as a flat, read-mostly filesystem. Storage options: `server` (base
    URL; default BLOBREF_SERVER, else http://127.0.0.1:8080), `token` (default BLOBREF_TOKEN),
    `timeout` (seconds), `block_size` (default read block: one Range request each)."""

    protocol = "blobref"
    cachable = False        # the defaults come from the environment, which may change
    root_marker = ""
    DEFAULT_BLOCK_SIZE = 1 << 20

    def __init__(self, server=None, token=None, timeout=60.0, block_size=None, **kwargs):
        super().__init__(**kwargs)
        self.client = blobref.Client(server, token, timeout=timeout)
        self.block_size = block_size or self.DEFAULT_BLOCK_SIZE
        self.last_put = None

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = fsspec.utils.stringify_path(path)
        if path.startswith("blobref://"):
            path = path[len("blobref://"):]
        elif path.startswith("blobref::"):
            path = path[len("blobref::"):]
        path = path.strip("/")
        if path[:7].lower() == "sha256:":
            path = path[7:]
        return path.lower() if len(path) == 64 else path

    def _hash(self, path):
        """The blob id of a path, or FileNotFoundError (no blob can have that name)."""
        p = self._strip_protocol(path)
        try:
            return blobref._norm_hash(p)
        except blobref.BlobrefError:
            raise FileNotFoundError(2, "not a blob path (64 hex digits or sha256:<hex>)", path)

    @staticmethod
    def _entry(rec):
        out = {"name": rec["sha256"], "size": rec.get("size"), "type": "file"}
        for k, v in rec.items():
            if k not in ("sha256", "size"):
                out[k] = v
        return out

    def ls(self, path="", detail=True, **kwargs):
        """The root lists every blob the index holds (all pages of GET /v1/blobs; `state`
        narrows it to `live` or `quarantined`); a blob's path lists that blob."""
        p = self._strip_protocol(path)
        if p == "":
            entries = [self._entry(r) for r in self.client.iter_blobs(state=kwargs.get("state"))]
        else:
            entries = [self.info(p)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        p = self._strip_protocol(path)
        if p == "":
            return {"name": "", "size": 0, "type": "directory"}
        h = self._hash(p)
        try:
            return self._entry(self.client.stat(h))
        except (blobref.NotFound, blobref.Quarantined) as e:
            raise _not_found(path, e)

    def exists(self, path, **kwargs):
        p = self._strip_protocol(path)
        if p == "":
            return True
        try:
            return self.client.exists(self._hash(p))
        except FileNotFoundError:
            return False

    def cat_file(self, path, start=None, end=None, **kwargs):
        """The whole blob verified against its SHA-256 (blobref.DigestMismatch otherwise); with
        start/end (Python slice semantics), those bytes only, by one Range request (a part
        cannot be verified)."""
        h = self._hash(path)
        try:
            if start is None and end is None:
                return self.client.get(h)
            with self.open(h, "rb", block_size=1) as f:
                size = f.size
                s = 0 if start is None else (start if start >= 0 else max(0, size + start))
                e = size if end is None else (end if end >= 0 else max(0, size + end))
                return f._fetch_range(s, min(e, size)) if s < min(e, size) else b""
        except (blobref.NotFound, blobref.Quarantined) as e:
            raise _not_found(path, e)

    def pipe_file(self, path, value, **kwargs):
        """Uploads bytes. The path is the blob's hash (refused with ValueError, before anything
        is sent, when the bytes do not hash to it) or the root (the hash is computed here)."""
        value = bytes(value)
        self._check_name(path, hashlib.sha256(value).hexdigest())
        self.last_put = self.client.put(value, content_type=kwargs.get("content_type"))
        return self.last_put

    def put_file(self, lpath, rpath, callback=None, **kwargs):
        """Uploads a local file (hashed locally first; a blob the server has is not sent)."""
        h = hashlib.sha256()
        with open(lpath, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        self._check_name(rpath, h.hexdigest())
        self.last_put = self.client.put(lpath, content_type=kwargs.get("content_type"))
        return self.last_put

    def _check_name(self, path, hexd):
        p = self._strip_protocol(path)
        if p == "" or p == hexd:
            return
        raise ValueError(f"blobref://{p}: a blob's path is its SHA-256; these bytes are {hexd}")

    def rm_file(self, path):
        raise PermissionError("blobref: blobs are removed by reconcile and purge, not by clients")

    def _rm(self, path):
        self.rm_file(path)

    def mkdir(self, path, create_parents=True, **kwargs):
        raise PermissionError("blobref: a flat namespace of hashes has no folders")

    def makedirs(self, path, exist_ok=False):
        if self._strip_protocol(path) == "" and exist_ok:
            return
        self.mkdir(path)

    def ukey(self, path):
        return self._hash(path)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if mode == "rb":
            h = self._hash(path)
            block = block_size or self.block_size
            try:
                reader = blobref._RangeReader(self.client, h, block)   # the first block, now
            except (blobref.NotFound, blobref.Quarantined) as e:
                raise _not_found(path, e)
            return BlobrefFile(self, h, mode, block, size=reader.size, reader=reader,
                               cache_options=cache_options,
                               cache_type=kwargs.pop("cache_type", "block"))
        if mode == "wb":
            return BlobrefFile(self, self._strip_protocol(path), mode, block_size or "default",
                               autocommit=autocommit)
        raise NotImplementedError(f"blobref: mode {mode!r} (blobs are immutable: rb or wb)")


class BlobrefFile(AbstractBufferedFile):
    """A blob opened through fsspec. Read mode: fsspec's block cache over aligned blocks of
    `block_size`, every block it lacks one Range request (`_fetch_range`; block 0 comes with
    the open); reading the whole blob in order verifies it (DigestMismatch at
    the end). Write mode buffers in memory and uploads on close (the path must be the hash of
    what was written, or the root)."""

    def __init__(self, fs, path, mode="rb", block_size="default", reader=None, **kwargs):
        self._reader = reader
        self._hasher = hashlib.sha256()
        self._hashed = 0
        self.verified = False
        self.requests = 0
        super().__init__(fs, path, mode, block_size, **kwargs)

    def _fetch_range(self, start, end):
        """Bytes start..end-1: the block prefetched at open when it covers them, else one
        ranged GET (redirects followed)."""
        end = min(end, self.size)
        if start >= end:
            return b""
        r = self._reader
        first = r._first
        if first is not None and r._first_off <= start and end <= r._first_off + len(first):
            data = first[start - r._first_off:end - r._first_off]
        else:
            data = r._fetch(start, end - 1)
            self.requests += 1
            if len(data) != end - start:
                raise blobref.BlobrefError("short_read", 206, f"GET {self.path}: asked "
                                           f"{end - start} bytes at {start}, got {len(data)}")
        if start == self._hashed:
            self._hasher.update(data)
            self._hashed += len(data)
            if self._hashed == self.size and not self.verified:
                if self._hasher.hexdigest() != self.path:
                    raise blobref.DigestMismatch(
                        "digest_mismatch", 206,
                        f"{self.path}: the bytes read hash to {self._hasher.hexdigest()}")
                self.verified = True
        return data

    def read(self, length=-1):
        """Up to `length` bytes (all that remain when negative); clipped at the end of the blob,
        which fsspec 2022.11's block cache does not do itself (it raises past the last block)."""
        length = -1 if length is None else int(length)
        if self.mode == "rb" and (length < 0 or self.loc + length > self.size):
            length = max(0, self.size - self.loc)
        return super().read(length)

    @property
    def bytes_fetched(self):
        return self._reader.bytes_fetched if self._reader else 0

    def _initiate_upload(self):
        pass

    def _upload_chunk(self, final=False):
        if not final:
            return False          # keep buffering: a blob is uploaded in one PUT
        self.fs.pipe_file(self.path, self.buffer.getvalue())
        return True


fsspec.register_implementation("blobref", BlobrefFileSystem, clobber=True)
