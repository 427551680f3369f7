"""A bounded Kafka range through the Arrow leg: stream(kafka://...?end=latest).arrow()
against DuckDB one-shot over the same events. Needs the test broker
(scripts/test.sh starts it and sets UBIK_TEST_KAFKA); without it the test
fails, unless UBIK_TEST_SKIP contains kafka (see the kafka_broker fixture)."""
import json
import uuid

import ubik
from conftest import SCHEMA, assert_same, duck, events, to_table

Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
ORACLE = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, sum(amount) AS total "
          "FROM orders GROUP BY ALL")


def produce(broker, topic, rows, partitions=4):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    p = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    for r in rows:
        value = json.dumps({**r, "ts": r["ts"].isoformat().replace("+00:00", "Z")})
        p.produce(topic, key=r["merchant"].encode(), value=value.encode())
    assert p.flush(30) == 0, "events not delivered to the test broker"


def test_bounded_kafka_range_equals_oracle(kafka_broker):
    rows = events(4000, keys=12, step_ms=200, disorder_ms=3000, seed=11)
    topic = f"py-orders-{uuid.uuid4().hex[:8]}"
    produce(kafka_broker, topic, rows)
    got = ubik.stream(Q, from_=f"kafka://{kafka_broker}/{topic}?start=earliest&end=latest", schema=SCHEMA,
                      table="orders", lateness="5s").arrow()
    assert_same(got, duck(ORACLE, to_table(rows)), ["merchant", "w"])
