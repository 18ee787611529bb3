#!/usr/bin/env python3
"""Log-compaction benchmark on one strom node: how fast the cleaner goes through a
compacted topic (MB of log per second cleaned, size before and after) and what it costs
a producer writing to another topic meanwhile (acks=all latency p50/p99/max at a fixed
rate, against the same rate with no cleaning, before the fill and after the pass), with
the broker's CPU-seconds and the cleaner's reads and writes; then a consumer reads the
compacted topic from the start and checks that every key's value is the last one
written and that no superseded record is left where the cleaner should have removed it.

    tests/setup_python.sh
    cargo build --release
    target/pyenv/bin/python bench/compaction_bench.py                    # 512 MB, 1,000 keys
    target/pyenv/bin/python bench/compaction_bench.py --mb 128           # quick check of the script
    target/pyenv/bin/python bench/compaction_bench.py --throttle-mb 50   # log.cleaner.io.max.bytes.per.second
    target/pyenv/bin/python bench/compaction_bench.py --sync             # dirty pages written back before the pass

See bench/README.md for what each number means.
"""
import argparse
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
sys.path.insert(0, os.path.dirname(__file__))

import harness  # noqa: E402
from kafka_bench import cpu_seconds, pct  # noqa: E402

import confluent_kafka as ck  # noqa: E402

MB = 1_000_000
MIB = 1 << 20
LONG_MAX = 2 ** 63 - 1
COMPACTED, PROBE = "compacted", "probe"
# Names in a partition's directory (src/log/partition_log.rs).
CLEANER_OFFSET_FILE, SCRATCH_DIR = "cleaner-offset", "compacting"


# ---- the partition's files ------------------------------------------------------------------

def partition_dir(data_dir, topic, partition=0):
    """The directory `<topic>-<partition>` under the node's data directory."""
    name = f"{topic}-{partition}"
    for root, dirs, _ in os.walk(data_dir):
        if name in dirs:
            return os.path.join(root, name)
    return None


def segments(pdir):
    """[(base offset, size in bytes)] of the partition's `*.log` files (not the
    cleaner's scratch directory), by base offset; the last is the active segment."""
    out = []
    for name in os.listdir(pdir):
        if name.endswith(".log") and name[:-4].isdigit():
            try:
                out.append((int(name[:-4]), os.path.getsize(os.path.join(pdir, name))))
            except OSError:  # swapped out between listdir and stat
                pass
    return sorted(out)


def scratch_bytes(pdir):
    """Bytes in the cleaner's scratch directory, None when there is none."""
    path = os.path.join(pdir, SCRATCH_DIR)
    try:
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    except OSError:
        return None


