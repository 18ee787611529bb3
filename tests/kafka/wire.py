"""A few Kafka requests spoken by hand, for what the client libraries hide:
ApiVersions, a raw Produce (to see the broker's own partition error code), a
raw Fetch (to see the compression attribute of the stored batches), and the
consumer-group APIs (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups,
OffsetDelete, and KIP-848's ConsumerGroupHeartbeat) to see the coordinator's own
error codes.

Non-flexible request versions (header v1) unless a helper says otherwise:
FindCoordinator v3/v4 and Heartbeat v4 are flexible (header v2, compact
strings, tagged fields). Standard library plus `crc32c` for the record batch
checksum, imported only when a batch is built.
"""
import socket
import struct

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_OFFSET_COMMIT, API_OFFSET_FETCH, API_FIND_COORDINATOR = 8, 9, 10
API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP = 11, 12, 13, 14
API_DESCRIBE_GROUPS, API_LIST_GROUPS = 15, 16
API_API_VERSIONS, API_CREATE_TOPICS, API_INIT_PRODUCER_ID = 18, 19, 22
API_DELETE_GROUPS, API_OFFSET_DELETE = 42, 47
API_WRITE_TXN_MARKERS = 27

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
    return uvarint((v << 1) ^ (v >> 63))  # zigzag


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
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)  # zigzag

    # flexible versions

    def uvarint(self):
        shift = 0
        v = 0
        while True:
            b = self.take(1)[0]
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7

    def cstring(self):
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def carray_len(self):
        n = self.uvarint()
        return -1 if n == 0 else n - 1

    def skip_tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


# ---- flexible-version encoding (compact strings, tagged fields) ------------------------

def uvarint(v):
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def cstring(s):
    """Compact (nullable) string: unsigned varint length + 1, 0 for null."""
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def carray(items):
    """Compact array of already encoded items."""
    return uvarint(len(items) + 1) + b"".join(items)


NO_TAGS = uvarint(0)


# ---- framing --------------------------------------------------------------------------

def request(api_key, version, correlation_id, body, client_id="strom-tests", flexible=False):
    """A request frame; flexible=True writes header v2 (header v1 + empty tagged fields)."""
    payload = i16(api_key) + i16(version) + i32(correlation_id) + string(client_id)
    if flexible:
        payload += NO_TAGS
    payload += body
    return i32(len(payload)) + payload


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_response(sock, correlation_id, flexible=False):
    """The response to correlation_id; flexible=True reads response header v1 (tagged fields)."""
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    if size < 4 or size > 512 * 1024 * 1024:
        raise ValueError(f"bad response size {size}")
    body = recv_exact(sock, size)
    r = Reader(body)
    got = r.i32()
    if got != correlation_id:
        raise ValueError(f"correlation id {got}, expected {correlation_id}")
    if flexible:
        r.skip_tags()
    return r


def roundtrip(addr, api_key, version, body, timeout=10, correlation_id=7, flexible=False, client_id="strom-tests"):
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(request(api_key, version, correlation_id, body, client_id=client_id, flexible=flexible))
        return recv_response(s, correlation_id, flexible=flexible)


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

def record_batch(records, base_timestamp=None, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                 transactional=False):
    """An uncompressed magic-2 batch; records = [(key, value)] (bytes or None), stamped with
    base_timestamp (ms), by default now: a batch from 1970 is older than any retention.ms and
    the next retention check deletes its segment. An idempotent producer's batch gives its id,
    epoch and first sequence number; a transactional one sets the transactional attribute."""
    import crc32c
    import time

    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)

    body = bytearray()
    for i, (key, value) in enumerate(records):
        rec = i8(0) + varint(0) + varint(i)
        rec += varint(-1) if key is None else varint(len(key)) + key
        rec += varint(-1) if value is None else varint(len(value)) + value
        rec += varint(0)  # headers
        body += varint(len(rec)) + rec
    after_crc = (i16(0x10 if transactional else 0) + i32(len(records) - 1) + i64(base_timestamp) + i64(base_timestamp) + i64(producer_id)
                 + i16(producer_epoch) + i32(base_sequence) + i32(len(records)) + bytes(body))
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



