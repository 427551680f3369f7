"""Shared test data: random order events and a DuckDB oracle; the Kafka test broker."""
import datetime as dt
import json
import os
import random

import duckdb
import pyarrow as pa
import pytest

BASE = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SCHEMA = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"


def events(n, keys=10, step_ms=100, disorder_ms=3000, seed=1, nulls=True):
    """Rows in arrival order: time advances step_ms per row, each row displaced back up to disorder_ms."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        t = BASE + dt.timedelta(milliseconds=i * step_ms - rnd.randrange(disorder_ms + 1))
        amount = None if nulls and rnd.randrange(25) == 0 else round(rnd.random() * 500, 2)
        rows.append({"merchant": f"m{rnd.randrange(keys):03d}", "ts": t, "amount": amount})
    return rows


def to_table(rows):
    return pa.table({
        "merchant": pa.array([r["merchant"] for r in rows], pa.string()),
        "ts": pa.array([r["ts"] for r in rows], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([r["amount"] for r in rows], pa.float64()),
    })


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "ts": r["ts"].isoformat().replace("+00:00", "Z")}) + "\n")
    return path


def duck(sql, table):
    con = duckdb.connect()
    con.register("orders", table)
    con.execute("SET TimeZone='UTC'")
    out = con.sql(sql).arrow()
    # duckdb >= 1.4 returns a RecordBatchReader here, older versions a Table.
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def rows_by_key(table, key):
    """{key tuple: row dict} with timestamps as epoch microseconds."""
    out = {}
    cols = table.column_names
    for row in table.to_pylist():
        norm = {c: (int(v.timestamp() * 1_000_000) if isinstance(v, dt.datetime) else v) for c, v in row.items()}
        out[tuple(norm[k] for k in key)] = norm
    assert len(out) == table.num_rows, f"duplicate keys in a result of {cols}"
    return out


def assert_same(got, want, key):
    g, w = rows_by_key(got, key), rows_by_key(want, key)
    assert g.keys() == w.keys(), f"keys differ: missing {list(w.keys() - g.keys())[:3]}, extra {list(g.keys() - w.keys())[:3]}"
    for k, row in w.items():
        for c, v in row.items():
            a = g[k][c]
            if isinstance(v, float) and a is not None:
                assert abs(a - v) <= 1e-9 * max(1.0, abs(v)), (k, c, a, v)
            else:
                assert a == v, (k, c, a, v)


@pytest.fixture
def orders():
    return events(3000)


def _skipping(suite):
    return suite in [s.strip() for s in os.environ.get("UBIK_TEST_SKIP", "").split(",")]


@pytest.fixture(scope="session")
def kafka_broker():
    """The address of the test broker (scripts/test.sh starts it and exports
    UBIK_TEST_KAFKA). A missing or unreachable broker fails the test; it is
    skipped only when a developer asks for it with UBIK_TEST_SKIP=kafka, and
    never when CI is set."""
    ci = bool(os.environ.get("CI"))
    if _skipping("kafka"):
        if ci:
            pytest.fail("UBIK_TEST_SKIP contains kafka, but CI is set: CI runs the Kafka tests")
        pytest.skip("UBIK_TEST_SKIP contains kafka")
    broker = os.environ.get("UBIK_TEST_KAFKA")
    if not broker:
        pytest.fail("UBIK_TEST_KAFKA is not set: run scripts/test.sh (it starts the test broker and sets it), "
                    "or set UBIK_TEST_SKIP=kafka to skip the Kafka tests")
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": broker}).list_topics(timeout=20)
    except KafkaException as e:
        pytest.fail(f"the test broker UBIK_TEST_KAFKA={broker} is unreachable: {e}")
    return broker


@pytest.fixture(scope="session")
def registry():
    """The Confluent-compatible base URL of the test schema registry
    (scripts/test.sh starts it and exports UBIK_TEST_REGISTRY); skipped
    like the broker, only on a developer's request and never on CI."""
    ci = bool(os.environ.get("CI"))
    if _skipping("registry"):
        if ci:
            pytest.fail("UBIK_TEST_SKIP contains registry, but CI is set: CI runs the registry tests")
        pytest.skip("UBIK_TEST_SKIP contains registry")
    url = os.environ.get("UBIK_TEST_REGISTRY")
    if not url:
        pytest.fail("UBIK_TEST_REGISTRY is not set: run scripts/test.sh (it starts the test registry and sets it), "
                    "or set UBIK_TEST_SKIP=registry to skip the registry tests")
    return url


@pytest.fixture(scope="session")
def debezium():
    """Kafka Connect's REST URL and PostgreSQL's DSN of the test Debezium
    setup (scripts/test.sh starts testing/debezium/debezium.sh and exports
    UBIK_TEST_DEBEZIUM as "URL DSN"); skipped like the broker, only on a
    developer's request and never on CI."""
    ci = bool(os.environ.get("CI"))
    if _skipping("debezium"):
        if ci:
            pytest.fail("UBIK_TEST_SKIP contains debezium, but CI is set: CI runs the Debezium tests")
        pytest.skip("UBIK_TEST_SKIP contains debezium")
    both = os.environ.get("UBIK_TEST_DEBEZIUM", "").split()
    if len(both) != 2:
        pytest.fail("UBIK_TEST_DEBEZIUM is not set: run scripts/test.sh (it starts PostgreSQL and Kafka Connect "
                    "with Debezium and sets it), or set UBIK_TEST_SKIP=debezium to skip the Debezium tests")
    return both[0], both[1]
