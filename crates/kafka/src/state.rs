//! [`StateTopic`]: a task's checkpoints replicated to a compacted topic, so
//! that whichever process takes the task over restores it from Kafka.
//!
//! Records of task `T`, all on partition `T % partitions`:
//!
//! ```text
//! key "T"                        manifest: {"epoch", "writer", "files": [{"name", "len", "chunks"}],
//!                                           "shared": [{"name", "len", "chunks"}], "summary"}
//! key "T/WRITER/EPOCH/FILE/I"    chunk I of the checkpoint's own FILE (at most CHUNK bytes)
//! key "T/WRITER/run/FILE/I"      chunk I of a shared FILE (a state store run)
//! key "T/idle"                   the idle-close log
//! ```
//!
//! Chunks are written before their manifest, on the same partition, so a
//! reader that sees a manifest has seen its chunks. Once the new manifest
//! is durable, the chunks it no longer names are deleted (tombstones); the
//! topic is compacted, so it holds about one checkpoint per task.
//!
//! The state topic carries deltas: a checkpoint's own files are small (the
//! state store's runs hold the keyed state), and a shared file, immutable
//! and uniquely named, is uploaded by the first checkpoint that names it
//! and kept while checkpoints name it. So each checkpoint uploads the runs
//! written since the previous one (what changed, plus the store's
//! compactions), and a restore reads the base runs plus the deltas.
//!
//! Chunk keys name their writer (one per opening of a task), and a writer
//! names only chunks it wrote itself: a fenced former owner that is still
//! saving cannot mix its files into the new owner's checkpoint, nor delete
//! files the new owner relies on. So a task's first checkpoint after it
//! moves uploads its shared files again, whole (its restore read them whole
//! anyway), and deletes the former owner's.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseRecord;
use serde_json::json;
use tracing::debug;
use ubik_connector::{CheckpointFiles, CheckpointReplica, ConnectorError, Replicated, SharedFile};

use crate::admin::{METADATA_TIMEOUT, ensure_topic_with};
use crate::config::{EmitMode, KafkaUrl};
use crate::error::Error;
use crate::retention::topic_config;
use crate::sink::{DeliveryErrors, UbikProducer, flush, producer, send};
use crate::source::SourceContext;

/// Bytes per chunk record: under the broker's default `message.max.bytes` (1 MB).
const CHUNK: usize = 512 * 1024;

/// How long a save waits for the broker: as long as librdkafka retries a
/// record (`message.timeout.ms`, 2 minutes unless set), and a little more
/// for its report. A broker that stalls (under load, or restarting) delays
/// the checkpoint, which completes in the background, instead of stopping
/// the task.
fn flush_timeout(properties: &BTreeMap<String, String>) -> Duration {
    let ms = properties
        .get("message.timeout.ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(120_000);
    Duration::from_millis(ms) + Duration::from_secs(5)
}

/// One task's checkpoints on a state topic.
pub struct StateTopic {
    url: KafkaUrl,
    properties: BTreeMap<String, String>,
    task: u32,
    partition: i32,
    writer: String,
    producer: UbikProducer,
    errors: DeliveryErrors,
    flush_timeout: Duration,
    /// Chunk keys to delete once the next manifest is durable: the last
    /// saved checkpoint's own files, and what a load found of other writers.
    chunks: Vec<String>,
    /// The shared files this writer uploaded that its last manifest names.
    shared: BTreeMap<String, Uploaded>,
}

/// A file's chunks on the topic.
struct Uploaded {
    len: u64,
    keys: Vec<String>,
}

impl Uploaded {
    fn listing(&self, name: &str) -> serde_json::Value {
        json!({"name": name, "len": self.len, "chunks": self.keys.len()})
    }
}

/// A name unique to this opening of a task.
fn writer_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
}

