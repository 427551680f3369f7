#!/usr/bin/env python3
"""ubik.stream(Q, from_=arrow_table).arrow() vs duckdb.sql(Q).arrow() over the
same in-memory Arrow table, side by side in one Python process.

    python bench/python_arrow.py [N=10000000] [ROUNDS=3]
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import duckdb  # noqa: E402
import gen_events  # noqa: E402
from peers import materialize  # noqa: E402

import ubik  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
table = gen_events.arrow_events(n)
UQ = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, "
      "avg(amount) AS mean FROM events GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
DQ = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, sum(amount) AS total, "
      "avg(amount) AS mean FROM events GROUP BY ALL")
con = duckdb.connect()
con.register("events", table)

u, d = [], []
for _ in range(rounds):
    t = time.perf_counter()
    got = ubik.stream(UQ, from_=table, lateness=0).arrow()
    u.append(time.perf_counter() - t)
    t = time.perf_counter()
    want = materialize(con.sql(DQ))  # read to the end: newer duckdb returns a lazy reader
    d.append(time.perf_counter() - t)
    assert got.num_rows == want.num_rows, (got.num_rows, want.num_rows)
mu, md = statistics.median(u), statistics.median(d)
print(f"{n} events, {got.num_rows} result rows; median of {rounds}:")
print(f"  ubik.stream(...).arrow()  {mu:.3f} s  ({n / mu / 1e6:.1f} M ev/s)")
print(f"  duckdb.sql(...).arrow()   {md:.3f} s  ({n / md / 1e6:.1f} M ev/s)")
print(f"  ubik/duckdb speed ratio   {md / mu:.2f}x")
