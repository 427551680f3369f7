#!/usr/bin/env python3
"""Helper of check.sh (run with scripts/python-env.sh's python).

    check.py config FORMAT TOPIC TABLE WAREHOUSE CCOMPAT RUN
        prints the Iceberg sink's connector config (JSON) and creates its control topic
    check.py verify FORMAT TOPIC TABLE WAREHOUSE CCOMPAT CONNECTOR
        reads the topic, waits until the Iceberg table holds as many rows as the topic records (or
        $TIMEOUT seconds), prints the table's schema and exits 0 when the types are right
        (w timestamp, n long, total double) and the rows match (see below).

The sink appends: Iceberg's own Kafka Connect sink (1.11.0) has no upsert or CDC mode (those were
in Tabular's original connector only; `iceberg.tables.upsert-mode-enabled` is not a setting of
it), so every changelog record becomes a row. Two checks follow: the table's rows equal the
topic's values as a multiset (every record, in append mode), and the table's latest row per key
(the one with the largest n: this query's counts only grow, as its input only inserts) equals
the topic's latest value per key, i.e. what ubik's changelog means. The table is read from its
metadata files (Hadoop catalog: WAREHOUSE/<ns>/<name>/metadata) with pyiceberg.
"""
import datetime
import glob
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testing", "registry"))
from connect_converters import avro_converters  # noqa: E402

# The result's key. Not given to the sink: its iceberg.tables.default-id-columns only matters for
# upsert/CDC writes, which the Apache sink (1.11.0) lacks, and its auto-create ignores it (the
# table gets no identifier fields).
ID_COLUMNS = ["merchant", "w"]
WANT = {"merchant": ("string",), "w": ("timestamp", "timestamptz"), "n": ("long",),
        "total": ("double",)}


def converters(fmt, ccompat):
    """As testing/debezium/selfcheck.py's converters()."""
    if fmt == "json-connect":
        return {f"{s}.converter": "org.apache.kafka.connect.json.JsonConverter" for s in ("key", "value")} | \
               {f"{s}.converter.schemas.enable": "true" for s in ("key", "value")}
    return avro_converters(ccompat)


def config(fmt, topic, table, warehouse, ccompat, run):
    control = f"ice-control-{run}"
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": os.environ["BOOTSTRAP"]})
    if control not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(control, 1, 1)]).values():
            try:
                f.result()
            except Exception as e:  # created meanwhile by the other format's run
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise
    conf = {
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": "1",
        "topics": topic,
        "iceberg.tables": table,
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.tables.evolve-schema-enabled": "true",
        "iceberg.catalog.type": "hadoop",
        "iceberg.catalog.warehouse": "file://" + os.path.abspath(warehouse),
        "iceberg.control.topic": control,
        "iceberg.control.commit.interval-ms": "1000",
        "iceberg.control.commit.timeout-ms": "10000",
        "consumer.override.auto.offset.reset": "earliest",
        "consumer.override.isolation.level": "read_committed",
        **converters(fmt, ccompat),
    }
    print(json.dumps(conf))


def micros(v):
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        return round(v.timestamp() * 1_000_000)
    return v


