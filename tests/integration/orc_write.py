"""A tiny ORC writer for the tests (protobuf by hand): a file whose root struct holds one string
or binary column, DIRECT_V2 (RLE v2 direct lengths) or DIRECT (RLE v1 literal lengths), nulls in
a PRESENT stream, compression NONE or ZLIB, rows split into stripes. Just enough to put ORC data files in an Iceberg table."""
import zlib

NONE, ZLIB = 0, 1
KIND_STRING, KIND_BINARY, KIND_STRUCT = 7, 8, 12


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def byte_rle_literals(data):
    out = bytearray()
    for i in range(0, len(data), 128):
        chunk = data[i:i + 128]
        out.append(256 - len(chunk))
        out += chunk
    return bytes(out)


def present_stream(values):
    bits = bytearray()
    for i in range(0, len(values), 8):
        b = 0
        for j, v in enumerate(values[i:i + 8]):
            if v is not None:
                b |= 0x80 >> j
        bits.append(b)
    return byte_rle_literals(bytes(bits))


def rle_v2_direct_u8(nums):
    """Unsigned values below 256 as RLE v2 DIRECT runs of 8-bit values (at most 512 a run)."""
    out = bytearray()
    for i in range(0, len(nums), 512):
        run = nums[i:i + 512]
        assert all(0 <= n < 256 for n in run)
        out += bytes([0x40 | 7 << 1 | (len(run) - 1) >> 8, (len(run) - 1) & 0xFF]) + bytes(run)
    return bytes(out)


def rle_v1_literals(nums):
    """Unsigned values as RLE v1 literal groups (at most 128 varints a group)."""
    out = bytearray()
    for i in range(0, len(nums), 128):
        run = nums[i:i + 128]
        out.append(256 - len(run))
        for n in run:
            out += varint(n)
    return bytes(out)


def compress(data, codec, block=1 << 16):
    """The file's compression framing: chunks of a 3-byte header (length << 1 | original)."""
    if codec == NONE:
        return data
    out = bytearray()
    for i in range(0, len(data), block):
        chunk = data[i:i + block]
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        z = c.compress(chunk) + c.flush()
        if len(z) < len(chunk):
            h = len(z) << 1
            out += bytes([h & 0xFF, h >> 8 & 0xFF, h >> 16 & 0xFF]) + z
        else:
            h = len(chunk) << 1 | 1
            out += bytes([h & 0xFF, h >> 8 & 0xFF, h >> 16 & 0xFF]) + chunk
    return bytes(out)


def orc_file(column, values, kind=KIND_STRING, codec=NONE, stripe_rows=1000, rle=2):
    """values: bytes/str or None per row; rle 2: DIRECT_V2 (ORC 0.12), 1: DIRECT with RLE v1
    lengths (ORC 0.11). Returns the file's bytes."""
    vals = [v.encode() if isinstance(v, str) else v for v in values]
    out = bytearray(b"ORC")
    stripes = []
    for s in range(0, max(len(vals), 1), stripe_rows):
        rows = vals[s:s + stripe_rows]
        if not rows:
            break
        offset = len(out)
        nonnull = [v for v in rows if v is not None]
        streams = []  # (kind, column, bytes)
        if len(nonnull) != len(rows):
            streams.append((0, 1, compress(present_stream(rows), codec)))
        streams.append((1, 1, compress(b"".join(nonnull), codec)))
        lengths = [len(v) for v in nonnull]
        lens = rle_v2_direct_u8(lengths) if rle == 2 else rle_v1_literals(lengths)
        streams.append((2, 1, compress(lens, codec)))
        data_len = 0
        for _, _, b in streams:
            out += b
            data_len += len(b)
        sf = b"".join(field_bytes(1, field_varint(1, k) + field_varint(2, c) + field_varint(3, len(b)))
                      for k, c, b in streams)
        sf += field_bytes(2, field_varint(1, 0)) + field_bytes(2, field_varint(1, 2 if rle == 2 else 0))
        sf = compress(sf, codec)
        out += sf
        stripes.append((offset, data_len, len(sf), len(rows)))
    content_len = len(out)
    footer = field_varint(1, 3) + field_varint(2, content_len)
    for offset, data_len, footer_len, n in stripes:
        footer += field_bytes(3, field_varint(1, offset) + field_varint(2, 0) +
                              field_varint(3, data_len) + field_varint(4, footer_len) +
                              field_varint(5, n))
    footer += field_bytes(4, field_varint(1, KIND_STRUCT) + field_bytes(2, varint(1)) +
                          field_bytes(3, column.encode()))
    footer += field_bytes(4, field_varint(1, kind))
    footer += field_varint(6, len(vals)) + field_varint(8, 0)
    footer = compress(footer, codec)
    out += footer
    ps = (field_varint(1, len(footer)) + field_varint(2, codec) + field_varint(3, 1 << 16) +
          field_bytes(4, varint(0) + varint(12)) + field_varint(5, 0) + field_varint(6, 1) +
          field_bytes(8000, b"ORC"))
    out += ps + bytes([len(ps)])
    return bytes(out)
