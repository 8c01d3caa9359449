//! Time spent inside PyTorch's allocator hooks (`emm_torch_alloc`,
//! `emm_torch_free`), counted only in builds with the `call-timing` feature.
//!
//! A diagnostic for training runs: it says how much of a step's host time is emm's
//! own (the call count, the total and slowest call, how many calls took 4 us or
//! more and how long those took together), so a slower step can be told apart
//! from a slower allocator; and, for the slow calls, what the pool did in them
//! (`emm_pool::call_work`: the arena's lock, a claim of other threads' caches, a
//! driver event call, parked blocks, growth; `none`: the thread's own cache
//! only), each slow call counted under every kind it did; and the time of each
//! phase of the pool's growths (`emm_pool::growth_phases::Phase`: a whole
//! growth, unmapping before it, planning, the unmapping helper's turn,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, retiring moved pieces,
//! `cuMemUnmap`, the wait for parked blocks; nested, not to be added up), as
//! `pool_<phase>_calls` and `pool_<phase>_ns`.
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

    use emm_pool::call_work::{self, Work};

    use super::Hook;

    /// The kinds slow calls are counted under: each of [`Work::ALL`], then
    /// `none` (a slow call that did none of them).
    const KINDS: usize = Work::ALL.len() + 1;

    /// Calls of at least this many nanoseconds are counted as slow.
    const SLOW_NS: u64 = 4_000;

    struct Counters {
        calls: AtomicU64,
        total_ns: AtomicU64,
        max_ns: AtomicU64,
        slow: AtomicU64,
        /// Nanoseconds spent in the slow calls.
        slow_ns: AtomicU64,
        /// Slow calls by what they did (see [`KINDS`]), and their nanoseconds.
        slow_by: [AtomicU64; KINDS],
        slow_by_ns: [AtomicU64; KINDS],
    }

    static COUNTERS: [Counters; 2] = [const {
        Counters {
            calls: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            slow_ns: AtomicU64::new(0),
            slow_by: [const { AtomicU64::new(0) }; KINDS],
            slow_by_ns: [const { AtomicU64::new(0) }; KINDS],
        }
    }; 2];

    pub(crate) fn timed<R>(hook: Hook, f: impl FnOnce() -> R) -> R {
        let _ = call_work::take(); // what an earlier, untimed call noted
        let start = Instant::now();
        let out = f();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let work = call_work::take();
        let c = &COUNTERS[hook as usize];
        c.calls.fetch_add(1, Relaxed);
        c.total_ns.fetch_add(ns, Relaxed);
        c.max_ns.fetch_max(ns, Relaxed);
        if ns >= SLOW_NS {
            c.slow.fetch_add(1, Relaxed);
            c.slow_ns.fetch_add(ns, Relaxed);
            let kinds = Work::ALL
                .iter()
                .enumerate()
                .filter(|(_, w)| work & w.bit() != 0)
                .map(|(i, _)| i);
            let none = (work == 0).then_some(Work::ALL.len());
            for i in kinds.chain(none) {
                c.slow_by[i].fetch_add(1, Relaxed);
                c.slow_by_ns[i].fetch_add(ns, Relaxed);
            }
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
            let names = Work::ALL.iter().map(|w| w.name()).chain(["none"]);
            for (i, kind) in names.enumerate() {
                text.push_str(&format!(
                    "\n{name}_slow_{kind}_calls: {}\n{name}_slow_{kind}_ns: {}",
                    c.slow_by[i].load(Relaxed),
                    c.slow_by_ns[i].load(Relaxed)
                ));
            }
        }
        // The phases of the pool's growths, process-wide.
        for (phase, calls, ns) in emm_pool::growth_phases::phases() {
            let name = phase.name();
            text.push_str(&format!(
                "\npool_{name}_calls: {calls}\npool_{name}_ns: {ns}"
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

    /// A report line's value (0 when missing).
    fn value(text: &str, key: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn slow_calls_are_counted_under_what_the_pool_did_in_them() {
        if !cfg!(feature = "call-timing") {
            return;
        }
        let slow = || std::thread::sleep(std::time::Duration::from_micros(50));
        let before = report();
        // A slow call that did no pool work: `none`.
        timed(Hook::Free, slow);
        // A slow call that took the arena's lock (a first allocation misses
        // the thread's cache) and grew the pool.
        let pool = emm_pool::PoolManager::host(1 << 30, emm_pool::PoolConfig::default()).unwrap();
        let block = timed(Hook::Alloc, || {
            slow();
            pool.alloc(64 << 20, emm_core::SYNC_STREAM).unwrap()
        });
        drop(block);
        let after = report();
        let grew = |key: &str| value(&after, key) - value(&before, key);
        assert!(grew("torch_free_slow_none_calls:") >= 1, "{after}");
        assert!(grew("torch_alloc_slow_locked_calls:") >= 1, "{after}");
        assert!(grew("torch_alloc_slow_grew_calls:") >= 1, "{after}");
        assert!(grew("pool_expand_calls:") >= 1, "{after}");
        assert!(grew("pool_plan_calls:") >= 1, "{after}");
        for kind in ["locked", "reclaim", "events", "parked", "grew", "none"] {
            assert!(
                after.contains(&format!("\ntorch_alloc_slow_{kind}_ns: ")),
                "{kind}: {after}"
            );
        }
    }
}
