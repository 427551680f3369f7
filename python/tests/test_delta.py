"""The seed's Arrow leg into a real Delta table, killed (SIGKILL) between a
MERGE and its checkpoint and between two MERGEs: after the reruns the table
equals DuckDB's one-shot answer, with no duplicate key and no hole."""
import os
import subprocess
import sys

from deltalake import DeltaTable

from conftest import assert_same, duck, events, to_table, write_jsonl

WORKER = os.path.join(os.path.dirname(__file__), "delta_worker.py")
ORACLE = ("SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, sum(amount) AS total "
          "FROM orders GROUP BY ALL")


def run_worker(tmp_path, source, kill_at):
    env = dict(os.environ, UBIK_KILL_AT=kill_at)
    return subprocess.run(
        [sys.executable, WORKER, source, str(tmp_path / "ck"), str(tmp_path / "table")],
        env=env, capture_output=True, text=True, timeout=300,
    )


def test_kill_between_merge_and_checkpoint_and_between_merges(tmp_path):
    # 10 hours of per-minute windows for 5 merchants: ~600 windows, so the
    # 256-window buffer is merged several times.
    rows = events(36_000, keys=5, step_ms=1000, disorder_ms=2000, seed=7, nulls=False)
    source = f"file://{write_jsonl(tmp_path / 'orders.jsonl', rows)}"
    # Each run counts its own merges; the checkpoint decides where it resumes.
    for kill_at in ["merged-1", "checkpointed-1", "merged-1", "merged-tail"]:
        r = run_worker(tmp_path, source, kill_at)
        assert r.returncode == -9, f"{kill_at}: expected SIGKILL, got {r.returncode}\n{r.stderr[-2000:]}"
    r = run_worker(tmp_path, source, "")
    assert r.returncode == 0, r.stderr[-3000:]
    got = DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    want = duck(ORACLE, to_table(rows))
    assert got.num_rows == want.num_rows, "a hole or a duplicate"
    assert_same(got, want, ["merchant", "w"])
