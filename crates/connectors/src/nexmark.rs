//! `nexmark://bid` (and `person`, `auction`): the Nexmark benchmark's
//! event stream, generated in process by the `nexmark` crate (RisingWave's
//! implementation of the spec: proportions 1 person : 3 auctions : 46 bids,
//! hot sellers, bidders and auctions, ids and times as the spec gives them).
//!
//! The three tables are views of one stream: sources opened with the same
//! options see the same events, each its own kind, so a pipeline reads
//! `--from nexmark://person --from nexmark://auction` and joins them. Rows
//! come as Arrow (no parsing), with the column names of RisingWave's and
//! Feldera's Nexmark SQL (`date_time`, `email_address`, ...).
//!
//! URL options (all optional): `events` (events of the whole stream, all
//! kinds; 0 = unbounded; default 1000000), `rate` (events per second of
//! event time, default 10000), `partitions` (default 1: a table's k-th
//! event goes to partition k mod n), `base` (event time of the first
//! event, RFC 3339, default 2026-01-01T00:00:00Z). The stream is a pure
//! function of these options.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use nexmark::EventGenerator;
use nexmark::config::{NexmarkConfig, RateShape};
use nexmark::event::{Event, EventType};
use serde_json::json;
use ubik_connector::{
    Chunk, ConnectorError, EVENT_TIME_METADATA, Payload, Source, SourceEvent, SourcePosition,
};

/// 2026-01-01T00:00:00Z in milliseconds.
const DEFAULT_BASE_MS: u64 = 1_767_225_600_000;

#[derive(Debug, Clone, PartialEq)]
pub struct NexmarkOptions {
    pub events: u64,
    pub rate: u64,
    pub partitions: u32,
    pub base_ms: u64,
}

impl Default for NexmarkOptions {
    fn default() -> Self {
        Self {
            events: 1_000_000,
            rate: 10_000,
            partitions: 1,
            base_ms: DEFAULT_BASE_MS,
        }
    }
}

impl NexmarkOptions {
    /// Parses `key=value&...` query options.
    pub fn parse(query: &str) -> Result<Self, ConnectorError> {
        let mut o = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad =
                |why: &str| ConnectorError::Config(format!("nexmark:// option {k}={v:?}: {why}"));
            match k {
                "events" => o.events = v.parse().map_err(|_| bad("not a count"))?,
                "rate" => {
                    o.rate = v.parse().map_err(|_| bad("not a count"))?;
                    if o.rate == 0 {
                        return Err(bad("the rate must be at least 1 event per second"));
                    }
                }
                "partitions" => {
                    o.partitions = v.parse().map_err(|_| bad("not a count"))?;
                    if o.partitions == 0 {
                        return Err(bad("at least one partition"));
                    }
                }
                "base" => {
                    let micros = ubik_connector::time::parse_rfc3339(v)
                        .ok_or_else(|| bad("not an RFC 3339 timestamp"))?;
                    o.base_ms = u64::try_from(micros / 1000).map_err(|_| bad("before 1970"))?;
                }
                _ => {
                    return Err(ConnectorError::Config(format!(
                        "unknown nexmark:// option {k:?}; options: events, rate, partitions, base"
                    )));
                }
            }
        }
        Ok(o)
    }

    fn config(&self) -> NexmarkConfig {
        NexmarkConfig {
            base_time: self.base_ms,
            rate_shape: RateShape::Square,
            first_rate: self.rate as usize,
            next_rate: self.rate as usize,
            ..NexmarkConfig::default()
        }
    }
}

/// One of the three tables of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NexmarkTable {
    Person,
    Auction,
    Bid,
}

