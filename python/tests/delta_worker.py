"""The Arrow leg of the seed, as written, against a local Delta table and a
local source: iterate, buffer, MERGE, then checkpoint. Killed (SIGKILL) by
itself at the point named in UBIK_KILL_AT, to test resume."""
import os
import signal
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import ubik

Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
SCHEMA = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"
source, checkpoint, table_path = sys.argv[1:4]
kill_at = os.environ.get("UBIK_KILL_AT", "")


def maybe_die(point):
    if point == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


if not os.path.exists(os.path.join(table_path, "_delta_log")):
    # The host creates its table up front from the exact result schema.
    write_deltalake(table_path, ubik.validate(Q, schema=SCHEMA).empty_table())
dt = DeltaTable(table_path)


def merge(buf):
    (dt.merge(pa.Table.from_batches(buf),         # upsert on the (group, window) key
              predicate="t.merchant = s.merchant AND t.w = s.w",
              source_alias="s", target_alias="t")
       .when_matched_update_all()
       .when_not_matched_insert_all()
       .execute())


merges = 0
with ubik.pipeline(Q, from_=source, checkpoint=checkpoint, schema=SCHEMA, lateness="5s") as p:
    buf = []
    for window in p:                    # each closed window, as a pyarrow RecordBatch
        buf.append(window)
        if len(buf) >= 256:
            merge(buf)
            merges += 1
            maybe_die(f"merged-{merges}")
            buf.clear()
            p.checkpoint()              # commit to the lake THEN checkpoint
            maybe_die(f"checkpointed-{merges}")
    # A bounded local source ends: commit the tail too.
    if buf:
        merge(buf)
        maybe_die("merged-tail")
        p.checkpoint()
print("done", merges)
