//! [`KafkaSink`]: the changelog to a topic, transactional or idempotent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use tracing::{info, warn};
use ubik_connector::{ConnectorError, Sink, SinkRecord};

use crate::admin::ensure_topic;
use crate::config::{EmitMode, KafkaUrl};
use crate::error::{Error, is_fenced};
use crate::retention::{RetentionGuard, deleting_retention};

/// Remembers the first failed delivery; the next commit reports it.
#[derive(Default, Clone)]
pub struct DeliveryErrors(Arc<Mutex<Option<KafkaError>>>);

impl DeliveryErrors {
    pub fn take_error(&self) -> Option<KafkaError> {
        self.0.lock().map(|mut e| e.take()).unwrap_or(None)
    }
}

pub struct Deliveries {
    errors: DeliveryErrors,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result
            && let Ok(mut slot) = self.errors.0.lock()
            && slot.is_none()
        {
            *slot = Some(e.clone());
        }
    }
}

pub type UbikProducer = BaseProducer<Deliveries>;

/// Creates a producer for `url` in `mode`.
pub fn producer(
    url: &KafkaUrl,
    properties: &BTreeMap<String, String>,
    mode: EmitMode,
    transactional_id: Option<&str>,
) -> Result<(UbikProducer, DeliveryErrors), Error> {
    let mut config = url.client_config_with(
        &[
            ("acks", "all"),
            ("linger.ms", "5"),
            ("compression.type", "lz4"),
            ("message.timeout.ms", "120000"),
            ("transaction.timeout.ms", "120000"),
            // Only failures matter (the next commit or flush reports the
            // first); a report per delivered record was about 2% of a
            // pass-through's CPU.
            ("delivery.report.only.error", "true"),
        ],
        properties,
    );
    config.set("enable.idempotence", "true");
    if mode == EmitMode::Transactional {
        let id = transactional_id
            .map(String::from)
            .or_else(|| url.transactional_id.clone())
            .ok_or_else(|| Error::Config("transactional emit needs a transactional.id".into()))?;
        config.set("transactional.id", &id);
    }
    let errors = DeliveryErrors::default();
    let producer: UbikProducer = config.create_with_context(Deliveries {
        errors: errors.clone(),
    })?;
    Ok((producer, errors))
}

/// Waits until every record sent so far is delivered, serving delivery
/// reports as they arrive. Not `Producer::flush`: rdkafka's `poll` waits out
/// its whole timeout even once a report arrived (every flush took at least
/// 100 ms: a group checkpoint idled ~300 ms), and spins through the last
/// millisecond of it (a short timeout is a busy loop). librdkafka's own
/// flush is called once, not in the loop: each call wakes every broker
/// thread.
pub fn flush(producer: &UbikProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    // Sends what lingers now; a zero timeout does not wait for it.
    match producer.flush(Duration::ZERO) {
        Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
        done => return done,
    }
    let mut nap = Backoff::default();
    loop {
        serve(producer, &mut nap);
        if producer.in_flight_count() == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        nap.sleep();
    }
}

/// A short sleep that doubles while nothing is delivered: prompt for a
/// local broker, a few wake-ups per millisecond at most for a slow one.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_micros(50))
    }
}

impl Backoff {
    fn sleep(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_millis(2));
    }
}

/// Serves every delivery report waiting: non-blocking polls while the
/// outstanding count drops (then the next wait starts short again).
fn serve(producer: &UbikProducer, nap: &mut Backoff) {
    loop {
        let before = producer.in_flight_count();
        producer.poll(Duration::ZERO);
        if producer.in_flight_count() >= before {
            return;
        }
        *nap = Backoff::default();
    }
}

/// Sends one record, waiting while librdkafka's queue is full.
pub fn send(producer: &UbikProducer, record: BaseRecord<'_, [u8], [u8]>) -> Result<(), Error> {
    let mut record = record;
    let mut nap = Backoff::default();
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                serve(producer, &mut nap);
                nap.sleep();
            }
            Err((e, _)) if is_fenced(&e) => return Err(Error::Fenced(e.to_string())),
            Err((e, _)) => return Err(Error::Kafka(e)),
        }
    }
}

pub struct KafkaSink {
    url: KafkaUrl,
    producer: UbikProducer,
    errors: DeliveryErrors,
    mode: EmitMode,
    transactional_id: Option<String>,
    in_transaction: bool,
    sent: u64,
    retention: Option<RetentionGuard>,
}

const TXN_TIMEOUT: Duration = Duration::from_secs(60);

impl KafkaSink {
    /// Opens the sink, creating the topic if needed and allowed (compacted
    /// when `keyed`: a changelog). In transactional mode this fences any
    /// older producer with the same id and aborts its open transaction.
    pub fn open(
        url: &str,
        properties: &BTreeMap<String, String>,
        mode: EmitMode,
        transactional_id: Option<&str>,
        keyed: bool,
    ) -> Result<Self, Error> {
        let url = KafkaUrl::parse(url)?;
        let cleanup = if keyed { "compact" } else { "delete" };
        let client = url.client_config(properties);
        ensure_topic(&url, &client, cleanup)?;
        // Only a changelog loses its meaning when old records go: append-only
        // output on a delete topic is the usual, wanted set-up.
        let retention = match keyed {
            true => deleting_retention(&client, &url.topic)?
                .map(|rule| RetentionGuard::new(rule, url.retention_check)),
            false => None,
        };
        let (producer, errors) = producer(&url, properties, mode, transactional_id)?;
        let transactional_id = (mode == EmitMode::Transactional)
            .then(|| {
                transactional_id
                    .map(String::from)
                    .or(url.transactional_id.clone())
            })
            .flatten();
        if mode == EmitMode::Transactional {
            retry("initialising transactions", || {
                producer.init_transactions(TXN_TIMEOUT).map_err(classify)
            })?;
            info!(transactional_id = ?transactional_id, "transactional producer ready");
        }
        Ok(Self {
            url,
            producer,
            errors,
            mode,
            transactional_id,
            in_transaction: false,
            sent: 0,
            retention,
        })
    }