impl NexmarkTable {
    pub fn parse(name: &str) -> Result<Self, ConnectorError> {
        match name {
            "person" => Ok(Self::Person),
            "auction" => Ok(Self::Auction),
            "bid" => Ok(Self::Bid),
            other => Err(ConnectorError::Config(format!(
                "nexmark://{other}: the Nexmark tables are person, auction and bid"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Person => "person",
            Self::Auction => "auction",
            Self::Bid => "bid",
        }
    }

    fn event_type(self) -> EventType {
        match self {
            Self::Person => EventType::Person,
            Self::Auction => EventType::Auction,
            Self::Bid => EventType::Bid,
        }
    }

    /// The table's columns (RisingWave's and Feldera's names).
    pub fn schema(self) -> SchemaRef {
        let time = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let cols: Vec<(&str, DataType)> = match self {
            Self::Person => vec![
                ("id", DataType::Int64),
                ("name", DataType::Utf8),
                ("email_address", DataType::Utf8),
                ("credit_card", DataType::Utf8),
                ("city", DataType::Utf8),
                ("state", DataType::Utf8),
                ("date_time", time()),
                ("extra", DataType::Utf8),
            ],
            Self::Auction => vec![
                ("id", DataType::Int64),
                ("item_name", DataType::Utf8),
                ("description", DataType::Utf8),
                ("initial_bid", DataType::Int64),
                ("reserve", DataType::Int64),
                ("date_time", time()),
                ("expires", time()),
                ("seller", DataType::Int64),
                ("category", DataType::Int64),
                ("extra", DataType::Utf8),
            ],
            Self::Bid => vec![
                ("auction", DataType::Int64),
                ("bidder", DataType::Int64),
                ("price", DataType::Int64),
                ("channel", DataType::Utf8),
                ("url", DataType::Utf8),
                ("date_time", time()),
                ("extra", DataType::Utf8),
            ],
        };
        Arc::new(
            Schema::new(
                cols.into_iter()
                    .map(|(n, t)| Field::new(n, t, false))
                    .collect::<Vec<_>>(),
            )
            .with_metadata([(EVENT_TIME_METADATA.to_string(), "date_time".to_string())].into()),
        )
    }
}

/// Column builders of one table's rows.
// One value per poll, never stored in bulk: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Rows {
    Person(
        [StringBuilder; 6],
        Int64Builder,
        TimestampMicrosecondBuilder,
    ),
    Auction(
        [StringBuilder; 3],
        [Int64Builder; 5],
        [TimestampMicrosecondBuilder; 2],
    ),
    Bid(
        [StringBuilder; 3],
        [Int64Builder; 3],
        TimestampMicrosecondBuilder,
    ),
}

fn micros(ms: u64) -> i64 {
    (ms as i64).saturating_mul(1000)
}

impl Rows {
    fn new(table: NexmarkTable) -> Self {
        match table {
            NexmarkTable::Person => Rows::Person(
                Default::default(),
                Int64Builder::new(),
                TimestampMicrosecondBuilder::new(),
            ),
            NexmarkTable::Auction => {
                Rows::Auction(Default::default(), Default::default(), Default::default())
            }
            NexmarkTable::Bid => Rows::Bid(
                Default::default(),
                Default::default(),
                TimestampMicrosecondBuilder::new(),
            ),
        }
    }

    fn push(&mut self, event: Event) {
        match (self, event) {
            (Rows::Person(s, id, t), Event::Person(p)) => {
                id.append_value(p.id as i64);
                for (b, v) in s.iter_mut().zip([
                    &p.name,
                    &p.email_address,
                    &p.credit_card,
                    &p.city,
                    &p.state,
                    &p.extra,
                ]) {
                    b.append_value(v);
                }
                t.append_value(micros(p.date_time));
            }
            (Rows::Auction(s, n, t), Event::Auction(a)) => {
                for (b, v) in s.iter_mut().zip([&a.item_name, &a.description, &a.extra]) {
                    b.append_value(v);
                }
                for (b, v) in
                    n.iter_mut()
                        .zip([a.id, a.initial_bid, a.reserve, a.seller, a.category])
                {
                    b.append_value(v as i64);
                }
                t[0].append_value(micros(a.date_time));
                t[1].append_value(micros(a.expires));
            }
            (Rows::Bid(s, n, t), Event::Bid(b)) => {
                for (col, v) in s.iter_mut().zip([&b.channel, &b.url, &b.extra]) {
                    col.append_value(v);
                }
                for (col, v) in n.iter_mut().zip([b.auction, b.bidder, b.price]) {
                    col.append_value(v as i64);
                }
                t.append_value(micros(b.date_time));
            }
            // The generator is filtered to the table's kind.
            _ => {}
        }
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, ConnectorError> {
        let utc = |b: &mut TimestampMicrosecondBuilder| -> ArrayRef {
            Arc::new(b.finish().with_timezone("UTC"))
        };
        let columns: Vec<ArrayRef> = match self {
            Rows::Person(s, id, t) => {
                let [name, email, card, city, state, extra] = s;
                vec![
                    Arc::new(id.finish()),
                    Arc::new(name.finish()),
                    Arc::new(email.finish()),
                    Arc::new(card.finish()),
                    Arc::new(city.finish()),
                    Arc::new(state.finish()),
                    utc(t),
                    Arc::new(extra.finish()),
                ]
            }
            Rows::Auction(s, n, t) => {
                let [item, description, extra] = s;
                let [id, initial, reserve, seller, category] = n;
                let [date_time, expires] = t;
                vec![
                    Arc::new(id.finish()),
                    Arc::new(item.finish()),
                    Arc::new(description.finish()),
                    Arc::new(initial.finish()),
                    Arc::new(reserve.finish()),
                    utc(date_time),
                    utc(expires),
                    Arc::new(seller.finish()),
                    Arc::new(category.finish()),
                    Arc::new(extra.finish()),
                ]
            }
            Rows::Bid(s, n, t) => {
                let [channel, url, extra] = s;
                let [auction, bidder, price] = n;
                vec![
                    Arc::new(auction.finish()),
                    Arc::new(bidder.finish()),
                    Arc::new(price.finish()),
                    Arc::new(channel.finish()),
                    Arc::new(url.finish()),
                    utc(t),
                    Arc::new(extra.finish()),
                ]
            }
        };
        RecordBatch::try_new(Arc::clone(schema), columns)
            .map_err(|e| ConnectorError::Fatal(format!("nexmark rows: {e}")))
    }
}

/// One partition: the table's events k, k + n, k + 2n, ... of the stream.
struct Partition {
    /// The index (among the table's events) of the next one to generate.
    next: u64,
    ended: bool,
}

pub struct NexmarkSource {
    table: NexmarkTable,
    options: NexmarkOptions,
    schema: SchemaRef,
    config: NexmarkConfig,
    partitions: Vec<Partition>,
    /// The partition the next poll serves (round-robin).
    turn: usize,
    ended_reported: bool,
}

impl NexmarkSource {
    pub fn new(table: NexmarkTable, options: NexmarkOptions) -> Self {
        let partitions = (0..options.partitions)
            .map(|p| Partition {
                next: u64::from(p),
                ended: false,
            })
            .collect();
        Self {
            config: options.config(),
            schema: table.schema(),
            table,
            options,
            partitions,
            turn: 0,
            ended_reported: false,
        }
    }

    /// A generator positioned at the table's `index`-th event.
    fn generator(&self, index: u64) -> EventGenerator {
        EventGenerator::new(self.config.clone())
            .with_type_filter(self.table.event_type())
            .with_offset(index)
            .with_step(u64::from(self.options.partitions))
    }
}

impl Source for NexmarkSource {
    fn table(&self) -> &str {
        self.table.name()
    }

    fn schema(&self) -> Option<SchemaRef> {
        Some(Arc::clone(&self.schema))
    }

    fn partitions(&self) -> Vec<u32> {
        (0..self.options.partitions).collect()
    }

    fn poll(
        &mut self,
        max_records: usize,
        _timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        let n = self.partitions.len();
        let Some(p) = (0..n)
            .map(|k| (self.turn + k) % n)
            .find(|&p| !self.partitions[p].ended)
        else {
            if self.ended_reported {
                return Ok(SourceEvent::Idle);
            }
            self.ended_reported = true;
            return Ok(SourceEvent::End);
        };
        self.turn = (p + 1) % n;
        let mut generator = self.generator(self.partitions[p].next);
        let mut rows = Rows::new(self.table);
        let mut positions = Vec::with_capacity(max_records.max(1));
        let bounded = self.options.events > 0;
        while positions.len() < max_records.max(1) {
            if bounded && generator.global_offset() >= self.options.events {
                break;
            }
            positions.push(generator.offset());
            let Some(event) = generator.next() else {
                break;
            };
            rows.push(event);
        }
        if positions.is_empty() {
            self.partitions[p].ended = true;
            return Ok(SourceEvent::PartitionEnd(p as u32));
        }
        self.partitions[p].next = generator.offset();
        Ok(SourceEvent::Chunk(Chunk {
            partition: p as u32,
            payload: Payload::Arrow(rows.finish(&self.schema)?),
            positions,
            position_name: "event",
            meta: Default::default(),
        }))
    }

    fn position(&self) -> SourcePosition {
        json!({
            "next": self.partitions.iter().map(|p| p.next).collect::<Vec<_>>(),
            "ended": self.partitions.iter().map(|p| p.ended).collect::<Vec<_>>(),
        })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        for (i, p) in self.partitions.iter_mut().enumerate() {
            if let Some(next) = position["next"][i].as_u64() {
                p.next = next;
            }
            p.ended = position["ended"][i].as_bool().unwrap_or(false);
        }
        self.ended_reported = false;
        Ok(())
    }

    fn describe(&self) -> String {
        let o = &self.options;
        format!(
            "nexmark://{} ({} events at {}/s, {} partitions)",
            self.table.name(),
            o.events,
            o.rate,
            o.partitions
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_rows(table: NexmarkTable, options: &str) -> Vec<RecordBatch> {
        let mut s = NexmarkSource::new(table, NexmarkOptions::parse(options).unwrap());
        let mut out = Vec::new();
        loop {
            match s.poll(1000, Duration::ZERO).unwrap() {
                SourceEvent::Chunk(c) => {
                    let Payload::Arrow(b) = c.payload else {
                        panic!("nexmark rows are Arrow")
                    };
                    out.push(b);
                }
                SourceEvent::End => return out,
                _ => {}
            }
        }
    }

    fn count(batches: &[RecordBatch]) -> usize {
        batches.iter().map(RecordBatch::num_rows).sum()
    }

    #[test]
    fn the_three_tables_hold_the_spec_proportions_of_one_stream() {
        let n = 50_000;
        let opts = format!("events={n}");
        let counts: Vec<usize> = [
            NexmarkTable::Person,
            NexmarkTable::Auction,
            NexmarkTable::Bid,
        ]
        .into_iter()
        .map(|t| count(&all_rows(t, &opts)))
        .collect();
        assert_eq!(counts, vec![n / 50, n / 50 * 3, n / 50 * 46]);
    }

    #[test]
    fn partitions_split_the_same_events_and_times_follow_the_rate() {
        let one = arrow::compute::concat_batches(
            &NexmarkTable::Bid.schema(),
            &all_rows(NexmarkTable::Bid, "events=5000&rate=1000"),
        )
        .unwrap();
        let four = all_rows(NexmarkTable::Bid, "events=5000&rate=1000&partitions=4");
        assert_eq!(count(&four), one.num_rows());
        let key = |b: &RecordBatch, i: usize| -> String {
            (0..b.num_columns())
                .map(|c| arrow::util::display::array_value_to_string(b.column(c), i).unwrap())
                .collect::<Vec<_>>()
                .join("|")
        };
        let mut a: Vec<String> = (0..one.num_rows()).map(|i| key(&one, i)).collect();
        let mut b: Vec<String> = four
            .iter()
            .flat_map(|batch| (0..batch.num_rows()).map(move |i| key(batch, i)))
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        // 5000 events at 1000/s span 5 seconds of event time.
        let times = one
            .column(5)
            .as_any()
            .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
            .unwrap();
        let span = times.value(times.len() - 1) - times.value(0);
        assert!((4_900_000..=5_000_000).contains(&span), "{span}");
    }

    #[test]
    fn a_seek_resumes_the_same_stream() {
        let opts = NexmarkOptions::parse("events=3000&partitions=2").unwrap();
        let mut s = NexmarkSource::new(NexmarkTable::Auction, opts.clone());
        let SourceEvent::Chunk(_) = s.poll(10, Duration::ZERO).unwrap() else {
            panic!()
        };
        let at = s.position();
        let SourceEvent::Chunk(c1) = s.poll(10, Duration::ZERO).unwrap() else {
            panic!()
        };
        let mut t = NexmarkSource::new(NexmarkTable::Auction, opts);
        t.seek(&at).unwrap();
        t.turn = 1;
        let SourceEvent::Chunk(c2) = t.poll(10, Duration::ZERO).unwrap() else {
            panic!()
        };
        assert_eq!(c1.positions, c2.positions);
        let (Payload::Arrow(a), Payload::Arrow(b)) = (c1.payload, c2.payload) else {
            panic!()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn bad_options_are_named() {
        for (opts, needle) in [
            ("events=x", "events"),
            ("rate=0", "rate"),
            ("partitions=0", "partitions"),
            ("speed=3", "unknown"),
        ] {
            let e = NexmarkOptions::parse(opts).unwrap_err().to_string();
            assert!(e.contains(needle), "{opts}: {e}");
        }
        assert!(NexmarkTable::parse("bids").is_err());
    }
}
