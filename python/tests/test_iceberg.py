"""The seed's Arrow leg into a real Apache Iceberg table (pyiceberg, a SQL
catalog on sqlite), killed (SIGKILL) between an upsert and its checkpoint and
between two upserts, each run resuming from the position stored in the
table's current snapshot: after the reruns the table equals DuckDB's one-shot
answer, with no duplicate key and no hole. And a table rolled back behind
the newest checkpoint: the next run resumes from the table's position."""
import os
import subprocess
import sys

from pyiceberg.catalog.sql import SqlCatalog

from conftest import assert_same, duck, events, to_table, write_jsonl

WORKER = os.path.join(os.path.dirname(__file__), "iceberg_worker.py")
ORACLE = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, sum(amount) AS total "
          "FROM orders GROUP BY ALL")


def run_worker(tmp_path, source, kill_at):
    env = dict(os.environ, UBIK_KILL_AT=kill_at)
    return subprocess.run(
        [sys.executable, WORKER, source, str(tmp_path / "ck"), str(tmp_path / "lake")],
        env=env, capture_output=True, text=True, timeout=300,
    )


def load_table(tmp_path):
    lake = tmp_path / "lake"
    catalog = SqlCatalog("ubik", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse")
    return catalog.load_table("ubik.orders")


def assert_oracle(table, rows):
    assert table.current_snapshot().summary["ubik.position"], "no position in the last snapshot"
    got = table.scan().to_arrow()
    want = duck(ORACLE, to_table(rows))
    assert got.num_rows == want.num_rows, "a hole or a duplicate"
    assert_same(got, want, ["merchant", "w"])


def test_kill_between_upsert_and_checkpoint_and_between_upserts(tmp_path):
    # 10 hours of per-minute windows for 5 merchants: ~600 windows, so the
    # 256-window buffer is upserted several times.
    rows = events(36_000, keys=5, step_ms=1000, disorder_ms=2000, seed=7, nulls=False)
    source = f"file://{write_jsonl(tmp_path / 'orders.jsonl', rows)}"
    # Each run counts its own upserts; the table's position decides where it resumes.
    for kill_at in ["merged-1", "checkpointed-1", "merged-1", "merged-tail"]:
        r = run_worker(tmp_path, source, kill_at)
        assert r.returncode == -9, f"{kill_at}: expected SIGKILL, got {r.returncode}\n{r.stderr[-2000:]}"
    r = run_worker(tmp_path, source, "")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_oracle(load_table(tmp_path), rows)


def test_resume_from_the_tables_position_behind_the_newest_checkpoint(tmp_path):
    # The lake loses commits the checkpoints already cover (rolled back to its
    # first upsert): resuming from the newest checkpoint would leave a hole;
    # resume_from= the table's position replays what the table lacks.
    rows = events(36_000, keys=5, step_ms=1000, disorder_ms=2000, seed=7, nulls=False)
    source = f"file://{write_jsonl(tmp_path / 'orders.jsonl', rows)}"
    r = run_worker(tmp_path, source, "")
    assert r.returncode == 0, r.stderr[-3000:]
    table = load_table(tmp_path)
    first = min(table.snapshots(), key=lambda s: s.sequence_number)
    table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    assert load_table(tmp_path).scan().to_arrow().num_rows < duck(ORACLE, to_table(rows)).num_rows
    r = run_worker(tmp_path, source, "")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {first.summary['ubik.position']}" in r.stdout
    assert_oracle(load_table(tmp_path), rows)
