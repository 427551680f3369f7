//! A changelog folded into its latest value per key, and the comparison of
//! such a fold with the oracle: same keys, same values, floats within a
//! relative 1e-9 (a streaming sum adds in another order than a one-shot one).

use std::collections::BTreeMap;

use serde_json::Value;

/// Latest value per key: key JSON -> value JSON.
pub type State = BTreeMap<String, String>;

/// Folds changelog records `(key, value)` in order into the latest value per
/// key; a `None` value (a tombstone) deletes the key. Keys and values are
/// kept as they are (bytes read as UTF-8).
pub fn fold<K, V>(records: impl IntoIterator<Item = (K, Option<V>)>) -> State
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut state = State::new();
    for (key, value) in records {
        let key = String::from_utf8_lossy(key.as_ref()).into_owned();
        match value {
            Some(v) => {
                state.insert(key, String::from_utf8_lossy(v.as_ref()).into_owned());
            }
            None => {
                state.remove(&key);
            }
        }
    }
    state
}

/// Folds the changelog lines `ubik run` prints (`{"key":..,"value":..}`,
/// a null value deletes); keys and values re-serialised as compact JSON.
pub fn fold_lines<L: AsRef<str>>(lines: &[L]) -> State {
    fold(lines.iter().map(|l| {
        let l = l.as_ref();
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}"));
        let value = (!v["value"].is_null()).then(|| v["value"].to_string());
        (v["key"].to_string(), value)
    }))
}

/// Whether two JSON values agree: integers exactly, other numbers within a
/// relative 1e-9 of the smaller magnitude (absolute below 1), objects field
/// by field with the same fields, everything else exactly.
pub fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                return x == y;
            }
            if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                return x == y;
            }
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            (x - y).abs() <= 1e-9 * x.abs().min(y.abs()).max(1.0)
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| close(v, w))
        }
        _ => a == b,
    }
}

fn parse(what: &str, text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
}

/// Keys parsed and re-serialised, so equal JSON compares equal however it
/// was spelled.
fn by_key<'a>(what: &str, state: &'a State) -> BTreeMap<String, &'a String> {
    state
        .iter()
        .map(|(k, v)| (parse(what, k).to_string(), v))
        .collect()
}

/// Asserts that a fold of ubik's changelog (`got`) equals the oracle's
/// (`want`): the same keys, nothing missing and nothing extra, and values
/// that are [`close`]. Fails on an empty oracle, which would prove nothing.
#[track_caller]
pub fn assert_matches(what: &str, got: &State, want: &State) {
    assert!(
        !want.is_empty(),
        "{what}: the oracle's result is empty, the comparison would prove nothing"
    );
    let got = by_key(what, got);
    let want = by_key(what, want);
    let missing: Vec<&String> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(3)
        .collect();
    let extra: Vec<&String> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(3)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: keys differ; missing {missing:?}, extra {extra:?} (ubik {} keys, oracle {})",
        got.len(),
        want.len()
    );
    for (k, v) in &want {
        let a = parse(what, got[k]);
        let b = parse(what, v);
        assert!(
            close(&a, &b),
            "{what}: key {k}\n  ubik:   {a}\n  oracle: {b}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_keeps_the_latest_and_deletes_on_tombstones() {
        let s = fold([
            ("a", Some("1")),
            ("b", Some("2")),
            ("a", Some("3")),
            ("b", None),
        ]);
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            [("a".to_string(), "3".to_string())]
        );
        let s = fold_lines(&[
            r#"{"key":{"k":1},"value":{"n":1}}"#,
            r#"{"key":{"k":2},"value":{"n":2}}"#,
            r#"{"key":{"k":2},"value":null}"#,
        ]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[r#"{"k":1}"#], r#"{"n":1}"#);
    }

    #[test]
    fn close_is_tolerant_for_floats_only() {
        let v = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert!(close(
            &v(r#"{"a":0.1,"n":3}"#),
            &v(r#"{"n":3,"a":0.10000000000000002}"#)
        ));
        assert!(!close(&v(r#"{"a":0.1}"#), &v(r#"{"a":0.1001}"#)));
        assert!(!close(&v(r#"{"n":3}"#), &v(r#"{"n":4}"#)));
        assert!(!close(&v(r#"{"n":3}"#), &v(r#"{"n":3,"m":1}"#)));
        assert!(close(&v(r#"{"a":null}"#), &v(r#"{"a":null}"#)));
    }

    #[test]
    #[should_panic(expected = "missing")]
    fn a_lost_key_fails() {
        let want = fold([("{\"k\":1}", Some("1")), ("{\"k\":2}", Some("2"))]);
        let got = fold([("{\"k\":1}", Some("1"))]);
        assert_matches("lost", &got, &want);
    }

    #[test]
    #[should_panic(expected = "empty")]
    fn an_empty_oracle_fails() {
        assert_matches("empty", &State::new(), &State::new());
    }
}
