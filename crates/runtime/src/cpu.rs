//! CPU time of the calling thread: what a task's turns and commits cost,
//! so a consumer group reports CPU per event per stage (the cost of each
//! exchange), apart from librdkafka's threads and the store's merges.

/// Seconds of CPU the calling thread has used so far (0 where the clock is
/// not available).
pub fn thread_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_thread_uses_cpu_and_a_sleeping_one_hardly_any() {
        let start = super::thread_seconds();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let busy = super::thread_seconds() - start;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = super::thread_seconds() - start - busy;
        assert!(busy > 0.0, "{busy}");
        assert!(slept < 0.02, "sleeping used {slept} s of CPU");
    }
}
