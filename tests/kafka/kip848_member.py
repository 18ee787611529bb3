"""One member of a consumer-protocol group (KIP-848, librdkafka's group.protocol=consumer),
run as its own process so that a test can SIGKILL it like a crashed consumer.

    kip848_member.py BOOTSTRAP GROUP TOPIC ASSIGNOR [INSTANCE_ID]

ASSIGNOR is the broker's assignor (group.remote.assignor), or `classic:STRATEGY` for a
member of the classic protocol with that partition.assignment.strategy (the online
migration tests mix both in one group).

It prints one JSON line per event, each with CLOCK_MONOTONIC time `t` (comparable
between processes on one machine):
  {"ev": "assign"|"revoke"|"lost", "parts": [...]}   partitions added to or taken from it
  {"ev": "consumed", "values": [...]}                 values read since the last such line
  {"ev": "commit_error", "error": "..."}              a commit refused (retried later)
  {"ev": "closing"} / {"ev": "closed"}                 before and after its consumer's close()
It commits what it consumed every half second, and leaves the group on SIGTERM.
"""
import json
import signal
import sys
import time

import confluent_kafka as ck


def main():
    bootstrap, group, topic, assignor = sys.argv[1:5]
    instance = sys.argv[5] if len(sys.argv) > 5 else None
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "client.id": f"kip848-{instance or 'member'}"}
    if assignor.startswith("classic:"):
        conf.update({"group.protocol": "classic", "partition.assignment.strategy": assignor[len("classic:"):],
                     "heartbeat.interval.ms": 500, "session.timeout.ms": 6000})
    else:
        conf.update({"group.protocol": "consumer", "group.remote.assignor": assignor})
    if instance:
        conf["group.instance.id"] = instance
    consumer = ck.Consumer(conf)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

    def emit(ev, **fields):
        print(json.dumps(dict({"t": time.monotonic(), "ev": ev}, **fields)), flush=True)

    def parts(ps):
        return sorted(p.partition for p in ps)

    consumer.subscribe([topic], on_assign=lambda c, ps: emit("assign", parts=parts(ps)),
                       on_revoke=lambda c, ps: emit("revoke", parts=parts(ps)),
                       on_lost=lambda c, ps: emit("lost", parts=parts(ps)))
    values, last = [], time.monotonic()
    while not stop:
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is None:
            values.append(msg.value().decode())
        if time.monotonic() - last >= 0.5:
            last = time.monotonic()
            if values:
                emit("consumed", values=values)
                values = []
                try:
                    consumer.commit(asynchronous=False)
                except ck.KafkaException as e:
                    emit("commit_error", error=str(e))
    if values:
        emit("consumed", values=values)
    # From here on it processes nothing: close() gives its partitions up and leaves.
    emit("closing")
    consumer.close()
    emit("closed")


if __name__ == "__main__":
    main()