impl StateTopic {
    /// Opens task `task`'s checkpoints on `topic` (at `bootstrap`), creating
    /// the topic (compacted, `partitions` partitions) if it is missing and
    /// refusing one that is not compacted.
    pub fn open(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        task: u32,
        properties: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let url = KafkaUrl::parse(&format!(
            "kafka://{bootstrap}/{topic}?partitions={partitions}&cleanup=compact"
        ))?;
        let client = url.client_config(properties);
        let parts = ensure_topic_with(
            &url,
            &client,
            &[("cleanup.policy", "compact")],
            "state topic",
        )?;
        let [policy] =
            <[Option<String>; 1]>::try_from(topic_config(&client, topic, &["cleanup.policy"])?)
                .map_err(|_| Error::Transient(format!("incomplete config of topic {topic}")))?;
        let policy = policy.unwrap_or_else(|| "delete".into());
        if !policy.split(',').any(|p| p.trim() == "compact") {
            return Err(Error::Topic(format!(
                "state topic {topic} has cleanup.policy={policy}: the broker would delete the checkpoints tasks restore from; set cleanup.policy=compact on it (kafka-configs --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact)"
            )));
        }
        let (producer, errors) = producer(&url, properties, EmitMode::Idempotent, None)?;
        Ok(Self {
            partition: (task % parts.len() as u32) as i32,
            url,
            properties: properties.clone(),
            task,
            writer: writer_id(),
            producer,
            errors,
            flush_timeout: flush_timeout(properties),
            chunks: Vec::new(),
            shared: BTreeMap::new(),
        })
    }

    fn put(&self, key: &str, value: Option<&[u8]>) -> Result<(), Error> {
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.url.topic)
            .partition(self.partition)
            .key(key.as_bytes());
        if let Some(v) = value {
            r = r.payload(v);
        }
        send(&self.producer, r)
    }

    /// Writes `bytes` as chunks keyed `PREFIX/I` (one empty chunk if empty).
    fn put_chunks(&self, prefix: &str, bytes: &[u8]) -> Result<Uploaded, Error> {
        let pieces: Vec<&[u8]> = if bytes.is_empty() {
            vec![&[][..]]
        } else {
            bytes.chunks(CHUNK).collect()
        };
        let mut keys = Vec::with_capacity(pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            let key = format!("{prefix}/{i}");
            self.put(&key, Some(piece))?;
            keys.push(key);
        }
        Ok(Uploaded {
            len: bytes.len() as u64,
            keys,
        })
    }

    /// Writes a shared file as chunks, reading it a chunk at a time.
    fn put_file(&self, file: &SharedFile) -> Result<Uploaded, Error> {
        let unreadable =
            |e: std::io::Error| Error::Io(format!("reading {}: {e}", file.path.display()));
        let mut f = std::fs::File::open(&file.path).map_err(unreadable)?;
        let prefix = format!("{}/{}/run/{}", self.task, self.writer, file.name);
        let mut piece = Vec::with_capacity(CHUNK);
        let (mut len, mut keys) = (0, Vec::new());
        loop {
            piece.clear();
            (&mut f)
                .take(CHUNK as u64)
                .read_to_end(&mut piece)
                .map_err(unreadable)?;
            // An empty file is one empty chunk, as an empty own file is.
            if piece.is_empty() && !keys.is_empty() {
                break;
            }
            let key = format!("{prefix}/{}", keys.len());
            self.put(&key, Some(&piece))?;
            keys.push(key);
            len += piece.len() as u64;
            if piece.len() < CHUNK {
                break;
            }
        }
        Ok(Uploaded { len, keys })
    }

    fn flush(&self) -> Result<(), Error> {
        flush(&self.producer, self.flush_timeout)
            .map_err(|e| Error::Transient(format!("saving state to {}: {e}", self.url.topic)))?;
        match self.errors.take_error() {
            None => Ok(()),
            Some(e) => Err(Error::Transient(format!(
                "saving state to {}: {e}",
                self.url.topic
            ))),
        }
    }

    /// Every record of this task on the state topic, latest value per key.
    fn read_all(&self) -> Result<BTreeMap<String, Option<Vec<u8>>>, Error> {
        let mut config = self.url.client_config(&self.properties);
        config
            .set("group.id", format!("{}-restore", self.url.topic))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true");
        let consumer: BaseConsumer<SourceContext> = config.create_with_context(SourceContext)?;
        let (low, high) = consumer
            .fetch_watermarks(&self.url.topic, self.partition, METADATA_TIMEOUT)
            .map_err(|e| Error::Transient(format!("reading {}: {e}", self.url.topic)))?;
        let mut latest = BTreeMap::new();
        if high <= low {
            return Ok(latest);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.url.topic, self.partition, Offset::Offset(low))?;
        consumer.assign(&tpl)?;
        let prefix = self.task.to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        let mut next = low;
        while next < high {
            if std::time::Instant::now() > deadline {
                return Err(Error::Transient(format!(
                    "reading the state of task {} from {} did not finish in 5 minutes",
                    self.task, self.url.topic
                )));
            }
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        continue;
                    };
                    if key.split('/').next() != Some(prefix.as_str()) {
                        continue;
                    }
                    latest.insert(key.to_string(), m.payload().map(<[u8]>::to_vec));
                }
                // The end of a compacted log can sit past its last record.
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
                // librdkafka reports a lost connection (AllBrokersDown, a
                // transport failure) and keeps reconnecting; the deadline
                // bounds an outage.
                Some(Err(e)) if lost_connection(&e) => {
                    tracing::warn!(topic = %self.url.topic, error = %e, "reading the state topic: retrying");
                }
                Some(Err(e)) => {
                    return Err(Error::Transient(format!("reading {}: {e}", self.url.topic)));
                }
                None => {}
            }
        }
        Ok(latest)
    }
}

