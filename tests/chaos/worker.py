"""The chaos harness's Kafka clients (confluent-kafka), each its own process so that one
can run inside a node's network namespace (a client stranded in a minority).

  worker.py produce  --bootstrap B --topic T --partitions P --rate R --id W --out FILE [--progress FILE]
  worker.py consume  --bootstrap B --topic T --partitions P --id W --out FILE --drain FILE [--read-committed]

History is JSON lines, flushed every half second, so that what a worker saw survives
even if it is killed:

  producer: {"f":"send","w":W,"v":VALUE,"p":P,"t0":invoked,"t1":completed,"ok":true,"o":OFFSET}
            {"f":"send",...,"ok":false,"err":"..."}       definitely not written (librdkafka says so)
            {"f":"send",...,"ok":null}                    indeterminate (still in flight at the end)
            {"f":"event","w":W,"t":..,"what":"..."}        fatal errors, producer re-created, ...
  consumer: {"f":"poll","w":W,"s":SESSION,"p":P,"o":OFFSET,"v":VALUE,"t":..}

A producer stops on SIGTERM: it stops producing, waits (bounded) for what is in flight
and records the rest as indeterminate. A consumer assigns every partition from the
start and reads until SIGTERM, or, once the drain file exists ({"partition": end
offset}), until it has read below every end offset (bounded by a deadline).
"""
import argparse
import json
import os
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

# Reconnect fast to restarted nodes (librdkafka's default backs off to 10 s).
COMMON = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 1000, "log_level": 0,
          "topic.metadata.refresh.interval.ms": 2000, "socket.connection.setup.timeout.ms": 5000}
# STROM_CHAOS_RDKAFKA_DEBUG=broker,protocol,eos (librdkafka debug contexts): the clients'
# own logs, to stderr (DIR/workers/ID.log).
if os.environ.get("STROM_CHAOS_RDKAFKA_DEBUG"):
    COMMON.update({"debug": os.environ["STROM_CHAOS_RDKAFKA_DEBUG"], "log_level": 7})


class History:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1 << 20)
        self.last_flush = time.monotonic()

    def write(self, rec):
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def maybe_flush(self):
        if time.monotonic() - self.last_flush > 0.5:
            self.flush()

    def flush(self):
        self.f.flush()
        self.last_flush = time.monotonic()

    def close(self):
        self.f.flush()
        self.f.close()


