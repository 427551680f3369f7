"""The seed document's pipeline loop, copied as written (the same query with
count(*) only, no schema=, no lateness, the same 256-window buffer, MERGE
predicate and checkpoint after the merge), against the real Kafka test
broker and a local Delta table.

    python seed_worker.py BROKER TOPIC TABLE_PATH CHECKPOINT_DIR

Deviations from the seed's text, each marked "deviation" below:
- the broker address, topic, Delta table path and checkpoint directory come
  from argv instead of kafka://localhost:9092/orders, s3://lake/orders_agg
  and ~/.ubik/orders;
- the seed opens DeltaTable(...) on a table that already exists; here the
  first full buffer creates it (write_deltalake) when it does not exist yet,
  because without schema= the host does not know the result schema before
  the first window;
- it kills itself (SIGKILL) at the point UBIK_KILL_AT names: "merged-N"
  (right after the N-th merge of this run, before its checkpoint) or
  "checkpointed-N" (right after the N-th checkpoint of this run).

A Kafka pipeline is unbounded: the loop never ends by itself; the test
kills the process."""
import os
import signal
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import ubik

broker, topic, table_path, checkpoint = sys.argv[1:5]
kill_at = os.environ.get("UBIK_KILL_AT", "")


def maybe_die(point):
    if point == kill_at:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


Q = ("SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n "
     "FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')")
# deviation: the table is created by the first merge if it does not exist yet.
dt = DeltaTable(table_path) if os.path.exists(os.path.join(table_path, "_delta_log")) else None

merges = 0
# deviation: the broker, topic and checkpoint directory from argv.
with ubik.pipeline(Q, from_=f"kafka://{broker}/{topic}",
                   checkpoint=checkpoint) as p:
    buf = []
    for window in p:                    # each closed window, as a pyarrow RecordBatch
        buf.append(window)
        if len(buf) >= 256:
            if dt is None:
                # deviation: create the table from the first buffer (its schema is the result's).
                write_deltalake(table_path, pa.Table.from_batches(buf))
                dt = DeltaTable(table_path)
            else:
                (dt.merge(pa.Table.from_batches(buf),         # upsert on the (group, window) key
                          predicate="t.merchant = s.merchant AND t.w = s.w",
                          source_alias="s", target_alias="t")
                   .when_matched_update_all()
                   .when_not_matched_insert_all()
                   .execute())
            merges += 1
            print("merged", merges, flush=True)
            maybe_die(f"merged-{merges}")
            buf.clear()
            p.checkpoint()              # commit to the lake THEN checkpoint
            print("checkpointed", merges, flush=True)
            maybe_die(f"checkpointed-{merges}")