/// The summary of every task's latest checkpoint on a state topic (for
/// `ubik status`): task -> the summary its runtime saved.
pub fn summaries(
    bootstrap: &str,
    topic: &str,
    properties: &BTreeMap<String, String>,
) -> Result<BTreeMap<u32, serde_json::Value>, Error> {
    let url = KafkaUrl::parse(&format!("kafka://{bootstrap}/{topic}"))?;
    let mut config = url.client_config(properties);
    config
        .set("group.id", format!("{topic}-status"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer<SourceContext> = config.create_with_context(SourceContext)?;
    let Some(parts) = crate::admin::partitions(&consumer, topic)? else {
        return Ok(BTreeMap::new());
    };
    let mut tpl = TopicPartitionList::new();
    let mut open = 0;
    for p in parts {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, METADATA_TIMEOUT)
            .map_err(|e| Error::Transient(format!("reading {topic}: {e}")))?;
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
            open += 1;
        }
    }
    let mut out = BTreeMap::new();
    if open == 0 {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let mut ended = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ended < open && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let Some(task) = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Some(v) = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                {
                    out.insert(task, v["summary"].clone());
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => ended += 1,
            // A lost connection is retried by librdkafka until the deadline.
            Some(Err(e)) if lost_connection(&e) => {
                tracing::debug!(%topic, error = %e, "reading the state topic: retrying")
            }
            Some(Err(e)) => return Err(Error::Transient(format!("reading {topic}: {e}"))),
            None => {}
        }
    }
    Ok(out)
}

/// Whether a consumer's error only says that connections to the brokers
/// were lost for now (librdkafka keeps reconnecting).
fn lost_connection(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Code::AllBrokersDown
                | Code::BrokerTransportFailure
                | Code::Resolve
                | Code::OperationTimedOut
                | Code::RequestTimedOut
                | Code::NetworkException
                | Code::BrokerNotAvailable
                | Code::LeaderNotAvailable
                | Code::NotLeaderForPartition
        )
    )
}

fn bad(topic: &str, task: u32, what: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::Fatal(format!(
        "the checkpoint of task {task} on state topic {topic} is damaged: {what}"
    ))
}

