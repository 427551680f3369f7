#!/usr/bin/env python3
"""Self-check of debezium.sh: real Debezium change events from Postgres, and what they look like.

    testing/kafka/broker.sh start
    testing/registry/registry.sh start       # optional: only for the Avro variant
    testing/debezium/debezium.sh start
    python3 testing/debezium/selfcheck.py    # needs confluent-kafka[avro,schemaregistry]

For each variant (JSON without schemas, JSON with schemas, Avro through the registry when it
answers) it creates a fresh schema with a table `orders` (REPLICA IDENTITY FULL) holding two
rows, registers a Debezium Postgres connector (pgoutput, snapshot.mode=initial) through
Connect's REST API, then inserts, updates, deletes, updates a primary key and truncates, and
prints every record (key, value, headers) of the table's topic as it arrives. It checks the
sequence of operations, then deletes the connector, its replication slot, publication, topic
and schema. Names carry a per-run id, so it can run repeatedly against the same servers.
Addresses come from the scripts' `address` commands (UBIK_* variables apply, UBIK_TEST_KAFKA
overrides the broker). Exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "registry"))
from connect_converters import avro_converters  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = uuid.uuid4().hex[:8]
TIMEOUT = 60.0


def address(script):
    return subprocess.run([os.path.join(HERE, script), "address"], check=True,
                          capture_output=True, text=True).stdout.split()


CONNECT, DSN = address("debezium.sh")
BOOTSTRAP = os.environ.get("UBIK_TEST_KAFKA") or address("../kafka/broker.sh")[0]
CCOMPAT = address("../registry/registry.sh")[0]  # http://127.0.0.1:PORT/apis/ccompat/v7


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def sql(*statements):
    """Runs each statement in its own transaction through psql; returns the last one's rows."""
    args = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", DSN]
    for s in statements:
        args += ["-c", s]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def rest(method, path, body=None):
    req = urllib.request.Request(CONNECT + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def registry_up():
    try:
        with urllib.request.urlopen(CCOMPAT + "/subjects", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def converters(kind):
    """Connector settings for the key and value converters of a variant."""
    if kind.startswith("json"):
        schemas = "true" if kind == "json-schemas" else "false"
        return {f"{side}.converter": "org.apache.kafka.connect.json.JsonConverter" for side in ("key", "value")} | \
               {f"{side}.converter.schemas.enable": schemas for side in ("key", "value")}
    return avro_converters(CCOMPAT)


class Decoder:
    """Turns a record's key or value into something printable (JSON text or Avro via registry)."""

    def __init__(self, kind):
        self.kind, self.schema_seen, self.ids = kind, {}, {"key": set(), "value": set()}
        if kind == "avro":
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroDeserializer
            self.avro = AvroDeserializer(SchemaRegistryClient({"url": CCOMPAT}))

    def __call__(self, data, side, topic):
        if data is None:
            return None
        if self.kind == "avro":
            from confluent_kafka.serialization import MessageField, SerializationContext
            # Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro body.
            if data[0] != 0:
                raise AssertionError(f"{side} does not begin with the magic byte 0: {data[:8]!r}")
            self.ids[side].add(int.from_bytes(data[1:5], "big"))
            field = MessageField.KEY if side == "key" else MessageField.VALUE
            return self.avro(data, SerializationContext(topic, field))
        return json.loads(data)

    def show(self, obj, side):
        """With schemas.enable=true each record repeats its schema: print each schema once."""
        if isinstance(obj, dict) and "schema" in obj and "payload" in obj:
            s = json.dumps(obj["schema"], sort_keys=True)
            if self.schema_seen.get(side) == s:
                obj = {"schema": "<as above>", "payload": obj["payload"]}
            self.schema_seen[side] = s
        return json.dumps(obj, default=str)


def payload(v):
    return v["payload"] if isinstance(v, dict) and "payload" in v else v


def run_variant(n, kind, admin):
    name = f"ubik_{RUN}_{n}"  # connector, schema, topic prefix, slot and publication
    schema, topic = name, f"{name}.{name}.orders"
    truncates = kind != "json"  # the first variant keeps Debezium's default skipped.operations
    print(f"\n=== variant {kind}: connector {name}, topic {topic}")
    sql(f"CREATE SCHEMA {schema}",
        f"CREATE TABLE {schema}.orders(id int PRIMARY KEY, merchant text, amount double precision,"
        " ts timestamp)",
        f"ALTER TABLE {schema}.orders REPLICA IDENTITY FULL",
        f"INSERT INTO {schema}.orders VALUES (1, 'acme', 10.5, '2024-01-02 03:04:05.123456'),"
        " (2, 'bolt', 20.25, '2024-01-02 03:04:06')")
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1", "database.port": DSN.rsplit(":", 1)[1].split("/")[0],
        "database.user": "postgres", "database.password": "", "database.dbname": "postgres",
        "plugin.name": "pgoutput", "slot.name": name,
        "publication.name": name, "publication.autocreate.mode": "filtered",
        "topic.prefix": name, "table.include.list": f"{schema}.orders",
        "snapshot.mode": "initial", "decimal.handling.mode": "double",
        "time.precision.mode": "connect" if kind == "json-schemas" else "adaptive_time_microseconds",
        **({"skipped.operations": "none"} if truncates else {}),
        **converters(kind),
    }
    dec = Decoder(kind)
    t0 = time.time()
    status, body = rest("POST", "/connectors", {"name": name, "config": config})
    check(status == 201, f"connector {name} registered" + ("" if status == 201 else f" ({status} {body})"))
    try:
        # The topic appears with the first snapshot record; read it from offset 0.
        deadline = time.time() + TIMEOUT
        while topic not in admin.list_topics(timeout=10).topics:
            st = rest("GET", f"/connectors/{name}/status")[1]
            if isinstance(st, dict) and any(t["state"] == "FAILED" for t in st.get("tasks", [])):
                raise AssertionError(f"connector task failed: {st['tasks'][0].get('trace', '')[:2000]}")
            if time.time() > deadline:
                raise AssertionError(f"no topic {topic} after {TIMEOUT}s: {st}")
            time.sleep(0.1)
        c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"selfcheck-{name}",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        records, dml_done = [], False

        def poll_until(pred):
            deadline = time.time() + TIMEOUT
            while not pred():
                if time.time() > deadline:
                    raise AssertionError(f"timed out; got {len(records)} records")
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                k, v = dec(m.key(), "key", topic), dec(m.value(), "value", topic)
                if not records:
                    print(f"first snapshot event {time.time() - t0:.2f}s after registration")
                records.append((k, v))
                # Every record carries __debezium.context.* headers (connector name, task,
                # run id): print only the others.
                hdrs = {h: (b or b"").decode(errors="replace") for h, b in (m.headers() or [])
                        if not h.startswith("__debezium.context.")}
                op = payload(v)["op"] if v is not None else "tombstone"
                print(f"[{m.offset()}] {op:9} key={dec.show(k, 'key')}\n{' ' * 14}value={dec.show(v, 'value')}"
                      + (f"\n{' ' * 14}headers={hdrs}" if hdrs else ""))

        ops = lambda: [payload(v)["op"] if v is not None else None for _, v in records]  # noqa: E731
        poll_until(lambda: len(records) >= 2)
        check(ops() == ["r", "r"], "snapshot: one 'r' per existing row")
        sql(f"INSERT INTO {schema}.orders VALUES (3, 'crux', 30, '2024-01-03 00:00:00'),"
            " (4, 'dyne', 40, NULL)",
            f"UPDATE {schema}.orders SET amount = 31.5 WHERE id = 3",
            f"DELETE FROM {schema}.orders WHERE id = 4",
            f"UPDATE {schema}.orders SET id = 30 WHERE id = 3",
            f"TRUNCATE {schema}.orders",
            f"INSERT INTO {schema}.orders VALUES (999, 'end', 0, NULL)")
        poll_until(lambda: any(v is not None and (payload(v).get("after") or {}).get("id") == 999
                               for _, v in records))
        expect = ["r", "r", "c", "c", "u", "d", None, "d", None, "c"] + (["t"] if truncates else []) + ["c"]
        check(ops() == expect, f"events in order {expect}")
        c.close()
        if kind == "avro":
            check(all(len(dec.ids[side]) == 1 for side in dec.ids),
                  f"all keys and values in Confluent wire format, schema ids {dec.ids}")
            with urllib.request.urlopen(CCOMPAT + "/subjects", timeout=5) as r:
                subjects = [s for s in json.load(r) if s.startswith(name)]
            print(f"registry subjects: {subjects}")
            for s in subjects:
                with urllib.request.urlopen(f"{CCOMPAT}/subjects/{s}/versions/latest", timeout=5) as r:
                    latest = json.load(r)
                print(f"{s}: {latest['schema']}")
                check(dec.ids[s.rsplit("-", 1)[1]] == {latest["id"]},
                      f"the id in the records is the registry's id of subject {s}")
    finally:
        rest("DELETE", f"/connectors/{name}")
        # The slot stays active until the task's replication connection closes.
        deadline = time.time() + TIMEOUT
        while sql(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{name}'") == "t" \
                and time.time() < deadline:
            time.sleep(0.2)
        sql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            f" WHERE slot_name = '{name}'",
            f"DROP PUBLICATION IF EXISTS {name}", f"DROP SCHEMA {schema} CASCADE")
        admin.delete_topics([topic])
    check(sql(f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{name}'") == "0",
          "connector deleted, replication slot dropped")


def main():
    t0 = time.time()
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    status, plugins = rest("GET", "/connector-plugins")
    check(status == 200 and any(p["class"].endswith("PostgresConnector") for p in plugins),
          f"Connect at {CONNECT} offers Debezium's PostgresConnector")
    check(sql("SHOW wal_level") == "logical", f"Postgres at {DSN} has wal_level=logical")
    kinds = ["json", "json-schemas"] + (["avro"] if registry_up() else [])
    if "avro" not in kinds:
        print(f"note: no registry at {CCOMPAT}: skipping the Avro variant")
    for n, kind in enumerate(kinds):
        run_variant(n, kind, admin)
    print(f"\nselfcheck passed ({', '.join(kinds)}) in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure fails the check
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
