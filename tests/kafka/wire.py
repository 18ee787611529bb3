"""A few Kafka requests spoken by hand, for what the client libraries hide:
ApiVersions, a raw Produce (to see the broker's own partition error code) and a
raw Fetch (to see the compression attribute of the stored batches).

Only non-flexible request versions (header v1) are used. Standard library plus
`crc32c` for the record batch checksum, imported only when a batch is built.
"""
import socket
import struct

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_FIND_COORDINATOR = 10
API_API_VERSIONS, API_CREATE_TOPICS, API_INIT_PRODUCER_ID = 18, 19, 22

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


# ---- primitive encoding -------------------------------------------------------------

def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def string(s):
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def nbytes(b):
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


def varint(v):
    v = (v << 1) ^ (v >> 63)  # zigzag
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"short response: need {n} bytes at {self.pos}, have {len(self.data) - self.pos}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i8(self):
        return struct.unpack(">b", self.take(1))[0]

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def u32(self):
        return struct.unpack(">I", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def nbytes(self):
        n = self.i32()
        return None if n < 0 else self.take(n)

    def varint(self):
        shift = 0
        raw = 0
        while True:
            b = self.take(1)[0]
            raw |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        return (raw >> 1) ^ -(raw & 1)


# ---- framing --------------------------------------------------------------------------

def request(api_key, version, correlation_id, body, client_id="strom-tests"):
    payload = i16(api_key) + i16(version) + i32(correlation_id) + string(client_id) + body
    return i32(len(payload)) + payload


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_response(sock, correlation_id):
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    if size < 4 or size > 512 * 1024 * 1024:
        raise ValueError(f"bad response size {size}")
    body = recv_exact(sock, size)
    r = Reader(body)
    got = r.i32()
    if got != correlation_id:
        raise ValueError(f"correlation id {got}, expected {correlation_id}")
    return r


def roundtrip(addr, api_key, version, body, timeout=10, correlation_id=7):
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(request(api_key, version, correlation_id, body))
        return recv_response(s, correlation_id)


# ---- ApiVersions ------------------------------------------------------------------------

def api_versions_on(sock, correlation_id=1):
    """ApiVersions v0 on an open socket: {api_key: (min, max)}."""
    sock.sendall(request(API_API_VERSIONS, 0, correlation_id, b""))
    r = recv_response(sock, correlation_id)
    err = r.i16()
    if err != 0:
        raise ValueError(f"ApiVersions v0 error code {err}")
    out = {}
    for _ in range(r.i32()):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        out[key] = (lo, hi)
    return out


def api_versions(addr, timeout=10):
    with socket.create_connection(addr, timeout=timeout) as s:
        s.settimeout(timeout)
        return api_versions_on(s)


def pick_version(versions, api_key, lo, hi):
    """Highest version in [lo, hi] that the broker advertises for api_key, or None."""
    if api_key not in versions:
        return None
    blo, bhi = versions[api_key]
    v = min(hi, bhi)
    return v if v >= max(lo, blo) else None


# ---- record batches ---------------------------------------------------------------------

def record_batch(records, base_timestamp=0):
    """An uncompressed magic-2 batch; records = [(key, value)] (bytes or None)."""
    import crc32c

    body = bytearray()
    for i, (key, value) in enumerate(records):
        rec = i8(0) + varint(0) + varint(i)
        rec += varint(-1) if key is None else varint(len(key)) + key
        rec += varint(-1) if value is None else varint(len(value)) + value
        rec += varint(0)  # headers
        body += varint(len(rec)) + rec
    after_crc = (i16(0) + i32(len(records) - 1) + i64(base_timestamp) + i64(base_timestamp) + i64(-1) + i16(-1)
                 + i32(-1) + i32(len(records)) + bytes(body))
    crc = crc32c.crc32c(after_crc)
    after_length = i32(-1) + i8(2) + struct.pack(">I", crc) + after_crc
    return i64(0) + i32(len(after_length)) + after_length


def batch_headers(records_bytes):
    """[(base_offset, record_count, compression codec id)] of the batches in a records blob
    (a trailing partial batch is ignored, as clients do)."""
    out = []
    pos = 0
    data = records_bytes or b""
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break
        magic = data[pos + 16]
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        count = struct.unpack_from(">i", data, pos + 57)[0]
        if magic != 2:
            raise ValueError(f"batch at {base_offset} has magic {magic}")
        out.append((base_offset, count, attributes & 0x7))
        pos += 12 + length
    return out


# ---- Produce / Fetch ----------------------------------------------------------------------

def produce(addr, topic, partition, batch, acks=-1, timeout_ms=10000, version=3):
    """Produce (v3..v8, same request layout) one batch; returns (error_code, base_offset)."""
    body = (string(None) + i16(acks) + i32(timeout_ms) + i32(1) + string(topic) + i32(1) + i32(partition)
            + nbytes(batch))
    r = roundtrip(addr, API_PRODUCE, version, body, timeout=timeout_ms / 1000 + 10)
    n_topics = r.i32()
    assert n_topics == 1, f"Produce response has {n_topics} topics"
    name = r.string()
    assert name == topic, f"Produce response names topic {name!r}"
    assert r.i32() == 1
    index = r.i32()
    assert index == partition
    err = r.i16()
    base_offset = r.i64()
    return err, base_offset


def fetch(addr, topic, partition, offset, max_bytes=8 * 1024 * 1024, version=4, timeout=15):
    """Fetch v4: (error_code, high_watermark, records bytes)."""
    body = (i32(-1) + i32(100) + i32(1) + i32(max_bytes) + i8(0) + i32(1) + string(topic) + i32(1) + i32(partition)
            + i64(offset) + i32(max_bytes))
    r = roundtrip(addr, API_FETCH, version, body, timeout=timeout)
    r.i32()  # throttle
    assert r.i32() == 1
    assert r.string() == topic
    assert r.i32() == 1
    assert r.i32() == partition
    err = r.i16()
    hw = r.i64()
    r.i64()  # last stable offset
    n_aborted = r.i32()
    for _ in range(max(n_aborted, 0)):
        r.i64()
        r.i64()
    return err, hw, r.nbytes()
