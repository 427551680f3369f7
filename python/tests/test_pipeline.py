"""pipeline(): byte-identical replay after a crash, position tokens,
right-sized batches, compaction, spilling."""
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import ubik
from conftest import SCHEMA, events, to_table, write_jsonl

Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")


def collect(p, n=None):
    out = []
    for b in p:
        out.append(b)
        if n is not None and len(out) == n:
            break
    return out


def test_reopen_rehands_after_last_checkpoint_byte_identically(tmp_path):
    rows = events(20_000, keys=4, step_ms=200, disorder_ms=2000, seed=5)
    src = f"file://{write_jsonl(tmp_path / 'o.jsonl', rows)}"
    ck = str(tmp_path / "ck")
    with ubik.pipeline(Q, from_=src, checkpoint=str(tmp_path / "ref"), schema=SCHEMA) as p:
        reference = collect(p)
    with ubik.pipeline(Q, from_=src, checkpoint=ck, schema=SCHEMA) as p:
        first = collect(p, 10)
        p.checkpoint()
        after = collect(p, 5)  # handed out, never checkpointed: lost in a "crash"
    with ubik.pipeline(Q, from_=src, checkpoint=ck, schema=SCHEMA) as p:
        rest = collect(p)
    assert [b.to_pylist() for b in rest[:5]] == [b.to_pylist() for b in after]
    assert len(first) + len(rest) == len(reference)
    for a, b in zip(first + rest, reference):
        assert a.equals(b)


def test_checkpoint_saves_batches_not_yet_handed_out(tmp_path):
    table = to_table(events(5000, keys=3, seed=9))
    ck = str(tmp_path / "ck")
    reference = collect(ubik.pipeline(Q, from_=table, checkpoint=str(tmp_path / "ref")))
    with ubik.pipeline(Q, from_=table, checkpoint=ck, max_rows=50) as p:
        head = collect(p, 2)
        p.checkpoint()
    with ubik.pipeline(Q, from_=table, checkpoint=ck, max_rows=50) as p:
        tail = collect(p)
    got = pa.Table.from_batches(head + tail)
    assert got.equals(pa.Table.from_batches(reference))


def test_position_token_resume(tmp_path):
    table = to_table(events(6000, keys=3, step_ms=1000, seed=4))
    ck = str(tmp_path / "ck")
    tokens, seen = [], []
    with ubik.pipeline(Q, from_=table, checkpoint=ck, keep_checkpoints=100) as p:
        for i, b in enumerate(p):
            seen.append(b)
            if i % 5 == 4:
                tokens.append(p.position)   # stored with the host's commit
                p.checkpoint()
    # The host's table says it committed up to the second checkpoint: resume there.
    with ubik.pipeline(Q, from_=table, checkpoint=ck, resume_from=tokens[1], keep_checkpoints=100) as p:
        again = collect(p)
    assert len(seen) > 20
    assert [b.to_pylist() for b in again] == [b.to_pylist() for b in seen[10:]]
    with pytest.raises(ubik.CheckpointError, match="different pipeline"):
        ubik.pipeline(Q.replace("count(*)", "count(amount)"), from_=table, checkpoint=ck, resume_from=tokens[0])


def test_right_sized_batches_and_compaction(tmp_path):
    rows = events(30_000, keys=20, step_ms=50, disorder_ms=20_000, seed=2)
    table = to_table(rows)
    q = Q
    sized = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "a"), max_rows=100, lateness="1s"))
    assert all(b.num_rows >= 100 for b in sized[:-1]), [b.num_rows for b in sized]
    by_bytes = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "b"), max_bytes=20_000, lateness="1s"))
    assert len(by_bytes) > 1
    compact = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "c"), max_rows=100_000,
                                    compact=True, lateness="1s"))
    assert len(compact) == 1
    keys = [(r["merchant"], r["w"]) for r in compact[0].to_pylist()]
    assert len(keys) == len(set(keys)), "compaction keeps one row per key"
    plain = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "d"), lateness="1s"))
    assert sum(b.num_rows for b in plain) > len(keys), "late rows re-emitted some windows"
    # A flush past spill_bytes is handed out in the pieces it was spilled
    # in, never concatenated: together they are the same batch.
    spilled = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "e"), max_rows=100_000, compact=True,
                                    spill_dir=str(tmp_path / "spill"), spill_bytes=1, lateness="1s"))
    assert len(spilled) > 10 and max(b.num_rows for b in spilled) < compact[0].num_rows / 10
    assert pa.Table.from_batches(spilled).equals(pa.Table.from_batches(compact))
    assert not os.listdir(tmp_path / "spill"), "spill files are removed once read"
    one = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "f"), max_rows=100_000, lateness="1s"))
    pieces = collect(ubik.pipeline(q, from_=table, checkpoint=str(tmp_path / "g"), max_rows=100_000,
                                   spill_dir=str(tmp_path / "spill"), spill_bytes=1, lateness="1s"))
    assert len(pieces) > len(one)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches(one))


def test_a_checkpoint_between_the_pieces_of_a_spilled_flush(tmp_path):
    """Killed after a checkpoint taken halfway through a spilled flush, the
    pipeline hands out the rest of it, and nothing else, again."""
    table = to_table(events(20_000, keys=20, step_ms=50, disorder_ms=2000, seed=5))
    opts = dict(max_rows=1_000_000, spill_dir=str(tmp_path / "spill"), spill_bytes=1, lateness="1s")
    whole = collect(ubik.pipeline(Q, from_=table, checkpoint=str(tmp_path / "a"), **opts))
    ck = str(tmp_path / "b")
    with ubik.pipeline(Q, from_=table, checkpoint=ck, **opts) as p:
        first = collect(p, len(whole) // 2)
        p.checkpoint()
    with ubik.pipeline(Q, from_=table, checkpoint=ck, **opts) as p:
        rest = collect(p)
    assert len(first) > 1 and rest
    assert pa.Table.from_batches(first + rest).equals(pa.Table.from_batches(whole))


def test_ctrl_c_interrupts_a_waiting_pipeline(tmp_path):
    # If the process hangs, it prints every thread's Python stack and exits
    # (the failure then says where), rather than running into the timeout.
    # Python leaves SIGINT ignored when it starts with it ignored (a job
    # started in the background by a non-interactive shell), so the child
    # installs the handler a terminal's Ctrl-C would find.
    script = textwrap.dedent(f"""
        import faulthandler, signal
        faulthandler.dump_traceback_later(40, exit=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import ubik, os, threading
        threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            with ubik.pipeline({Q!r}, from_="demo://orders?count=0&rate=5&realtime=1", checkpoint={str(tmp_path / 'ck')!r}) as p:
                for b in p:
                    pass
        except KeyboardInterrupt:
            print("interrupted")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "interrupted" in r.stdout, r.stderr[-2000:]
