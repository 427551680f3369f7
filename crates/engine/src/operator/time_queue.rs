//! [`TimeQueue`]: entries popped in (time, entry) order, cheap when they
//! arrive as a few interleaved in-order streams, as the rows of several
//! input partitions do (each partition's rows nearly in time order, one
//! partition's chunk after another's).
//!
//! An entry goes to the first of up to [`MAX_RUNS`] FIFO runs whose last
//! entry is not after it (O(1) push and pop; each run stays sorted); only an
//! entry no run takes goes to a binary heap. A pop takes the smallest of the
//! fronts, so the order is exactly a heap's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Sorted runs kept at most: one per interleaved input partition is enough
/// for the heap to stay empty; a pop compares every run's front.
const MAX_RUNS: usize = 8;

#[derive(Debug, Default)]
pub struct TimeQueue {
    runs: Vec<VecDeque<(i64, u32)>>,
    /// The run pushed to last: the next entry most likely belongs there too.
    last: usize,
    late: BinaryHeap<Reverse<(i64, u32)>>,
}

/// Where the smallest entry is.
#[derive(Clone, Copy)]
enum Front {
    Run(usize),
    Late,
}

impl TimeQueue {
    pub fn push(&mut self, time: i64, entry: u32) {
        let item = (time, entry);
        let fits = |run: &VecDeque<(i64, u32)>| run.back().is_none_or(|&last| last <= item);
        if let Some(run) = self.runs.get_mut(self.last)
            && fits(run)
        {
            return run.push_back(item);
        }
        if let Some(i) = self.runs.iter().position(fits) {
            self.last = i;
            return self.runs[i].push_back(item);
        }
        if self.runs.len() < MAX_RUNS {
            self.last = self.runs.len();
            self.runs.push(VecDeque::from([item]));
        } else {
            self.late.push(Reverse(item));
        }
    }

    fn front(&self) -> Option<((i64, u32), Front)> {
        let mut best = self.late.peek().map(|&Reverse(item)| (item, Front::Late));
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(&item) = run.front()
                && best.is_none_or(|(b, _)| item < b)
            {
                best = Some((item, Front::Run(i)));
            }
        }
        best
    }

    /// The smallest entry, if any.
    pub fn peek(&self) -> Option<(i64, u32)> {
        self.front().map(|(item, _)| item)
    }

    /// Pops every entry whose time is before `bound`, in order.
    pub fn pop_before(&mut self, bound: i64, mut each: impl FnMut(i64, u32)) {
        while let Some(((t, e), at)) = self.front().filter(|&((t, _), _)| t < bound) {
            match at {
                Front::Run(i) => {
                    self.runs[i].pop_front();
                }
                Front::Late => {
                    self.late.pop();
                }
            }
            each(t, e);
        }
    }

    /// Renumbers entries by `map` (increasing, so order holds), dropping
    /// those it maps to `None`.
    pub fn renumber(&mut self, map: impl Fn(u32) -> Option<u32>) {
        for run in &mut self.runs {
            *run = run
                .drain(..)
                .filter_map(|(t, e)| Some((t, map(e)?)))
                .collect();
        }
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
    fn interleaved_partitions_keep_the_heap_empty_and_pop_in_order() {
        let mut q = TimeQueue::default();
        let mut heap = BinaryHeap::new();
        let mut e = 0u32;
        // Four partitions, each in time order, read one chunk of 100 rows
        // after another; partition p runs p * 37 behind.
        for chunk in 0..50i64 {
            for p in 0..4i64 {
                for r in 0..100i64 {
                    let t = (chunk * 100 + r) * 10 - p * 37;
                    q.push(t, e);
                    heap.push(Reverse((t, e)));
                    e += 1;
                }
            }
        }
        assert!(
            q.late.is_empty(),
            "{} entries fell back to the heap",
            q.late.len()
        );
        let mut got = Vec::new();
        q.pop_before(i64::MAX, |t, e| got.push((t, e)));
        let want: Vec<_> = std::iter::from_fn(|| heap.pop().map(|Reverse(x)| x)).collect();
        assert_eq!(got, want);
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
