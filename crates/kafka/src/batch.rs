//! Batch reads from librdkafka's consumer queue (`rd_kafka_consume_batch_queue`).
//!
//! rdkafka's `BaseConsumer::poll` hands out one message per call, each behind
//! a freshly allocated `Arc`, with two clock reads and an event round trip:
//! about a fifth of a Kafka-to-Kafka pass-through's CPU. A batch read costs
//! that once per call; per message only librdkafka's own queue work remains.
//!
//! A batch read serves librdkafka's log lines (and its global errors, which
//! it logs) with librdkafka's own stderr printer instead of returning them as
//! events, so the queue routes them to a log queue of its own, drained into
//! `tracing` at each read.

use std::ffi::{CStr, c_char, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, info, warn};

/// One message of a batch, borrowed until the batch is released.
pub(crate) struct Received<'a> {
    pub partition: i32,
    pub offset: i64,
    /// Set for a consumer error or notice (end of partition) instead of a record.
    pub error: Option<RDKafkaErrorCode>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    /// Milliseconds since the epoch; 0 when the record has none.
    pub timestamp_ms: i64,
}

/// The consumer's queue (the main queue is forwarded to it: errors and
/// notices arrive there too). Drop it before the consumer it came from.
pub(crate) struct ConsumerQueue {
    client: NonNull<rd::rd_kafka_t>,
    queue: NonNull<rd::rd_kafka_queue_t>,
    logs: NonNull<rd::rd_kafka_queue_t>,
    batch: Vec<*mut rd::rd_kafka_message_t>,
}

// SAFETY: librdkafka handles and queues are thread-safe; the message
// pointers in `batch` are only held during `read` and never shared.
unsafe impl Send for ConsumerQueue {}

/// Messages asked for per librdkafka call.
const BATCH: usize = 4096;

impl ConsumerQueue {
    /// The queue of a consumer created with a `group.id` (which forwards the
    /// main queue to it); `None` without one.
    pub fn of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<Self> {
        use rdkafka::consumer::Consumer;
        let client = NonNull::new(consumer.client().native_ptr())?;
        // SAFETY (this block and the next two): the client is valid while
        // `consumer` lives; the references taken here are released once, in
        // `Drop` (before the consumer) or right below when `of` fails.
        let queue = NonNull::new(unsafe { rd::rd_kafka_queue_get_consumer(client.as_ptr()) })?;
        let Some(logs) = NonNull::new(unsafe { rd::rd_kafka_queue_new(client.as_ptr()) }) else {
            unsafe { rd::rd_kafka_queue_destroy(queue.as_ptr()) };
            return None;
        };
        // SAFETY: both handles are valid; rdkafka created the client with
        // `log.queue`, so log lines go where this says.
        unsafe { rd::rd_kafka_set_log_queue(client.as_ptr(), logs.as_ptr()) };
        Some(Self {
            client,
            queue,
            logs,
            batch: Vec::with_capacity(BATCH),
        })
    }

    /// Passes librdkafka's queued log lines to `tracing`.
    fn drain_logs(&mut self) {
        loop {
            // SAFETY: a valid queue; a returned event is destroyed below.
            let event = unsafe { rd::rd_kafka_queue_poll(self.logs.as_ptr(), 0) };
            if event.is_null() {
                return;
            }
            let (mut fac, mut text, mut level): (*const c_char, *const c_char, c_int) =
                (std::ptr::null(), std::ptr::null(), 0);
            // SAFETY: a valid event; on success the strings live as long as it.
            let logged = unsafe { rd::rd_kafka_event_log(event, &mut fac, &mut text, &mut level) };
            if logged == 0 && !fac.is_null() && !text.is_null() {
                // SAFETY: NUL-terminated strings owned by the event.
                let (fac, text) = unsafe {
                    (
                        CStr::from_ptr(fac).to_string_lossy(),
                        CStr::from_ptr(text).to_string_lossy(),
                    )
                };
                // Syslog levels; the source retries what librdkafka calls errors.
                match level {
                    ..=4 => warn!("librdkafka: {fac} {text}"),
                    5 | 6 => info!("librdkafka: {fac} {text}"),
                    _ => debug!("librdkafka: {fac} {text}"),
                }
            }
            // SAFETY: destroyed once, after its strings were last used.
            unsafe { rd::rd_kafka_event_destroy(event) };
        }
    }

