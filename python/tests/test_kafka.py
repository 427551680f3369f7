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
    # Idempotence keeps each partition in produce order even when a batch is
    # retried (a topic just created may refuse the first one): the events'
    # time order per partition is what the lateness bound assumes.
    p = Producer({"bootstrap.servers": broker, "linger.ms": 5, "enable.idempotence": True})
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


def test_kafka_topic_joined_with_an_arrow_table(kafka_broker):
    """Orders from a topic enriched with an in-process Arrow table of
    merchant versions (a temporal join), against DuckDB's ASOF JOIN."""
    import datetime as dt

    import duckdb
    import pyarrow as pa

    rows = events(3000, keys=8, step_ms=200, disorder_ms=2000, seed=12, nulls=False)
    topic = f"py-join-{uuid.uuid4().hex[:8]}"
    produce(kafka_broker, topic, rows)
    base = min(r["ts"] for r in rows)
    merchants = pa.table({
        "id": [f"m{k:03d}" for k in range(8)] * 3,
        "region": [f"r{(k * 7 + v) % 3}" for v in range(3) for k in range(8)],
        "ts": pa.array([base + dt.timedelta(minutes=4 * v, milliseconds=k) - dt.timedelta(seconds=10)
                        for v in range(3) for k in range(8)], pa.timestamp("us", tz="UTC")),
    })
    sql = ("SELECT m.region, TUMBLE(o.ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(o.amount) AS total "
           "FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id "
           "GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1 MINUTE')")
    got = ubik.stream(sql, from_={"orders": f"kafka://{kafka_broker}/{topic}?start=earliest&end=latest",
                                  "merchants": merchants},
                      schema={"orders": SCHEMA}, lateness="5s").arrow()
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    con.register("orders", to_table(rows))
    con.register("merchants", merchants)
    want = con.sql("SELECT m.region, time_bucket(INTERVAL '1 minute', o.ts) AS w, count(*) AS n, "
                   "sum(o.amount) AS total FROM orders o ASOF JOIN merchants m "
                   "ON o.merchant = m.id AND o.ts >= m.ts GROUP BY ALL").arrow()
    want = want.read_all() if isinstance(want, pa.RecordBatchReader) else want
    assert got.num_rows > 0
    assert_same(got, want, ["region", "w"])