def cleaner_offset(pdir):
    try:
        with open(os.path.join(pdir, CLEANER_OFFSET_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def last_batch_ranges(pdir):
    """{segment base: (first, last) offset of the segment's last batch}, from the v2 batch
    headers of each `*.log` (baseOffset int64, batchLength int32, ..., lastOffsetDelta
    int32 at byte 23)."""
    out = {}
    for base, size in segments(pdir):
        with open(os.path.join(pdir, f"{base:020d}.log"), "rb") as f:
            position, last = 0, None
            while position + 27 <= size:
                f.seek(position)
                head = f.read(27)
                base_offset, length = struct.unpack(">qi", head[:12])
                last = (base_offset, base_offset + struct.unpack(">i", head[23:27])[0])
                position += 12 + length
        if last is not None:
            out[base] = last
    return out


def proc_io(pid):
    """/proc/<pid>/io: rchar and wchar count read(2)/pread(2) and write(2) bytes on files
    (the broker's socket I/O goes through recv/send and is not in them), read_bytes and
    write_bytes what reached the block device."""
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out


def meminfo_bytes(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# ---- produce --------------------------------------------------------------------------------

class Probe:
    """An acks=all producer at a fixed rate in a thread: (send time, latency ms) of every
    delivered record, latency being the delivery callback's time minus the send time."""

    def __init__(self, bootstrap, topic, rate, size):
        self.p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "log_level": 0})
        self.topic, self.rate, self.value = topic, rate, os.urandom(size)
        self.samples, self.errors = [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def delivered(self, err, _msg, sent):
        if err is not None:
            self.errors += 1
        else:
            self.samples.append((sent, (time.monotonic() - sent) * 1000))

    def run(self):
        period, next_at = 1 / self.rate, time.monotonic()
        while not self.stop.is_set():
            sent = time.monotonic()
            self.p.produce(self.topic, value=self.value,
                           on_delivery=lambda e, m, s=sent: self.delivered(e, m, s))
            self.p.poll(0)
            next_at += period
            while True:
                delay = next_at - time.monotonic()
                if delay <= 0:
                    break
                self.p.poll(0)
                self.stop.wait(min(delay, 0.0005))

    def window(self, t0, t1):
        """Latencies (ms) of the records sent in [t0, t1)."""
        return [ms for sent, ms in list(self.samples) if t0 <= sent < t1]

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        self.p.flush(30)


def idle_window(probe, pid, seconds):
    """`seconds` of the probe alone: (latencies, broker CPU-seconds, seconds, the broker's
    file reads (rchar) per second, which should be about nothing)."""
    io0, cpu0, t0 = proc_io(pid)["rchar"], cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # the length of the measurement, not a wait for a condition
    t1 = time.monotonic()
    cpu, rchar = cpu_seconds(pid) - cpu0, proc_io(pid)["rchar"] - io0
    harness.wait_for("the probe's records of the idle window delivered", 30,
                     lambda: probe.samples and probe.samples[-1][0] >= t1)
    return probe.window(t0, t1), cpu, t1 - t0, rchar / (t1 - t0)


def fill(bootstrap, total_bytes, keys, size, seed, batch_bytes):
    """Writes total_bytes of `size`-byte values over `keys` keys, keys drawn at random;
    each value starts with `key|sequence|`. Returns ({key: last sequence}, records, s)."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": batch_bytes,
                     "queue.buffering.max.messages": 1_000_000, "log_level": 0})
    rng = random.Random(seed)
    pad = b"." * size
    n = total_bytes // size
    last = {}
    failed = []
    started = time.monotonic()
    for seq in range(n):
        k = rng.randrange(keys)
        key = b"k%06d" % k
        head = b"%s|%d|" % (key, seq)
        value = head + pad[:max(0, size - len(head))]
        while True:
            try:
                p.produce(COMPACTED, key=key, value=value, partition=0,
                          on_delivery=lambda e, m: failed.append(e) if e else None)
                break
            except BufferError:
                p.poll(0.01)
        last[key] = seq
        if seq % 1000 == 0:
            p.poll(0)
    left = p.flush(300)
    assert left == 0 and not failed, f"fill: {left} records not delivered, {len(failed)} failed ({failed[:3]})"
    return last, n, time.monotonic() - started


# ---- verify ---------------------------------------------------------------------------------

def read_back(bootstrap, timeout=300):
    """[(offset, key, sequence)] of the compacted topic's partition 0, from its start to
    its high watermark."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-bench-verify",
                     "enable.auto.commit": False, "fetch.max.bytes": 64 * MIB,
                     "max.partition.fetch.bytes": 16 * MIB, "fetch.wait.max.ms": 100, "log_level": 0})
    try:
        _, high = c.get_watermark_offsets(ck.TopicPartition(COMPACTED, 0), timeout=30)
        c.assign([ck.TopicPartition(COMPACTED, 0, ck.OFFSET_BEGINNING)])
        out, deadline = [], time.monotonic() + timeout
        while not out or out[-1][0] + 1 < high:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read up to offset {out[-1][0] if out else None} of {high} in {timeout} s")
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error() is None:
                    key, seq, _ = m.value().split(b"|", 2)
                    assert key == m.key(), f"offset {m.offset()}: key {m.key()!r} carries a value of {key!r}"
                    out.append((m.offset(), m.key(), int(seq)))
        return out
    finally:
        c.close()