def expected(fmt, topic, ccompat):
    """The topic's latest value per key (None: deleted)."""
    from confluent_kafka import Consumer, TopicPartition
    dec = None
    if fmt == "avro":
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        avro = AvroDeserializer(SchemaRegistryClient({"url": ccompat}))
        dec = lambda b, f: None if b is None else avro(b, SerializationContext(topic, f))
    else:
        def dec(b, f):
            if b is None:
                return None
            p = json.loads(b)["payload"]
            return p and {k: (v * 1000 if k == "w" else v) for k, v in p.items()}  # ms -> µs
        MessageField = type("F", (), {"KEY": "key", "VALUE": "value"})
    c = Consumer({"bootstrap.servers": os.environ["BOOTSTRAP"], "group.id": f"check-{topic}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    # ubik's last transaction is committed when it exits, but the broker writes the commit
    # markers into the partitions a moment later: wait until the last stable offset (what a
    # read_committed consumer sees as the end) reaches the high watermark.
    u = Consumer({"bootstrap.servers": os.environ["BOOTSTRAP"], "group.id": f"check-{topic}-u",
                  "isolation.level": "read_uncommitted"})
    for p in parts:
        deadline = time.time() + 30
        while (c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
               < u.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]):
            if time.time() > deadline:
                raise AssertionError(f"{topic}[{p}]: an open transaction after 30 s")
            time.sleep(0.2)
    u.close()
    latest, n, value_schema, values = {}, 0, None, []
    for p in parts:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        if hi <= lo:
            continue
        c.assign([TopicPartition(topic, p, lo)])
        deadline = time.time() + 30
        while True:
            m = c.poll(0.5)
            if m is None:  # the end: past the last record (and its transaction's marker)?
                if c.position([TopicPartition(topic, p)])[0].offset >= hi:
                    break
                if time.time() > deadline:
                    raise AssertionError(f"{topic}[{p}]: could not read up to offset {hi}")
                continue
            if m.error():
                continue
            if fmt == "json-connect" and value_schema is None and m.value():
                value_schema = json.loads(m.value())["schema"]
            k, v = dec(m.key(), MessageField.KEY), dec(m.value(), MessageField.VALUE)
            key = tuple(micros(k[c_]) for c_ in ID_COLUMNS)
            latest[key] = None if v is None else {c_: micros(x) for c_, x in v.items()}
            if v is not None:
                values.append(latest[key])
            n += 1
    c.close()
    if value_schema:
        print("topic's Connect value schema: " + ", ".join(
            f"{f['field']} {f['type']}{'/' + f['name'] if 'name' in f else ''}{'' if f.get('optional') else ' (required)'}"
            for f in value_schema["fields"]))
    live = {k: v for k, v in latest.items() if v is not None}
    print(f"topic {topic}: {n} records, {len(latest)} keys, {len(live)} live")
    return live, values


def table_dir(warehouse, table):
    return os.path.join(warehouse, *table.split("."))


def read_table(warehouse, table):
    """(table, rows, stats) of the table's current snapshot, or None before it exists."""
    metas = glob.glob(os.path.join(table_dir(warehouse, table), "metadata", "v*.metadata.json"))
    if not metas:
        return None
    meta = max(metas, key=lambda p: int(re.search(r"v(\d+)\.metadata\.json$", p).group(1)))
    from pyiceberg.table import StaticTable
    tbl = StaticTable.from_metadata(meta)
    snap = tbl.current_snapshot()
    rows = [] if snap is None else \
        [{c: micros(v) for c, v in r.items()} for r in tbl.scan().to_arrow().to_pylist()]
    stats = {"snapshots": len(tbl.metadata.snapshots), "metadata": os.path.basename(meta),
             "summary": dict(snap.summary.additional_properties) if snap else {},
             "operation": str(snap.summary.operation) if snap else None}
    return tbl, rows, stats


def connector_failed(name):
    try:
        with urllib.request.urlopen(f"{os.environ['CONNECT']}/connectors/{name}/status", timeout=5) as r:
            st = json.load(r)
    except OSError:
        return None
    for t in [st.get("connector", {})] + st.get("tasks", []):
        if t.get("state") == "FAILED":
            return t.get("trace", "FAILED")[:3000]
    return None


def same(a, b):
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if set(x) != set(y):
            return False
        for c in x:
            if isinstance(x[c], float) or isinstance(y[c], float):
                if abs(float(x[c]) - float(y[c])) > 1e-9 * max(1.0, abs(float(x[c]))):
                    return False
            elif x[c] != y[c]:
                return False
    return True


def canon(row):
    return tuple(sorted((c, round(v, 6) if isinstance(v, float) else v) for c, v in row.items()))


def verify(fmt, topic, table, warehouse, ccompat, connector):
    want_latest, want_all = expected(fmt, topic, ccompat)
    deadline = time.time() + float(os.environ.get("TIMEOUT", "120"))
    t0, got = time.time(), None
    while True:
        trace = connector_failed(connector)
        if trace:
            print(f"sink failed:\n{trace}")
            return False
        got = read_table(warehouse, table)
        if (got and len(got[1]) >= len(want_all)) or time.time() > deadline:
            break
        time.sleep(1)
    if not got:
        print(f"FAIL: no table {table} under {warehouse} after the timeout")
        return False
    tbl, rows, stats = got
    print(f"Iceberg table {table} ({time.time() - t0:.1f}s after the sink was registered): {stats}")
    print(f"schema: {tbl.schema()}")
    print(f"identifier fields: {sorted(tbl.schema().identifier_field_names())}")
    types = {f.name: str(f.field_type) for f in tbl.schema().fields}
    ok = True
    for col, allowed in WANT.items():
        good = types.get(col) in allowed
        ok &= good
        print(f"  {col:8} {types.get(col)!s:12} {'ok' if good else 'WRONG, want ' + '/'.join(allowed)}")
    all_ok = sorted(map(canon, rows)) == sorted(map(canon, want_all))
    print(f"append mode: table {len(rows)} rows, topic {len(want_all)} records: "
          + ("equal as multisets (every column)" if all_ok else "DIFFERENT"))
    latest = {}
    for r in rows:
        k = tuple(r[c] for c in ID_COLUMNS)
        if k not in latest or r["n"] > latest[k]["n"]:
            latest[k] = r
    latest_ok = same(latest, want_latest)
    print(f"latest per key (max n): table {len(latest)} keys, topic {len(want_latest)} live keys: "
          + ("equal (every column)" if latest_ok else "DIFFERENT"))
    if not latest_ok:
        for k in sorted(set(latest) | set(want_latest), key=str)[:5]:
            if latest.get(k) != want_latest.get(k):
                print(f"  {k}: table {latest.get(k)} topic {want_latest.get(k)}")
    ok &= all_ok and latest_ok
    print(("PASS" if ok else "FAIL") + f" {fmt}")
    return ok


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "config":
        config(*args)
    else:
        sys.exit(0 if verify(*args) else 1)
