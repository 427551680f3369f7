"""Avro topics behind a real schema registry (Apicurio, Confluent's API) and a
real broker, written and read by Confluent's own Python serializers (fastavro):
Avro in (records of two schema versions, resolved to the latest, with bad
records among them), Avro out and Kafka Connect's JSON out, each folded and
compared with DuckDB's one-shot answer over the same rows; and a subject
whose rule refuses the query's schema."""
import json
import os
import subprocess
import uuid

import numpy as np
import pyarrow as pa
import pytest
import ubik
from conftest import BASE, assert_same, duck, events

V1 = {"type": "record", "name": "order", "fields": [
    {"name": "merchant", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": ["null", "float"], "default": None},
    {"name": "note", "type": "string"},
]}
# v2: amount widened to double, note removed, qty added with a default.
V2 = {"type": "record", "name": "order", "fields": [
    {"name": "merchant", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": ["null", "double"], "default": None},
    {"name": "qty", "type": "long", "default": 1},
]}
Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, "
     "sum(qty) AS qty FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
ORACLE = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, sum(amount) AS total, "
          "sum(qty) AS qty FROM orders GROUP BY ALL")
BIN = os.environ.get("UBIK_BIN", "ubik")


def produce_avro(broker, registry, topic, rows, junk=()):
    """The first half of `rows` with schema v1, the rest with v2 (as the
    topic's producers upgrade), plus `junk` raw values; returns the rows as
    a reader of v2 sees them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    client = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": broker, "linger.ms": 5, "enable.idempotence": True})
    seen = []
    half = len(rows) // 2
    for version, part in ((V1, rows[:half]), (V2, rows[half:])):
        serialize = AvroSerializer(client, json.dumps(version))
        for i, r in enumerate(part):
            if version is V1:
                record = {**r, "note": f"n{i}"}
                # A float travels as 32 bits: the reader widens that.
                amount = None if r["amount"] is None else float(np.float32(r["amount"]))
                seen.append({**r, "amount": amount, "qty": 1})
            else:
                record = {**r, "qty": i % 7}
                seen.append(record)
            p.produce(topic, key=r["merchant"].encode(), value=serialize(record, ctx))
        p.flush(30)
    for value in junk:
        p.produce(topic, key=b"junk", value=value)
    assert p.flush(30) == 0
    return seen


def table_of(rows):
    return pa.table({
        "merchant": pa.array([r["merchant"] for r in rows], pa.string()),
        "ts": pa.array([r["ts"] for r in rows], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([r["amount"] for r in rows], pa.float64()),
        "qty": pa.array([r["qty"] for r in rows], pa.int64()),
    })


def test_avro_topic_of_two_schema_versions_equals_oracle(kafka_broker, registry):
    rows = events(3000, keys=9, step_ms=200, disorder_ms=2000, seed=21)
    topic = f"py-avro-{uuid.uuid4().hex[:8]}"
    junk = [b'{"merchant":"m000"}', b"\x00\x00\x01\x86\xa0\x02"]  # JSON; an unknown schema id (100000)
    seen = produce_avro(kafka_broker, registry, topic, rows, junk)
    url = f"kafka://{kafka_broker}/{topic}?format=avro&registry={registry}"
    planned = ubik.validate(Q, url, table="orders")
    assert planned.names == ["merchant", "w", "n", "total", "qty"]
    assert planned.field("qty").type == pa.int64()
    letters = []
    got = ubik.stream(Q, from_=f"kafka://{kafka_broker}/{topic}?end=latest&format=avro&registry={registry}",
                      table="orders", lateness="5s", on_error="dlq",
                      on_dead_letter=letters.append).arrow()
    assert got.schema.field("w").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("qty").type == pa.int64()
    assert_same(got, duck(ORACLE, table_of(seen)), ["merchant", "w"])
    reasons = sorted(d.message for d in letters)
    assert len(reasons) == 2, reasons
    assert any("magic byte" in m for m in reasons), reasons
    assert any("unknown schema id 100000" in m for m in reasons), reasons


def consume(broker, topic):
    """Every record of `topic`, (key bytes, value bytes or None), in order."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker, "group.id": f"t-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    meta = c.list_topics(topic, timeout=20).topics[topic]
    out = []
    for p in meta.partitions:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)
        if hi <= lo:
            continue
        c.assign([TopicPartition(topic, p, lo)])
        while True:
            m = c.poll(10)
            assert m is not None, "timed out reading the output"
            if m.error():
                continue
            out.append((m.key(), m.value()))
            if m.offset() >= hi - 2:  # the last record may be a transaction marker
                break
    c.close()
    return out


