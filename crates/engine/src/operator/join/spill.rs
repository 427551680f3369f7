//! An interval join's rows under the memory budget.
//!
//! A row is held until no row of the other side can fall within bounds,
//! plus the join retention: with a long retention most rows held have
//! fired long ago and only wait to be matched by a row still to come. The
//! budget moves such rows out by join key, both sides' rows of a key
//! together, least recently used keys first, to the tables
//! `<path>spilled/<side>` ([`StoredVersions`](super::StoredVersions), bookkept). A key goes only
//! when every row of it has fired, and, in a LEFT join, every left row of
//! it has matched (an unmatched row is padded at its expiry, from memory).
//! A key's rows come back, one batched lookup per batch, before a new row
//! of the key is taken in; so a row that fires finds every row of its key
//! in memory, and the output does not depend on the budget.
//!
//! The stored rows are deleted when read back, and the store drops a key's
//! row once its latest expiry has passed. With a durable store the rows
//! are also in the join's row log ([`RowLog`](super::RowLog)), which
//! checkpoints use: a spill first logs the rows not logged yet, and a
//! restore reads the log and forgets the spilled tables.

use arrow::array::BooleanArray;
use arrow::compute::filter_record_batch;

use super::{HeldRows, JoinOperator, pick};
use crate::error::Result;
use crate::operator::join_versions::{Bookkeeping, Loaded};
use crate::state::keyed::Evicted;

impl JoinOperator {
    /// Before rows of keys `keys` are taken in: their keys' spilled rows
    /// come back, and the keys are the most recently used.
    pub(super) fn take_back(&mut self, keys: &[u32]) -> Result<()> {
        let n = self.interner.len();
        let Some(spilled) = self.spilled.as_mut() else {
            return Ok(());
        };
        for s in spilled.iter_mut() {
            s.grow(n);
        }
        // Both sides leave and come back together: the left side's use
        // order picks the victims for both.
        spilled[0].touch(keys);
        let unloaded = spilled[0].unloaded(keys.iter().copied());
        if unloaded.is_empty() {
            return Ok(());
        }
        let groups: Vec<usize> = unloaded.iter().map(|&k| k as usize).collect();
        let key_columns = self.interner.keys(&groups)?;
        for side in 0..2 {
            let spilled = self.spilled.as_mut().expect("checked above");
            let loaded = spilled[side].load(&unloaded, &key_columns)?;
            let (held, probe, kept) = alive(loaded, self.fired_through)?;
            let keys: Vec<u32> = probe.iter().map(|&p| unloaded[p]).collect();
            self.stores[side].push_fired(held, &keys, kept);
        }
        Ok(())
    }

    /// Moves the least recently used keys' rows out until about `target`
    /// bytes of both sides are held (see the module docs for which may go).
    pub(super) fn spill_rows(&mut self, target: usize) -> Result<Evicted> {
        let held = self.spillable();
        if held <= target || self.spilled.is_none() {
            return Ok(Evicted::default());
        }
        let candidates = self.evictable_keys();
        let keep = (candidates.len() as f64 * (target as f64 / held as f64)) as usize;
        let spilled = self.spilled.as_ref().expect("checked above");
        let victims = spilled[0].victims(&candidates, keep);
        if victims.is_empty() {
            return Ok(Evicted::default());
        }
        // A row leaves memory logged: the next checkpoint reads the log's
        // new rows from memory.
        for side in 0..2 {
            if let Some(log) = self.logs[side].as_mut() {
                log.checkpoint(&self.stores[side])?;
            }
        }
        let mut bytes_written = 0;
        for side in 0..2 {
            let store = &self.stores[side];
            let (mut ids, mut counts, mut entries) = (Vec::new(), Vec::new(), Vec::new());
            for &k in &victims {
                let before = entries.len();
                let list = store.by_key.get(k as usize).map_or(&[][..], Vec::as_slice);
                entries.extend(list.iter().copied().filter(|&e| store.alive[e as usize]));
                if entries.len() > before {
                    ids.push(k as usize);
                    counts.push(entries.len() - before);
                }
            }
            if ids.is_empty() {
                continue;
            }
            let rows = store.held(&entries)?;
            let kept = Bookkeeping {
                expires: pick(&store.expires, &entries),
                seq: pick(&store.seq, &entries),
                matched: pick(&store.matched, &entries),
            };
            let key_columns = self.interner.keys(&ids)?;
            let spilled = self.spilled.as_mut().expect("checked above");
            bytes_written += spilled[side].write(key_columns, &counts, &rows, &kept)?;
        }
        for side in 0..2 {
            for &k in &victims {
                self.stores[side].forget_key(k);
            }
            self.stores[side].compact_now()?;
            let spilled = self.spilled.as_mut().expect("checked above");
            spilled[side].evicted(&victims);
        }
        Ok(Evicted {
            groups: victims.len(),
            written: victims.len(),
            bytes_written,
        })
    }

