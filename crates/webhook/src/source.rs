//! [`WebhookSource`]: the buffer as a ubik source, one partition.
//!
//! The buffer holds rows already decoded at the door, so a poll hands the
//! pipeline [`Payload::Arrow`]: no JSON is parsed on the read side. The
//! source therefore needs the pipeline's schema when it opens; a webhook
//! pipeline must declare it (`--schema`), since inferring it from a sample
//! would need events before the endpoint could decode any.
//!
//! Flush policy: a poll returns a chunk when `max_rows` events or
//! `max_bytes` payload bytes are buffered, or when the oldest unread event
//! has waited `max_interval`, whichever comes first; a chunk never holds
//! more than `max_rows` events nor (beyond its first event) more than
//! `max_bytes` bytes. The position is the offset of the next event;
//! `commit` deletes segments a checkpoint covers.
//!
//! With `end=latest` the source is bounded: it serves no endpoint, hands
//! out the events its buffer holds when it opens, then ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use serde_json::json;
use ubik_connector::time::now_ms;
use ubik_connector::{Chunk, ConnectorError, Payload, Source, SourceEvent, SourcePosition};

use crate::buffer::{self, Shared};
use crate::config::WebhookConfig;
use crate::error::Error;
use crate::server::Server;

pub struct WebhookSource {
    config: WebhookConfig,
    shared: Arc<Shared>,
    /// `None` for a bounded run (`end=latest`): nothing is received.
    server: Option<Server>,
    schema: SchemaRef,
}

/// Who a webhook buffer belongs to: where it lives unless `buffer=` names a
/// directory, and the identity of the pipeline that writes it. A buffer is
/// replayed only by the pipeline that wrote it; another one is refused.
#[derive(Debug, Clone)]
pub struct BufferOwner {
    pub default_dir: PathBuf,
    pub identity: String,
}

/// The file in a buffer directory that names its pipeline.
const OWNER_FILE: &str = "pipeline";

