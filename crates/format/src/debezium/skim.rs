//! The fast way to read a Debezium JSON event's envelope: one pass over its
//! bytes that notes `op`, the source time and where `before` and `after`
//! lie, with no allocation. It checks the JSON grammar of all it skips but
//! the row objects in `before` and `after`, which it bounds by their
//! brackets alone: the row decoder reads them whole anyway, and refuses
//! one that is not JSON (as a bad record, like serde's refusal).
//!
//! It reads the common form only: printable ASCII (no control character,
//! which JSON allows between tokens but not in strings), unescaped field
//! names, no repeated field, values of the types the envelope defines.
//! On anything else it gives up
//! and the event is read by serde ([`super::read_event`]), so the two never
//! differ in what they accept or answer.

use std::borrow::Cow;

use crate::flat_json::{
    GiveUp, Step, expect, literal, number, parse_i64, skip_value, skip_ws, string, utf8,
};

/// An envelope's fields, borrowed from the event's text (`None`: absent or
/// null).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Fields<'a> {
    /// Connect's `schema` beside the `payload` (bounded by its brackets).
    pub schema: Option<&'a str>,
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
    pub op: Option<Cow<'a, str>>,
    /// `source.ts_ms`.
    pub source_ts: Option<i64>,
    /// The envelope's own `ts_ms`.
    pub ts_ms: Option<i64>,
}

/// The fields of the event in `record`, or of the `payload` of Connect's
/// `{"schema":…,"payload":…}` when the event has no `op` of its own (as
/// serde reads it); `None` when it gives up.
pub(super) fn skim(record: &[u8]) -> Option<Fields<'_>> {
    if !printable_ascii(record) {
        return None;
    }
    let text = utf8(record)?;
    let mut scratch = String::new();
    let b = text.as_bytes();
    let i = skip_ws(b, 0);
    let (end, fields, payload) = envelope(text, i, true, &mut scratch).ok()?;
    if skip_ws(b, end) != b.len() {
        return None;
    }
    match (&fields.op, payload) {
        (None, Some(payload)) => Some(Fields {
            schema: fields.schema,
            ..payload
        }),
        _ => Some(fields),
    }
}

/// The envelope object at `i`: the index after it, its fields, and (when
/// `outer`) its `payload`'s.
fn envelope<'a>(
    text: &'a str,
    i: usize,
    outer: bool,
    scratch: &mut String,
) -> Step<(usize, Fields<'a>, Option<Fields<'a>>)> {
    let b = text.as_bytes();
    let mut fields = Fields::default();
    let mut payload = None;
    let mut seen = [false; 7];
    let mut i = skip_ws(b, expect(b, i, b'{')?);
    if b.get(i) == Some(&b'}') {
        return Ok((i + 1, fields, payload));
    }
    loop {
        let (after_key, key) = name(text, i)?;
        i = skip_ws(b, expect(b, skip_ws(b, after_key), b':')?);
        let field = [
            "before", "after", "op", "source", "ts_ms", "payload", "schema",
        ]
        .iter()
        .position(|k| *k == key);
        if let Some(f) = field
            && std::mem::replace(&mut seen[f], true)
        {
            return Err(GiveUp);
        }
        let null = b.get(i) == Some(&b'n');
        i = match field {
            _ if null => literal(b, i, b"null")?,
            Some(f @ (0 | 1)) => {
                let end = match b.get(i) {
                    Some(b'{' | b'[') => bracketed(b, i)?,
                    _ => skip_value(text, i, 2, scratch)?,
                };
                let raw = Some(&text[i..end]);
                match f {
                    0 => fields.before = raw,
                    _ => fields.after = raw,
                }
                end
            }
            Some(2) => {
                let (end, op) = string(text, expect(b, i, b'"')?, scratch)?;
                fields.op = Some(Cow::Borrowed(op.ok_or(GiveUp)?));
                end
            }
            Some(3) => {
                let (end, ts) = source(text, i, scratch)?;
                fields.source_ts = ts;
                end
            }
            Some(4) => {
                let (end, ts) = integer(b, i)?;
                fields.ts_ms = Some(ts);
                end
            }
            Some(6) if outer => {
                let end = match b.get(i) {
                    Some(b'{' | b'[') => bracketed(b, i)?,
                    _ => skip_value(text, i, 2, scratch)?,
                };
                fields.schema = Some(&text[i..end]);
                end
            }
            // serde reads a payload's own schema, and ignores it.
            Some(6) => skip_value(text, i, 2, scratch)?,
            Some(_) if outer => {
                let (end, inner, _) = envelope(text, i, false, scratch)?;
                payload = Some(inner);
                end
            }
            // serde reads a payload's payload as an envelope too.
            Some(_) => return Err(GiveUp),
            _ => skip_value(text, i, 2, scratch)?,
        };
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok((i + 1, fields, payload)),
            _ => return Err(GiveUp),
        }
    }
}

/// The `source` object at `i`: the index after it and its `ts_ms`.
fn source(text: &str, i: usize, scratch: &mut String) -> Step<(usize, Option<i64>)> {
    let b = text.as_bytes();
    let (mut ts, mut seen) = (None, false);
    let mut i = skip_ws(b, expect(b, i, b'{')?);
    if b.get(i) == Some(&b'}') {
        return Ok((i + 1, ts));
    }
    loop {
        let (after_key, key) = name(text, i)?;
        i = skip_ws(b, expect(b, skip_ws(b, after_key), b':')?);
        i = match key {
            "ts_ms" if std::mem::replace(&mut seen, true) => return Err(GiveUp),
            "ts_ms" if b.get(i) == Some(&b'n') => literal(b, i, b"null")?,
            "ts_ms" => {
                let (end, v) = integer(b, i)?;
                ts = Some(v);
                end
            }
            _ => skip_value(text, i, 3, scratch)?,
        };
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok((i + 1, ts)),
            _ => return Err(GiveUp),
        }
    }
}