    /// Keys holding rows whose rows may all leave memory: every one fired,
    /// and (a LEFT join's left rows) matched.
    fn evictable_keys(&self) -> Vec<u32> {
        let pads = self.pads();
        let mut keys = Vec::new();
        for k in 0..self.interner.len() {
            let mut holds = false;
            let mut pinned = false;
            for (side, store) in self.stores.iter().enumerate() {
                for &e in store.by_key.get(k).map_or(&[][..], Vec::as_slice) {
                    let e = e as usize;
                    if !store.alive[e] {
                        continue;
                    }
                    holds = true;
                    pinned |= store.effective[e] >= self.fired_through
                        || (pads && side == 0 && !store.matched[e]);
                }
            }
            if holds && !pinned {
                keys.push(k as u32);
            }
        }
        keys
    }

    /// Every spilled row of `side` still alive, for a snapshot that cannot
    /// refer to the store's files.
    pub(super) fn spilled_rows(&mut self, side: usize) -> Result<Vec<(HeldRows, Vec<bool>)>> {
        let fired = self.fired_through;
        let Some(spilled) = self.spilled.as_mut().filter(|s| s[side].cold()) else {
            return Ok(Vec::new());
        };
        let mut parts = Vec::new();
        spilled[side].scan(|loaded| {
            let (held, _, kept) = alive(loaded, fired)?;
            parts.push((held, kept.matched));
            Ok(())
        })?;
        Ok(parts)
    }

    /// The watermark moved to `watermark`: stored keys whose rows all
    /// expired are gone.
    pub(super) fn expire_spilled(&mut self, watermark: i64) -> Result<()> {
        for s in self.spilled.iter_mut().flatten() {
            s.expired(watermark)?;
        }
        Ok(())
    }
}

/// The rows of `loaded` not expired when the watermark has fired up to
/// `fired` (a row expiring before it was dropped from memory by then).
fn alive(loaded: Loaded, fired: i64) -> Result<(HeldRows, Vec<usize>, Bookkeeping)> {
    let Loaded { held, probe, kept } = loaded;
    if kept.expires.iter().all(|&x| x >= fired) {
        return Ok((held, probe, kept));
    }
    let keep: Vec<bool> = kept.expires.iter().map(|&x| x >= fired).collect();
    let held = HeldRows {
        rows: filter_record_batch(&held.rows, &BooleanArray::from(keep.clone()))?,
        times: filtered(&held.times, &keep),
        effective: filtered(&held.effective, &keep),
        present: filtered(&held.present, &keep),
    };
    let kept = Bookkeeping {
        expires: filtered(&kept.expires, &keep),
        seq: filtered(&kept.seq, &keep),
        matched: filtered(&kept.matched, &keep),
    };
    Ok((held, filtered(&probe, &keep), kept))
}

