#!/usr/bin/env python3
"""Joins side by side with DuckDB, in one process over the same Arrow tables:
a temporal join (each order meets its merchant's version as of the order,
DuckDB's ASOF JOIN) and an interval join (payments within 10 minutes of
their order), each aggregated per region / merchant and minute. Prints
seconds, rows/s and the ratio ubik/DuckDB (median of --runs).

    python3 bench/join_vs_duckdb.py [--orders 2000000] [--merchants 1000] [--versions 20000] [--runs 3]

The issue's target: --orders 10000000 --merchants 100000 --versions 100000 (1 % updates).

Needs the ubik package importable (scripts/python-dev-install.sh, or pip
install of a release build), duckdb and numpy. Say which build you measured.
"""
import argparse
import statistics
import time

import duckdb
import numpy as np
import pyarrow as pa

import ubik

BASE_MS = 1_704_067_200_000


def tables(n_orders, n_versions, merchants=1000, seed=7):
    rng = np.random.default_rng(seed)
    span = 3_600_000
    ts = BASE_MS + np.sort(rng.integers(0, span, n_orders))
    m_codes = rng.integers(0, merchants, n_orders)
    names = np.array([f"m{i:06d}" for i in range(merchants)], dtype=object)
    orders = pa.table({
        "oid": pa.array(np.arange(n_orders, dtype=np.int64)),
        "merchant": pa.array(names[m_codes], pa.string()),
        "ts": pa.array(ts * 1000, pa.timestamp("us", tz="UTC")),
        "amount": pa.array(np.round(rng.random(n_orders) * 500, 2)),
    })
    # Every merchant has a version before the first order, then updates.
    v_ts = np.concatenate([np.full(merchants, BASE_MS - 1000 - merchants) + np.arange(merchants),
                           BASE_MS + np.sort(rng.choice(span, n_versions, replace=False))])
    v_codes = np.concatenate([np.arange(merchants), rng.integers(0, merchants, n_versions)])
    versions = pa.table({
        "id": pa.array(names[v_codes], pa.string()),
        "region": pa.array([f"r{i}" for i in rng.integers(0, 20, len(v_codes))], pa.string()),
        "ts": pa.array(v_ts * 1000, pa.timestamp("us", tz="UTC")),
    })
    # Half the orders are paid within 15 minutes (a third of those after
    # the join's 10-minute bound); payments arrive in time order.
    paid = rng.random(n_orders) < 0.5
    k = int(paid.sum())
    p_ts = ts[paid] + rng.integers(0, 900_000, k)
    order = np.argsort(p_ts, kind="stable")
    payments = pa.table({
        "pid": pa.array(np.arange(k, dtype=np.int64)),
        "order_id": pa.array(np.arange(n_orders, dtype=np.int64)[paid][order]),
        "ts": pa.array(p_ts[order] * 1000, pa.timestamp("us", tz="UTC")),
        "paid": pa.array(np.round(rng.random(k) * 500, 2)),
    })
    return orders, versions, payments


CASES = {
    "temporal": (
        "SELECT m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(o.amount) AS total "
        "FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id "
        "GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE)",
        "SELECT m.region, time_bucket(INTERVAL '1 minute', o.ts) AS w, count(*) AS n, sum(o.amount) AS total "
        "FROM orders o ASOF JOIN merchants m ON o.merchant = m.id AND o.ts >= m.ts GROUP BY ALL",
        ("orders", "merchants"),
    ),
    "interval": (
        "SELECT o.merchant, TUMBLE(p.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(p.paid) AS paid "
        "FROM payments p JOIN orders o ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '10' MINUTE "
        "GROUP BY o.merchant, TUMBLE(p.ts, INTERVAL '1' MINUTE)",
        "SELECT o.merchant, time_bucket(INTERVAL '1 minute', p.ts) AS w, count(*) AS n, sum(p.paid) AS paid "
        "FROM payments p JOIN orders o ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL 10 MINUTE "
        "GROUP BY ALL",
        ("payments", "orders"),
    ),
}


def timed(f, runs):
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orders", type=int, default=2_000_000)
    ap.add_argument("--merchants", type=int, default=1000)
    ap.add_argument("--versions", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="DuckDB threads (ubik's join runs on one)")
    args = ap.parse_args()
    orders, merchants, payments = tables(args.orders, args.versions, args.merchants)
    data = {"orders": orders, "merchants": merchants, "payments": payments}
    con = duckdb.connect()
    con.execute(f"SET threads={args.threads}")
    con.execute("SET TimeZone='UTC'")
    for name, t in data.items():
        con.register(name, t)
    print(f"{'query':10} {'input rows':>11} {'ubik s':>8} {'duckdb s':>9} {'ubik/duckdb':>12} {'result rows':>12}")
    for name, (q, oracle, sources) in CASES.items():
        inputs = {s: data[s] for s in sources}
        rows = sum(t.num_rows for t in inputs.values())
        u, got = timed(lambda: ubik.stream(q, from_=inputs, lateness="0s").arrow(), args.runs)

        def duck():
            out = con.sql(oracle).arrow()
            return out.read_all() if isinstance(out, pa.RecordBatchReader) else out

        d, want = timed(duck, args.runs)
        assert got.num_rows == want.num_rows, (name, got.num_rows, want.num_rows)
        print(f"{name:10} {rows:>11} {u:>8.3f} {d:>9.3f} {u / d:>12.2f} {got.num_rows:>12}")


if __name__ == "__main__":
    main()