    fn fenced_message(&self, e: impl std::fmt::Display) -> String {
        format!(
            "another ubik instance with transactional.id {:?} took over the output topic {} ({e}); this instance stops",
            self.transactional_id.as_deref().unwrap_or(""),
            self.url.topic
        )
    }

    fn check_delivery(&self) -> Result<(), Error> {
        match self.errors.take_error() {
            None => Ok(()),
            Some(e) if is_fenced(&e) => Err(Error::Fenced(self.fenced_message(e))),
            Some(e) => Err(Error::Transient(format!(
                "a record could not be delivered: {e}"
            ))),
        }
    }
}

/// Maps a librdkafka error to what the pipeline should do.
fn classify(e: KafkaError) -> Error {
    if is_fenced(&e) {
        return Error::Fenced(e.to_string());
    }
    match &e {
        KafkaError::Transaction(t) if t.is_retriable() => Error::Transient(e.to_string()),
        KafkaError::Transaction(t) if t.txn_requires_abort() => Error::Transient(e.to_string()),
        KafkaError::Transaction(t) if t.is_fatal() => Error::Kafka(e),
        KafkaError::Transaction(_) => Error::Transient(e.to_string()),
        _ => Error::Kafka(e),
    }
}

/// Retries `op` while it fails transiently, backing off up to 10 s.
fn retry<T>(what: &str, mut op: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    let mut delay = Duration::from_millis(200);
    loop {
        match op() {
            Err(Error::Transient(m)) => {
                warn!("{what}: {m}; retrying in {delay:?}");
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            other => return other,
        }
    }
}

impl Sink for KafkaSink {
    fn write(&mut self, record: SinkRecord<'_>) -> Result<(), ConnectorError> {
        if let (Some(guard), Some(ts)) = (&mut self.retention, record.timestamp_ms) {
            guard.check(ts)?;
        }
        if self.mode == EmitMode::Transactional && !self.in_transaction {
            self.producer
                .begin_transaction()
                .map_err(|e| ConnectorError::from(classify(e)))?;
            self.in_transaction = true;
        }
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.url.topic);
        if let Some(k) = record.key {
            r = r.key(k);
        }
        if let Some(v) = record.value {
            r = r.payload(v);
        }
        if let Some(ts) = record.timestamp_ms {
            r = r.timestamp(ts);
        }
        if let Some(p) = record.partition {
            r = r.partition(p as i32);
        }
        send(&self.producer, r).map_err(|e| match e {
            Error::Fenced(m) => ConnectorError::Fenced(self.fenced_message(m)),
            other => other.into(),
        })?;
        self.sent += 1;
        if self.sent.is_multiple_of(1024) {
            self.producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), ConnectorError> {
        if let Some(guard) = &mut self.retention {
            guard.refresh();
        }
        let result = match self.mode {
            EmitMode::Transactional => {
                if !self.in_transaction {
                    return Ok(());
                }
                let r = retry("committing the transaction", || {
                    self.producer
                        .commit_transaction(TXN_TIMEOUT)
                        .map_err(classify)
                });
                match r {
                    Ok(()) => {
                        self.in_transaction = false;
                        self.check_delivery()
                    }
                    Err(Error::Fenced(m)) => Err(Error::Fenced(self.fenced_message(m))),
                    Err(e) => {
                        // The epoch is lost: abort it; the runtime replays it
                        // from the last checkpoint. An abort that does not
                        // finish now (the broker is away) stays pending, and
                        // librdkafka refuses every other transactional call
                        // until it is called again and completes: the
                        // runtime's recovery retries it (`abort`) instead of
                        // beginning the next transaction over it, which
                        // looped on "conflicting abort_transaction" forever.
                        self.in_transaction = self.producer.abort_transaction(TXN_TIMEOUT).is_err();
                        Err(Error::Transient(format!(
                            "transaction aborted ({e}); replaying from the last checkpoint"
                        )))
                    }
                }
            }
            EmitMode::Idempotent => retry("flushing", || {
                flush(&self.producer, TXN_TIMEOUT)
                    .map_err(|e| Error::Transient(format!("flush: {e}")))
            })
            .and_then(|_| self.check_delivery()),
        };
        result.map_err(Into::into)
    }

    /// Drops the epoch in progress (the runtime will replay it).
    fn abort(&mut self) -> Result<(), ConnectorError> {
        if self.in_transaction {
            self.producer
                .abort_transaction(TXN_TIMEOUT)
                .map_err(|e| ConnectorError::from(classify(e)))?;
            self.in_transaction = false;
        }
        let _ = self.errors.take_error();
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "{} ({})",
            self.url.display(),
            match self.mode {
                EmitMode::Transactional => "transactional",
                EmitMode::Idempotent => "idempotent",
            }
        )
    }
}

/// Headers of a dead letter.
pub fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
    pairs.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(rdkafka::message::Header {
            key: k,
            value: Some(*v),
        })
    })
}