fn filtered<T: Copy>(of: &[T], keep: &[bool]) -> Vec<T> {
    of.iter()
        .zip(keep)
        .filter(|(_, k)| **k)
        .map(|(v, _)| *v)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use ubik_state::StoreOptions;

    use super::*;
    use crate::plan::QueryOptions;
    use crate::sql::{Catalog, plan_query};
    use crate::state::SharedStore;
    use crate::time::MAX_TIME;

    const SECOND: i64 = 1_000_000;

    /// `orders LEFT JOIN payments` within an hour after each order, with
    /// its rows in `store` if given.
    fn join(store: Option<&SharedStore>) -> JoinOperator {
        let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let orders = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("ts", time.clone(), true),
        ]));
        let payments = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, true),
            Field::new("order_id", DataType::Int64, true),
            Field::new("ts", time, true),
        ]));
        let catalog = Catalog::new()
            .with_table("orders", orders)
            .with_table("payments", payments);
        let q = "SELECT o.id, p.pid FROM orders o LEFT JOIN payments p ON p.order_id = o.id \
                 AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1 HOUR'";
        let plan = plan_query(q, &catalog, QueryOptions::default()).unwrap();
        let plan = plan.join.expect("a join");
        let fields: Vec<_> = plan
            .sides
            .iter()
            .flat_map(|s| s.schema.fields().to_vec())
            .collect();
        let schema = Arc::new(Schema::new(fields));
        JoinOperator::new(&plan, schema, 0, store.map(|s| (s, "j/"))).unwrap()
    }

    fn batch(schema: &Arc<Schema>, ints: Vec<Vec<i64>>, times: &[i64]) -> RecordBatch {
        let mut columns: Vec<arrow::array::ArrayRef> = ints
            .into_iter()
            .map(|c| Arc::new(Int64Array::from(c)) as _)
            .collect();
        columns.push(Arc::new(
            TimestampMicrosecondArray::from(times.to_vec()).with_timezone("UTC"),
        ));
        RecordBatch::try_new(Arc::clone(schema), columns).unwrap()
    }

    /// Each second an order and a few payments of orders up to an hour
    /// old; the spilling join moves every row it may out after each
    /// firing, and must find them again for the payments still to come.
    #[test]
    fn spilled_rows_come_back_for_later_matches() {
        let store = SharedStore::temporary(None, StoreOptions::default());
        let (mut plain, mut spilling) = (join(None), join(Some(&store)));
        let schemas = [0, 1].map(|s| Arc::clone(&plain.plan.sides[s].schema));
        let (mut expected, mut got) = (Vec::new(), Vec::new());
        let mut evicted = 0;
        let mut rng = 7u64;
        for t in 0..1200i64 {
            let ts = t * SECOND;
            let orders = batch(&schemas[0], vec![vec![t]], &[ts]);
            let mut payments = (Vec::new(), Vec::new());
            for p in 0..3 {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Half the orders get payments, spread over their hour.
                let order = t - (rng >> 33) as i64 % 600;
                if order >= 0 && order % 2 == 0 {
                    payments.0.push(t * 10 + p);
                    payments.1.push(order);
                }
            }
            let times = vec![ts; payments.0.len()];
            let payments = batch(&schemas[1], vec![payments.0, payments.1], &times);
            for j in [&mut plain, &mut spilling] {
                j.insert(0, orders.clone(), &[ts], None, None).unwrap();
                j.insert(1, payments.clone(), &times, None, None).unwrap();
            }
            let wm = ts - 5 * SECOND;
            expected.extend(plain.fire(wm).unwrap().map(|j| j.rows));
            got.extend(spilling.fire(wm).unwrap().map(|j| j.rows));
            evicted += spilling.spill(0).unwrap().groups;
        }
        expected.extend(plain.fire(MAX_TIME).unwrap().map(|j| j.rows));
        got.extend(spilling.fire(MAX_TIME).unwrap().map(|j| j.rows));
        let rows = |b: &[RecordBatch]| b.iter().map(RecordBatch::num_rows).sum::<usize>();
        assert!(
            rows(&expected) > 1200,
            "matches and pads: {}",
            rows(&expected)
        );
        assert_eq!(expected, got, "the budget changed the joined rows");
        assert!(evicted > 1000, "only {evicted} keys were moved out");
    }
}
