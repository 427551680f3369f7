//! [`Query`]: a compiled plan plus its running state. Sources feed it
//! decoded batches per partition; it stamps rows against their partition's
//! watermark, hands them to the operator, and fires the operator whenever the
//! global watermark (the minimum over partitions) advances.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{Array, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{filter_record_batch, take_record_batch};

use crate::checkpoint::QuerySnapshot;
use crate::error::{EngineError, Result};
use crate::operator::continuous::ContinuousOperator;
use crate::operator::emit::Emitter;
use crate::operator::eval::{eval_array, eval_predicate};
use crate::operator::session::SessionOperator;
use crate::operator::window::WindowOperator;
use crate::operator::{ChangeBatch, Operator, Output, Reject, RejectReason, StampedBatch};
use crate::plan::{EventTime, PassthroughPlan, QueryKind, QueryPlan, WindowSpec};
use crate::progress::Progress;
use crate::time::{MIN_TIME, to_micros};

pub struct Query {
    plan: Arc<QueryPlan>,
    operator: Option<Box<dyn Operator>>,
    progress: Progress,
    /// The global watermark the operator was last fired with.
    fired: i64,
}

fn wall_clock_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Query {
    pub fn new(plan: QueryPlan) -> Result<Self> {
        let plan = Arc::new(plan);
        let operator: Option<Box<dyn Operator>> = match &plan.kind {
            QueryKind::Passthrough(_) => None,
            QueryKind::Aggregate(a) => {
                let emitter =
                    Emitter::new(a, Arc::clone(&plan.output_schema), plan.key_columns.clone());
                let schema = Arc::clone(&plan.source.schema);
                Some(match a.window {
                    Some(WindowSpec::Tumble { .. }) | Some(WindowSpec::Hop { .. }) => {
                        Box::new(WindowOperator::new(a, &plan.options, emitter, schema)?)
                    }
                    Some(WindowSpec::Session { .. }) => {
                        Box::new(SessionOperator::new(a, &plan.options, emitter, schema)?)
                    }
                    None => Box::new(ContinuousOperator::new(a, &plan.options, emitter, schema)?),
                })
            }
        };
        let lateness = match &plan.kind {
            QueryKind::Aggregate(a) if matches!(a.event_time, EventTime::Column(_)) => {
                plan.options.lateness_us.max(0)
            }
            _ => 0,
        };
        Ok(Self {
            plan,
            operator,
            progress: Progress::new(lateness),
            fired: MIN_TIME,
        })
    }

    pub fn plan(&self) -> &QueryPlan {
        &self.plan
    }

    /// Declares a source partition up front: until it reports progress it
    /// holds the global watermark back (as an unread Kafka partition must).
    pub fn add_partition(&mut self, partition: u32) {
        self.progress.partition(partition);
    }

    /// The global watermark (µs, or rows for queries without event time).
    pub fn watermark(&self) -> i64 {
        self.progress.global()
    }

    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Feeds a batch of source rows read from `partition`, in read order.
    pub fn process(&mut self, partition: u32, batch: &RecordBatch, out: &mut Output) -> Result<()> {
        self.check_schema(batch)?;
        let plan = Arc::clone(&self.plan);
        match &plan.kind {
            QueryKind::Passthrough(p) => self.passthrough(p, batch, out),
            QueryKind::Aggregate(a) => {
                let stamped =
                    self.stamp(partition, batch, a.filter.as_deref(), &a.event_time, out)?;
                if let Some(stamped) = stamped {
                    self.operator
                        .as_mut()
                        .expect("aggregate operator")
                        .process_batch(stamped, out)?;
                }
                self.fire(out)
            }
        }
    }

    /// Advances a partition's watermark without data (idle close). The
    /// runtime records where it did so, so a replay can do the same.
    pub fn push_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        out: &mut Output,
    ) -> Result<()> {
        let p = self.progress.partition(partition);
        p.pushed = p.pushed.max(watermark);
        self.fire(out)
    }

    /// A bounded partition has no more rows.
    pub fn end_partition(&mut self, partition: u32, out: &mut Output) -> Result<()> {
        self.progress.partition(partition).ended = true;
        self.fire(out)
    }

    /// Every partition has ended: close all windows, flush everything.
    pub fn finish(&mut self, out: &mut Output) -> Result<()> {
        if self.progress.partitions.is_empty() {
            self.progress.partition(0);
        }
        for p in self.progress.partitions.values_mut() {
            p.ended = true;
        }
        self.fire(out)
    }

    fn fire(&mut self, out: &mut Output) -> Result<()> {
        let wm = self.progress.global();
        if wm > self.fired {
            self.fired = wm;
            if let Some(op) = self.operator.as_mut() {
                op.handle_watermark(wm, out)?;
            }
        }
        Ok(())
    }

    fn check_schema(&self, batch: &RecordBatch) -> Result<()> {
        let expected = &self.plan.source.schema;
        let got = batch.schema();
        let same = expected.fields().len() == got.fields().len()
            && expected
                .fields()
                .iter()
                .zip(got.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if same {
            Ok(())
        } else {
            Err(EngineError::Schema(format!(
                "input batch schema {got:?} does not match the declared source schema {expected:?}"
            )))
        }
    }

    fn passthrough(
        &mut self,
        p: &PassthroughPlan,
        batch: &RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        let batch = match &p.filter {
            Some(f) => filter_record_batch(batch, &eval_predicate(f.as_ref(), batch)?)?,
            None => batch.clone(),
        };
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let columns = p
            .projection
            .iter()
            .map(|e| eval_array(e.as_ref(), &batch))
            .collect::<Result<Vec<_>>>()?;
        let rows = RecordBatch::try_new(Arc::clone(&self.plan.output_schema), columns)?;
        let timestamps = match &p.event_time {
            EventTime::Column(e) => to_micros(&eval_array(e.as_ref(), &batch)?)?,
            EventTime::Ordinal => Int64Array::new_null(batch.num_rows()),
        };
        out.changes.push(ChangeBatch {
            rows,
            deletes: None,
            timestamps,
        });
        Ok(())
    }

    /// Applies WHERE, checks event times, and stamps each kept row with its
    /// partition's watermark before it.
    fn stamp(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        filter: Option<&dyn datafusion_physical_expr::PhysicalExpr>,
        event_time: &EventTime,
        out: &mut Output,
    ) -> Result<Option<StampedBatch>> {
        let n = batch.num_rows();
        let lateness = self.progress.lateness;
        let keep = match filter {
            Some(f) => Some(eval_predicate(f, batch)?),
            None => None,
        };
        let progress = self.progress.partition(partition);
        let mut times = Vec::with_capacity(n);
        let mut stamps = Vec::with_capacity(n);
        let mut origin = Vec::with_capacity(n);
        match event_time {
            EventTime::Column(expr) => {
                let ts = to_micros(&eval_array(expr.as_ref(), batch)?)?;
                let limit = wall_clock_micros().saturating_add(self.plan.options.max_future_us);
                let values = ts.values();
                for i in 0..n {
                    let kept = keep.as_ref().is_none_or(|k| k.value(i));
                    if ts.is_null(i) {
                        if kept {
                            out.rejects.push(Reject {
                                partition,
                                row: i,
                                reason: RejectReason::NullEventTime,
                            });
                        }
                        continue;
                    }
                    let t = values[i];
                    if t > limit {
                        if kept {
                            out.rejects.push(Reject {
                                partition,
                                row: i,
                                reason: RejectReason::FutureEventTime {
                                    event_time: t,
                                    limit,
                                },
                            });
                        }
                        continue;
                    }
                    if kept {
                        times.push(t);
                        stamps.push(progress.watermark(lateness));
                        origin.push(i as u32);
                    }
                    if t > progress.max_time {
                        progress.max_time = t;
                    }
                }
            }
            EventTime::Ordinal => {
                for i in 0..n {
                    let ordinal = progress.rows as i64 + i as i64;
                    if keep.as_ref().is_none_or(|k| k.value(i)) {
                        times.push(ordinal);
                        stamps.push(progress.watermark(0));
                        origin.push(i as u32);
                    }
                    progress.max_time = ordinal;
                }
            }
        }
        progress.rows += n as u64;
        if origin.is_empty() {
            return Ok(None);
        }
        let rows = if origin.len() == n {
            batch.clone()
        } else if let Some(k) = keep.as_ref().filter(|k| k.true_count() == origin.len()) {
            filter_record_batch(batch, k)?
        } else {
            take_record_batch(batch, &UInt32Array::from(origin.clone()))?
        };
        Ok(Some(StampedBatch {
            partition,
            batch: rows,
            times,
            stamps,
            origin,
        }))
    }

    /// The state for a checkpoint, taken between batches.
    pub fn snapshot(&mut self) -> Result<QuerySnapshot> {
        Ok(QuerySnapshot {
            progress: self.progress.clone(),
            fired: self.fired,
            operator: match self.operator.as_mut() {
                Some(op) => op.handle_checkpoint()?,
                None => Default::default(),
            },
        })
    }

    /// Restores a fresh query from a snapshot of the same plan.
    pub fn restore(&mut self, snapshot: QuerySnapshot) -> Result<()> {
        self.progress = snapshot.progress;
        self.fired = snapshot.fired;
        if let Some(op) = self.operator.as_mut() {
            op.restore(snapshot.operator)?;
        }
        Ok(())
    }

    pub fn state_size(&self) -> usize {
        self.operator.as_ref().map_or(0, |o| o.state_size())
    }

    pub fn state_keys(&self) -> usize {
        self.operator.as_ref().map_or(0, |o| o.state_keys())
    }
}
