"""Real change data capture: PostgreSQL (wal_level=logical) -> Debezium's
PostgreSQL connector in Kafka Connect -> a real broker -> ubik. Two
connectors capture the same table: one with JsonConverter (schemas on, as
Connect's default) read with format=debezium-json, one with Apicurio's
AvroConverter (Confluent's wire format, key and value registered in the
test registry) read with format=debezium-avro, whose columns and primary
key come from the registry alone. Both run Debezium's default
time.precision.mode, so the TIMESTAMP column is its microsecond type: the
JSON events name it in their schema, and a copy of them without schemas (as
`schemas.enable=false` writes them) is read with timestamp_unit=us.

The table's history holds a snapshot, inserts, updates that move rows
between groups, deletes, an update of the primary key (Debezium's delete,
tombstone and create), a truncate and rows written again. The table keeps
PostgreSQL's default replica identity, so updates carry no old row: ubik
keeps each key's current row itself.

Debezium skips the truncate (its default `skipped.operations=t`), so the
change stream's table keeps the rows the truncate removed. The oracle is
PostgreSQL running the same query over a mirror of the table that row
triggers keep (a TRUNCATE fires none): the table as its change stream
describes it. The changes start only once both connectors streamed their
snapshot, so the truncate is always in the stream, never before a
snapshot that would hide it."""
import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing" / "registry"))
from connect_converters import avro_converters  # noqa: E402

BIN = os.environ.get("UBIK_BIN", "ubik")
TIMEOUT = 90


