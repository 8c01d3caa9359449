//! Time spent inside PyTorch's allocator hooks (`emm_torch_alloc`,
//! `emm_torch_free`), counted only in builds with the `call-timing` feature.
//!
//! A diagnostic for training runs: it says how much of a step's host time is emm's
//! own (the call count, the total and slowest call, how many calls took 4 us or
//! more and how long those took together), so a slower step can be told apart
//! from a slower allocator.
//! `emm_manager_report` appends the counters as `name: value` lines. Without the
//! feature, [`timed`] is a plain call and [`report`] is empty.

/// Which hook a timing belongs to.
#[derive(Clone, Copy)]
pub(crate) enum Hook {
    /// `emm_torch_alloc`.
    Alloc,
    /// `emm_torch_free`.
    Free,
}

#[cfg(feature = "call-timing")]
mod counters {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::Instant;

    use super::Hook;

    /// Calls of at least this many nanoseconds are counted as slow.
    const SLOW_NS: u64 = 4_000;

    struct Counters {
        calls: AtomicU64,
        total_ns: AtomicU64,
        max_ns: AtomicU64,
        slow: AtomicU64,
        /// Nanoseconds spent in the slow calls.
        slow_ns: AtomicU64,
    }

    static COUNTERS: [Counters; 2] = [const {
        Counters {
            calls: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            slow_ns: AtomicU64::new(0),
        }
    }; 2];

    pub(crate) fn timed<R>(hook: Hook, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let out = f();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let c = &COUNTERS[hook as usize];
        c.calls.fetch_add(1, Relaxed);
        c.total_ns.fetch_add(ns, Relaxed);
        c.max_ns.fetch_max(ns, Relaxed);
        if ns >= SLOW_NS {
            c.slow.fetch_add(1, Relaxed);
            c.slow_ns.fetch_add(ns, Relaxed);
        }
        out
    }

    pub(crate) fn report() -> String {
        let mut text = String::new();
        for (name, c) in ["torch_alloc", "torch_free"].iter().zip(&COUNTERS) {
            text.push_str(&format!(
                "\n{name}_calls: {}\n{name}_ns: {}\n{name}_max_ns: {}\n{name}_slow_calls: {}\n{name}_slow_ns: {}",
                c.calls.load(Relaxed),
                c.total_ns.load(Relaxed),
                c.max_ns.load(Relaxed),
                c.slow.load(Relaxed),
                c.slow_ns.load(Relaxed)
            ));
        }
        text
    }
}

/// Runs `f`, the body of `hook`; with `call-timing`, counts its duration.
#[inline(always)]
pub(crate) fn timed<R>(hook: Hook, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "call-timing")]
    {
        counters::timed(hook, f)
    }
    #[cfg(not(feature = "call-timing"))]
    {
        let _ = hook; // only the timing build records which hook ran
        f()
    }
}

/// The counters as `name: value` lines, each after a newline; empty without
/// `call-timing`.
pub(crate) fn report() -> String {
    #[cfg(feature = "call-timing")]
    {
        counters::report()
    }
    #[cfg(not(feature = "call-timing"))]
    {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_returns_the_result_and_reports_only_in_the_timing_build() {
        assert_eq!(timed(Hook::Alloc, || 7), 7);
        assert_eq!(timed(Hook::Free, || "freed"), "freed");
        let text = report();
        if cfg!(feature = "call-timing") {
            let count = |key: &str| -> u64 {
                text.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            assert!(count("torch_alloc_calls:") >= 1, "{text}");
            assert!(count("torch_free_calls:") >= 1, "{text}");
        } else {
            assert!(text.is_empty(), "{text}");
        }
    }
}
