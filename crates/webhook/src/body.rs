//! Request bodies: content type, gzip, and splitting into events (a JSON
//! object, a JSON array of objects, or NDJSON), validated without building
//! JSON trees. Errors carry the position of the problem.

use std::io::Read;

use axum::http::HeaderMap;
use serde::de::IgnoredAny;

/// Why a body was refused, as an HTTP status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: u16,
    pub reason: &'static str,
    pub message: String,
    /// More fields for the JSON reply (the refused events of a 400).
    pub detail: Option<serde_json::Value>,
}

impl Reject {
    pub fn new(status: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            detail: None,
        }
    }
}

/// Checks the content type: JSON or NDJSON (a missing one is accepted).
pub fn check_content_type(headers: &HeaderMap) -> Result<(), Reject> {
    let Some(ct) = headers.get("content-type") else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or_default().trim();
    match mime {
        "application/json"
        | "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines"
        | "text/plain"
        | "application/cloudevents+json" => Ok(()),
        other if other.ends_with("+json") => Ok(()),
        other => Err(Reject::new(
            415,
            "content_type",
            format!(
                "content type {other:?} is not accepted: send application/json (an object or an array of objects) or application/x-ndjson"
            ),
        )),
    }
}

/// Gunzips `body` when the request says so, refusing more than `limit` bytes.
pub fn decode(headers: &HeaderMap, body: &[u8], limit: usize) -> Result<Option<Vec<u8>>, Reject> {
    let encoding = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_ascii_lowercase();
    match encoding.as_str() {
        "identity" | "" => Ok(None),
        "gzip" | "x-gzip" => {
            let mut out = Vec::with_capacity(body.len() * 4);
            let mut dec = flate2::read::GzDecoder::new(body).take(limit as u64 + 1);
            dec.read_to_end(&mut out)
                .map_err(|e| Reject::new(400, "gzip", format!("body is not valid gzip: {e}")))?;
            if out.len() > limit {
                return Err(Reject::new(
                    413,
                    "too_large",
                    format!("body is larger than {limit} bytes once decompressed"),
                ));
            }
            Ok(Some(out))
        }
        other => Err(Reject::new(
            415,
            "content_encoding",
            format!("content encoding {other:?} is not supported (gzip is)"),
        )),
    }
}

/// Line and column (1-based) of byte `offset` in `body`.
fn position(body: &[u8], offset: usize) -> (usize, usize) {
    let before = &body[..offset.min(body.len())];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let col = before.iter().rev().take_while(|&&c| c != b'\n').count() + 1;
    (line, col)
}

fn invalid(body: &[u8], base: usize, e: serde_json::Error) -> Reject {
    // serde_json counts lines and columns within the slice it parsed.
    let (line0, col0) = position(body, base);
    let (line, col) = if e.line() <= 1 {
        (line0, col0 + e.column().saturating_sub(1))
    } else {
        (line0 + e.line() - 1, e.column())
    };
    let what = e.to_string();
    let what = what.split(" at line").next().unwrap_or(&what).to_string();
    Reject::new(
        400,
        "malformed_json",
        format!("malformed JSON at line {line}, column {col}: {what}"),
    )
}

/// The byte ranges of the events in `body`, each a JSON object.
pub fn split_events(body: &[u8]) -> Result<Vec<std::ops::Range<usize>>, Reject> {
    let start = body.iter().position(|c| !c.is_ascii_whitespace());
    let Some(start) = start else {
        return Err(Reject::new(
            400,
            "empty",
            "empty body: send a JSON object, an array of objects, or NDJSON",
        ));
    };
    let mut events = Vec::new();
    if body[start] == b'[' {
        for r in array_elements(body, start)? {
            check_object(body, r.clone())?;
            events.push(r);
        }
        return Ok(events);
    }
    // One object, or several (NDJSON or concatenated): stream through them.
    let mut stream = serde_json::Deserializer::from_slice(body).into_iter::<IgnoredAny>();
    let mut begin = 0;
    loop {
        match stream.next() {
            None => break,
            Some(Ok(_)) => {
                let end = stream.byte_offset();
                let r = trim(body, begin..end);
                check_object(body, r.clone())?;
                events.push(r);
                begin = end;
            }
            Some(Err(e)) => return Err(invalid(body, 0, e)),
        }
    }
    Ok(events)
}

