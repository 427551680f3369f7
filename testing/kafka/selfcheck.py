#!/usr/bin/env python3
"""Self-check of the test broker started by broker.sh; documents what ubik's tests can rely on.

    pip install confluent-kafka          # in a throwaway venv
    testing/kafka/broker.sh start
    python3 testing/kafka/selfcheck.py [BOOTSTRAP]   # default 127.0.0.1:${UBIK_KAFKA_PORT:-39092}

Checks: topic creation with 4 partitions; keyed produce (idempotent) and group consume, with
per-key partitioning and order; transactions: an aborted transaction is invisible to a
read_committed consumer (yet its records are in the log), an open one stays invisible until
committed, a committed one is visible; consumer offsets committed inside a transaction; a
second producer with the same transactional.id fences the first. Exits non-zero on failure.
Topic names are unique per run, so it can run repeatedly against the same broker. The fencing
step makes librdkafka log "Fatal error ... fenced" on stderr: that is the expected outcome.
"""
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = sys.argv[1] if len(sys.argv) > 1 else f"127.0.0.1:{os.environ.get('UBIK_KAFKA_PORT', '39092')}"
RUN = uuid.uuid4().hex[:8]
TIMEOUT = 30.0


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def consume(conf, n, topic, partitions=None, wait=TIMEOUT):
    """Returns the first n records (key, value, partition) seen, or fewer after `wait` s.
    With `partitions`, reads them from offset 0 without a group; else joins conf's group."""
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "group.id": f"selfcheck-unused-{RUN}", **conf})
    if partitions is not None:
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
    else:
        c.subscribe([topic])
    out, deadline = [], time.time() + wait
    while len(out) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise KafkaException(m.error())
        out.append((m.key().decode(), m.value().decode(), m.partition()))
    if partitions is None and out:
        c.commit(asynchronous=False)
    c.close()
    return out


def produce(p, topic, records):
    for k, v in records:
        p.produce(topic, key=k, value=v)
    check(p.flush(TIMEOUT) == 0, f"{len(records)} records to {topic} delivered")


def main():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    keyed, tx = f"selfcheck-keyed-{RUN}", f"selfcheck-tx-{RUN}"
    for f in admin.create_topics([NewTopic(keyed, 4, 1), NewTopic(tx, 1, 1)]).values():
        f.result(TIMEOUT)
    parts = admin.list_topics(keyed, timeout=TIMEOUT).topics[keyed].partitions
    check(len(parts) == 4, f"topic {keyed} has 4 partitions")

    # Keyed records through an idempotent producer, read back by a consumer group.
    errors = []
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True,
                  "error_cb": errors.append})
    sent = [(f"k{i % 8}", f"v{i}") for i in range(40)]
    produce(p, keyed, sent)
    check(not errors, f"the idempotent producer reported no errors {errors}")
    got = consume({"group.id": f"selfcheck-{RUN}"}, len(sent), topic=keyed)
    check(sorted((k, v) for k, v, _ in got) == sorted(sent), "a consumer group read all 40 records")
    check(all(len({pt for k2, _, pt in got if k2 == k}) == 1 for k, _ in sent),
          "each key maps to a single partition")
    check(len({pt for _, _, pt in got}) > 1, "keys spread over several partitions")
    check(all([v for k2, v, _ in got if k2 == k] == [v for k2, v in sent if k2 == k] for k, _ in sent),
          "records of each key arrive in the order produced")
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"selfcheck-{RUN}"})
    committed = c.committed([TopicPartition(keyed, i) for i in range(4)], timeout=TIMEOUT)
    c.close()
    check(sum(tp.offset for tp in committed if tp.offset > 0) == len(sent),
          "group offsets committed for all 40 records")

    # Transactions: aborted, then open, then committed, on a 1-partition topic (one order).
    tid = f"selfcheck-txn-{RUN}"
    p1 = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": tid})
    p1.init_transactions(TIMEOUT)
    p1.begin_transaction()
    produce(p1, tx, [("a", "aborted-1"), ("a", "aborted-2")])
    p1.abort_transaction(TIMEOUT)
    p1.begin_transaction()
    produce(p1, tx, [("o", "open-1")])
    rc, ru = {"isolation.level": "read_committed"}, {"isolation.level": "read_uncommitted"}
    values = [v for _, v, _ in consume(ru, 3, tx, [0])]
    check(values == ["aborted-1", "aborted-2", "open-1"], "read_uncommitted sees aborted and open records")
    check(consume(rc, 1, tx, [0], wait=3) == [], "read_committed sees neither")
    p1.commit_transaction(TIMEOUT)
    p1.begin_transaction()
    produce(p1, tx, [("c", "committed-1")])
    p1.commit_transaction(TIMEOUT)
    values = [v for _, v, _ in consume(rc, 2, tx, [0])]
    check(values == ["open-1", "committed-1"],
          f"once committed, read_committed sees them, still without the aborted ones (got {values})")

    # Fencing: a second producer with the same transactional.id takes over.
    p1.begin_transaction()
    p1.produce(tx, key="z", value="zombie")
    p1.flush(5)
    p2 = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": tid})
    p2.init_transactions(TIMEOUT)  # bumps the epoch and aborts p1's open transaction
    try:
        p1.produce(tx, key="z", value="zombie-2")
        p1.commit_transaction(TIMEOUT)
        fenced = None
    except KafkaException as e:
        fenced = e.args[0]
    check(fenced is not None and fenced.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                                   KafkaError.INVALID_PRODUCER_EPOCH),
          f"first producer is fenced ({fenced.name() if fenced else 'no error'})")
    # The new producer commits a transaction that includes a consumer group's offsets.
    group = f"selfcheck-eos-{RUN}"
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    p2.begin_transaction()
    produce(p2, tx, [("n", "new-owner")])
    p2.send_offsets_to_transaction([TopicPartition(tx, 0, 3)], c.consumer_group_metadata(), TIMEOUT)
    p2.commit_transaction(TIMEOUT)
    got = c.committed([TopicPartition(tx, 0)], timeout=TIMEOUT)[0].offset
    c.close()
    check(got == 3, "offsets sent to the transaction are committed with it")
    values = [v for _, v, _ in consume(rc, 3, tx, [0])]
    check(values == ["open-1", "committed-1", "new-owner"],
          f"read_committed never sees the fenced producer's records (got {values})")

    admin.delete_topics([keyed, tx])
    print(f"selfcheck passed against {BOOTSTRAP}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure fails the check
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
