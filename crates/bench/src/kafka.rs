//! The broker's own rate, the peer of the Kafka -> ubik -> Kafka benchmark:
//!
//! - `kafka-load BROKER TOPIC FILE.jsonl PARTITIONS [KEY_FIELD]`: creates
//!   TOPIC and produces one message per line, without a key (spread over the
//!   partitions) or keyed by the line's KEY_FIELD (partitioned by it).
//! - `kafka-copy BROKER IN OUT`: consumes IN from the start to the end
//!   offsets taken when it starts and produces every message, same key and
//!   value, to OUT with ubik's producer settings (idempotent, acks=all,
//!   lz4, linger 5 ms), then flushes. Same message sizes as ubik's input, so
//!   this is the produce+consume rate a pipeline would have with no work.

use std::io::BufRead;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

fn producer(broker: &str) -> Result<BaseProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// Produces, retrying while librdkafka's queue is full.
fn send(p: &BaseProducer, topic: &str, key: Option<&[u8]>, value: &[u8]) -> Result<()> {
    let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(value);
    if let Some(k) = key {
        record = record.key(k);
    }
    loop {
        match p.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                record = r;
                p.poll(Duration::from_millis(5));
            }
            Err((e, _)) => bail!("produce to {topic}: {e}"),
        }
    }
}

pub fn load(
    broker: &str,
    topic: &str,
    path: &str,
    partitions: i32,
    key_field: Option<&str>,
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let created = futures_executor::block_on(admin.create_topics([&new], &AdminOptions::new()))?;
    for r in created {
        r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    let p = producer(broker)?;
    let f = std::fs::File::open(path).with_context(|| format!("open {path}"))?;
    let mut n = 0u64;
    for line in std::io::BufReader::with_capacity(1 << 20, f).lines() {
        let line = line?;
        let key = match key_field {
            None => None,
            Some(f) => {
                let v: serde_json::Value = serde_json::from_str(&line)
                    .with_context(|| format!("line {} is not JSON", n + 1))?;
                Some(match &v[f] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            }
        };
        send(
            &p,
            topic,
            key.as_deref().map(str::as_bytes),
            line.as_bytes(),
        )?;
        n += 1;
    }
    p.flush(Duration::from_secs(120))?;
    println!("{}", json!({"bench": "kafka-load", "messages": n}));
    Ok(())
}

pub fn copy(broker: &str, input: &str, output: &str) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set(
            "group.id",
            format!("ubik-bench-copy-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let meta = consumer.fetch_metadata(Some(input), TIMEOUT)?;
    let parts = meta.topics()[0].partitions().len() as i32;
    if parts == 0 {
        bail!("topic {input} not found");
    }
    let start = Instant::now();
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0i64;
    let mut ends = Vec::new();
    for p in 0..parts {
        let (lo, hi) = consumer.fetch_watermarks(input, p, TIMEOUT)?;
        assignment.add_partition_offset(input, p, rdkafka::Offset::Offset(lo))?;
        remaining += hi - lo;
        ends.push(hi);
    }
    consumer.assign(&assignment)?;
    let producer = producer(broker)?;
    let (mut messages, mut bytes) = (0u64, 0u64);
    while remaining > 0 {
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m?;
        if m.offset() >= ends[m.partition() as usize] {
            continue;
        }
        let value = m.payload().unwrap_or_default();
        send(&producer, output, m.key(), value)?;
        producer.poll(Duration::ZERO);
        messages += 1;
        bytes += value.len() as u64;
        remaining -= 1;
    }
    producer.flush(Duration::from_secs(120))?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "kafka-copy", "messages": messages, "bytes": bytes, "seconds": seconds,
               "messages_per_s": messages as f64 / seconds})
    );
    Ok(())
}
