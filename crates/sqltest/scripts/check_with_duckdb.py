#!/usr/bin/env python3
"""Cross-checks the expected changelogs of golden .slt files against DuckDB.

For every `query` preceded by `# oracle(...)` comment lines, the oracle SQL
(a one-shot DuckDB query over the same rows) is run and compared with the
fold of the expected changelog (the latest value per key, tombstones
delete). The source tables are loaded into DuckDB with three extra columns:
`_row` (the row's index in insertion order, from 0), `_part` (its source
partition), so an oracle can leave out rows the stream dead-letters, and
`_deleted`: a `DELETE FROM t WHERE id = .. AND ts = ..` statement (a
tombstone for key `id` taking effect at `ts`) is loaded as a row holding
those columns, the others NULL, with `_deleted` true.

    # oracle(key=0,1): SELECT merchant, time_bucket(...) AS w, count(*) ...
    # oracle: ... (more lines of the same SQL)

Options in the parentheses, `name=value` or flags, separated by `;`:
  key=0,1     output columns (0-based, after the +/- marker) of the key;
              `key=` for a global aggregate (the empty key)
  append      a pass-through query: the changelog is the oracle's rows, in
              order (end the oracle with ORDER BY _row)
  noprefix    skip the prefix check below

Prefix check (when every row of the table is in partition 0): in a single
partition, the rows folded into any emitted record are a prefix of the
arrival order (a window holds its on-time rows, then its late ones; a
continuous aggregate or a session folds rows in arrival order). So every
upsert of a key must equal the oracle run over some prefix of the rows, and
every tombstone must find the key absent from the oracle over some prefix,
with the prefixes non-decreasing per key.

Floats are compared with a relative tolerance of 1e-12 (DuckDB and ubik
may round sums differently in the last bit). Lists print as JSON arrays.
The oracle may call nan_to_null(v) (DuckDB's corr, regr_slope of a single
row are NaN where the SQL standard says NULL). Usage:

    pip install duckdb   # (tested with duckdb 2.0.1)
    python3 crates/sqltest/scripts/check_with_duckdb.py crates/sqltest/slt/*.slt
"""

import datetime
import json
import math
import re
import sys

import duckdb


def fmt(v):
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, str):
        return v if v else "(empty)"
    if isinstance(v, list):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


NEAR = []  # (golden, oracle) float pairs equal only within the tolerance


def same_token(a, b):
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if x == y or (math.isnan(x) and math.isnan(y)):
        return True
    if abs(x - y) <= 1e-12 * max(abs(x), abs(y), 1e-300):
        NEAR.append((a, b))
        return True
    return False


def same_row(a, b):
    return len(a) == len(b) and all(same_token(x, y) for x, y in zip(a, b))


class Table:
    def __init__(self, name, columns):
        self.name = name
        self.columns = columns
        self.rows = 0
        self.partitions = set()


def parse_records(text):
    """Yields (comments, lines) per blank-line-separated record."""
    comments, lines = [], []
    for line in text.split("\n") + [""]:
        if not line.strip():
            if lines:
                yield comments, lines
                comments, lines = [], []
            continue
        if line.startswith("#") and not lines:
            comments.append(line)
        else:
            lines.append(line)


def parse_oracle(comments):
    sql, opts = [], None
    for c in comments:
        m = re.match(r"#\s*oracle(\(([^)]*)\))?:\s?(.*)$", c)
        if not m:
            continue
        if m.group(1) is not None:
            opts = {}
            for part in m.group(2).split(";"):
                part = part.strip()
                if not part:
                    continue
                if "=" in part:
                    k, v = part.split("=", 1)
                    opts[k.strip()] = v.strip()
                else:
                    opts[part] = True
        sql.append(m.group(3))
    if not sql:
        return None
    return " ".join(sql), (opts or {})


