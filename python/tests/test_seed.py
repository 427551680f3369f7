"""The seed document's two Python examples, copied as written except for
addresses and paths, against the real Kafka test broker, checked against
DuckDB one-shot:

- the pipeline loop (seed_worker.py): windows buffered 256 at a time, each
  full buffer MERGEd into a Delta table, then checkpointed; killed (SIGKILL)
  between a merge and its checkpoint and after a checkpoint, resumed, and
  finally killed once the table holds every full buffer;
- the one-shot backfill: ubik.stream(Q, from_=kafka://...).arrow() with no
  end= option, then write_deltalake(..., mode="overwrite").

Neither passes schema= (ubik infers it from a sample of the topic) nor a
lateness (the default, 5s: the events' disorder stays within it). The
topics are not named orders: ubik maps the one table the query reads to
the one source. Needs the test broker (see the kafka_broker fixture)."""
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid

import pyarrow.compute as pc
from deltalake import DeltaTable

from conftest import assert_same, duck, events, to_table
from test_kafka import produce

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "seed_worker.py")
ORACLE = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n "
          "FROM orders GROUP BY ALL")
BUFFER = 256  # the seed's buffer: windows per MERGE


def produce_flush(broker, topic, at, partitions=4):
    """One event per partition at `at`, far after the real events: every
    partition's watermark passes every real window, so all of them close.
    The flush windows themselves stay open (`at` is a minute start: idle
    close would need 65 s of silence to close them)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker, "enable.idempotence": True})
    value = json.dumps({"merchant": "flush", "ts": at.isoformat().replace("+00:00", "Z"), "amount": 0.0})
    for part in range(partitions):
        p.produce(topic, partition=part, key=b"flush", value=value.encode())
    assert p.flush(30) == 0, "flush events not delivered to the test broker"


def worker(broker, topic, tmp_path, kill_at):
    env = dict(os.environ, UBIK_KILL_AT=kill_at)
    args = [sys.executable, WORKER, broker, topic, str(tmp_path / "table"), str(tmp_path / "ck")]
    return args, env


def table_rows(path):
    if not os.path.exists(os.path.join(path, "_delta_log")):
        return 0
    return DeltaTable(path).to_pyarrow_table().num_rows


def test_seed_pipeline_loop_killed_and_resumed(kafka_broker, tmp_path):
    # 15 hours of events, one every 2 s (disorder up to 3 s, within the
    # default 5 s lateness; produced in order per partition), 12 merchants.
    # The pipeline hands out one RecordBatch per closed one-minute window
    # (every merchant's row of that minute), so ~900 windows: three full
    # 256-window buffers are merged, the tail of ~130 windows stays in the
    # buffer (the seed merges full buffers only).
    rows = events(27_000, keys=12, step_ms=2000, disorder_ms=3000, seed=21, nulls=False)
    topic = f"py-seed-{uuid.uuid4().hex[:8]}"
    produce(kafka_broker, topic, rows)
    flush_at = (max(r["ts"] for r in rows) + dt.timedelta(hours=1)).replace(second=0, microsecond=0)
    produce_flush(kafka_broker, topic, flush_at)

    oracle = duck(ORACLE, to_table(rows)).sort_by([("w", "ascending"), ("merchant", "ascending")])
    windows = sorted(set(oracle.column("w").to_pylist()))
    closed = len(windows)  # every real window closes: the flush events are an hour later
    merged = closed // BUFFER * BUFFER
    assert merged >= 3 * BUFFER, f"only {closed} windows: fewer than three merges"
    # Windows close in event-time order, one batch each: the merged ones are
    # the first `merged` windows, every merchant's row of each.
    want = oracle.filter(pc.less_equal(oracle.column("w"), windows[merged - 1]))

    path = str(tmp_path / "table")
    # Each run counts its own merges; the checkpoint decides where it resumes:
    # 1) merges windows 0-255, killed before its checkpoint;
    # 2) replays 0-255, merges them again (an upsert), checkpoints, killed;
    # 3) merges 256-511, killed before its checkpoint.
    for kill_at in ["merged-1", "checkpointed-1", "merged-1"]:
        args, env = worker(kafka_broker, topic, tmp_path, kill_at)
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == -9, f"{kill_at}: expected SIGKILL, got {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"

    # 4) replays 256-511, merges them again, checkpoints, merges 512-767; the
    # tail waits in the buffer forever (the topic is unbounded): killed once
    # the table holds the expected number of rows (only this run's second
    # merge gets it there).
    assert table_rows(path) < want.num_rows
    args, env = worker(kafka_broker, topic, tmp_path, "")
    log_path = tmp_path / "final.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def done():
        # The worker prints "merged 2" right after its second merge commits.
        return "merged 2" in log_path.read_text() and table_rows(path) >= want.num_rows

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not done():
            time.sleep(0.5)
    finally:
        exited = proc.poll()
        proc.kill()
        proc.wait()
    output = log_path.read_text()[-3000:]
    assert exited is None, f"the final run exited by itself ({exited}):\n{output}"
    assert "merged 2" in output, f"the final run did not merge twice within 60 s:\n{output}"

    got = DeltaTable(path).to_pyarrow_table()
    assert got.num_rows == want.num_rows, (
        f"{got.num_rows} rows, want {want.num_rows} (the first {merged} of {closed} windows): "
        f"a hole, a duplicate or a late merge\n{output}")
    assert_same(got, want, ["merchant", "w"])  # no duplicate key, every row DuckDB's


# The seed's backfill, as written (addresses and paths from argv).
BACKFILL = """
import sys
import ubik
from deltalake import write_deltalake

broker, topic, path = sys.argv[1:4]
Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")

tbl = ubik.stream(Q, from_=f"kafka://{broker}/{topic}").arrow()
write_deltalake(path, tbl, mode="overwrite")
"""


def test_seed_backfill_reads_the_topic_as_it_stands(kafka_broker, tmp_path):
    rows = events(6000, keys=12, step_ms=1000, disorder_ms=3000, seed=22, nulls=False)
    topic = f"py-seed-backfill-{uuid.uuid4().hex[:8]}"
    produce(kafka_broker, topic, rows)
    path = str(tmp_path / "table")
    try:
        # A subprocess, so that a call that never returns fails the test
        # instead of hanging it.
        r = subprocess.run([sys.executable, "-c", BACKFILL, kafka_broker, topic, path],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            "ubik.stream(Q, from_=kafka://...).arrow() did not return within 30 s: "
            "a Kafka URL without end= is read as unbounded") from e
    assert r.returncode == 0, r.stderr[-3000:]
    got = DeltaTable(path).to_pyarrow_table()
    want = duck(ORACLE, to_table(rows))
    assert got.num_rows == want.num_rows, "a hole or a duplicate"
    assert_same(got, want, ["merchant", "w"])