/// The field name at `i` (quoted, without escapes) and the index after it.
/// Names are short: a byte loop beats a search call.
fn name(text: &str, i: usize) -> Step<(usize, &str)> {
    let b = text.as_bytes();
    let start = expect(b, i, b'"')?;
    let mut j = start;
    loop {
        match b.get(j) {
            Some(b'"') => return Ok((j + 1, &text[start..j])),
            Some(b'\\') | None => return Err(GiveUp),
            Some(_) => j += 1,
        }
    }
}

/// The index after the object or array at `i`, found by counting its
/// brackets outside strings (no other check: see the module doc).
fn bracketed(b: &[u8], i: usize) -> Step {
    let mut depth = 0usize;
    let mut j = i;
    loop {
        match b.get(j).ok_or(GiveUp)? {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            b'"' => loop {
                let rest = b.get(j + 1..).ok_or(GiveUp)?;
                j += 1 + memchr::memchr2(b'"', b'\\', rest).ok_or(GiveUp)?;
                match b[j] {
                    b'"' => break,
                    _ => j += 1,
                }
            },
            _ => {}
        }
        j += 1;
    }
}

/// The JSON integer at `i` (in the `i64` range) and the index after it.
fn integer(b: &[u8], i: usize) -> Step<(usize, i64)> {
    let (end, is_integer) = number(b, i)?;
    match is_integer {
        true => Ok((end, parse_i64(&b[i..end]).ok_or(GiveUp)?)),
        false => Err(GiveUp),
    }
}

/// Whether every byte is printable ASCII (0x20 to 0x7e, or DEL), checked
/// in blocks the compiler vectorises.
fn printable_ascii(b: &[u8]) -> bool {
    b.chunks(64).all(|block| {
        block
            .iter()
            .fold(true, |ok, &c| ok & (c.wrapping_sub(0x20) < 0x60))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    const EVENTS: &[&str] = &[
        r#"{"before":null,"after":{"id":1,"m":"a"},"source":{"version":"3.6","ts_ms":5,"db":"s"},"op":"c","ts_ms":9}"#,
        r#"{"schema":{"type":"struct","fields":[{"field":"op"}]},"payload":{"before":{"id":1},"after":null,"source":{"ts_ms":6},"op":"d","ts_ms":7}}"#,
        r#" { "op" : "u" , "before" : { "id" : [1, 2.5e3, -0] } , "after" : {"id":"x\"y\u00e9"}, "source" : null } "#,
        r#"{"op":"r","after":{"a":{"b":{"c":[true,false,null]}}},"ts_ms":-12,"extra":[{},[]]}"#,
    ];

    #[test]
    fn a_row_cut_after_a_backslash_is_given_up_on() {
        for event in [
            r#"{"after":{"a":"\"#,
            r#"{"after":{"a":"x\"#,
            r#"{"after":["\"#,
        ] {
            assert_eq!(skim(event.as_bytes()), None, "{event}");
        }
    }

    #[test]
    fn the_common_form_is_skimmed() {
        for event in EVENTS {
            assert!(skim(event.as_bytes()).is_some(), "{event}");
        }
        let fields = skim(EVENTS[1].as_bytes()).unwrap();
        assert_eq!(fields.op.as_deref(), Some("d"));
        assert_eq!(fields.before, Some(r#"{"id":1}"#));
        assert_eq!((fields.source_ts, fields.ts_ms), (Some(6), Some(7)));
    }

    /// Whatever the skim reads, serde reads the same; whatever serde
    /// refuses, the skim gives up on.
    #[test]
    fn the_skim_agrees_with_serde_on_damaged_events() {
        const BYTES: &[u8] = b"{}[]\":,\\ 0123456789.-+eEnulltrfaseopbd\t\n\x01\xc3";
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut skimmed, mut refused) = (0, 0);
        for round in 0..200_000 {
            let mut event = EVENTS[round % EVENTS.len()].as_bytes().to_vec();
            for _ in 0..=rng.next() % 3 {
                let at = rng.below(event.len());
                let byte = BYTES[rng.below(BYTES.len())];
                match rng.next() % 3 {
                    0 => event[at] = byte,
                    1 => event.insert(at, byte),
                    _ => {
                        event.remove(at);
                    }
                }
            }
            let serde = super::super::parse_envelope(&event);
            let text = String::from_utf8_lossy(&event);
            match (skim(&event), serde) {
                (Some(fields), Ok(read)) => {
                    skimmed += 1;
                    assert_eq!(read, fields, "{text}");
                }
                // Rows are bounded by their brackets only: the row decoder
                // refuses what serde did.
                (Some(fields), Err(_)) => {
                    let json = |v: Option<&str>| {
                        v.is_none_or(|v| serde_json::from_str::<serde::de::IgnoredAny>(v).is_ok())
                    };
                    assert!(
                        !json(fields.before) || !json(fields.after) || !json(fields.schema),
                        "{text}"
                    );
                }
                (None, read) => refused += usize::from(read.is_err()),
            }
        }
        assert!(skimmed > 10_000 && refused > 10_000, "{skimmed} {refused}");
    }
}
