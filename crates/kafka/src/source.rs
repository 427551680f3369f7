//! [`KafkaSource`]: every partition of a topic, assigned explicitly.
//!
//! Each record's timestamp travels with it ([`RecordMeta::timestamps`]); a
//! tombstone (a keyed record without a value, how a compacted topic deletes
//! a key) is passed on as a deletion whose bytes are the record's key.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::CString;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;
use tracing::warn;
use ubik_connector::{
    Chunk, ConnectorError, Payload, RecordMeta, Source, SourceEvent, SourcePosition,
};

use crate::admin::{METADATA_TIMEOUT, partitions};
use crate::batch::ConsumerQueue;
use crate::config::{Bound, KafkaUrl};
use crate::error::Error;
use crate::purge::Purger;

/// Records read from the broker but not yet returned, per partition.
#[derive(Default)]
struct Buffered {
    data: Vec<u8>,
    spans: Vec<std::ops::Range<usize>>,
    offsets: Vec<u64>,
    meta: RecordMeta,
}

impl Buffered {
    /// Room for a chunk like `last`: a chunk's buffers leave with it, and
    /// growing the next from empty by doubling costs a copy of each byte and
    /// fresh pages at every step (3% of a Kafka-to-Kafka run's CPU).
    fn sized_like(last: (usize, usize)) -> Self {
        let (bytes, records) = last;
        Self {
            data: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(records),
            offsets: Vec::with_capacity(records),
            meta: RecordMeta {
                timestamps: Vec::with_capacity(records),
                ..RecordMeta::default()
            },
        }
    }
}

/// Reports librdkafka errors that rdkafka itself serves, except the
/// end-of-partition notices that `enable.partition.eof` turns on (they are
/// events here, not errors). The source's batch reads get consumer errors as
/// messages and global ones as log lines (see `batch.rs`).
pub struct SourceContext;