def check_file(path):
    con = duckdb.connect()
    con.execute("CREATE MACRO nan_to_null(v) AS CASE WHEN isnan(v) THEN NULL ELSE v END")
    tables = {}
    failures, checked, unchecked = [], 0, []
    text = open(path).read()
    for comments, lines in parse_records(text):
        head = lines[0].strip()
        if head.startswith("statement"):
            sql = " ".join(l.strip() for l in lines[1:])
            low = sql.lower()
            if low.startswith("create table"):
                m = re.match(r"create table\s+(\w+)\s*\((.*)\)\s*;?$", sql, re.I | re.S)
                name, cols = m.group(1).lower(), m.group(2)
                con.execute(f"CREATE TABLE {name} ({cols}, _row INTEGER, _part INTEGER, _deleted BOOLEAN)")
                con.execute(f"CREATE TABLE {name}__stage ({cols})")
                tables[name] = Table(name, cols)
            elif low.startswith("insert"):
                m = re.match(
                    r"insert\s+into\s+(\w+)\s*(partition\s*\(\s*(\d+)\s*\))?\s*values(.*)$",
                    sql,
                    re.I | re.S,
                )
                name, part, values = m.group(1).lower(), int(m.group(3) or 0), m.group(4)
                t = tables[name]
                con.execute(f"DELETE FROM {name}__stage")
                con.execute(f"INSERT INTO {name}__stage VALUES {values}")
                n = con.execute(f"SELECT count(*) FROM {name}__stage").fetchone()[0]
                con.execute(
                    f"INSERT INTO {name} SELECT *, {t.rows} + row_number() OVER (ORDER BY rowid) - 1, {part}, false "
                    f"FROM {name}__stage ORDER BY rowid"
                )
                t.rows += n
                t.partitions.add(part)
            elif low.startswith("delete"):
                m = re.match(r"delete\s+from\s+(\w+)\s+where\s+(.*?);?$", sql, re.I | re.S)
                name = m.group(1).lower()
                t = tables[name]
                pairs = [c.split("=", 1) for c in re.split(r"\s+and\s+", m.group(2), flags=re.I)]
                cols = ", ".join(c.strip() for c, _ in pairs)
                vals = ", ".join(v.strip() for _, v in pairs)
                con.execute(f"INSERT INTO {name} ({cols}, _row, _part, _deleted) VALUES ({vals}, {t.rows}, 0, true)")
                t.rows += 1
                t.partitions.add(0)
            continue
        if not head.startswith("query") or head.startswith("query error"):
            continue
        sep = lines.index("----")
        query_sql = " ".join(l.strip() for l in lines[1:sep])
        expected = [l.split() for l in lines[sep + 1 :]]
        oracle = parse_oracle(comments)
        if oracle is None:
            unchecked.append(query_sql[:90])
            continue
        osql, opts = oracle
        checked += 1
        where = f"{path}: {query_sql[:100]}"
        src = re.search(r"\bfrom\s+(\w+)", query_sql, re.I).group(1).lower()
        table = tables[src]

        def run_oracle(prefix=None):
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW {src}__v AS SELECT * FROM {src}"
                + ("" if prefix is None else f" WHERE _row < {prefix}")
            )
            sql = re.sub(rf"\b{src}\b", f"{src}__v", osql)
            try:
                rows = con.execute(sql).fetchall()
            except duckdb.Error as e:
                raise SystemExit(f"{where}\n  oracle failed: {e}\n  {osql}")
            return [[fmt(v) for v in r] for r in rows]

        changes = [r for r in expected if r[0] in "+-"]
        if "append" in opts:
            want = [["+"] + r for r in run_oracle()]
            if len(want) != len(changes) or not all(same_row(a, b) for a, b in zip(want, changes)):
                failures.append(f"{where}\n  oracle: {want}\n  golden: {changes}")
            continue
        key = [int(k) for k in opts.get("key", "").split(",") if k.strip()]

        def keyed(rows):
            out = {}
            for r in rows:
                k = tuple(r[i] for i in key)
                if k in out:
                    raise SystemExit(f"{where}: oracle returns key {k} twice")
                out[k] = r
            return out

        fold = {}
        for r in changes:
            k = tuple(r[1 + i] for i in key)
            if r[0] == "+":
                fold[k] = r[1:]
            else:
                fold.pop(k, None)
        want = keyed(run_oracle())
        if set(fold) != set(want) or not all(same_row(fold[k], want[k]) for k in want):
            failures.append(
                f"{where}\n  oracle: {sorted(want.values())}\n  fold:   {sorted(fold.values())}"
            )
            continue
        if "noprefix" in opts or table.partitions - {0}:
            continue
        prefixes = [keyed(run_oracle(j)) for j in range(table.rows + 1)]
        at = {}
        for r in changes:
            k = tuple(r[1 + i] for i in key)
            j = at.get(k, 0)
            while j <= table.rows:
                got = prefixes[j].get(k)
                if (r[0] == "+" and got is not None and same_row(got, r[1:])) or (
                    r[0] == "-" and got is None
                ):
                    break
                j += 1
            if j > table.rows:
                failures.append(f"{where}\n  record {' '.join(r)} is the oracle over no prefix")
                break
            at[k] = j
    return checked, unchecked, failures


def main():
    total, bad = 0, 0
    for path in sys.argv[1:]:
        checked, unchecked, failures = check_file(path)
        total += checked
        bad += len(failures)
        status = "ok" if not failures else f"{len(failures)} FAILED"
        print(f"{path}: {checked} checked, {len(unchecked)} without oracle: {status}")
        for u in unchecked:
            print(f"    no oracle: {u}")
        for f in failures:
            print("  FAIL " + f)
        for a, b in sorted(set(NEAR)):
            print(f"    near: {a} vs {b}")
        NEAR.clear()
    print(f"{total} queries checked, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
