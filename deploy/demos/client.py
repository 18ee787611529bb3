#!/usr/bin/env python3
"""The demos' Kafka client (confluent-kafka).

produce BOOTSTRAP TOPIC SECONDS RATE OUT [KEY_PREFIX]: an idempotent acks=all producer writing
steadily; writes every acknowledged key with its partition, offset and ack time to OUT.
SIGTERM ends it early the same way: it stops producing, waits for what is in flight and
writes OUT.
verify BOOTSTRAP TOPIC PARTITIONS ACKED: reads every partition from the start and
checks every acknowledged record is there exactly once, at its acknowledged offset,
in order. Exit 1 on any loss or duplicate.
"""
import signal
import os
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def produce(bootstrap, topic, seconds, rate, out, prefix="k"):
    extra = {"debug": os.environ["DEMO_CLIENT_DEBUG"], "log_level": 7} if os.environ.get("DEMO_CLIENT_DEBUG") else {}
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "message.timeout.ms": 30000, "log_level": 0, **extra})
    acked, failed = [], []

    def cb(err, msg):
        if err:
            failed.append(str(err))
        else:
            acked.append((msg.key().decode(), msg.partition(), msg.offset(), time.time()))

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    start, i, fatal = time.time(), 0, None
    try:
        while time.time() - start < seconds and not stop:
            due = int((time.time() - start) * rate)
            while i < due:
                try:
                    p.produce(topic, key=b"%s%08d" % (prefix.encode(), i), value=b"value-%d" % i, on_delivery=cb)
                    i += 1
                except BufferError:
                    break
            p.poll(0.01)
        p.flush(60)
    except KafkaException as e:
        # An idempotent producer whose unacknowledged records expired on a
        # cut-off leader can end in a fatal error; what it had acknowledged
        # before still counts, and is checked.
        fatal = e
    finally:
        with open(out, "w") as f:
            for key, part, off, ts in acked:
                f.write(f"{key} {part} {off} {ts:.3f}\n")
    ending = f"; stopped by a fatal client error: {fatal.args[0].str()}" if fatal else ""
    print(f"produced {i}, acknowledged {len(acked)}, not acknowledged {len(failed)}{ending}", flush=True)


def verify(bootstrap, topic, partitions, acked_file):
    acked = {}
    for line in open(acked_file):
        key, part, off, _ = line.split()
        # librdkafka acknowledges some records without their offset (None): those a
        # later batch's success acknowledged implicitly. Their offset is not checked.
        acked[key] = (int(part), None if off == "None" else int(off))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "log_level": 0})
    c.assign([TopicPartition(topic, i, 0) for i in range(int(partitions))])
    seen, dups, out_of_order, last, dup_keys = {}, 0, 0, {}, []
    deadline = time.time() + 60
    idle_since = time.time()
    while time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            if time.time() - idle_since > 5 and all(k in seen for k in acked):
                break
            continue
        if m.error():
            continue
        idle_since = time.time()
        key = m.key().decode()
        if key in seen:
            dups += 1
            dup_keys.append(key)
        seen[key] = (m.partition(), m.offset())
        if m.offset() <= last.get(m.partition(), -1):
            out_of_order += 1
        last[m.partition()] = m.offset()
    c.close()
    missing = [k for k in acked if k not in seen]
    moved = [k for k in acked if k in seen and seen[k][0] != acked[k][0]
             or acked[k][1] is not None and seen.get(k) not in (None, acked[k])]
    for kind, keys in (("missing", missing), ("duplicated", dup_keys), ("at another offset", moved)):
        if keys:
            print(f"{kind}: " + ", ".join(f"{k} acked {acked.get(k)} read {seen.get(k)}" for k in keys[:10]), flush=True)
    print(f"acknowledged {len(acked)}, read {len(seen)}, missing {len(missing)}, "
          f"duplicated {dups}, at another offset {len(moved)}, out of order {out_of_order}", flush=True)
    return 1 if (missing or dups or moved or out_of_order) else 0


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), sys.argv[6], *sys.argv[7:8])
    elif sys.argv[1] == "verify":
        sys.exit(verify(*sys.argv[2:6]))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
