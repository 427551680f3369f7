"""Joins on the Arrow leg: several named sources (in-process Arrow and
files), checked against DuckDB's ASOF and interval joins in one shot."""
import datetime as dt
import random

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ubik
from conftest import BASE, assert_same

ORDERS = "oid BIGINT, merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"
MERCHANTS = "id VARCHAR PRIMARY KEY, region VARCHAR, ts TIMESTAMP"


def data(seed, n=2000):
    rnd = random.Random(seed)
    orders, merchants = [], []
    for m in range(6):
        merchants.append({"id": f"m{m}", "region": f"r{rnd.randrange(3)}", "ts": BASE + dt.timedelta(milliseconds=m)})
    for i in range(n):
        t = BASE + dt.timedelta(milliseconds=1000 + i * 300 - rnd.randrange(2000))
        orders.append({"oid": i, "merchant": f"m{rnd.randrange(7)}", "ts": t, "amount": round(rnd.random() * 100, 2)})
        if i % 50 == 0:
            merchants.append({"id": f"m{rnd.randrange(6)}", "region": f"r{rnd.randrange(3)}",
                              "ts": t + dt.timedelta(milliseconds=1 + i)})
    o = pa.table({
        "oid": pa.array([r["oid"] for r in orders], pa.int64()),
        "merchant": pa.array([r["merchant"] for r in orders], pa.string()),
        "ts": pa.array([r["ts"] for r in orders], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([r["amount"] for r in orders], pa.float64()),
    })
    m = pa.table({
        "id": pa.array([r["id"] for r in merchants], pa.string()),
        "region": pa.array([r["region"] for r in merchants], pa.string()),
        "ts": pa.array([r["ts"] for r in merchants], pa.timestamp("us", tz="UTC")),
    })
    return o, m


def duck(sql, **tables):
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    for name, t in tables.items():
        con.register(name, t)
    out = con.sql(sql).arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


TEMPORAL = ("SELECT m.region, TUMBLE(o.ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(o.amount) AS total "
            "FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id "
            "GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1 MINUTE')")
TEMPORAL_ORACLE = ("SELECT m.region, time_bucket(INTERVAL '1 minute', o.ts) AS w, count(*) AS n, sum(o.amount) AS total "
                   "FROM orders o ASOF JOIN merchants m ON o.merchant = m.id AND o.ts >= m.ts GROUP BY ALL")


@pytest.mark.parametrize("seed", [1, 2])
def test_temporal_join_of_two_arrow_tables_equals_duckdb_asof(seed):
    o, m = data(seed)
    got = ubik.stream(TEMPORAL, from_={"orders": o, "merchants": m}, lateness="5s").arrow()
    assert_same(got, duck(TEMPORAL_ORACLE, orders=o, merchants=m), ["region", "w"])
    # Batching does not change the result.
    small = ubik.stream(TEMPORAL, from_={"orders": o.to_batches(max_chunksize=97), "merchants": m.to_reader(max_chunksize=5)},
                        lateness="5s").arrow()
    assert small.equals(got)


def test_late_orders_join_within_the_join_retention():
    """Without a watermark delay many orders arrive behind their partition's
    watermark. With a join retention they join all the same, and their
    windows are re-emitted: the result equals DuckDB's. Without one they
    are dead letters."""
    o, m = data(3)
    sources = {"orders": o.to_batches(max_chunksize=64), "merchants": m}
    got = ubik.stream(TEMPORAL, from_=sources, lateness="0s", join_retention="5s").arrow()
    assert_same(got, duck(TEMPORAL_ORACLE, orders=o, merchants=m), ["region", "w"])
    letters = []
    ubik.stream(TEMPORAL, from_=sources, lateness="0s", on_dead_letter=letters.append).arrow()
    assert letters and {d.reason for d in letters} == {"late"}, letters[:3]


def test_validate_a_join_with_schemas_by_table():
    schema = ubik.validate(TEMPORAL, schema={"orders": ORDERS, "merchants": MERCHANTS})
    assert schema.names == ["region", "w", "n", "total"]
    assert ubik.key_columns(schema) == ["region", "w"]
    with pytest.raises(ubik.UnsupportedQueryError, match="unbounded"):
        ubik.validate("SELECT o.oid FROM orders o JOIN orders p ON o.oid = p.oid",
                      schema={"orders": ORDERS, "merchants": MERCHANTS})


def test_interval_join_passthrough_from_files(tmp_path):
    o, _ = data(3, n=500)
    pays = pa.table({
        "pid": pa.array(range(0, 500, 2), pa.int64()),
        "order_id": pa.array(range(0, 500, 2), pa.int64()),
        "ts": pc.add(o["ts"].take(list(range(0, 500, 2))), pa.scalar(dt.timedelta(seconds=20))),
    })
    path = tmp_path / "payments.jsonl"
    with open(path, "w") as f:
        for r in pays.to_pylist():
            f.write(f'{{"pid":{r["pid"]},"order_id":{r["order_id"]},"ts":"{r["ts"].isoformat()}"}}\n')
    sql = ("SELECT p.pid, o.merchant, o.amount FROM payments p JOIN orders o "
           "ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '30' SECOND")
    got = ubik.stream(sql, from_={"payments": f"file://{path}", "orders": o},
                      schema={"payments": "pid BIGINT, order_id BIGINT, ts TIMESTAMP"}, lateness="60s").arrow()
    want = duck("SELECT p.pid, o.merchant, o.amount FROM payments p JOIN orders o "
                "ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL 30 SECOND", payments=pays, orders=o)
    assert got.num_rows == want.num_rows == 250
    assert_same(got, want, ["pid"])


def test_three_arrow_tables_in_a_temporal_chain_equal_duckdb():
    """Orders meet their merchant's version, and that merchant's region the
    region's version, both as of the order's time: a join over a join."""
    o, m = data(4)
    rnd = random.Random(4)
    regions = [{"id": f"r{r}", "name": f"region-{r}-v0", "ts": BASE} for r in range(3)]
    for i in range(30):
        r = rnd.randrange(3)
        regions.append({"id": f"r{r}", "name": f"region-{r}-v{i + 1}",
                        "ts": BASE + dt.timedelta(milliseconds=2000 + i * 20_000 + rnd.randrange(1000))})
    g = pa.table({
        "id": pa.array([r["id"] for r in regions], pa.string()),
        "name": pa.array([r["name"] for r in regions], pa.string()),
        "ts": pa.array([r["ts"] for r in regions], pa.timestamp("us", tz="UTC")),
    })
    sql = ("SELECT r.name, TUMBLE(o.ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(o.amount) AS total "
           "FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id "
           "JOIN regions FOR SYSTEM_TIME AS OF o.ts AS r ON m.region = r.id "
           "GROUP BY r.name, TUMBLE(o.ts, INTERVAL '1 MINUTE')")
    got = ubik.stream(sql, from_={"orders": o, "merchants": m, "regions": g}, lateness="5s").arrow()
    want = duck("SELECT r.name, time_bucket(INTERVAL '1 minute', o.ts) AS w, count(*) AS n, sum(o.amount) AS total "
                "FROM orders o ASOF JOIN merchants m ON o.merchant = m.id AND o.ts >= m.ts "
                "ASOF JOIN regions r ON m.region = r.id AND o.ts >= r.ts GROUP BY ALL",
                orders=o, merchants=m, regions=g)
    assert want.num_rows > 20
    assert_same(got, want, ["name", "w"])
