"""validate(): the exact result schema before any row is read, and errors."""
import pyarrow as pa
import pytest

import ubik
from conftest import SCHEMA, events, to_table

W = "TUMBLE(ts, INTERVAL '1 MINUTE')"
QUERIES = [
    f"SELECT merchant, {W} AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, {W}",
    f"SELECT merchant, {W} AS w, min(amount) AS lo, max(amount) AS hi, stddev(amount) AS sd, var_pop(amount) AS vp, "
    f"count(DISTINCT merchant) AS nd, approx_distinct(merchant) AS ad FROM orders GROUP BY merchant, {W}",
    "SELECT merchant, HOP(ts, INTERVAL '30 SECONDS', INTERVAL '1 MINUTE') AS w, count(*) AS n FROM orders "
    "GROUP BY merchant, HOP(ts, INTERVAL '30 SECONDS', INTERVAL '1 MINUTE')",
    "SELECT merchant, SESSION(ts, INTERVAL '10 SECONDS') AS s, WINDOW_END(SESSION(ts, INTERVAL '10 SECONDS')) AS e, "
    "count(*) AS n FROM orders GROUP BY merchant, SESSION(ts, INTERVAL '10 SECONDS')",
    "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant HAVING count(*) > 5",
    "SELECT merchant, amount * 2 AS doubled FROM orders WHERE amount > 100",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_validate_matches_produced_batches(sql):
    schema = ubik.validate(sql, schema=SCHEMA)
    table = to_table(events(500, seed=3))
    got = list(ubik.stream(sql, from_=table, lateness="5s"))
    assert got, "the query produced no batch"
    for b in got:
        assert b.schema.remove_metadata() == schema.remove_metadata(), (b.schema, schema)


def test_window_column_type_and_key():
    schema = ubik.validate(QUERIES[0], schema=SCHEMA)
    assert schema.field("w").type == pa.timestamp("us", tz="UTC")
    assert ubik.key_columns(schema) == ["merchant", "w"]
    assert schema.metadata[b"ubik.kind"] == b"windowed (TUMBLE) aggregation"


def test_schema_forms():
    arrow_schema = pa.schema([("merchant", pa.string()), ("ts", pa.timestamp("ms", tz="UTC")), ("amount", pa.float64())])
    a = ubik.validate(QUERIES[0], schema=arrow_schema)
    b = ubik.validate(QUERIES[0], schema={"orders": arrow_schema})
    c = ubik.validate(QUERIES[0], schema=SCHEMA)
    assert a == b == c


def test_retracting_queries_carry_deleted_column():
    schema = ubik.validate(QUERIES[4], schema=SCHEMA)
    assert schema.names[-1] == "_deleted"
    assert "_deleted" not in ubik.validate(QUERIES[0], schema=SCHEMA).names


def test_errors():
    with pytest.raises(ubik.SqlError) as e:
        ubik.validate("SELECT merchant,, FROM orders", schema=SCHEMA)
    assert e.value.line == 1 and e.value.column is not None
    with pytest.raises(ubik.SqlError) as e:
        ubik.validate("SELECT nope FROM orders", schema=SCHEMA)
    assert e.value.column == 8 and "nope" in str(e.value)
    # The same text as the CLI: the query line quoted, a caret under the mistake.
    with pytest.raises(ubik.SqlError) as e:
        ubik.validate("SELECT merchant,\n  cnt(*) AS n\nFROM orders GROUP BY merchant", schema=SCHEMA)
    assert (e.value.line, e.value.column) == (2, 3)
    assert str(e.value) == (
        "unknown function `cnt`\n --> line 2, column 3\n  |\n2 |   cnt(*) AS n\n  |   ^^^\n"
        "hint: did you mean `count`? (windows are TUMBLE, HOP and SESSION; aggregates include "
        "count, sum, avg, min, max, stddev, approx_distinct)"
    )
    assert e.value.hint.startswith("did you mean `count`?")
    with pytest.raises(ubik.UnsupportedQueryError, match="window column"):
        ubik.validate(f"SELECT merchant, count(*) FROM orders GROUP BY merchant, {W}", schema=SCHEMA)
    with pytest.raises(ubik.SchemaError, match="VARCHAR"):
        ubik.validate(QUERIES[0], schema="merchant NOPE, ts TIMESTAMP")
    with pytest.raises(ubik.SqlError, match="not a source"):
        ubik.validate("SELECT * FROM other", schema=SCHEMA, table="orders")
    assert issubclass(ubik.UnsupportedQueryError, ubik.SqlError)
    assert issubclass(ubik.SqlError, ubik.UbikError)
