//! `emm bench`'s thread runs: sixteen threads, each on its own stream, against
//! one, and the same loop over libc's allocator beside them.
//!
//! A run gives its threads the same number of pairs and stops the clock when the
//! last is done, so its rate is set by the slowest thread; on a host whose CPUs
//! run at different speeds (a lent machine's did, 9.7-19.9 ms for one loop,
//! docs/benchmarks.md, sixty-seventh session) that is the slowest CPU's speed.
//! Each thread's own rate (its pairs over its own time) is summed beside it, and
//! the slowest thread's time over the fastest's says how uneven they were.

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use emm::driver::{Context, Stream};

use super::build;
use crate::backend::Backend;
use crate::out::{note, Out};

/// Sixteen threads, each on its own stream, against one thread: aggregate pairs/s,
/// and the same loop over libc's allocator beside it, a reference for how a
/// general-purpose allocator scales on this host (not the host's ceiling: glibc
/// takes an arena lock on every call past its small per-thread cache).
pub(super) fn threads(
    backend: &Backend,
    ctx: &Context,
    json: bool,
    out: &mut Out,
) -> io::Result<ExitCode> {
    let pool = match build(backend, "pool") {
        Ok(p) => p,
        Err(e) => {
            note(format_args!("emm bench: {e}"));
            return Ok(ExitCode::from(1));
        }
    };
    // The streams first: a stream the driver refuses is reported, not a panic in
    // a thread that the others would wait for at the barrier.
    let streams = match (0..THREADS)
        .map(|_| Stream::new(ctx))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(s) => s,
        Err(e) => {
            note(format_args!("emm bench: creating a stream failed: {e}"));
            return Ok(ExitCode::from(1));
        }
    };
    let sizes = [256usize, 4096, 65_536, 1 << 20];
    // A failed call is counted, not taken for a pair: the run then reports it
    // and exits with status 1 instead of printing a rate.
    let failures = AtomicUsize::new(0);
    let first_failure = Mutex::new(None::<String>);
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        if failures.fetch_add(1, Ordering::Relaxed) == 0 {
            if let Ok(mut f) = first_failure.lock() {
                *f = Some(format!("{what}: {e}"));
            }
        }
    };
    let pool_run = |n: usize| {
        scaling(n, |t, ready: &dyn Fn()| {
            let Some(stream) = streams.get(t) else {
                failed("a thread without a stream", &t);
                return ready();
            };
            if let Err(e) = ctx.set_current() {
                failed("making the context current", &e);
            }
            let pair = |size: usize| {
                if let Err(e) = pool.memalloc_async(size, stream.raw()) {
                    failed(&format!("allocating {size} bytes"), &e);
                }
            };
            for &s in &sizes {
                pair(s);
            }
            ready();
            for i in 0..PER_THREAD {
                pair(sizes[(i + t) % 4]);
            }
        })
    };
    // The same loop over libc's allocator, its first pairs before the clock too.
    let libc_run = |n: usize| {
        scaling(n, |t, ready: &dyn Fn()| {
            let pair = |size: usize| {
                let v: Vec<u8> = Vec::with_capacity(size);
                std::hint::black_box(&v);
            };
            for &s in &sizes {
                pair(s);
            }
            ready();
            for i in 0..PER_THREAD {
                pair(sizes[(i + t) % 4]);
            }
        })
    };
    // One run of each moves by tens of percent on a shared host: the four are
    // interleaved over `THREAD_REPS` repetitions, and each figure is its median.
    let mut reps: [Vec<Scaling>; 4] = Default::default();
    let mut runs = || -> std::io::Result<()> {
        pool_run(1)?; // warm up
        libc_run(1)?;
        for _ in 0..THREAD_REPS {
            reps[0].push(pool_run(1)?);
            reps[1].push(pool_run(THREADS)?);
            reps[2].push(libc_run(1)?);
            reps[3].push(libc_run(THREADS)?);
        }
        Ok(())
    };
    if let Err(e) = runs() {
        note(format_args!(
            "emm bench: starting the threads of the thread runs failed: {e}"
        ));
        return Ok(ExitCode::from(1));
    }
    let [one, sixteen, libc_one, libc_sixteen] = reps.map(|v| Scaling::median(&v));
    let n_failed = failures.load(Ordering::Relaxed);
    if n_failed > 0 {
        let first = first_failure
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_default();
        note(format_args!(
            "emm bench: {n_failed} calls failed in the thread runs, so no rate is printed; the first: {first}"
        ));
        return Ok(ExitCode::from(1));
    }
    let cpus = std::thread::available_parallelism().ok().map(|n| n.get());
    // The frees were stream-ordered: the streams finish before they are dropped.
    for stream in &streams {
        if let Err(e) = stream.synchronize() {
            note(format_args!(
                "emm bench: synchronizing a stream failed: {e}"
            ));
            return Ok(ExitCode::from(1));
        }
    }
    if json {
        out.line(serde_json::json!({
            "path": "emm pool threads",
            "pairs_per_second_1": one.rate.round(),
            "pairs_per_second_16": sixteen.rate.round(),
            "pairs_per_second_16_threads_summed": sixteen.summed.round(),
            "thread_time_spread_16": sixteen.spread,
            "libc_pairs_per_second_1": libc_one.rate.round(),
            "libc_pairs_per_second_16": libc_sixteen.rate.round(),
            "libc_pairs_per_second_16_threads_summed": libc_sixteen.summed.round(),
            "libc_thread_time_spread_16": libc_sixteen.spread,
            "available_cpus": cpus,
        }))?;
    } else {
        let cpus = cpus.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        out.line(Scaling::line(
            &format!("emm pool, mixed sizes, own stream per thread (median of {THREAD_REPS})"),
            &one,
            &sixteen,
            "",
        ))?;
        out.line(Scaling::line(
            "libc malloc + free, the same loop (a reference)",
            &libc_one,
            &libc_sixteen,
            &format!("; {cpus} CPUs available to this process"),
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Pairs each thread makes in [`scaling`].
const PER_THREAD: usize = 4_000_000;
/// Threads of the many-thread run.
const THREADS: usize = 16;
/// Repetitions of the thread runs (medians are reported).
const THREAD_REPS: usize = 5;

/// What one run of [`scaling`] measured.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scaling {
    /// Pairs a second of all the threads together: every pair over the time
    /// from the start to the last thread's end (the slowest thread sets it).
    rate: f64,
    /// Each thread's own pairs a second (its pairs over its own time from the
    /// start), summed.
    summed: f64,
    /// The slowest thread's time over the fastest's (1: alike).
    spread: f64,
}

impl Scaling {
    /// Each field's median over `runs` (0 for none), taken field by field.
    fn median(runs: &[Scaling]) -> Scaling {
        let med = |f: fn(&Scaling) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Scaling {
            rate: med(|s| s.rate),
            summed: med(|s| s.summed),
            spread: med(|s| s.spread),
        }
    }

    /// The line on `what`: one thread's rate, sixteen's, and the threads' own
    /// rates summed (`note` added inside the first parentheses).
    fn line(what: &str, one: &Scaling, sixteen: &Scaling, note: &str) -> String {
        format!(
            "{what}: 1 thread {:.1} M pairs/s, 16 threads {:.1} M pairs/s ({:.1}x{note}); each thread's own rate summed {:.1} M pairs/s ({:.1}x), the slowest thread taking {:.2}x the fastest's time",
            one.rate / 1e6,
            sixteen.rate / 1e6,
            sixteen.rate / one.rate,
            sixteen.summed / 1e6,
            sixteen.summed / one.rate,
            sixteen.spread
        )
    }
}

/// Pairs a second of `n` threads each running `body(t, ready)`: `body` sets up,
/// calls `ready()` once (the clock starts when every thread has), then makes
/// [`PER_THREAD`] pairs; the clock stops when the last is done, and each
/// thread's own time is taken when it is. `body` must call `ready()` exactly once and must not panic, or the
/// others wait at the barrier for good. The threads wait at a gate until all
/// `n` are started: where the system refuses one, those started leave without
/// running `body` and the error is returned.
fn scaling(n: usize, body: impl Fn(usize, &dyn Fn()) + Sync) -> std::io::Result<Scaling> {
    scaling_refusing(n, body, |_| None)
}

/// As [`scaling`]; `refuse(t)` stands for the system refusing thread `t`
/// (a test's refusal, where the system's cannot be had at will).
fn scaling_refusing(
    n: usize,
    body: impl Fn(usize, &dyn Fn()) + Sync,
    refuse: impl Fn(usize) -> Option<std::io::Error>,
) -> std::io::Result<Scaling> {
    let ready = std::sync::Barrier::new(n + 1);
    let done = std::sync::Barrier::new(n + 1);
    // `None` until every thread started; then whether they run.
    let gate = (Mutex::new(None::<bool>), std::sync::Condvar::new());
    let open = |run: bool| {
        let (lock, cv) = &gate;
        *lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(run);
        cv.notify_all();
    };
    let mut elapsed = 0.0;
    // Each thread's nanoseconds from its start (past the `ready` barrier) to the
    // end of its body.
    let took: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|sc| {
        for t in 0..n {
            let (ready, done, body, gate, took) = (&ready, &done, &body, &gate, &took);
            if let Some(e) = refuse(t) {
                open(false);
                return Err(e);
            }
            let started = std::thread::Builder::new().spawn_scoped(sc, move || {
                let (lock, cv) = gate;
                let mut g = lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                while g.is_none() {
                    g = cv
                        .wait(g)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                let run = *g == Some(true);
                drop(g);
                if run {
                    let began = std::cell::Cell::new(None);
                    body(t, &|| {
                        ready.wait();
                        began.set(Some(Instant::now()));
                    });
                    if let (Some(b), Some(slot)) = (began.get(), took.get(t)) {
                        let ns = u64::try_from(b.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        slot.store(ns.max(1), Ordering::Relaxed);
                    }
                    done.wait();
                }
            });
            if let Err(e) = started {
                open(false);
                return Err(e);
            }
        }
        open(true);
        ready.wait();
        let start = Instant::now();
        done.wait();
        elapsed = start.elapsed().as_secs_f64();
        Ok(())
    })?;
    let secs: Vec<f64> = took
        .iter()
        .map(|t| t.load(Ordering::Relaxed) as f64 / 1e9)
        .collect();
    let (fastest, slowest) = secs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &s| {
        (lo.min(s), hi.max(s))
    });
    Ok(Scaling {
        rate: (n * PER_THREAD) as f64 / elapsed,
        summed: secs.iter().map(|&s| PER_THREAD as f64 / s).sum(),
        spread: slowest / fastest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_its_body_once_behind_the_gate() {
        let ran = AtomicUsize::new(0);
        let s = scaling(3, |t, ready: &dyn Fn()| {
            assert!(t < 3);
            ran.fetch_add(1, Ordering::Relaxed);
            ready();
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        assert!(s.rate.is_finite() && s.rate > 0.0, "{s:?}");
        assert!(s.summed.is_finite() && s.summed >= s.rate, "{s:?}");
        assert!(s.spread.is_finite() && s.spread >= 1.0, "{s:?}");
    }

    /// A thread much slower than the other sets the rate until the last; the
    /// threads' own rates, summed, and the spread say so (the margins hold
    /// while a loaded host oversleeps the fast thread by up to 500 ms: with
    /// 300 ms for the slow one, a host busy building failed it once).
    #[test]
    fn a_slow_thread_sets_the_rate_and_the_spread_shows_it() {
        let s = scaling(2, |t, ready: &dyn Fn()| {
            ready();
            std::thread::sleep(std::time::Duration::from_millis(if t == 0 {
                1000
            } else {
                30
            }));
        })
        .unwrap();
        let pairs = 2.0 * PER_THREAD as f64;
        // The rate is every pair over the slow thread's time (at least 1 s).
        assert!(s.rate <= pairs / 1.0, "{s:?}");
        // Summed: each thread's pairs over its own time, more than the rate.
        assert!(s.summed > s.rate * 1.4, "{s:?}");
        assert!(s.spread > 2.0, "{s:?}");
    }

    #[test]
    fn the_line_names_both_rates_the_sum_and_the_spread() {
        let one = Scaling {
            rate: 2e6,
            summed: 2e6,
            spread: 1.0,
        };
        let sixteen = Scaling {
            rate: 20e6,
            summed: 30e6,
            spread: 1.5,
        };
        let l = Scaling::line("loop", &one, &sixteen, "; 16 CPUs");
        assert_eq!(
            l,
            "loop: 1 thread 2.0 M pairs/s, 16 threads 20.0 M pairs/s (10.0x; 16 CPUs); each thread's own rate summed 30.0 M pairs/s (15.0x), the slowest thread taking 1.50x the fastest's time"
        );
    }

    #[test]
    fn medians_are_taken_field_by_field() {
        let r = |rate, summed, spread| Scaling {
            rate,
            summed,
            spread,
        };
        let m = Scaling::median(&[r(3.0, 10.0, 1.5), r(1.0, 30.0, 1.1), r(2.0, 20.0, 1.3)]);
        assert_eq!(m, r(2.0, 20.0, 1.3));
        assert_eq!(Scaling::median(&[]), r(0.0, 0.0, 0.0));
    }

    #[test]
    fn a_refused_thread_lets_the_started_ones_go_without_running() {
        let ran = AtomicUsize::new(0);
        let r = scaling_refusing(
            3,
            |_, ready: &dyn Fn()| {
                ran.fetch_add(1, Ordering::Relaxed);
                ready();
            },
            |t| (t == 2).then(|| std::io::Error::other("no more threads")),
        );
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), "no more threads");
        assert_eq!(ran.load(Ordering::Relaxed), 0);
    }
}
