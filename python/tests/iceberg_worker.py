"""The Arrow leg of the seed against a local Apache Iceberg table (pyiceberg,
a SQL catalog on sqlite) and a local source: iterate, buffer, upsert with the
pipeline's position in the snapshot summary, then checkpoint. On start it
resumes from the position the table's current snapshot records, not from the
newest checkpoint. Killed (SIGKILL) by itself at the point named in
UBIK_KILL_AT, to test resume."""
import os
import signal
import sys

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

import ubik

Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
SCHEMA = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"
KEY = ["merchant", "w"]
POSITION = "ubik.position"
source, checkpoint, lake = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
kill_at = os.environ.get("UBIK_KILL_AT", "")


def maybe_die(point):
    if point == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


os.makedirs(os.path.join(lake, "warehouse"), exist_ok=True)
catalog = SqlCatalog("ubik", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse")
catalog.create_namespace_if_not_exists("ubik")
# The host creates its table up front from the exact result schema, as is:
# merchant and w stay optional, so they cannot be Iceberg identifier fields
# (those must be required); the upsert names its join columns instead.
result = ubik.validate(Q, schema=SCHEMA)
assert ubik.key_columns(result) == KEY
table = catalog.create_table_if_not_exists("ubik.orders", schema=result)


def merge(buf, position):
    props = {POSITION: position}
    with table.transaction() as tx:                 # one atomic commit
        # One chunk, not one per window: pyarrow evaluates upsert's filter
        # (an OR over every key) chunk by chunk, ~100x slower on 256 chunks.
        df = pa.Table.from_batches(buf).combine_chunks()
        r = tx.upsert(df, join_cols=KEY, snapshot_properties=props)
        if r.rows_updated == 0 and r.rows_inserted == 0:
            # Nothing changed (a replay of what the table already has):
            # upsert then writes no snapshot, so record the position with
            # an empty one.
            tx.append(df.slice(0, 0), snapshot_properties=props)


# Resume from what the lake has committed: the position stored with the
# table's last commit names the checkpoint written right after that commit.
snapshot = table.current_snapshot()
resume = snapshot.summary[POSITION] if snapshot is not None else None
opts = {"resume_from": resume} if resume else {}

merges = 0
with ubik.pipeline(Q, from_=source, checkpoint=checkpoint, schema=SCHEMA, lateness="5s", **opts) as p:
    buf = []
    for window in p:                    # each closed window, as a pyarrow RecordBatch
        buf.append(window)
        if len(buf) >= 256:
            merge(buf, p.position)
            merges += 1
            maybe_die(f"merged-{merges}")
            buf.clear()
            p.checkpoint()              # commit to the lake THEN checkpoint
            maybe_die(f"checkpointed-{merges}")
    # A bounded local source ends: commit the tail too.
    if buf:
        merge(buf, p.position)
        maybe_die("merged-tail")
        p.checkpoint()
print("done", merges, "resumed from", resume)