impl CheckpointReplica for StateTopic {
    fn save(
        &mut self,
        epoch: u64,
        files: &[(&str, &[u8])],
        shared: &[SharedFile],
        summary: &serde_json::Value,
    ) -> Result<(), ConnectorError> {
        let mut own = Vec::new();
        let mut listed = Vec::new();
        let mut sent = 0;
        for (name, bytes) in files {
            let up = self.put_chunks(
                &format!("{}/{}/{epoch}/{name}", self.task, self.writer),
                bytes,
            )?;
            listed.push(up.listing(name));
            sent += up.len;
            own.extend(up.keys);
        }
        let mut named = BTreeMap::new();
        let mut listed_shared = Vec::new();
        let (mut uploaded, mut sent_shared) = (0, 0);
        for f in shared {
            let up = match self.shared.remove(&f.name) {
                Some(up) => up,
                None => {
                    let up = self.put_file(f)?;
                    uploaded += 1;
                    sent_shared += up.len;
                    up
                }
            };
            listed_shared.push(up.listing(&f.name));
            named.insert(f.name.clone(), up);
        }
        ubik_connector::failpoint::hit("checkpoint-replica");
        let manifest = json!({"epoch": epoch, "writer": self.writer, "files": listed,
            "shared": listed_shared, "summary": summary});
        self.put(
            &self.task.to_string(),
            Some(manifest.to_string().as_bytes()),
        )?;
        self.flush()?;
        // The manifest is durable: the chunks it no longer names can go.
        let unnamed = std::mem::replace(&mut self.shared, named);
        let mut gone = std::mem::replace(&mut self.chunks, own);
        gone.extend(unnamed.into_values().flat_map(|u| u.keys));
        for key in &gone {
            self.put(key, None)?;
        }
        self.flush()?;
        debug!(
            task = self.task,
            epoch,
            bytes = sent + sent_shared,
            shared_uploaded = uploaded,
            shared_bytes = sent_shared,
            shared_kept = shared.len() - uploaded,
            chunks_deleted = gone.len(),
            "checkpoint replicated"
        );
        Ok(())
    }

    fn save_idle(&mut self, log: &[u8]) -> Result<(), ConnectorError> {
        self.put(&format!("{}/idle", self.task), Some(log))?;
        Ok(self.flush()?)
    }

    fn load(&mut self) -> Result<Replicated, ConnectorError> {
        if ubik_connector::failpoint::fails("replica-load") {
            return Err(ConnectorError::Transient(format!(
                "reading {}: failpoint replica-load",
                self.url.topic
            )));
        }
        let mut latest = self.read_all()?;
        let topic = self.url.topic.clone();
        let task = self.task;
        let idle = latest.remove(&format!("{task}/idle")).flatten();
        let Some(manifest) = latest.get(&task.to_string()).cloned().flatten() else {
            return Ok(Replicated {
                checkpoint: None,
                shared: Vec::new(),
                idle,
            });
        };
        let manifest: serde_json::Value =
            serde_json::from_slice(&manifest).map_err(|e| bad(&topic, task, e))?;
        let epoch = manifest["epoch"]
            .as_u64()
            .ok_or_else(|| bad(&topic, task, "no epoch"))?;
        let writer = manifest["writer"].as_str().unwrap_or_default();
        let mut keys = Vec::new();
        let mut read = |list: &serde_json::Value, prefix: &str| {
            let mut files: CheckpointFiles = Vec::new();
            for f in list.as_array().into_iter().flatten() {
                let name = f["name"].as_str().unwrap_or_default();
                let len = f["len"].as_u64().unwrap_or(0) as usize;
                let chunks = f["chunks"].as_u64().unwrap_or(0);
                let mut bytes = Vec::with_capacity(len);
                for i in 0..chunks {
                    let key = format!("{task}/{writer}/{prefix}/{name}/{i}");
                    // Taken out: the map then holds only what this manifest does not name.
                    let piece = latest
                        .remove(&key)
                        .flatten()
                        .ok_or_else(|| bad(&topic, task, format!("chunk {key} is missing")))?;
                    bytes.extend_from_slice(&piece);
                    keys.push(key);
                }
                if bytes.len() != len {
                    return Err(bad(
                        &topic,
                        task,
                        format!("{name} has {} bytes, its manifest says {len}", bytes.len()),
                    ));
                }
                files.push((name.to_string(), bytes));
            }
            Ok(files)
        };
        let files = read(&manifest["files"], &epoch.to_string())?;
        // Absent in checkpoints saved before the state topic carried deltas.
        let shared = read(&manifest["shared"], "run")?;
        // This writer deletes them once it saves a newer checkpoint, with
        // any chunks of writers that crashed before saving their manifest.
        let manifest_key = task.to_string();
        let orphans = latest
            .into_iter()
            .filter(|(k, v)| v.is_some() && *k != manifest_key);
        keys.extend(orphans.map(|(k, _)| k));
        // Its shared files too: this writer uploads its own copies (see the
        // module documentation).
        self.chunks = keys;
        self.shared.clear();
        Ok(Replicated {
            checkpoint: Some((epoch, files)),
            shared,
            idle,
        })
    }

    fn describe(&self) -> String {
        format!("{} task {}", self.url.display(), self.task)
    }
}