fn trim(body: &[u8], r: std::ops::Range<usize>) -> std::ops::Range<usize> {
    let s = r.start
        + body[r.clone()]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
    let e = r.end
        - body[s..r.end]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
    s..e
}

fn check_object(body: &[u8], r: std::ops::Range<usize>) -> Result<(), Reject> {
    if body.get(r.start) == Some(&b'{') {
        return Ok(());
    }
    let (line, col) = position(body, r.start);
    Err(Reject::new(
        400,
        "not_an_object",
        format!("event at line {line}, column {col} is not a JSON object"),
    ))
}

/// Ranges of the elements of the top-level array starting at `open`,
/// each validated by serde_json.
fn array_elements(body: &[u8], open: usize) -> Result<Vec<std::ops::Range<usize>>, Reject> {
    let mut out = Vec::new();
    let mut i = open + 1;
    let n = body.len();
    let skip_ws = |mut i: usize| {
        while i < n && body[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    i = skip_ws(i);
    if i < n && body[i] == b']' {
        i = skip_ws(i + 1);
        return if i == n {
            Ok(out)
        } else {
            Err(trailing(body, i))
        };
    }
    loop {
        let begin = skip_ws(i);
        let mut de = serde_json::Deserializer::from_slice(&body[begin..]);
        let r: Result<IgnoredAny, _> = serde::Deserialize::deserialize(&mut de);
        if let Err(e) = r {
            return Err(invalid(body, begin, e));
        }
        let end = begin + end_of_value(&body[begin..]);
        out.push(begin..end);
        i = skip_ws(end);
        match body.get(i) {
            Some(b',') => i += 1,
            Some(b']') => {
                i = skip_ws(i + 1);
                return if i == n {
                    Ok(out)
                } else {
                    Err(trailing(body, i))
                };
            }
            _ => {
                let (line, col) = position(body, i);
                return Err(Reject::new(
                    400,
                    "malformed_json",
                    format!(
                        "malformed JSON at line {line}, column {col}: expected ',' or ']' in the array of events"
                    ),
                ));
            }
        }
    }
}

fn trailing(body: &[u8], at: usize) -> Reject {
    let (line, col) = position(body, at);
    Reject::new(
        400,
        "malformed_json",
        format!("malformed JSON at line {line}, column {col}: trailing characters after the array"),
    )
}

/// Length of the (already validated) JSON value at the start of `s`.
fn end_of_value(s: &[u8]) -> usize {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut escaped = false;
    for (i, &c) in s.iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
                if depth == 0 {
                    return i + 1;
                }
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            // A scalar element ends at the array's closing bracket.
            b'}' | b']' if depth == 0 => return i,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b',' if depth == 0 => return i,
            _ if depth == 0 && c.is_ascii_whitespace() => return i,
            _ => {}
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(body: &str) -> Vec<String> {
        split_events(body.as_bytes())
            .unwrap()
            .into_iter()
            .map(|r| body[r].to_string())
            .collect()
    }

    #[test]
    fn shapes() {
        assert_eq!(texts(r#" {"a":1} "#), vec![r#"{"a":1}"#]);
        assert_eq!(
            texts(r#"[{"a":"x,]"}, {"b":[1,2]}]"#),
            vec![r#"{"a":"x,]"}"#, r#"{"b":[1,2]}"#]
        );
        assert_eq!(
            texts("{\"a\":1}\n{\"a\":2}\n\n"),
            vec!["{\"a\":1}", "{\"a\":2}"]
        );
        assert_eq!(texts("[]"), Vec::<String>::new());
    }

    #[test]
    fn errors_have_positions() {
        let e = split_events(b"{\"a\":1}\n{\"a\":}").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("line 2"), "{}", e.message);
        let e = split_events(b"[1]").unwrap_err();
        assert!(e.message.contains("not a JSON object"), "{}", e.message);
        let e = split_events(b"[{\"a\":1} {\"b\":2}]").unwrap_err();
        assert!(e.message.contains("column 10"), "{}", e.message);
        assert_eq!(split_events(b"  ").unwrap_err().reason, "empty");
    }
}