def verify(records, last, end, last_batches):
    """Checks the read-back records against what was written: a list of problems (empty
    when all is well) and counts. Below `end` (the cleaner-offset: the pass cleaned
    every segment under it) a key's record that a later record below `end` supersedes
    may survive only in its segment's last batch, which the cleaner keeps whole."""
    problems = []
    offsets = [o for o, _, _ in records]
    if any(b <= a for a, b in zip(offsets, offsets[1:])):
        problems.append("offsets do not increase")
    final, latest_below_end = {}, {}
    for offset, key, seq in records:
        final[key] = seq
        if offset < end:
            latest_below_end[key] = offset
    missing = [k for k in last if k not in final]
    wrong = [k for k in last if k in final and final[k] != last[k]]
    extra = [k for k in final if k not in last]
    if missing:
        problems.append(f"{len(missing)} keys missing, e.g. {missing[:3]}")
    if wrong:
        problems.append(f"{len(wrong)} keys whose last value is not the last written, e.g. "
                        f"{[(k, final[k], last[k]) for k in wrong[:3]]}")
    if extra:
        problems.append(f"{len(extra)} keys never written: {extra[:3]}")
    bases = sorted(last_batches)
    kept_whole, stray, cleaned = 0, [], 0
    for offset, key, _ in records:
        if offset >= end:
            continue
        cleaned += 1
        if latest_below_end[key] == offset:
            continue
        base = max((b for b in bases if b <= offset), default=None)
        first, last_offset = last_batches.get(base, (None, None))
        if first is not None and first <= offset <= last_offset:
            kept_whole += 1
        else:
            stray.append(offset)
    if stray:
        problems.append(f"{len(stray)} superseded records below the cleaner offset outside a segment's last batch, "
                        f"e.g. offsets {stray[:5]}")
    return problems, {"cleaned_records": cleaned, "cleaned_keys": len(latest_below_end), "kept_whole": kept_whole,
                      "keys_ok": len(last) - len(missing) - len(wrong), "records": len(records)}


# ---- main -----------------------------------------------------------------------------------