impl ClientContext for SourceContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // The end of a partition is news for the poll loop, not a warning
        // (librdkafka reports it as a partition's and as a global error).
        if !matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        ) {
            warn!("librdkafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for SourceContext {}

pub struct KafkaSource {
    url: KafkaUrl,
    /// The topic's name for librdkafka's C calls, made once (`lag` runs
    /// every report, and every round for a finished keyed task).
    topic_c: Option<CString>,
    /// Declared before `consumer`: dropped first, as librdkafka wants.
    queue: ConsumerQueue,
    consumer: BaseConsumer<SourceContext>,
    partitions: Vec<i32>,
    /// Next offset to return, per partition: the source position.
    next: BTreeMap<i32, i64>,
    /// Exclusive end offsets of a bounded run.
    end: Option<BTreeMap<i32, i64>>,
    ended: BTreeSet<i32>,
    buffered: BTreeMap<i32, Buffered>,
    /// Bytes and records of the last chunk returned: the next buffer's size.
    last_chunk: (usize, usize),
    events: VecDeque<SourceEvent>,
    all_ended_reported: bool,
    last_warning: Option<Instant>,
    purger: Option<Purger>,
    /// Where the consumer stood at a partition's last end-of-log, past
    /// transaction markers: the position once its buffer is handed out.
    end_of_log: BTreeMap<i32, i64>,
}

fn offset_of(o: Offset, low: i64, high: i64) -> i64 {
    match o {
        Offset::Offset(n) => n,
        Offset::End => high,
        _ => low,
    }
}

impl KafkaSource {
    /// Connects, resolves start (and end) offsets, and assigns partitions,
    /// waiting (with logged backoff, up to five minutes) while the brokers
    /// are unreachable.
    pub fn open(url: &str, properties: &BTreeMap<String, String>) -> Result<Self, Error> {
        let mut delay = Duration::from_millis(500);
        let started = Instant::now();
        loop {
            match Self::try_open(url, properties) {
                Err(Error::Transient(m)) if started.elapsed() < Duration::from_secs(300) => {
                    warn!("opening {url}: {m}; retrying in {delay:?}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
                other => return other,
            }
        }
    }

    fn try_open(url: &str, properties: &BTreeMap<String, String>) -> Result<Self, Error> {
        let url = KafkaUrl::parse(url)?;
        let group = url
            .group
            .clone()
            .unwrap_or_else(|| format!("ubik-{}", url.topic));
        let mut config = url.client_config_with(
            &[
                ("isolation.level", "read_committed"),
                ("auto.offset.reset", "earliest"),
                // librdkafka's default (1 s) stops fetching for a whole second
                // each time its queue fills: a backfill then reads ~140 K
                // records/s with the CPU mostly idle; 10 ms keeps the queue fed.
                ("fetch.queue.backoff.ms", "10"),
            ],
            properties,
        );
        config
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true");
        let consumer: BaseConsumer<SourceContext> = config.create_with_context(SourceContext)?;
        let purger = match url.purge {
            true => Some(Purger::new(&url.client_config(properties), &url.topic)?),
            false => None,
        };
        let mut parts = partitions(&consumer, &url.topic)?.ok_or_else(|| {
            Error::Topic(format!(
                "input topic {} does not exist on {}",
                url.topic, url.bootstrap
            ))
        })?;
        if let Some(only) = &url.assign {
            if let Some(missing) = only.iter().find(|p| !parts.contains(p)) {
                return Err(Error::Config(format!(
                    "assign={missing}: topic {} has partitions 0..{}",
                    url.topic,
                    parts.len()
                )));
            }
            parts.retain(|p| only.contains(p));
        }
        let queue = ConsumerQueue::of(&consumer)
            .ok_or_else(|| Error::Config("librdkafka gave the consumer no queue".into()))?;
        let mut source = Self {
            topic_c: CString::new(url.topic.as_str()).ok(),
            url,
            queue,
            consumer,
            partitions: parts,
            next: BTreeMap::new(),
            end: None,
            ended: BTreeSet::new(),
            buffered: BTreeMap::new(),
            last_chunk: (0, 0),
            events: VecDeque::new(),
            all_ended_reported: false,
            last_warning: None,
            purger,
            end_of_log: BTreeMap::new(),
        };
        let start = source.resolve(&source.url.start.clone())?;
        if let Some(end) = source.url.end.clone() {
            source.end = Some(source.resolve(&end)?);
        }
        source.assign(start)?;
        Ok(source)
    }

    /// Concrete offsets of a bound, per partition.
    fn resolve(&self, bound: &Bound) -> Result<BTreeMap<i32, i64>, Error> {
        let mut out = BTreeMap::new();
        let mut marks = BTreeMap::new();
        for &p in &self.partitions {
            let (low, high) = self
                .consumer
                .fetch_watermarks(&self.url.topic, p, METADATA_TIMEOUT)
                .map_err(|e| {
                    Error::Transient(format!(
                        "cannot read offsets of {}/{p}: {e}",
                        self.url.topic
                    ))
                })?;
            marks.insert(p, (low, high));
        }
        match bound {
            Bound::Earliest => marks.iter().for_each(|(&p, &(low, _))| {
                out.insert(p, low);
            }),
            Bound::Latest => marks.iter().for_each(|(&p, &(_, high))| {
                out.insert(p, high);
            }),
            Bound::Group => {
                let mut tpl = TopicPartitionList::new();
                for &p in &self.partitions {
                    tpl.add_partition(&self.url.topic, p);
                }
                let committed = self
                    .consumer
                    .committed_offsets(tpl, METADATA_TIMEOUT)
                    .map_err(|e| Error::Transient(format!("cannot read committed offsets: {e}")))?;
                for e in committed.elements() {
                    let (low, high) = marks[&e.partition()];
                    out.insert(e.partition(), offset_of(e.offset(), low, high).max(low));
                }
            }
            Bound::Time(ms) => {
                let mut tpl = TopicPartitionList::new();
                for &p in &self.partitions {
                    tpl.add_partition_offset(&self.url.topic, p, Offset::Offset(*ms))?;
                }
                let found = self
                    .consumer
                    .offsets_for_times(tpl, METADATA_TIMEOUT)
                    .map_err(|e| {
                        Error::Transient(format!("cannot look up offsets by time: {e}"))
                    })?;
                for e in found.elements() {
                    let (low, high) = marks[&e.partition()];
                    out.insert(e.partition(), offset_of(e.offset(), low, high));
                }
            }
        }
        Ok(out)
    }

    fn assign(&mut self, next: BTreeMap<i32, i64>) -> Result<(), Error> {
        self.next = next;
        self.buffered.clear();
        self.end_of_log.clear();
        self.events.clear();
        self.ended.clear();
        self.all_ended_reported = false;
        let mut tpl = TopicPartitionList::new();
        for &p in &self.partitions {
            let at = self.next[&p];
            if self.end.as_ref().is_some_and(|e| at >= e[&p]) {
                self.ended.insert(p);
                self.events.push_back(SourceEvent::PartitionEnd(p as u32));
                continue;
            }
            tpl.add_partition_offset(&self.url.topic, p, Offset::Offset(at))?;
        }
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    fn warn_rate_limited(&mut self, message: String) {
        if self
            .last_warning
            .is_none_or(|t| t.elapsed() > Duration::from_secs(5))
        {
            warn!("{message} (retrying)");
            self.last_warning = Some(Instant::now());
        }
    }

    fn mark_ended(&mut self, p: i32) {
        if self.ended.insert(p) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.url.topic, p);
            let _ = self.consumer.pause(&tpl);
            self.events.push_back(SourceEvent::PartitionEnd(p as u32));
        }
    }

    /// At the end of a partition's log the consumer stands past the records
    /// a read_committed reader skips (transaction markers, aborted records),
    /// which the position then covers too: a caught-up source is at the
    /// log's end, and its lag is 0. `at` is the end-of-partition notice's
    /// offset: where the next fetch starts. (Not the consumer's position:
    /// a batch read moves that one past the notice's offset.)
    fn note_end_of_log(&mut self, p: i32, at: i64) {
        match self.buffered.get(&p).is_some_and(|b| !b.offsets.is_empty()) {
            true => {
                self.end_of_log.insert(p, at);
            }
            false => {
                let next = self.next.entry(p).or_insert(at);
                *next = (*next).max(at);
            }
        }
    }

    /// Pulls messages from librdkafka into the per-partition buffers.
    fn fetch(&mut self, max_records: usize, timeout: Duration) -> Result<(), Error> {
        let mut past_end = Vec::new();
        let mut at_end_of_log = Vec::new();
        let mut error = None;
        let Self {
            queue,
            end,
            buffered,
            last_chunk,
            ..
        } = self;
        queue.read(max_records, timeout, |m| {
            match m.error {
                None => {}
                Some(RDKafkaErrorCode::PartitionEOF) => {
                    return at_end_of_log.push((m.partition, m.offset));
                }
                Some(code) => {
                    error.get_or_insert(code);
                    return;
                }
            }
            if let Some(end) = end
                && m.offset >= end[&m.partition]
            {
                return past_end.push(m.partition);
            }
            let b = buffered
                .entry(m.partition)
                .or_insert_with(|| Buffered::sized_like(*last_chunk));
            let start = b.data.len();
            match (m.payload, m.key) {
                (None, Some(key)) => {
                    b.meta.deletions.push(b.offsets.len() as u32);
                    b.data.extend_from_slice(key);
                }
                (payload, _) => b.data.extend_from_slice(payload.unwrap_or_default()),
            }
            b.spans.push(start..b.data.len());
            b.offsets.push(m.offset as u64);
            b.meta.timestamps.push(m.timestamp_ms);
        });
        for p in past_end {
            self.mark_ended(p);
        }
        for (p, at) in at_end_of_log {
            self.note_end_of_log(p, at);
            // At the end of the log: a bounded run is done with the
            // partition once everything before its end offset was read.
            if self.end.is_some() {
                self.mark_ended(p);
            }
        }
        if let Some(code) = error {
            self.warn_rate_limited(format!(
                "kafka consumer: {}",
                KafkaError::MessageConsumption(code)
            ));
        }
        Ok(())
    }
}

impl Source for KafkaSource {
    fn table(&self) -> &str {
        &self.url.topic
    }

    fn partitions(&self) -> Vec<u32> {
        self.partitions.iter().map(|&p| p as u32).collect()
    }

    fn poll(
        &mut self,
        max_records: usize,
        timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        if self.buffered.values().all(|b| b.offsets.is_empty()) && self.events.is_empty() {
            self.fetch(max_records, timeout)?;
        }
        // Records of one partition at a time, oldest partition buffer first.
        let ready = self
            .buffered
            .iter()
            .filter(|(_, b)| !b.offsets.is_empty())
            .map(|(&p, _)| p)
            .next();
        if let Some(p) = ready {
            let b = self.buffered.remove(&p).unwrap_or_default();
            let last = *b.offsets.last().expect("non-empty");
            self.last_chunk = (b.data.len(), b.offsets.len());
            let past_markers = self.end_of_log.remove(&p).unwrap_or(0);
            self.next.insert(p, (last as i64 + 1).max(past_markers));
            return Ok(SourceEvent::Chunk(Chunk {
                partition: p as u32,
                payload: Payload::Bytes {
                    data: b.data,
                    spans: b.spans,
                },
                positions: b.offsets,
                position_name: "offset",
                meta: b.meta,
            }));
        }
        if let Some(ev) = self.events.pop_front() {
            return Ok(ev);
        }
        if self.end.is_some() && self.ended.len() == self.partitions.len() {
            if !self.all_ended_reported {
                self.all_ended_reported = true;
            }
            return Ok(SourceEvent::End);
        }
        Ok(SourceEvent::Idle)
    }

    fn position(&self) -> SourcePosition {
        let next: BTreeMap<String, i64> =
            self.next.iter().map(|(p, o)| (p.to_string(), *o)).collect();
        json!({ "topic": self.url.topic, "next": next })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        if position["topic"].as_str() != Some(self.url.topic.as_str()) {
            return Err(ConnectorError::Config(format!(
                "the checkpoint was taken on topic {}, not {}",
                position["topic"], self.url.topic
            )));
        }
        let mut next = self.next.clone();
        if let Some(map) = position["next"].as_object() {
            for (p, o) in map {
                if let (Ok(p), Some(o)) = (p.parse::<i32>(), o.as_i64()) {
                    next.insert(p, o);
                }
            }
        }
        self.assign(next).map_err(Into::into)
    }

    fn commit(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        if let Some(purger) = &mut self.purger {
            let next: BTreeMap<i32, i64> = position["next"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(p, o)| Some((p.parse().ok()?, o.as_i64()?)))
                .collect();
            if let Err(e) = purger.release(&next) {
                self.warn_rate_limited(format!("{e}"));
            }
        }
        // Group offsets are for monitoring (lag dashboards) only.
        let mut tpl = TopicPartitionList::new();
        for (&p, &o) in &self.next {
            tpl.add_partition_offset(&self.url.topic, p, Offset::Offset(o))
                .map_err(|e| ConnectorError::Fatal(e.to_string()))?;
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            self.warn_rate_limited(format!("committing group offsets: {e}"));
        }
        Ok(())
    }

    fn sample(&mut self, n: usize) -> Result<Vec<Vec<u8>>, ConnectorError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self
            .buffered
            .values()
            .map(|b| b.offsets.len())
            .sum::<usize>()
            < n
            && Instant::now() < deadline
        {
            let before: usize = self.buffered.values().map(|b| b.offsets.len()).sum();
            self.fetch(n, Duration::from_millis(200))?;
            let after: usize = self.buffered.values().map(|b| b.offsets.len()).sum();
            if after == before && self.end.is_some() && self.ended.len() == self.partitions.len() {
                break;
            }
        }
        Ok(self
            .buffered
            .values()
            .flat_map(|b| b.spans.iter().map(|s| b.data[s.clone()].to_vec()))
            .take(n)
            .collect())
    }

    fn describe(&self) -> String {
        format!(
            "{} [{} partitions]",
            self.url.display(),
            self.partitions.len()
        )
    }

    /// From the high watermarks of the consumer's latest fetch responses,
    /// so reporting a group's tasks costs no broker round trips. Reading a
    /// partition's last committed records means the response that brought
    /// them saw the transaction markers after them: a caught-up reader's lag
    /// is 0 then, as the end of a bounded exchange needs.
    fn lag(&mut self) -> Option<u64> {
        let topic = self.topic_c.as_deref()?;
        let mut lag = 0u64;
        for (&p, &next) in &self.next {
            let high = self.queue.cached_high_watermark(topic, p)?;
            lag += (high - next).max(0) as u64;
        }
        Some(lag)
    }
}
