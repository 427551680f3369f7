"""stream(...).arrow() against DuckDB one-shot; in-process Arrow inputs; files."""
import json

import pyarrow as pa
import pytest

import ubik
from conftest import SCHEMA, assert_same, duck, events, to_table, write_jsonl

CASES = [
    (
        "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, count(amount) AS na, "
        "sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi "
        "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')",
        "SELECT merchant, time_bucket(INTERVAL '1 minute', ts) AS w, count(*) AS n, count(amount) AS na, "
        "sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi FROM orders GROUP BY ALL",
        ["merchant", "w"],
    ),
    (
        "SELECT merchant, HOP(ts, INTERVAL '20 SECONDS', INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total "
        "FROM orders GROUP BY merchant, HOP(ts, INTERVAL '20 SECONDS', INTERVAL '1 MINUTE')",
        "SELECT merchant, w, count(*) AS n, sum(amount) AS total FROM ("
        " SELECT merchant, amount, time_bucket(INTERVAL '20 seconds', ts) - INTERVAL (k * 20) SECOND AS w"
        " FROM orders, range(3) t(k)) GROUP BY ALL",
        ["merchant", "w"],
    ),
    (
        "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant HAVING count(*) > 280",
        "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY ALL HAVING count(*) > 280",
        ["merchant"],
    ),
    (
        "SELECT merchant, SESSION(ts, INTERVAL '2 SECONDS') AS s, count(*) AS n, max(ts) AS last "
        "FROM orders GROUP BY merchant, SESSION(ts, INTERVAL '2 SECONDS')",
        "WITH o AS (SELECT *, CASE WHEN ts - lag(ts) OVER (PARTITION BY merchant ORDER BY ts) < INTERVAL 2 SECOND "
        "THEN 0 ELSE 1 END AS brk FROM orders), s AS (SELECT *, sum(brk) OVER (PARTITION BY merchant ORDER BY ts "
        "ROWS UNBOUNDED PRECEDING) AS sid FROM o) SELECT merchant, min(ts) AS s, count(*) AS n, max(ts) AS last "
        "FROM s GROUP BY merchant, sid",
        ["merchant", "s"],
    ),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_arrow_equals_duckdb(seed, case):
    sql, oracle, key = CASES[case]
    rows = events(2000 + 500 * seed, keys=3 + seed, step_ms=400, disorder_ms=3000, seed=seed)
    table = to_table(rows)
    got = ubik.stream(sql, from_=table, lateness="5s", retention="1h").arrow()
    want = duck(oracle, table)
    assert_same(got, want, key)


def test_in_process_arrow_forms(orders):
    sql = CASES[0][0]
    table = to_table(orders)
    expected = ubik.stream(sql, from_=table).arrow()
    batches = table.to_batches(max_chunksize=333)
    for form in [table.to_reader(max_chunksize=100), batches, iter(batches), pa.Table.from_batches(batches)]:
        assert ubik.stream(sql, from_=form).arrow().equals(expected)
    one = ubik.stream(sql, from_=batches[0]).arrow()
    assert one.num_rows > 0


def test_file_source_and_changelog_iteration(tmp_path, orders):
    sql = CASES[0][0]
    path = write_jsonl(tmp_path / "orders.jsonl", orders)
    from_file = ubik.stream(sql, from_=f"file://{path}", schema=SCHEMA).arrow()
    assert from_file.equals(ubik.stream(sql, from_=to_table(orders)).arrow())
    s = ubik.stream(sql, from_=to_table(orders))
    reader = s.to_reader()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.read_all().num_rows >= from_file.num_rows


def test_bad_input_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"merchant":"a","ts":"2024-01-01T00:00:00Z","amount":1}\n{oops\n')
    sql = CASES[0][0]
    with pytest.raises(ubik.DecodeError, match="line 2"):
        ubik.stream(sql, from_=f"file://{path}", schema=SCHEMA).arrow()
    got = ubik.stream(sql, from_=f"file://{path}", schema=SCHEMA, on_error="skip").arrow()
    assert got.num_rows == 1
    with pytest.raises(ubik.SourceError, match="unsupported source"):
        ubik.stream(sql, from_="ftp://x/y")
    with pytest.raises(ubik.SourceError):
        ubik.stream(sql, from_=f"file://{tmp_path}/missing.jsonl", schema=SCHEMA)
    with pytest.raises(TypeError):
        ubik.stream(sql, from_=42)


def test_big_batches_on_several_threads_equal_one_thread_and_duckdb():
    # One 120k-row batch: ubik cuts it into batch_size pieces, folds each on
    # `threads` threads; the result must not depend on either knob.
    sql, oracle, key = CASES[0]
    table = to_table(events(120_000, keys=40, step_ms=5, disorder_ms=3000, seed=9))
    one = ubik.stream(sql, from_=table, lateness="5s", retention="1h", threads=1).arrow()
    for threads, batch_size in [(2, 65_536), (3, 40_000)]:
        many = ubik.stream(sql, from_=table, lateness="5s", retention="1h",
                           threads=threads, batch_size=batch_size).arrow()
        assert many.equals(one), (threads, batch_size)
    assert_same(one, duck(oracle, table), key)


def test_dead_letters_reach_the_host(tmp_path):
    """on_dead_letter receives each record set aside, with its bytes, reason
    and position; the good records are counted as usual."""
    rows = events(300, keys=3, step_ms=1000, disorder_ms=0, seed=4, nulls=False)
    path = write_jsonl(tmp_path / "orders.jsonl", rows)
    lines = open(path).read().splitlines()
    lines.insert(10, '{"merchant": "m001", "ts": "not a time", "amount": 1.5}')
    lines.insert(50, "not json at all")
    open(path, "w").write("\n".join(lines) + "\n")
    letters = []
    got = ubik.stream(CASES[0][0], from_=f"file://{path}", schema=SCHEMA, on_error="dlq",
                      on_dead_letter=letters.append).arrow()
    assert [(d.reason, d.position, d.position_name) for d in letters] == [("decode", 11, "line"), ("decode", 51, "line")]
    assert letters[1].record == b"not json at all" and letters[0].source == f"file://{path}"
    assert "not a time" in letters[0].record.decode()
    assert_same(got, duck(CASES[0][1], to_table(rows)), ["merchant", "w"])


def test_a_failing_dead_letter_callback_stops_the_stream(tmp_path):
    path = write_jsonl(tmp_path / "orders.jsonl", events(50, nulls=False))
    with open(path, "a") as f:
        f.write("not json\n")

    def refuse(letter):
        raise RuntimeError(f"refused {letter.reason}")

    with pytest.raises(RuntimeError, match="refused decode"):
        ubik.stream(CASES[0][0], from_=f"file://{path}", schema=SCHEMA, on_error="dlq", on_dead_letter=refuse).arrow()


def test_inferred_numbers_are_double_so_a_later_fraction_decodes(tmp_path):
    """Without schema=, a sample whose amounts are all whole must not fix
    an integer column that a later 128.5 cannot enter."""
    path = tmp_path / "orders.jsonl"
    with open(path, "w") as f:
        for i in range(2000):
            amount = 128 if i < 1500 else 128.5
            f.write(json.dumps({"merchant": "m", "ts": f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z", "amount": amount}) + "\n")
    s = ubik.stream(CASES[0][0], from_=f"file://{path}")
    assert s.schema.field("total").type == pa.float64()
    got = s.arrow()
    assert sum(got.column("total").to_pylist()) == 1500 * 128 + 500 * 128.5


def test_spilled_state_gives_the_same_table_and_duckdb_agrees(tmp_path):
    # 20 000 keys hold several MiB of groups: at 1 MiB they spill to disk and are read back.
    sql = "SELECT merchant, count(*) AS n, sum(amount) AS total, max(amount) AS hi FROM orders GROUP BY merchant"
    rows = events(60_000, keys=20_000, step_ms=5, disorder_ms=0, seed=4)
    table = to_table(rows)
    in_memory = ubik.stream(sql, from_=table).arrow()
    spilled = ubik.stream(sql, from_=table, state_memory="1MiB", state_dir=str(tmp_path)).arrow()
    assert spilled.equals(in_memory)
    want = duck("SELECT merchant, count(*) AS n, sum(amount) AS total, max(amount) AS hi FROM orders GROUP BY ALL", table)
    assert_same(spilled, want, ["merchant"])
    with pytest.raises(ValueError, match="state_memory"):
        ubik.stream(sql, from_=table, state_memory="lots").arrow()