/// Claims `dir` for `identity`, or refuses a buffer another pipeline wrote.
fn claim(dir: &Path, identity: &str) -> Result<(), Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Buffer(format!("cannot create {}: {e}", dir.display())))?;
    let file = dir.join(OWNER_FILE);
    match std::fs::read_to_string(&file) {
        Ok(owner) if owner.trim() == identity => Ok(()),
        Ok(owner) => Err(Error::Config(format!(
            "the webhook buffer in {} was written by another pipeline (identity {}, this one is {identity}): replaying it would feed that pipeline's events into this one; give this pipeline its own buffer= directory (or --checkpoint), or delete that directory if its events are no longer needed",
            dir.display(),
            owner.trim()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join(format!("{OWNER_FILE}.tmp"));
            std::fs::write(&tmp, identity)?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &file)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

impl WebhookSource {
    /// Replays the buffer and starts the HTTP endpoint, which decodes
    /// events into `schema` before acknowledging them.
    pub fn open(url: &str, owner: &BufferOwner, schema: Option<SchemaRef>) -> Result<Self, Error> {
        let mut config = WebhookConfig::parse(url)?;
        let schema = schema.ok_or_else(|| {
            Error::Config(format!(
                "webhook source {}{}: declare the schema of its events, e.g. --schema \"id VARCHAR, kind VARCHAR, amount DOUBLE, ts TIMESTAMP\" (schema = ... in a pipeline file, schema=... in Python): the endpoint decodes each request with it before acknowledging, so it cannot be inferred from events not yet received",
                config.bind, config.path
            ))
        })?;
        if !config.buffer_given {
            config.buffer_dir = Some(owner.default_dir.clone());
        }
        if let Some(dir) = &config.buffer_dir {
            claim(dir, &owner.identity)?;
        }
        let (shared, writer) = buffer::open(
            config.buffer_dir.clone(),
            config.segment_bytes,
            Arc::clone(&schema),
            config.dedupe.is_some(),
        )?;
        if let Ok(mut idx) = shared.index.lock() {
            idx.wake_rows = config.max_rows as u64;
            idx.wake_bytes = config.max_bytes as u64;
        }
        let server = if config.ends {
            drop(writer);
            None
        } else {
            Some(Server::start(
                config.clone(),
                Arc::clone(&schema),
                Arc::clone(&shared),
                writer,
            )?)
        };
        Ok(Self {
            config,
            shared,
            server,
            schema,
        })
    }

    /// The address the endpoint listens on (useful with port 0); `None`
    /// for a bounded run, which serves no endpoint.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(|s| s.local_addr)
    }

    fn ready(&self, idx: &buffer::Index) -> bool {
        let rows = idx.unread_rows();
        rows > 0
            && (idx.draining
                || self.config.ends
                || rows >= self.config.max_rows as u64
                || idx.unread_bytes() >= self.config.max_bytes as u64
                || idx
                    .oldest_unread_ms()
                    .is_some_and(|t| now_ms() - t >= self.config.max_interval.as_millis() as i64))
    }
}

impl Source for WebhookSource {
    fn table(&self) -> &str {
        &self.config.table
    }

    fn schema(&self) -> Option<SchemaRef> {
        Some(Arc::clone(&self.schema))
    }

    fn partitions(&self) -> Vec<u32> {
        vec![0]
    }

    fn poll(
        &mut self,
        _max_records: usize,
        timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        let deadline = Instant::now() + timeout;
        let mut idx = self
            .shared
            .index
            .lock()
            .map_err(|_| ConnectorError::Fatal("webhook buffer lock poisoned".into()))?;
        loop {
            if self.config.ends && idx.unread_rows() == 0 {
                return Ok(SourceEvent::End);
            }
            if self.ready(&idx) {
                let Some(taken) = idx.take(self.config.max_rows, self.config.max_bytes) else {
                    return Ok(SourceEvent::Idle);
                };
                return Ok(SourceEvent::Chunk(Chunk {
                    partition: 0,
                    payload: Payload::Arrow(taken.batch),
                    positions: taken.offsets,
                    position_name: "event",
                    meta: Default::default(),
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(SourceEvent::Idle);
            }
            // Wake for new events, or when the oldest unread one comes due.
            let mut wait = deadline - now;
            if let Some(t) = idx.oldest_unread_ms() {
                let due = t + self.config.max_interval.as_millis() as i64 - now_ms();
                wait = wait.min(Duration::from_millis(due.max(1) as u64));
            }
            idx = self
                .shared
                .changed
                .wait_timeout(idx, wait)
                .map_err(|_| ConnectorError::Fatal("webhook buffer lock poisoned".into()))?
                .0;
        }
    }

    fn position(&self) -> SourcePosition {
        let offset = self
            .shared
            .index
            .lock()
            .map(|i| i.read_offset())
            .unwrap_or(0);
        json!({ "offset": offset })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let offset = position["offset"].as_u64().unwrap_or(0);
        self.shared
            .index
            .lock()
            .map_err(|_| ConnectorError::Fatal("webhook buffer lock poisoned".into()))?
            .seek(offset);
        Ok(())
    }

    fn commit(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let offset = position["offset"].as_u64().unwrap_or(0);
        self.shared.truncate(offset).map_err(Into::into)
    }

    fn replayable(&self) -> bool {
        self.config.buffer_dir.is_some()
    }

    fn begin_drain(&mut self) -> bool {
        if let Some(server) = &self.server {
            server.stop_accepting();
        }
        if let Ok(mut idx) = self.shared.index.lock() {
            idx.draining = true;
        }
        self.shared.changed.notify_all();
        true
    }

    fn describe(&self) -> String {
        let buffer = self
            .config
            .buffer_dir
            .as_ref()
            .map_or("in memory".to_string(), |d| d.display().to_string());
        match self.local_addr() {
            Some(addr) => format!(
                "webhook http://{addr}{} (buffer {buffer})",
                self.config.path
            ),
            None => format!(
                "webhook buffer {buffer} of {}{} (bounded)",
                self.config.bind, self.config.path
            ),
        }
    }

    fn lag(&mut self) -> Option<u64> {
        self.shared.index.lock().ok().map(|i| i.unread_rows())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_replayed_only_by_the_pipeline_that_wrote_it() {
        let dir = std::env::temp_dir().join(format!("ubik-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        claim(&dir, "aaaa").unwrap();
        claim(&dir, "aaaa").unwrap();
        let e = claim(&dir, "bbbb").unwrap_err().to_string();
        assert!(
            e.contains("another pipeline") && e.contains(&dir.display().to_string()),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
