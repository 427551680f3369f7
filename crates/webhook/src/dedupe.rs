//! Event ids remembered for `dedupe`: a provider's retry of an event stored
//! within the window is acknowledged but not stored again. Ids older than the
//! window are forgotten, so memory stays bounded by the window's traffic.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

pub struct SeenIds {
    window_ms: i64,
    /// id -> when it was stored (ms since the epoch).
    ids: HashMap<String, i64>,
    /// Insertion order, for expiry.
    order: VecDeque<(i64, String)>,
}

impl SeenIds {
    /// `known`: ids already in the buffer (after a restart), with their time.
    pub fn new(window: Duration, known: impl IntoIterator<Item = (String, i64)>) -> Self {
        let mut known: Vec<(String, i64)> = known.into_iter().collect();
        known.sort_by_key(|(_, t)| *t);
        let mut s = Self {
            window_ms: window.as_millis().min(i64::MAX as u128) as i64,
            ids: HashMap::with_capacity(known.len()),
            order: VecDeque::with_capacity(known.len()),
        };
        for (id, t) in known {
            s.remember(&id, t);
        }
        s
    }

    /// True if `id` is new (and remembers it), false if it was stored
    /// within the window before `now_ms`.
    pub fn insert(&mut self, id: &str, now_ms: i64) -> bool {
        self.expire(now_ms);
        if self.ids.contains_key(id) {
            return false;
        }
        self.remember(id, now_ms);
        true
    }

    /// Forgets an id whose event was finally not stored.
    pub fn forget(&mut self, id: &str) {
        self.ids.remove(id);
    }

    fn remember(&mut self, id: &str, t: i64) {
        self.ids.insert(id.to_string(), t);
        self.order.push_back((t, id.to_string()));
    }

    fn expire(&mut self, now_ms: i64) {
        let cutoff = now_ms.saturating_sub(self.window_ms);
        while let Some((t, _)) = self.order.front() {
            if *t > cutoff {
                break;
            }
            let (t, id) = self.order.pop_front().expect("front exists");
            // A forgotten and re-stored id has a newer time: keep it.
            if self.ids.get(&id) == Some(&t) {
                self.ids.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_the_window_only() {
        let mut s = SeenIds::new(Duration::from_millis(100), [("a".to_string(), 0)]);
        assert!(!s.insert("a", 50), "seen 50 ms ago");
        assert!(s.insert("b", 60));
        assert!(s.insert("a", 101), "forgotten after the window");
        assert!(!s.insert("b", 150));
        s.forget("b");
        assert!(s.insert("b", 155), "a forgotten id may be stored again");
        assert!(!s.insert("b", 200), "and is remembered from its new time");
        assert!(s.insert("b", 256));
        assert_eq!(s.ids.len(), 1, "a (stored at 101) expired at 201");
    }
}