def write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def produce(a):
    hist = History(a.out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    conf = dict(COMMON, **{"bootstrap.servers": a.bootstrap, "enable.idempotence": True, "acks": "all",
                           "linger.ms": 5, "message.timeout.ms": a.message_timeout_ms,
                           "request.timeout.ms": 5000, "client.id": f"chaos-{a.id}"})
    pending = {}  # value -> (partition, t0)
    acked_per_partition = [0] * a.partitions
    last_ack = [None] * a.partitions
    counts = {"ok": 0, "fail": 0}

    def on_delivery(err, msg):
        v = msg.value().decode()
        p, t0 = pending.pop(v, (msg.partition(), None))
        rec = {"f": "send", "w": a.id, "v": v, "p": p, "t0": t0, "t1": time.time()}
        if err is None:
            rec["ok"] = True
            rec["o"] = msg.offset()
            acked_per_partition[p] += 1
            last_ack[p] = rec["t1"]
            counts["ok"] += 1
        else:
            rec["ok"] = False
            rec["err"] = err.str()
            counts["fail"] += 1
        hist.write(rec)

    fatal = []

    def on_error(err):
        if err.fatal():
            fatal.append(err.str())

    def new_producer():
        return Producer(dict(conf, error_cb=on_error))

    p = new_producer()
    start = time.monotonic()
    seq = 0
    last_progress = 0.0
    while not stop:
        due = int((time.monotonic() - start) * a.rate)
        while seq < due and not stop:
            v = f"{a.id}-{seq}"
            part = seq % a.partitions
            try:
                pending[v] = (part, time.time())
                p.produce(a.topic, value=v.encode(), key=v.encode(), partition=part, on_delivery=on_delivery)
                seq += 1
            except BufferError:
                pending.pop(v, None)
                break
            except KafkaException as e:
                pending.pop(v, None)
                hist.write({"f": "event", "w": a.id, "t": time.time(), "what": f"produce raised: {e}"})
                break
        try:
            p.poll(0.005)
        except KafkaException as e:
            if e.args[0].fatal():
                fatal.append(e.args[0].str())
        if fatal:
            # An idempotent producer can end in a fatal error; what it acknowledged
            # stands. Records still in flight are indeterminate; start a new one.
            hist.write({"f": "event", "w": a.id, "t": time.time(), "what": f"fatal: {fatal[0]}; new producer"})
            fatal.clear()
            try:
                p.purge(in_queue=True, in_flight=True)
                p.poll(0)
            except KafkaException:
                pass
            for v, (part, t0) in list(pending.items()):
                hist.write({"f": "send", "w": a.id, "v": v, "p": part, "t0": t0, "t1": time.time(), "ok": None})
            pending.clear()
            p = new_producer()
        now = time.monotonic()
        if a.progress and now - last_progress > 0.25:
            last_progress = now
            write_json_atomic(a.progress, {"seq": seq, "ok": counts["ok"], "fail": counts["fail"],
                                           "acked": acked_per_partition, "last_ack": last_ack, "t": time.time()})
        hist.maybe_flush()
    # Stop: wait for what is in flight, bounded.
    deadline = time.monotonic() + a.flush_s
    while pending and time.monotonic() < deadline:
        try:
            p.poll(0.05)
        except KafkaException:
            break
    for v, (part, t0) in list(pending.items()):
        hist.write({"f": "send", "w": a.id, "v": v, "p": part, "t0": t0, "t1": time.time(), "ok": None})
    hist.write({"f": "event", "w": a.id, "t": time.time(),
                "what": f"stopped: invoked {seq}, ok {counts['ok']}, fail {counts['fail']}, "
                        f"indeterminate {len(pending)}"})
    if a.progress:
        write_json_atomic(a.progress, {"seq": seq, "ok": counts["ok"], "fail": counts["fail"],
                                       "acked": acked_per_partition, "last_ack": last_ack, "t": time.time(),
                                       "done": True})
    hist.close()
    # Do not let librdkafka's destructor wait on a dead cluster.
    try:
        p.purge(in_queue=True, in_flight=True)
    except KafkaException:
        pass
    print(f"producer {a.id}: invoked {seq}, ok {counts['ok']}, fail {counts['fail']}, indeterminate {len(pending)}",
          flush=True)


def consume(a):
    """Reads every partition from 0 (see the module's doc). With --read-committed (the txn
    workload) it reads at isolation level read_committed, where markers and aborted
    records leave gaps: the end of a partition then tells how far it has read."""
    hist = History(a.out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    conf = dict(COMMON, **{"bootstrap.servers": a.bootstrap, "group.id": f"chaos-{a.id}",
                           "enable.auto.commit": False, "auto.offset.reset": "earliest",
                           "fetch.wait.max.ms": 100, "client.id": f"chaos-{a.id}"})
    if a.read_committed:
        conf.update({"isolation.level": "read_committed", "enable.partition.eof": True})
    session = 0

    def new_consumer():
        c = Consumer(conf)
        c.assign([TopicPartition(a.topic, i, 0) for i in range(a.partitions)])
        return c

    c = new_consumer()
    next_offset = [0] * a.partitions
    drain = None
    drain_deadline = None
    count = 0
    while not stop:
        if drain is None and os.path.exists(a.drain):
            with open(a.drain) as f:
                drain = {int(k): v for k, v in json.load(f).items()}
            drain_deadline = time.monotonic() + a.drain_s
        if drain is not None:
            if all(next_offset[p] >= end for p, end in drain.items()):
                hist.write({"f": "event", "w": a.id, "t": time.time(), "what": "drained"})
                break
            if time.monotonic() > drain_deadline:
                hist.write({"f": "event", "w": a.id, "t": time.time(),
                            "what": f"drain timed out at {next_offset}, ends {drain}"})
                break
        try:
            msgs = c.consume(num_messages=500, timeout=0.1)
        except KafkaException as e:
            hist.write({"f": "event", "w": a.id, "t": time.time(), "what": f"consume raised: {e}"})
            msgs = []
        now = time.time()
        for m in msgs:
            if m.error():
                err = m.error()
                if err.code() == KafkaError._PARTITION_EOF and a.read_committed and (m.offset() or -1) >= 0:
                    next_offset[m.partition()] = max(next_offset[m.partition()], m.offset())
                elif err.code() != KafkaError._PARTITION_EOF:
                    hist.write({"f": "event", "w": a.id, "t": now, "what": f"error: {err.str()}"})
                    if err.fatal():
                        c.close()
                        session += 1
                        c = new_consumer()
                        next_offset = [0] * a.partitions
                        break
                continue
            p, o = m.partition(), m.offset()
            hist.write({"f": "poll", "w": a.id, "s": session, "p": p, "o": o, "v": m.value().decode(), "t": now})
            next_offset[p] = o + 1
            count += 1
        hist.maybe_flush()
    hist.close()
    c.close()
    print(f"consumer {a.id}: polled {count}", flush=True)


def final_read(bootstrap, topic, partitions, timeout_s=120):
    """Every partition from the start to its high watermark (ListOffsets latest, from the
    leader). Returns ({partition: [(offset, value), ...]}, {partition: high watermark},
    complete)."""
    c = Consumer(dict(COMMON, **{"bootstrap.servers": bootstrap, "group.id": "chaos-final",
                                 "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                 "fetch.wait.max.ms": 100}))
    deadline = time.monotonic() + timeout_s
    ends = {}
    try:
        for p in range(partitions):
            while True:
                try:
                    low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)
                    ends[p] = high
                    break
                except KafkaException:
                    # E.g. OFFSET_NOT_AVAILABLE: a new leader's high watermark has not
                    # reached its epoch's start yet (it must not answer a lower one).
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        log, complete = read_to_ends(c, topic, ends, deadline)
        return log, ends, complete
    finally:
        c.close()


def read_to_ends(c, topic, ends, deadline):
    """Reads every partition of `ends` ({partition: end offset}) with consumer c from
    offset 0 up to its end, or until the deadline. The end of a partition (a consumer
    with enable.partition.eof) counts as read up to there: at read_committed, markers
    and aborted records leave gaps. Returns ({partition: [(offset, value)]}, complete)."""
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    log = {p: [] for p in ends}
    nxt = {p: 0 for p in ends}
    while time.monotonic() < deadline and any(nxt[p] < end for p, end in ends.items()):
        for m in c.consume(num_messages=1000, timeout=0.2):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() is not None:
                    nxt[m.partition()] = max(nxt[m.partition()], m.offset())
                continue
            p, o = m.partition(), m.offset()
            if o < ends[p]:
                log[p].append((o, m.value().decode()))
            nxt[p] = max(nxt[p], o + 1)
    return log, all(nxt[p] >= end for p, end in ends.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["produce", "consume"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--progress")
    ap.add_argument("--drain", default="/nonexistent")
    ap.add_argument("--drain-s", type=float, default=60)
    ap.add_argument("--flush-s", type=float, default=30)
    ap.add_argument("--message-timeout-ms", type=int, default=20000)
    ap.add_argument("--read-committed", action="store_true", help="consume: isolation level read_committed")
    a = ap.parse_args()
    (produce if a.mode == "produce" else consume)(a)


if __name__ == "__main__":
    sys.exit(main())
