//! [`WebhookSource`]: the buffer as a ubik source, one partition.
//!
//! Flush policy: a poll returns a chunk when `max_rows` events or
//! `max_bytes` payload bytes are buffered, or when the oldest unread event
//! has waited `max_interval`, whichever comes first; a chunk never holds
//! more than `max_rows` events nor (beyond its first event) more than
//! `max_bytes` bytes. The position is the offset of the next event;
//! `commit` deletes segments a checkpoint covers.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use ubik_connector::{Chunk, ConnectorError, Payload, Source, SourceEvent, SourcePosition};

use crate::buffer::{self, Shared};
use crate::config::WebhookConfig;
use crate::error::Error;
use crate::server::Server;

pub struct WebhookSource {
    config: WebhookConfig,
    shared: std::sync::Arc<Shared>,
    server: Server,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl WebhookSource {
    /// Replays the buffer and starts the HTTP endpoint.
    pub fn open(url: &str) -> Result<Self, Error> {
        let config = WebhookConfig::parse(url)?;
        let (shared, writer) = buffer::open(config.buffer_dir.clone(), config.segment_bytes)?;
        if let Ok(mut idx) = shared.index.lock() {
            idx.wake_rows = config.max_rows as u64;
            idx.wake_bytes = config.max_bytes as u64;
        }
        let server = Server::start(config.clone(), std::sync::Arc::clone(&shared), writer)?;
        Ok(Self {
            config,
            shared,
            server,
        })
    }

    /// The address the endpoint listens on (useful with port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.server.local_addr
    }

    fn ready(&self, idx: &buffer::Index) -> bool {
        let rows = idx.unread_rows();
        rows > 0
            && (idx.draining
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
            if self.ready(&idx) {
                let Some(taken) = idx.take(self.config.max_rows, self.config.max_bytes) else {
                    return Ok(SourceEvent::Idle);
                };
                return Ok(SourceEvent::Chunk(Chunk {
                    partition: 0,
                    payload: Payload::Bytes {
                        data: taken.data,
                        spans: taken.spans,
                    },
                    positions: taken.offsets,
                    position_name: "event",
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
        self.server.stop_accepting();
        if let Ok(mut idx) = self.shared.index.lock() {
            idx.draining = true;
        }
        self.shared.changed.notify_all();
        true
    }

    fn describe(&self) -> String {
        format!(
            "webhook http://{}{} (buffer {})",
            self.server.local_addr,
            self.config.path,
            self.config
                .buffer_dir
                .as_ref()
                .map_or("in memory".to_string(), |d| d.display().to_string())
        )
    }

    fn lag(&mut self) -> Option<u64> {
        self.shared.index.lock().ok().map(|i| i.unread_rows())
    }
}