    /// Reads up to `max` messages: waits up to `timeout` for the first, then
    /// takes what is already queued. Calls `each` per message, in queue
    /// order, and returns how many there were.
    pub fn read(
        &mut self,
        max: usize,
        timeout: Duration,
        mut each: impl FnMut(Received<'_>),
    ) -> usize {
        let mut total = 0;
        self.drain_logs();
        // The first call blocks for one message at most: asked for more, it
        // would wait out the whole timeout to fill the batch.
        let mut want = 1;
        let mut wait_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        while total < max {
            let n = self.fill(want.min(max - total), wait_ms);
            for &m in &self.batch[..n] {
                // SAFETY: librdkafka returned `n` valid messages, alive until
                // destroyed below.
                each(unsafe { view(m) });
            }
            for &m in &self.batch[..n] {
                // SAFETY: each message is destroyed exactly once.
                unsafe { rd::rd_kafka_message_destroy(m) };
            }
            total += n;
            if n < want {
                break;
            }
            want = BATCH;
            wait_ms = 0;
        }
        total
    }

    /// The partition's high watermark as of the consumer's latest fetch
    /// response (every fetch, empty ones too, carries it): no round trip to
    /// the broker, whose answer would queue behind the consumer's pending
    /// long-poll fetch (up to `fetch.wait.max.ms`). `None` before the first
    /// response.
    pub fn cached_high_watermark(&self, topic: &CStr, partition: i32) -> Option<i64> {
        let (mut low, mut high) = (0i64, 0i64);
        // SAFETY: the client is valid while the queue lives; librdkafka
        // copies nothing out of `topic` past the call.
        let err = unsafe {
            rd::rd_kafka_get_watermark_offsets(
                self.client.as_ptr(),
                topic.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
    }

    fn fill(&mut self, want: usize, wait_ms: i32) -> usize {
        self.batch.clear();
        self.batch.reserve(want);
        // SAFETY: `batch` has room for `want` pointers; librdkafka writes
        // `n <= want` of them and returns n (or -1 on error: none written).
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                wait_ms,
                self.batch.as_mut_ptr(),
                want,
            )
        };
        let n = n.max(0) as usize;
        // SAFETY: the first `n` slots were written by librdkafka.
        unsafe { self.batch.set_len(n) };
        n
    }
}

/// # Safety
/// `m` must be a valid message returned by librdkafka and not yet destroyed;
/// the view must not outlive it.
unsafe fn view<'a>(m: *mut rd::rd_kafka_message_t) -> Received<'a> {
    // SAFETY: per the function's contract.
    let msg = unsafe { &*m };
    let bytes = |ptr: *mut std::ffi::c_void, len: usize| {
        // SAFETY: librdkafka's payload and key pointers are valid for their
        // lengths while the message lives.
        (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
    };
    let error = (msg.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
        .then(|| RDKafkaErrorCode::from(msg.err));
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: a valid message; `kind` is a valid out pointer.
    let ts = unsafe { rd::rd_kafka_message_timestamp(m, &mut kind) };
    let timestamp_ms = match kind {
        rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => 0,
        _ => ts.max(0),
    };
    Received {
        partition: msg.partition,
        offset: msg.offset,
        error,
        key: bytes(msg.key, msg.key_len),
        payload: bytes(msg.payload, msg.len),
        timestamp_ms,
    }
}

impl Drop for ConsumerQueue {
    fn drop(&mut self) {
        self.drain_logs();
        // SAFETY: the client still lives (the queue is dropped before the
        // consumer); log lines go back to its main queue, and the references
        // taken in `of` are released once.
        unsafe {
            rd::rd_kafka_set_log_queue(self.client.as_ptr(), std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.logs.as_ptr());
            rd::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}