def psql(dsn, *statements):
    args = ["psql", "-X", "-q", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", dsn]
    for s in statements:
        args += ["-c", s]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def rest(connect, method, path, body=None):
    req = urllib.request.Request(connect + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def json_after(value):
    v = json.loads(value)
    return (v or {}).get("payload", {}).get("after") or {}


def wait_for(topic, broker, marker_id, connect, name, after=json_after):
    """Reads `topic` until the create of `marker_id` arrives (`after` reads
    an event's new row); returns the record count."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker})
    deadline = time.time() + TIMEOUT
    while topic not in admin.list_topics(timeout=10).topics:
        status = rest(connect, "GET", f"/connectors/{name}/status")[1]
        if isinstance(status, dict) and any(t["state"] == "FAILED" for t in status.get("tasks", [])):
            raise AssertionError(f"connector failed: {status['tasks'][0].get('trace', '')[:2000]}")
        assert time.time() < deadline, f"no topic {topic} after {TIMEOUT}s: {status}"
        time.sleep(0.2)
    c = Consumer({"bootstrap.servers": broker, "group.id": f"wait-{name}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    try:
        while time.time() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            n += 1
            if m.value() and (after(m.value()) or {}).get("id") == marker_id:
                return n
        raise AssertionError(f"the marker row {marker_id} did not arrive within {TIMEOUT}s ({n} records)")
    finally:
        c.close()


def fold(stdout):
    """The latest value per key of ubik's changelog on stdout (tombstones delete)."""
    state = {}
    for line in stdout.splitlines():
        r = json.loads(line)
        key = json.dumps(r["key"], sort_keys=True)
        if r.get("value") is None:
            state.pop(key, None)
        else:
            state[key] = r["value"]
    return state


def ubik_run(sql, source, schema=None):
    columns = ["--schema", schema] if schema else []
    p = subprocess.run([BIN, "run", sql, "--from", source, *columns, "--on-error", "fail"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return fold(p.stdout)


def test_debezium_changes_fold_to_postgres_own_answer(kafka_broker, registry, debezium):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    connect, dsn = debezium
    name = f"ubik_cdc_{uuid.uuid4().hex[:8]}"
    schema, topic = name, f"{name}.{name}.orders"
    psql(dsn, f"CREATE SCHEMA {schema}",
         f"CREATE TABLE {schema}.orders(id int PRIMARY KEY, merchant text, amount double precision,"
         " qty int, ts timestamp)",
         f"CREATE TABLE {schema}.mirror (LIKE {schema}.orders INCLUDING ALL)",
         f"""CREATE FUNCTION {schema}.mirror() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF TG_OP IN ('DELETE', 'UPDATE') THEN DELETE FROM {schema}.mirror WHERE id = OLD.id; END IF;
               IF TG_OP IN ('INSERT', 'UPDATE') THEN
                 INSERT INTO {schema}.mirror SELECT NEW.* ON CONFLICT (id) DO UPDATE SET merchant = EXCLUDED.merchant,
                   amount = EXCLUDED.amount, qty = EXCLUDED.qty, ts = EXCLUDED.ts;
               END IF;
               RETURN NULL;
             END $$""",
         f"CREATE TRIGGER mirror AFTER INSERT OR UPDATE OR DELETE ON {schema}.orders"
         f" FOR EACH ROW EXECUTE FUNCTION {schema}.mirror()",
         f"INSERT INTO {schema}.orders SELECT i, 'm' || (i % 4), (i * 7 % 50) + 0.25, i % 5,"
         " TIMESTAMP '2024-01-01 00:00:00' + i * INTERVAL '1 second' FROM generate_series(1, 40) i")
    port = dsn.rsplit(":", 1)[1].split("/")[0]
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1", "database.port": port,
        "database.user": "postgres", "database.password": "", "database.dbname": "postgres",
        "plugin.name": "pgoutput", "slot.name": name,
        "publication.name": name, "publication.autocreate.mode": "filtered",
        "topic.prefix": name, "table.include.list": f"{schema}.orders",
        "snapshot.mode": "initial", "decimal.handling.mode": "double",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    }
    avro_name = f"{name}_avro"
    # Debezium's default time.precision.mode: TIMESTAMP columns are io.debezium.time.MicroTimestamp.
    avro_config = config | avro_converters(registry) | {
        "slot.name": avro_name, "publication.name": avro_name, "topic.prefix": avro_name}
    for n, c in ((name, config), (avro_name, avro_config)):
        status, body = rest(connect, "POST", "/connectors", {"name": n, "config": c})
        assert status == 201, body
    try:
        t = f"{schema}.orders"
        avro_topic = f"{avro_name}.{schema}.orders"
        deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry}))
        avro_after = lambda v: deserialize(v, SerializationContext(avro_topic, MessageField.VALUE))["after"]  # noqa: E731
        # Both snapshots streamed (row 40 is the snapshot's last): what follows is streamed as changes.
        wait_for(topic, kafka_broker, 40, connect, name)
        wait_for(avro_topic, kafka_broker, 40, connect, avro_name, after=avro_after)
        psql(dsn,
             f"INSERT INTO {t} VALUES (41, 'm9', 3.5, 2, '2024-01-01 00:01:00')",
             f"UPDATE {t} SET amount = amount + 100 WHERE id % 3 = 0",
             f"UPDATE {t} SET merchant = 'm1' WHERE id % 7 = 0",
             f"DELETE FROM {t} WHERE id % 5 = 0",
             f"UPDATE {t} SET id = id + 1000 WHERE id IN (1, 2)",
             f"UPDATE {t} SET amount = 999.5 WHERE id = 1001",
             f"DELETE FROM {t} WHERE merchant = 'm9'",
             f"TRUNCATE {t}",
             f"INSERT INTO {t} SELECT i, 'm' || (i % 3), i * 1.5, i % 4,"
             " TIMESTAMP '2024-01-01 00:02:00' + i * INTERVAL '1 second' FROM generate_series(1, 30) i",
             f"UPDATE {t} SET amount = amount * 2 WHERE id < 10",
             f"DELETE FROM {t} WHERE id BETWEEN 20 AND 24",
             f"INSERT INTO {t} VALUES (100000, 'm0', 0.5, 1, '2024-01-01 00:03:00')")
        events = wait_for(topic, kafka_broker, 100000, connect, name)
        wait_for(avro_topic, kafka_broker, 100000, connect, avro_name, after=avro_after)
        plain_topic = f"{name}_plain"
        schemaless_copy(kafka_broker, topic, plain_topic, events)
        columns = "id INT PRIMARY KEY, merchant VARCHAR, amount DOUBLE, qty INT, ts TIMESTAMP"
        # Debezium's Avro: the columns and the primary key come from the registry.
        sources = [(f"orders=kafka://{kafka_broker}/{topic}?format=debezium-json&end=latest", columns),
                   (f"orders=kafka://{kafka_broker}/{avro_topic}?format=debezium-avro&registry={registry}"
                    "&end=latest", None),
                   (f"orders=kafka://{kafka_broker}/{plain_topic}?format=debezium-json&timestamp_unit=us"
                    "&end=latest", columns)]
        for source, declared in sources:
            check_queries(source, declared, dsn, f"{schema}.mirror")

        # A window cannot take a row back: refused before anything is read.
        source = sources[0][0]
        p = subprocess.run([BIN, "run", "SELECT merchant, TUMBLE(ts, INTERVAL '1' MINUTE) AS w, count(*) AS n "
                            "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1' MINUTE)",
                            "--from", source, "--schema", columns], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "changelog" in p.stderr and "continuous" in p.stderr, p.stderr

        # The registry's table is what validate shows.
        p = subprocess.run([BIN, "validate", "SELECT * FROM orders", "--from", sources[1][0]],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        columns = "columns of orders: id Int32, merchant Utf8, amount Float64, qty Int32, ts Timestamp"
        assert columns in p.stdout and "key: [id]" in p.stdout and "changelog" in p.stdout, p.stdout
        # And Python's: the URL stands for the schema, which the registry gives.
        import ubik
        got = ubik.validate("SELECT merchant, count(*) AS n FROM orders GROUP BY merchant",
                            sources[1][0].removeprefix("orders="))
        assert ubik.key_columns(got) == ["merchant"]
        assert b"changelog" in got.metadata[b"ubik.kind"], got.metadata
    finally:
        for n in (name, avro_name):
            drop_connector(connect, dsn, n)
        psql(dsn, f"DROP SCHEMA {schema} CASCADE")


def schemaless_copy(broker, topic, to, count):
    """Copies the first `count` records of `topic` to `to` as JsonConverter
    writes them with schemas.enable=false: the payloads of key and value."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    c = Consumer({"bootstrap.servers": broker, "group.id": f"copy-{to}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    p = Producer({"bootstrap.servers": broker})
    payload = lambda b: None if b is None else json.dumps(json.loads(b)["payload"], separators=(",", ":")).encode()  # noqa: E731
    deadline, copied = time.time() + TIMEOUT, 0
    try:
        while copied < count:
            assert time.time() < deadline, f"copied {copied} of {count} records of {topic}"
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            p.produce(to, key=payload(m.key()), value=payload(m.value()))
            copied += 1
        assert p.flush(30) == 0
    finally:
        c.close()


def check_queries(source, columns, dsn, t):
    """The GROUP BY and pass-through over `source` equal PostgreSQL's answer over table `t`
    (the mirror: the table as its change stream describes it)."""
    # A continuous GROUP BY takes updated and deleted rows back out.
    got = ubik_run("SELECT merchant, count(*) AS n, sum(amount) AS total, min(amount) AS lo, "
                   "max(amount) AS hi, sum(qty) AS q, max(ts) AS last FROM orders GROUP BY merchant",
                   source, columns)
    for v in got.values():  # the time as epoch seconds, as PostgreSQL gives it below
        v["last"] = datetime.datetime.fromisoformat(v["last"]).timestamp()
    rows = psql(dsn, f"SELECT merchant, count(*), sum(amount), min(amount), max(amount), sum(qty), "
                     f"extract(epoch FROM max(ts)) FROM {t} GROUP BY merchant")
    want = {}
    for line in rows.splitlines():
        m, n, total, lo, hi, q, last = line.split("\t")
        want[json.dumps({"merchant": m})] = {"merchant": m, "n": int(n), "total": float(total),
                                             "lo": float(lo), "hi": float(hi), "q": int(q),
                                             "last": float(last)}
    assert len(want) >= 3
    assert got == want

    # A pass-through is an upsert changelog of the table keyed by its primary key.
    got = ubik_run("SELECT id, merchant, amount FROM orders", source, columns)
    rows = psql(dsn, f"SELECT id, merchant, amount FROM {t}")
    want = {json.dumps({"id": int(i)}): {"id": int(i), "merchant": m, "amount": float(a)}
            for i, m, a in (line.split("\t") for line in rows.splitlines())}
    assert got == want


def drop_connector(connect, dsn, name):
    rest(connect, "DELETE", f"/connectors/{name}")
    deadline = time.time() + TIMEOUT
    while psql(dsn, f"SELECT active FROM pg_replication_slots WHERE slot_name = '{name}'") == "t" \
            and time.time() < deadline:
        time.sleep(0.2)
    psql(dsn, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{name}'",
         f"DROP PUBLICATION IF EXISTS {name}")