def run_cli(args, timeout=180):
    return subprocess.run([BIN, "run", *args], capture_output=True, text=True, timeout=timeout)


def test_avro_and_connect_json_out_fold_to_the_oracle(kafka_broker, registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    rows = events(2000, keys=6, step_ms=300, disorder_ms=2000, seed=22)
    topic = f"py-avro-in-{uuid.uuid4().hex[:8]}"
    seen = produce_avro(kafka_broker, registry, topic, rows)
    want = duck(ORACLE, table_of(seen))
    source = f"kafka://{kafka_broker}/{topic}?end=latest&format=avro&registry={registry}"
    out_avro, out_connect = f"{topic}-avro", f"{topic}-connect"
    for out, fmt in ((out_avro, f"format=avro&registry={registry}"), (out_connect, "format=json-connect")):
        r = run_cli([Q, "--from", f"orders={source}", "--lateness", "5s",
                     "--to", f"kafka://{kafka_broker}/{out}?{fmt}"])
        assert r.returncode == 0, r.stderr[-3000:]

    client = SchemaRegistryClient({"url": registry})

    def avro_types(subject):
        fields = json.loads(client.get_latest_version(subject).schema.schema_str)["fields"]
        # A nullable column (as the result schema says) is the union ["null", T].
        return {f["name"]: [t for t in f["type"] if t != "null"][0] if isinstance(f["type"], list) else f["type"]
                for f in fields}

    types = avro_types(f"{out_avro}-value")
    assert types["w"] == {"type": "long", "logicalType": "timestamp-micros"}, types
    assert types["n"] == "long" and types["total"] == "double", types
    key_schema = json.loads(client.get_latest_version(f"{out_avro}-key").schema.schema_str)
    assert [f["name"] for f in key_schema["fields"]] == ["merchant", "w"]
    key_de = AvroDeserializer(client)
    value_de = AvroDeserializer(client)
    latest = {}
    for k, v in consume(kafka_broker, out_avro):
        key = key_de(k, SerializationContext(out_avro, MessageField.KEY))
        latest[(key["merchant"], key["w"])] = None if v is None else value_de(
            v, SerializationContext(out_avro, MessageField.VALUE))
    got = pa.Table.from_pylist([v for v in latest.values() if v is not None])
    assert_same(got, want, ["merchant", "w"])

    # timestamp_unit=ms: `w` as timestamp-millis (what Kafka Connect's Avro
    # converters read as a Timestamp), the same rows (windows are whole ms).
    out_millis = f"{topic}-avro-ms"
    r = run_cli([Q, "--from", f"orders={source}", "--lateness", "5s", "--to",
                 f"kafka://{kafka_broker}/{out_millis}?format=avro&registry={registry}&timestamp_unit=ms"])
    assert r.returncode == 0, r.stderr[-3000:]
    for part in ("key", "value"):
        w = avro_types(f"{out_millis}-{part}")["w"]
        assert w == {"type": "long", "logicalType": "timestamp-millis"}, w
    latest = {}
    for k, v in consume(kafka_broker, out_millis):
        key = key_de(k, SerializationContext(out_millis, MessageField.KEY))
        latest[(key["merchant"], key["w"])] = None if v is None else value_de(
            v, SerializationContext(out_millis, MessageField.VALUE))
    assert_same(pa.Table.from_pylist([v for v in latest.values() if v is not None]), want, ["merchant", "w"])

    latest = {}
    for k, v in consume(kafka_broker, out_connect):
        key = json.loads(k)
        assert key["schema"]["type"] == "struct"
        value = None if v is None else json.loads(v)
        latest[json.dumps(key["payload"], sort_keys=True)] = value
    values = [v for v in latest.values() if v is not None]
    fields = {f["field"]: f for f in values[0]["schema"]["fields"]}
    assert fields["w"]["name"] == "org.apache.kafka.connect.data.Timestamp" and fields["w"]["type"] == "int64"
    assert fields["n"]["type"] == "int64" and fields["total"]["type"] == "double"
    payloads = [{**v["payload"], "w": BASE.fromtimestamp(v["payload"]["w"] / 1000, tz=BASE.tzinfo)} for v in values]
    assert_same(pa.Table.from_pylist(payloads), want, ["merchant", "w"])


def test_a_subject_whose_rule_refuses_the_schema_stops_before_any_record(kafka_broker, registry):
    import urllib.request

    rows = events(200, keys=3, seed=23)
    topic = f"py-avro-rule-{uuid.uuid4().hex[:8]}"
    produce_avro(kafka_broker, registry, topic, rows)
    out = f"{topic}-out"

    def call(method, path, body):
        req = urllib.request.Request(f"{registry}{path}", data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        return json.loads(urllib.request.urlopen(req, timeout=10).read())

    taken = {"type": "record", "name": "other", "fields": [{"name": "merchant", "type": "long"}]}
    call("POST", f"/subjects/{out}-value/versions", {"schema": json.dumps(taken)})
    call("PUT", f"/config/{out}-value", {"compatibility": "BACKWARD"})
    r = run_cli([Q, "--from", f"orders=kafka://{kafka_broker}/{topic}?end=latest&format=avro&registry={registry}",
                 "--to", f"kafka://{kafka_broker}/{out}?format=avro&registry={registry}"])
    assert r.returncode != 0
    assert f"subject {out}-value refuses" in r.stderr and "BACKWARD" in r.stderr, r.stderr[-2000:]
    from confluent_kafka.admin import AdminClient
    topics = AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=20).topics
    assert out not in topics or not consume(kafka_broker, out), "records were written"


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_registry_only_with_avro(fmt, kafka_broker, registry):
    q = "SELECT merchant FROM orders"
    url = f"kafka://{kafka_broker}/nowhere?end=latest&registry={registry}" + ("&format=avro" if fmt == "avro" else "")
    with pytest.raises(Exception) as e:
        ubik.stream(q, from_=url, table="orders").arrow()
    if fmt == "avro":
        assert "has no subject nowhere-value" in str(e.value)
    else:
        assert "registry= is for format=avro" in str(e.value)


def test_debezium_avro_needs_an_envelope_and_a_key(kafka_broker, registry):
    """format=debezium-avro over a plain Avro topic: without a key subject the
    primary key is unknown; with one declared the value is no envelope. Both
    stop before any record, saying what to do."""
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    produce_avro(kafka_broker, registry, topic, events(10))
    url = f"orders=kafka://{kafka_broker}/{topic}?end=latest&format=debezium-avro&registry={registry}"
    q = "SELECT merchant, count(*) AS n FROM orders GROUP BY merchant"
    r = subprocess.run([BIN, "run", q, "--from", url], capture_output=True, text=True, timeout=90)
    assert r.returncode != 0
    assert f"no subject {topic}-key" in r.stderr and "PRIMARY KEY" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([BIN, "run", q, "--from", url, "--schema", "orders=merchant VARCHAR PRIMARY KEY"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode != 0
    assert "not Debezium's envelope" in r.stderr and "format=avro" in r.stderr, r.stderr[-2000:]