def lat_line(name, lat, cpu, seconds, *_):
    return (f"  {name:22} p50 {pct(lat, 50):6.1f} ms  p99 {pct(lat, 99):6.1f} ms  max {max(lat, default=0):7.1f} ms"
            f"  ({len(lat):6} records, broker CPU {cpu:5.2f} s in {seconds:5.1f} s = {cpu / seconds:4.2f} cores)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("STROM_BIN") or os.path.join(REPO, "target/release/strom"))
    ap.add_argument("--mb", type=int, default=512, help="MB of values written to the compacted topic")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024, help="bytes per value")
    ap.add_argument("--batch-kib", type=int, default=64,
                    help="the fill producer's batch.size, KiB (the cleaner keeps each segment's last batch whole)")
    ap.add_argument("--segment-mib", type=int, default=16, help="the compacted topic's segment.bytes, MiB")
    ap.add_argument("--rate", type=int, default=2000, help="records/s of the probe producer")
    ap.add_argument("--idle-s", type=float, default=10, help="length of each probe window with no cleaning")
    ap.add_argument("--check-ms", type=int, default=100,
                    help="log.retention.check.interval.ms (how often the cleaner looks; 100 is the least)")
    ap.add_argument("--throttle-mb", type=float, default=None,
                    help="log.cleaner.io.max.bytes.per.second, in MB/s (no bound by default)")
    ap.add_argument("--sync", action="store_true",
                    help="write the fill's dirty pages back (sync) before the pass; by default the pass starts with "
                         "them still dirty in the page cache, as when recently written data is compacted")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache after the fill (root: sync, /proc/sys/vm/drop_caches), so that the "
                         "cleaner reads the log from the device")
    ap.add_argument("--timeout", type=float, default=900, help="longest wait for the cleaning pass, s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--rust-log", default="warn")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and the node's log")
    args = ap.parse_args()

    settings = [f"log.retention.check.interval.ms={args.check_ms}"]
    if args.throttle_mb is not None:
        settings.append(f"log.cleaner.io.max.bytes.per.second={int(args.throttle_mb * MB)}")
    settings += args.set
    directory = tempfile.mkdtemp(prefix="strom-compaction-bench-")
    wall_offset = time.time() - time.monotonic()
    cluster = probe = None
    try:
        cluster = harness.start(directory, n=1, settings=settings, binary=args.binary, rust_log=args.rust_log)
        node = cluster.node(1)
        pid = node.pid
        cluster.create_topic(PROBE, partitions=1, rf=1)
        # Nothing is cleanable while min.compaction.lag.ms is Long.MAX: the fill runs with
        # the cleaner idle, and setting the lag to 0 afterwards starts the pass.
        cluster.create_topic(COMPACTED, partitions=1, rf=1, configs={
            "cleanup.policy": "compact", "segment.bytes": str(args.segment_mib * MIB),
            "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": str(LONG_MAX)})
        cluster.wait_topic(PROBE, 1)
        cluster.wait_topic(COMPACTED, 1)
        pdir = harness.wait_for(f"{COMPACTED}-0 in {node.data_dir}", 10,
                                lambda: partition_dir(node.data_dir, COMPACTED))

        probe = Probe(cluster.bootstrap, PROBE, args.rate, args.size)
        time.sleep(2)  # warm-up of the probe's connection, not counted
        idle_before = idle_window(probe, pid, args.idle_s)
        print(lat_line("no cleaning (before)", *idle_before), flush=True)

        probe.stop.set()  # the fill runs alone
        probe.thread.join(timeout=10)
        probe.p.flush(30)
        cpu0 = cpu_seconds(pid)
        last, n, fill_s = fill(cluster.bootstrap, args.mb * MB, args.keys, args.size, args.seed,
                                args.batch_kib * 1024)
        fill_cpu = cpu_seconds(pid) - cpu0
        print(f"  fill: {n:,} records of {args.size} B over {len(last)} keys in {fill_s:.1f} s "
              f"({args.mb / fill_s:.1f} MB/s, broker CPU {fill_cpu:.2f} s)", flush=True)
        assert cleaner_offset(pdir) is None, "the cleaner ran during the fill"
        before = segments(pdir)
        end = before[-1][0]  # the active segment's base: the pass cleans everything below
        sealed_before = sum(s for b, s in before[:-1])

        if args.sync or args.drop_caches:
            os.sync()
        if args.drop_caches:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        probe = Probe(cluster.bootstrap, PROBE, args.rate, args.size)
        time.sleep(2)  # warm-up of the new producer, not counted
        dirty = meminfo_bytes("Dirty")
        io0, cpu0 = proc_io(pid), cpu_seconds(pid)
        t_patch = time.monotonic()
        status, body = cluster.send(1, "PATCH", f"/v1/topics/{COMPACTED}/configs", {"min.compaction.lag.ms": "0"})
        assert status in (200, 204), f"PATCH min.compaction.lag.ms: {status} {body}"
        # Poll every 20 ms until the pass has swapped its segments in and written the
        # cleaner offset. Its phases: it starts after the last sample before the broker's
        # file reads (rchar) pass 1 MiB (its first read is a 4 MiB chunk); the scratch
        # directory appears once the whole log has been read for the key map; the swap
        # (under the partition's lock) starts when a sealed segment first shrinks.
        deadline = t_patch + args.timeout
        t_start = t_scratch = t_swap = t_done = None
        prev_t, peak_scratch = t_patch, 0
        while True:
            now, io, sb = time.monotonic(), proc_io(pid), scratch_bytes(pdir)
            if t_start is None and io["rchar"] - io0["rchar"] >= MIB:
                t_start = prev_t
            if sb is not None:
                t_scratch = t_scratch or now
                peak_scratch = max(peak_scratch, sb)
            if t_swap is None and sum(size for base, size in segments(pdir) if base < end) < sealed_before:
                t_swap = prev_t
            if cleaner_offset(pdir) == end and sb is None:
                t_done = now
                break
            if now > deadline:
                raise TimeoutError(f"no finished pass {args.timeout} s after the PATCH (cleaner-offset "
                                   f"{cleaner_offset(pdir)}, want {end}; scratch {sb})\n{cluster.log_tails()}")
            prev_t = now
            time.sleep(0.02)
        io1, cpu1 = proc_io(pid), cpu_seconds(pid)
        t_start = t_start or t_patch
        t_scratch, t_swap = t_scratch or t_done, t_swap or t_done
        harness.wait_for("the probe's records of the cleaning delivered", 30,
                         lambda: probe.samples and probe.samples[-1][0] >= t_done)
        # Latency of the records sent while the pass ran; CPU from the PATCH to its end.
        during = (probe.window(t_start, t_done), cpu1 - cpu0, t_done - t_patch)
        after = segments(pdir)
        sealed_after = sum(s for b, s in after[:-1])
        pass_s = t_done - t_start
        probe_bytes = len(during[0]) * args.size  # the probe's appends, in wchar too
        rchar = io1["rchar"] - io0["rchar"]
        wchar = io1["wchar"] - io0["wchar"] - probe_bytes
        disk_read = io1["read_bytes"] - io0["read_bytes"]

        idle_after = idle_window(probe, pid, args.idle_s)
        probe.close()
        probe_errors, probe_samples, probe = probe.errors, probe.samples, None

        records = read_back(cluster.bootstrap)
        problems, counts = verify(records, last, cleaner_offset(pdir), last_batch_ranges(pdir))

        print("=" * 100)
        print(f"1 node, {COMPACTED}: {args.mb} MB, {n:,} records of {args.size} B over {args.keys} keys, "
              f"segment.bytes {args.segment_mib} MiB, log.retention.check.interval.ms {args.check_ms}, "
              f"{'page cache dropped, ' if args.drop_caches else ''}"
              f"{'synced, ' if args.sync and not args.drop_caches else ''}"
              f"cleaner throttle {f'{args.throttle_mb:g} MB/s' if args.throttle_mb is not None else 'off'}")
        print(f"  before: {len(before) - 1} sealed segments {sealed_before / MB:8.1f} MB + active "
              f"{before[-1][1] / MB:5.1f} MB   (machine's dirty page cache when the pass started: {dirty / MB:.0f} MB)")
        print(f"  after:  {len(after) - 1} sealed segments {sealed_after / MB:8.1f} MB + active "
              f"{after[-1][1] / MB:5.1f} MB   (scratch peak {peak_scratch / MB:.1f} MB)")
        print(f"  pass:   {pass_s:6.2f} s from its first read to the cleaner offset written: key map "
              f"{t_scratch - t_start:.2f} s, rewrite {t_swap - t_scratch:.2f} s, swap {t_done - t_swap:.2f} s "
              f"({t_start - t_patch:.2f} s from the PATCH to the first read)")
        print(f"  cleaned {sealed_before / MB / pass_s:7.1f} MB/s (sealed MB before / pass s); cleaner file I/O: "
              f"read {rchar / MB:.0f} MB ({rchar / max(sealed_before, 1):.1f}x the log, {disk_read / MB:.0f} MB "
              f"from the device), wrote {wchar / MB:.0f} MB, {(rchar + wchar) / MB / pass_s:.1f} MB/s")
        if args.throttle_mb is not None:
            io_rate = (rchar + wchar) / MB / pass_s
            print(f"  throttle {args.throttle_mb:g} MB/s: cleaner I/O {io_rate:.1f} MB/s -> "
                  f"{'holds' if io_rate <= args.throttle_mb * 1.02 else 'EXCEEDED'}")
        print(f"probe: acks=all, {args.size} B records at {args.rate}/s to topic {PROBE} (broker file reads with "
              f"the probe alone: {idle_before[3] / 1000:.0f} and {idle_after[3] / 1000:.0f} KB/s)")
        print(lat_line("no cleaning (before)", *idle_before))
        print(lat_line("during the pass", *during))
        worst = max(((ms, sent) for sent, ms in list(probe_samples) if t_start <= sent < t_done), default=None)
        if worst:
            wall = worst[1] + wall_offset
            print(f"  (slowest: {worst[0]:.1f} ms, sent {worst[1] - t_start:.2f} s into the pass, "
                  f"{'in the swap' if worst[1] >= t_swap - 0.02 else 'before the swap'}; "
                  f"{time.strftime('%H:%M:%S', time.gmtime(wall))}.{int(wall % 1 * 1000):03d} UTC in the node's log)")
        if len(during[0]) < 2000:
            print(f"  (only {len(during[0])} records during the pass: its p99 rests on a few of them; a larger --mb "
                  f"or a --throttle-mb makes the pass longer)")
        print(lat_line("no cleaning (after)", *idle_after))
        if probe_errors:
            print(f"  probe: {probe_errors} records failed")
        print(f"verify: read {counts['records']:,} records; {counts['keys_ok']}/{len(last)} keys end with the "
              f"last value written; below the cleaner offset {counts['cleaned_records']:,} records of "
              f"{counts['cleaned_keys']} keys, {counts['kept_whole']} superseded ones kept in segments' last batches")
        if problems:
            print("VERIFY FAILED: " + "; ".join(problems))
            sys.exit(1)
        print("verify: OK")
    finally:
        if probe is not None:
            probe.stop.set()
        if cluster is not None:
            cluster.close()
        if args.keep:
            print(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
