//! Decode at the door: a request's body, once unpacked and verified, is
//! split into events and decoded into the pipeline's schema by the
//! pipeline's own JSON decoder before anything is stored. A request is
//! atomic: if the decoder refuses any event, the whole request gets 400
//! naming each refused event (index, field, reason), and none is stored.
//!
//! What is refused is exactly what `ubik_format::json` refuses: invalid
//! UTF-8, a value of the wrong type, an integer out of range or a float
//! beyond its type's range, a timestamp that does not parse, nesting deeper
//! than `ubik_format::json::MAX_DEPTH` (64) levels, an event that is not an
//! object. Duplicate keys are accepted (the last one wins).

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use axum::http::HeaderMap;
use ubik_format::json::JsonDecoder;

use crate::body::{Reject, check_content_type, decode, split_events};

/// At most this many refused events are listed in a 400's body.
const LISTED_BAD_EVENTS: usize = 10;

/// A request's events, admitted: their bytes and their rows.
pub struct Admitted<'a> {
    pub events: Vec<&'a [u8]>,
    /// One row per event, in order, in the pipeline's schema.
    pub batch: RecordBatch,
}

/// The decoders of one endpoint.
pub struct Door {
    schema: SchemaRef,
    /// Idle decoders (one per concurrent request at most).
    decoders: Mutex<Vec<JsonDecoder>>,
}

impl Door {
    pub fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            decoders: Mutex::new(Vec::new()),
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Splits `payload` (unpacked and verified) into events and decodes them.
    pub fn admit<'a>(&self, payload: &'a [u8]) -> Result<Admitted<'a>, Reject> {
        let events: Vec<&[u8]> = split_events(payload)?
            .into_iter()
            .map(|r| &payload[r])
            .collect();
        let batch = self.decode(&events)?;
        Ok(Admitted { events, batch })
    }

    /// The whole body path short of the signature: content type, gzip,
    /// split, decode (what the endpoint does, for tests and fuzzing).
    pub fn admit_request(
        &self,
        headers: &HeaderMap,
        raw: &[u8],
        max_body: usize,
    ) -> Result<RecordBatch, Reject> {
        check_content_type(headers)?;
        if raw.len() > max_body {
            return Err(Reject::new(
                413,
                "too_large",
                "body is larger than max_body",
            ));
        }
        let unpacked = decode(headers, raw, max_body)?;
        let payload = unpacked.as_deref().unwrap_or(raw);
        Ok(self.admit(payload)?.batch)
    }

    fn decode(&self, events: &[&[u8]]) -> Result<RecordBatch, Reject> {
        let pooled = self
            .decoders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let mut decoder = match pooled {
            Some(d) => d,
            None => JsonDecoder::with_threads(Arc::clone(&self.schema), 1)
                .map_err(|e| Reject::new(500, "decoder", e.to_string()))?,
        };
        let decoded = decoder.decode(events);
        self.decoders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(decoder);
        let decoded = decoded.map_err(|e| Reject::new(400, "bad_event", e.to_string()))?;
        let Some(first) = decoded.bad.first() else {
            return Ok(decoded.batch);
        };
        let listed: Vec<serde_json::Value> = decoded
            .bad
            .iter()
            .take(LISTED_BAD_EVENTS)
            .map(|b| serde_json::json!({"event": b.index, "field": b.field, "reason": b.reason}))
            .collect();
        let mut r = Reject::new(
            400,
            "bad_event",
            format!(
                "event {} of the request: {}; nothing of this request was stored",
                first.index,
                first.message()
            ),
        );
        r.detail = Some(serde_json::json!({
            "event": first.index,
            "field": first.field,
            "detail": first.reason,
            "bad_events": listed,
            "bad_count": decoded.bad.len(),
        }));
        Err(r)
    }
}
