#!/usr/bin/env python3
"""Data generation and the peer side of ubik's benchmarks (DuckDB, Polars).

  peers.py make-arrow N OUT.arrow     events as an Arrow IPC file (64k-row batches)
  peers.py make-jsonl N OUT.jsonl     the same events as JSON lines
  peers.py duckdb-arrow FILE.arrow    DuckDB GROUP BY over the in-memory Arrow table
  peers.py duckdb-jsonl FILE.jsonl    DuckDB read_json + the same GROUP BY
  peers.py polars-arrow FILE.arrow    Polars group_by over the in-memory table

Each timing prints one JSON line; only the query is timed (not loading).
"""
import json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_events  # noqa: E402

DUCK_Q = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, "
          "sum(amount) AS total, avg(amount) AS mean FROM {src} GROUP BY merchant, w")


def materialize(rel):
    """The whole result as a pyarrow Table: duckdb >= 1.4 returns a lazy RecordBatchReader
    from .arrow(), which must be read inside the timed block."""
    import pyarrow as pa
    out = rel.arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def report(bench, rows, secs, out_rows):
    print(json.dumps({"bench": bench, "rows": rows, "seconds": secs,
                      "rows_per_s": rows / secs, "changes": out_rows}), flush=True)


def main():
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "make-arrow":
        import pyarrow as pa
        n, out = int(arg), sys.argv[3]
        t = gen_events.arrow_events(n)
        with pa.OSFile(out, "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t, max_chunksize=65536)
    elif cmd == "make-jsonl":
        n, out = int(arg), sys.argv[3]
        with open(out, "w", buffering=1 << 20) as f:
            f.writelines(gen_events.gen_lines(n))
    elif cmd == "duckdb-arrow":
        import duckdb, pyarrow as pa
        tbl = pa.ipc.open_file(arg).read_all()
        con = duckdb.connect()
        con.register("events", tbl)
        t0 = time.perf_counter()
        res = materialize(con.sql(DUCK_Q.format(src="events")))
        report("duckdb-arrow", tbl.num_rows, time.perf_counter() - t0, res.num_rows)
    elif cmd == "duckdb-jsonl":
        import duckdb
        con = duckdb.connect()
        src = ("read_json('{}', format='newline_delimited', columns={{'merchant': 'VARCHAR', "
               "'ts': 'TIMESTAMPTZ', 'amount': 'DOUBLE'}})").format(arg)
        t0 = time.perf_counter()
        res = materialize(con.sql(DUCK_Q.format(src=src)))
        secs = time.perf_counter() - t0
        rows = sum(1 for _ in open(arg, "rb"))
        report("duckdb-jsonl", rows, secs, res.num_rows)
    elif cmd == "polars-arrow":
        import polars as pl, pyarrow as pa
        df = pl.from_arrow(pa.ipc.open_file(arg).read_all())
        t0 = time.perf_counter()
        res = (df.group_by(["merchant", pl.col("ts").dt.truncate("1m").alias("w")])
                 .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"),
                      pl.col("amount").mean().alias("mean")))
        report("polars-arrow", df.height, time.perf_counter() - t0, res.height)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