def batch_attributes(records_bytes):
    """[(base_offset, offsets covered, attributes)] of the batches in a records blob (a
    trailing partial batch is ignored); attributes bit 0x20 marks a control batch."""
    out = []
    pos = 0
    data = records_bytes or b""
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        last_offset_delta = struct.unpack_from(">i", data, pos + 23)[0]
        out.append((base_offset, last_offset_delta + 1, attributes))
        pos += 12 + length
    return out

# ---- Produce / Fetch ----------------------------------------------------------------------

def produce(addr, topic, partition, batch, acks=-1, timeout_ms=10000, version=3, transactional_id=None):
    """Produce (v3..v8, same request layout) one batch; returns (error_code, base_offset)."""
    body = (string(transactional_id) + i16(acks) + i32(timeout_ms) + i32(1) + string(topic) + i32(1) + i32(partition)
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


def init_producer_id(addr, timeout=10):
    """InitProducerId v0 for an idempotent (not transactional) producer: (error_code,
    producer_id, producer_epoch)."""
    r = roundtrip(addr, API_INIT_PRODUCER_ID, 0, string(None) + i32(60000), timeout=timeout)
    r.i32()  # throttle_time_ms
    return r.i16(), r.i64(), r.i16()


def fetch(addr, topic, partition, offset, max_bytes=8 * 1024 * 1024, version=4, timeout=15):
    """Fetch v4: (error_code, high_watermark, records bytes)."""
    err, hw, _, _, records = fetch_isolated(addr, topic, partition, offset, max_bytes, version, timeout)
    return err, hw, records


def fetch_isolated(addr, topic, partition, offset, max_bytes=8 * 1024 * 1024, version=4, timeout=15,
                   isolation_level=0):
    """Fetch v4 at an isolation level (1: read_committed): (error_code, high_watermark,
    last_stable_offset, aborted transactions [(producer_id, first_offset)], records bytes)."""
    body = (i32(-1) + i32(100) + i32(1) + i32(max_bytes) + i8(isolation_level) + i32(1) + string(topic) + i32(1)
            + i32(partition) + i64(offset) + i32(max_bytes))
    r = roundtrip(addr, API_FETCH, version, body, timeout=timeout)
    r.i32()  # throttle
    assert r.i32() == 1
    assert r.string() == topic
    assert r.i32() == 1
    assert r.i32() == partition
    err = r.i16()
    hw = r.i64()
    lso = r.i64()
    aborted = [(r.i64(), r.i64()) for _ in range(max(r.i32(), 0))]
    return err, hw, lso, aborted, r.nbytes()


def list_offset_latest(addr, topic, partition, isolation_level=0, timeout=10):
    """ListOffsets v2 for the latest offset at an isolation level: (error_code, offset)."""
    body = (i32(-1) + i8(isolation_level) + i32(1) + string(topic) + i32(1) + i32(partition) + i64(-1))
    r = roundtrip(addr, API_LIST_OFFSETS, 2, body, timeout=timeout)
    r.i32()  # throttle
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1 and r.i32() == partition
    err = r.i16()
    r.i64()  # timestamp
    return err, r.i64()


def write_txn_markers(addr, markers, timeout=40):
    """WriteTxnMarkers v1 (flexible); markers = [(producer_id, epoch, commit, coordinator_epoch,
    {topic: [partition]})]. Returns {(producer_id, topic, partition): error_code}."""
    body = carray([
        i64(pid) + i16(epoch) + i8(1 if commit else 0)
        + carray([cstring(t) + carray([i32(p) for p in ps]) + NO_TAGS for t, ps in topics.items()])
        + i32(coordinator_epoch) + NO_TAGS
        for pid, epoch, commit, coordinator_epoch, topics in markers
    ]) + NO_TAGS
    r = roundtrip(addr, API_WRITE_TXN_MARKERS, 1, body, timeout=timeout, flexible=True)
    out = {}
    for _ in range(r.carray_len()):
        pid = r.i64()
        for _ in range(r.carray_len()):
            topic = r.cstring()
            for _ in range(r.carray_len()):
                partition, err = r.i32(), r.i16()
                r.skip_tags()
                out[(pid, topic, partition)] = err
            r.skip_tags()
        r.skip_tags()
    return out


# ---- consumer groups ----------------------------------------------------------------------
#
# Each helper opens its own connection (a group member is not tied to a connection) and
# returns the broker's error codes as numbers. `array(...)` of encoded items is written as
# i32 count + items.

ERROR_NAMES = {
    0: "NONE", 12: "OFFSET_METADATA_TOO_LARGE", 14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE",
    16: "NOT_COORDINATOR", 22: "ILLEGAL_GENERATION", 23: "INCONSISTENT_GROUP_PROTOCOL", 24: "INVALID_GROUP_ID",
    25: "UNKNOWN_MEMBER_ID", 26: "INVALID_SESSION_TIMEOUT", 27: "REBALANCE_IN_PROGRESS", 42: "INVALID_REQUEST",
    68: "NON_EMPTY_GROUP", 69: "GROUP_ID_NOT_FOUND", 79: "MEMBER_ID_REQUIRED", 81: "GROUP_MAX_SIZE_REACHED",
    82: "FENCED_INSTANCE_ID", 86: "GROUP_SUBSCRIBED_TO_TOPIC",
}


def error_name(code):
    return f"{ERROR_NAMES.get(code, 'error')} ({code})"


def array(items):
    return i32(len(items)) + b"".join(items)


def consumer_subscription(topics, user_data=None):
    """ConsumerProtocolSubscription v0: the metadata a consumer puts in its JoinGroup protocols."""
    return i16(0) + array([string(t) for t in topics]) + nbytes(user_data)


def consumer_assignment(assignment, user_data=None):
    """ConsumerProtocolAssignment v0 for {topic: [partitions]}: what SyncGroup hands out."""
    return i16(0) + array([string(t) + array([i32(p) for p in parts]) for t, parts in assignment.items()]) + nbytes(
        user_data)


def decode_assignment(data):
    """{topic: [partitions]} of a ConsumerProtocolAssignment (empty bytes: {})."""
    if not data:
        return {}
    r = Reader(data)
    r.i16()  # version
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        out[t] = [r.i32() for _ in range(r.i32())]
    return out


def find_coordinator(addr, key, key_type=0, version=2, timeout=10):
    """FindCoordinator v0..v3 for one key (0 = group): (error_code, node_id, host, port).
    v3 is flexible."""
    if version == 0:
        body = string(key)
    elif version <= 2:
        body = string(key) + i8(key_type)
    else:
        body = cstring(key) + i8(key_type) + NO_TAGS
    r = roundtrip(addr, API_FIND_COORDINATOR, version, body, timeout=timeout, flexible=version >= 3)
    if version >= 1:
        r.i32()  # throttle
    err = r.i16()
    if version >= 3:
        r.cstring()  # error message
        node_id, host, port = r.i32(), r.cstring(), r.i32()
    else:
        if version >= 1:
            r.string()  # error message
        node_id, host, port = r.i32(), r.string(), r.i32()
    return err, node_id, host, port


def find_coordinators(addr, keys, key_type=0, version=4, timeout=10):
    """FindCoordinator v4 (flexible, batched keys): {key: (error_code, node_id, host, port)}."""
    body = i8(key_type) + carray([cstring(k) for k in keys]) + NO_TAGS
    r = roundtrip(addr, API_FIND_COORDINATOR, version, body, timeout=timeout, flexible=True)
    r.i32()  # throttle
    out = {}
    for _ in range(r.carray_len()):
        key = r.cstring()
        node_id, host, port = r.i32(), r.cstring(), r.i32()
        err = r.i16()
        r.cstring()  # error message
        r.skip_tags()
        out[key] = (err, node_id, host, port)
    return out


def join_group_request(group, member_id="", protocols=(), session_timeout_ms=30000, rebalance_timeout_ms=30000,
                       instance_id=None, protocol_type="consumer", version=5):
    """The body of JoinGroup v0..v5; protocols = [(name, metadata bytes)]."""
    body = string(group) + i32(session_timeout_ms)
    if version >= 1:
        body += i32(rebalance_timeout_ms)
    body += string(member_id)
    if version >= 5:
        body += string(instance_id)
    body += string(protocol_type) + array([string(n) + nbytes(m) for n, m in protocols])
    return body


def parse_join_group(r, version):
    """A JoinGroup v0..v5 response: dict(error, generation, protocol, leader, member_id,
    members=[(member_id, instance_id, metadata)])."""
    if version >= 2:
        r.i32()  # throttle
    out = {"error": r.i16(), "generation": r.i32(), "protocol": r.string(), "leader": r.string(),
           "member_id": r.string()}
    members = []
    for _ in range(r.i32()):
        mid = r.string()
        iid = r.string() if version >= 5 else None
        members.append((mid, iid, r.nbytes()))
    out["members"] = members
    return out


def join_group(addr, group, member_id="", protocols=(), session_timeout_ms=30000, rebalance_timeout_ms=30000,
               instance_id=None, protocol_type="consumer", version=5, timeout=60):
    """One JoinGroup (v0..v5) round trip; blocks until the coordinator answers (the end of
    the rebalance). See parse_join_group for the result."""
    body = join_group_request(group, member_id, protocols, session_timeout_ms, rebalance_timeout_ms, instance_id,
                              protocol_type, version)
    return parse_join_group(roundtrip(addr, API_JOIN_GROUP, version, body, timeout=timeout), version)


def join(addr, group, topics, member_id="", version=5, protocol="range", **kw):
    """JoinGroup as a consumer subscribed to `topics`, answering MEMBER_ID_REQUIRED (v4+,
    dynamic members) by joining again with the member id the coordinator gave."""
    protocols = [(protocol, consumer_subscription(topics))]
    res = join_group(addr, group, member_id, protocols, version=version, **kw)
    if res["error"] == 79 and not member_id:
        res = join_group(addr, group, res["member_id"], protocols, version=version, **kw)
    return res


def sync_group(addr, group, generation, member_id, assignments=(), instance_id=None, version=3, timeout=60):
    """SyncGroup v0..v3; assignments = [(member_id, assignment bytes)] (the leader's), empty for
    followers: (error_code, assignment bytes)."""
    body = string(group) + i32(generation) + string(member_id)
    if version >= 3:
        body += string(instance_id)
    body += array([string(m) + nbytes(a) for m, a in assignments])
    r = roundtrip(addr, API_SYNC_GROUP, version, body, timeout=timeout)
    if version >= 1:
        r.i32()  # throttle
    return r.i16(), r.nbytes()


def heartbeat(addr, group, generation, member_id, instance_id=None, version=3, timeout=10):
    """Heartbeat v0..v4 (v4 flexible): error_code."""
    if version >= 4:
        body = cstring(group) + i32(generation) + cstring(member_id) + cstring(instance_id) + NO_TAGS
    else:
        body = string(group) + i32(generation) + string(member_id)
        if version >= 3:
            body += string(instance_id)
    r = roundtrip(addr, API_HEARTBEAT, version, body, timeout=timeout, flexible=version >= 4)
    if version >= 1:
        r.i32()  # throttle
    return r.i16()


def leave_group(addr, group, member_id, instance_id=None, version=3, timeout=10):
    """LeaveGroup v0..v3 for one member: (error_code, member error_code or None before v3)."""
    if version >= 3:
        body = string(group) + array([string(member_id) + string(instance_id)])
    else:
        body = string(group) + string(member_id)
    r = roundtrip(addr, API_LEAVE_GROUP, version, body, timeout=timeout)
    if version >= 1:
        r.i32()  # throttle
    err = r.i16()
    member_err = None
    if version >= 3:
        for _ in range(r.i32()):
            r.string()
            r.string()
            member_err = r.i16()
    return err, member_err


def group_by_topic(rows):
    """[(topic, x)] -> {topic: [x]}, in first-seen order."""
    out = {}
    for t, x in rows:
        out.setdefault(t, []).append(x)
    return out


def topic_partitions(partitions):
    """[(topic, partition)] as the wire's array of (topic, [partition])."""
    return array([string(t) + array([i32(p) for p in ps]) for t, ps in group_by_topic(partitions).items()])


def read_by_partition(r, value):
    """An array of (topic, array of (partition, value)) read as {(topic, partition): value(r)}."""
    out = {}
    for _ in range(r.i32()):
        t = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            out[(t, p)] = value(r)
    return out


def offset_commit(addr, group, offsets, generation=-1, member_id="", instance_id=None, version=7, timeout=20):
    """OffsetCommit v2..v7; offsets = {(topic, partition): (offset, metadata)}; generation -1
    and member "" commit for a group without members: {(topic, partition): error_code}."""
    by_topic = group_by_topic((t, (p, off, meta)) for (t, p), (off, meta) in offsets.items())
    body = string(group) + i32(generation) + string(member_id)
    if version >= 7:
        body += string(instance_id)
    if 2 <= version <= 4:
        body += i64(-1)  # retention time: the broker's default
    topics = []
    for t, parts in by_topic.items():
        enc = []
        for p, off, meta in parts:
            e = i32(p) + i64(off)
            if version >= 6:
                e += i32(-1)  # committed leader epoch
            enc.append(e + string(meta))
        topics.append(string(t) + array(enc))
    body += array(topics)
    r = roundtrip(addr, API_OFFSET_COMMIT, version, body, timeout=timeout)
    if version >= 3:
        r.i32()  # throttle
    return read_by_partition(r, Reader.i16)


def offset_fetch(addr, group, partitions=None, version=5, timeout=20):
    """OffsetFetch v1..v5 of [(topic, partition)], or of every committed partition when None
    (v2+): (group error_code (None before v2), {(topic, partition): (offset, metadata, error_code)})."""
    if partitions is None:
        topics = i32(-1)
    else:
        topics = topic_partitions(partitions)
    r = roundtrip(addr, API_OFFSET_FETCH, version, string(group) + topics, timeout=timeout)
    if version >= 3:
        r.i32()  # throttle
    def committed(r):
        off = r.i64()
        if version >= 5:
            r.i32()  # committed leader epoch
        meta = r.string()
        return off, meta, r.i16()

    out = read_by_partition(r, committed)
    err = r.i16() if version >= 2 else None
    return err, out


def list_groups(addr, version=2, timeout=10):
    """ListGroups v0..v2: (error_code, [(group_id, protocol_type)])."""
    r = roundtrip(addr, API_LIST_GROUPS, version, b"", timeout=timeout)
    if version >= 1:
        r.i32()  # throttle
    err = r.i16()
    return err, [(r.string(), r.string()) for _ in range(r.i32())]


def describe_groups(addr, groups, version=4, timeout=10):
    """DescribeGroups v0..v4: {group_id: dict(error, state, protocol_type, protocol,
    members=[dict(member_id, instance_id, client_id, host, metadata, assignment)])}."""
    body = array([string(g) for g in groups])
    if version >= 3:
        body += i8(0)  # include authorized operations: no
    r = roundtrip(addr, API_DESCRIBE_GROUPS, version, body, timeout=timeout)
    if version >= 1:
        r.i32()  # throttle
    out = {}
    for _ in range(r.i32()):
        err, gid = r.i16(), r.string()
        g = {"error": err, "state": r.string(), "protocol_type": r.string(), "protocol": r.string(), "members": []}
        for _ in range(r.i32()):
            m = {"member_id": r.string()}
            m["instance_id"] = r.string() if version >= 4 else None
            m["client_id"], m["host"] = r.string(), r.string()
            m["metadata"], m["assignment"] = r.nbytes(), r.nbytes()
            g["members"].append(m)
        if version >= 3:
            r.i32()  # authorized operations
        out[gid] = g
    return out


def delete_groups(addr, groups, version=1, timeout=20):
    """DeleteGroups v0..v1: {group_id: error_code}."""
    r = roundtrip(addr, API_DELETE_GROUPS, version, array([string(g) for g in groups]), timeout=timeout)
    r.i32()  # throttle
    return {r.string(): r.i16() for _ in range(r.i32())}


def offset_delete(addr, group, partitions, timeout=20):
    """OffsetDelete v0 of [(topic, partition)]: (error_code, {(topic, partition): error_code})."""
    body = string(group) + topic_partitions(partitions)
    r = roundtrip(addr, API_OFFSET_DELETE, 0, body, timeout=timeout)
    err = r.i16()
    r.i32()  # throttle
    return err, read_by_partition(r, Reader.i16)


def java_string_hash(s):
    """Java's String.hashCode (UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def offsets_partition_for(group, num_partitions):
    """The __consumer_offsets partition of a group: Kafka's Utils.abs(hashCode) % n."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# ---- transaction coordinator ------------------------------------------------------------

API_ADD_PARTITIONS_TO_TXN, API_END_TXN, API_TXN_OFFSET_COMMIT = 24, 26, 28


def init_txn_producer(addr, transactional_id, timeout_ms=60000, timeout=20):
    """InitProducerId v1 for a transactional producer: (error_code, producer_id, epoch)."""
    r = roundtrip(addr, API_INIT_PRODUCER_ID, 1, string(transactional_id) + i32(timeout_ms), timeout=timeout)
    r.i32()  # throttle_time_ms
    return r.i16(), r.i64(), r.i16()


def add_partitions_to_txn(addr, transactional_id, producer_id, epoch, topics, version=1, timeout=20):
    """AddPartitionsToTxn v0/v1; topics = {topic: [partition]}. Returns {(topic, partition): error_code}."""
    body = (string(transactional_id) + i64(producer_id) + i16(epoch)
            + array([string(t) + array([i32(p) for p in ps]) for t, ps in topics.items()]))
    r = roundtrip(addr, API_ADD_PARTITIONS_TO_TXN, version, body, timeout=timeout)
    r.i32()  # throttle_time_ms
    out = {}
    for _ in range(r.i32()):
        topic = r.string()
        for _ in range(r.i32()):
            partition = r.i32()
            out[(topic, partition)] = r.i16()
    return out


def end_txn(addr, transactional_id, producer_id, epoch, commit, version=1, timeout=20):
    """EndTxn v0/v1: the error code."""
    body = string(transactional_id) + i64(producer_id) + i16(epoch) + i8(1 if commit else 0)
    r = roundtrip(addr, API_END_TXN, version, body, timeout=timeout)
    r.i32()  # throttle_time_ms
    return r.i16()


def txn_offset_commit(addr, transactional_id, group, producer_id, epoch, generation, member_id, offsets, timeout=20):
    """TxnOffsetCommit v3 (flexible); offsets = {(topic, partition): offset}. Returns
    {(topic, partition): error_code}."""
    by_topic = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append((p, o))
    body = (cstring(transactional_id) + cstring(group) + i64(producer_id) + i16(epoch) + i32(generation)
            + cstring(member_id) + cstring(None)
            + carray([cstring(t) + carray([i32(p) + i64(o) + i32(-1) + cstring("") + NO_TAGS for p, o in ps])
                      + NO_TAGS for t, ps in by_topic.items()])
            + NO_TAGS)
    r = roundtrip(addr, API_TXN_OFFSET_COMMIT, 3, body, timeout=timeout, flexible=True)
    r.i32()  # throttle_time_ms
    out = {}
    for _ in range(r.carray_len()):
        topic = r.cstring()
        for _ in range(r.carray_len()):
            partition, err = r.i32(), r.i16()
            r.skip_tags()
            out[(topic, partition)] = err
        r.skip_tags()
    r.skip_tags()
    return out


API_CONSUMER_GROUP_HEARTBEAT = 68


def consumer_group_heartbeat(addr, group, member_id, member_epoch, topics=None, owned=None, regex=None,
                             server_assignor=None, instance_id=None, rebalance_timeout_ms=30000, version=1,
                             timeout=20):
    """ConsumerGroupHeartbeat v0/v1 (KIP-848, flexible); owned = {topic_id bytes (16): [partition]}.
    Returns {error, message, member_id, member_epoch, interval, assignment} where assignment is
    None or {topic_id bytes: [partition]}."""
    def nullable_carray(items):
        return uvarint(0) if items is None else carray(items)

    body = (cstring(group) + cstring(member_id) + i32(member_epoch) + cstring(instance_id) + cstring(None)
            + i32(rebalance_timeout_ms)
            + nullable_carray(None if topics is None else [cstring(t) for t in topics]))
    if version >= 1:
        body += cstring(regex)
    body += cstring(server_assignor)
    body += nullable_carray(None if owned is None else [
        tid + carray([i32(p) for p in ps]) + NO_TAGS for tid, ps in owned.items()])
    body += NO_TAGS
    r = roundtrip(addr, API_CONSUMER_GROUP_HEARTBEAT, version, body, timeout=timeout, flexible=True)
    r.i32()  # throttle_time_ms
    out = {"error": r.i16(), "message": r.cstring(), "member_id": r.cstring(), "member_epoch": r.i32(),
           "interval": r.i32(), "assignment": None}
    if r.i8() >= 0:
        assignment = {}
        for _ in range(r.carray_len()):
            tid = r.take(16)
            assignment[tid] = [r.i32() for _ in range(r.carray_len())]
            r.skip_tags()
        r.skip_tags()
        out["assignment"] = assignment
    return out
