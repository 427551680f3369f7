//! [`TimeQueue`]: entries popped in (time, entry) order, cheap when they
//! arrive nearly in order, as a stream's rows do.
//!
//! An entry not before the last in-order one goes to a FIFO (O(1) push and
//! pop); only an out-of-order one goes to a binary heap. A pop takes the
//! smaller of the two fronts, so the order is exactly a heap's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Debug, Default)]
pub struct TimeQueue {
    in_order: VecDeque<(i64, u32)>,
    late: BinaryHeap<Reverse<(i64, u32)>>,
}

impl TimeQueue {
    pub fn push(&mut self, time: i64, entry: u32) {
        let item = (time, entry);
        if self.in_order.back().is_none_or(|&last| last <= item) {
            self.in_order.push_back(item);
        } else {
            self.late.push(Reverse(item));
        }
    }

    /// The smallest entry, if any.
    pub fn peek(&self) -> Option<(i64, u32)> {
        match (self.in_order.front(), self.late.peek()) {
            (Some(&a), Some(&Reverse(b))) => Some(a.min(b)),
            (Some(&a), None) => Some(a),
            (None, Some(&Reverse(b))) => Some(b),
            (None, None) => None,
        }
    }

    /// Pops every entry whose time is before `bound`, in order.
    pub fn pop_before(&mut self, bound: i64, mut each: impl FnMut(i64, u32)) {
        while let Some((t, e)) = self.peek().filter(|&(t, _)| t < bound) {
            if self.in_order.front() == Some(&(t, e)) {
                self.in_order.pop_front();
            } else {
                self.late.pop();
            }
            each(t, e);
        }
    }

    /// Renumbers entries by `map` (increasing, so order holds), dropping
    /// those it maps to `None`.
    pub fn renumber(&mut self, map: impl Fn(u32) -> Option<u32>) {
        self.in_order = self
            .in_order
            .drain(..)
            .filter_map(|(t, e)| Some((t, map(e)?)))
            .collect();
        self.late = self
            .late
            .drain()
            .filter_map(|Reverse((t, e))| Some(Reverse((t, map(e)?))))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_the_order_a_heap_would() {
        let mut q = TimeQueue::default();
        let mut heap = BinaryHeap::new();
        let mut x: u64 = 7;
        for e in 0..10_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Mostly increasing times, some far behind.
            let t = i64::from(e) * 10
                - if x >> 60 == 0 {
                    (x >> 40) as i64 % 5000
                } else {
                    0
                };
            q.push(t, e);
            heap.push(Reverse((t, e)));
        }
        for bound in [0, 5_000, 50_000, i64::MAX] {
            let mut got = Vec::new();
            q.pop_before(bound, |t, e| got.push((t, e)));
            let mut want = Vec::new();
            while let Some(&Reverse((t, e))) = heap.peek().filter(|r| r.0.0 < bound) {
                heap.pop();
                want.push((t, e));
            }
            assert_eq!(got, want, "bound {bound}");
        }
        assert_eq!(q.peek(), None);
    }

    #[test]
    fn renumbering_keeps_the_order_and_drops() {
        let mut q = TimeQueue::default();
        for (t, e) in [(5, 0), (7, 1), (6, 2), (9, 3)] {
            q.push(t, e);
        }
        q.renumber(|e| (e != 1).then_some(e * 10));
        let mut got = Vec::new();
        q.pop_before(i64::MAX, |t, e| got.push((t, e)));
        assert_eq!(got, vec![(5, 0), (6, 20), (9, 30)]);
    }
}
