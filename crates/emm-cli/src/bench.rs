//! `emm bench`: allocate+free pairs through every path, side by side in one run.
//!
//! The managers are built as `emm replay` builds them ([`Backend::build`], so
//! `emm::build_manager` or `emm::build_host_standin`): configured from the
//! environment (`EMM_POOL_*`, `EMM_MAX_PENDING_DEALLOCS_*`,
//! `EMM_HOSTONLY_RELEASE_THRESHOLD`), and an invalid value stops the run with a
//! message naming it and exit status 1.

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use emm::driver::{memory, mempool, Context, Stream};
use emm::{EmmError, MemoryManager};

use crate::backend::Backend;
use crate::out::{note, Out};

const SIZES: &[(usize, &str)] = &[
    (256, "256 B"),
    (64 << 10, "64 KiB"),
    (1 << 20, "1 MiB"),
    (64 << 20, "64 MiB"),
];
const REPS: usize = 7;

/// Median over `REPS` repetitions of the mean time of one pair, in nanoseconds.
fn median_ns(iters: usize, mut pair: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    for _ in 0..iters.min(1000) {
        pair()?; // warm up: the pool's first pair goes upstream
    }
    let mut v = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let t = Instant::now();
        for _ in 0..iters {
            pair()?;
        }
        v.push(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[REPS / 2])
}

fn fmt_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.1} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

pub fn run(json: bool) -> io::Result<ExitCode> {
    let backend = Backend::detect();
    let mut out = Out::stdout();
    if !json {
        out.line(backend.describe())?;
    }
    let rows = match &backend {
        Backend::Gpu { ctx, .. } => gpu_rows(&backend, ctx),
        Backend::Host { .. } => host_rows(&backend),
    };
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            note(format_args!("emm bench: {e}"));
            return Ok(ExitCode::from(1));
        }
    };
    if json {
        for (path, cells) in &rows {
            let mut ns = serde_json::Map::new();
            for ((size, _), c) in SIZES.iter().zip(cells) {
                ns.insert(size.to_string(), serde_json::json!(c));
            }
            let line = serde_json::json!({
                "path": path,
                "backend": backend.name(),
                "ns_per_pair": ns,
            });
            out.line(line)?;
        }
    } else {
        let mut head = format!("{:<52}", "allocate+free pair (median of 7)");
        for (_, n) in SIZES {
            head.push_str(&format!("{n:>12}"));
        }
        out.line(head)?;
        for (path, cells) in &rows {
            let mut line = format!("{path:<52}");
            for c in cells {
                line.push_str(&format!("{:>12}", c.map_or("-".into(), fmt_ns)));
            }
            out.line(line)?;
        }
    }
    match &backend {
        Backend::Gpu { ctx, .. } => threads(&backend, ctx, json, &mut out),
        Backend::Host { .. } => Ok(ExitCode::SUCCESS),
    }
}

type Rows = Vec<(String, Vec<Option<f64>>)>;

/// Manager `name` as `emm replay` builds it (configured from the environment); a
/// message naming the manager and the setting when it cannot be built.
fn build(backend: &Backend, name: &str) -> Result<Arc<dyn MemoryManager>, String> {
    backend
        .build(name)
        .map_err(|e| format!("cannot build manager `{name}`: {e}"))
}

fn host_rows(backend: &Backend) -> Result<Rows, String> {
    let e2s = |e: EmmError| e.to_string();
    let pool = build(backend, "pool")?;
    let mut cells = Vec::new();
    for &(size, _) in SIZES {
        cells.push(Some(median_ns(200_000, || {
            pool.memalloc_async(size, emm::core::SYNC_STREAM)
                .map(drop)
                .map_err(e2s)
        })?));
    }
    Ok(vec![(
        "emm pool, host stand-in (bookkeeping only)".into(),
        cells,
    )])
}

fn gpu_rows(backend: &Backend, ctx: &Context) -> Result<Rows, String> {
    let e2s = |e: EmmError| e.to_string();
    let d2s = |e: emm::driver::DriverError| e.to_string();
    ctx.set_current().map_err(d2s)?;
    let stream = Stream::new(ctx).map_err(d2s)?;
    let s = stream.raw();
    let mut rows: Rows = Vec::new();

    let pool = build(backend, "pool")?;
    let mut cells = Vec::new();
    for &(size, _) in SIZES {
        cells.push(Some(median_ns(200_000, || {
            pool.memalloc_async(size, s).map(drop).map_err(e2s)
        })?));
    }
    rows.push(("emm pool, same stream".into(), cells));

    let mut cells = Vec::new();
    for &(size, _) in SIZES {
        cells.push(Some(median_ns(200, || {
            let p = memory::alloc(ctx, size).map_err(d2s)?;
            // SAFETY: allocated just above, freed once.
            unsafe { memory::free(ctx, p) }.map_err(d2s)
        })?));
    }
    rows.push(("cuMemAlloc + cuMemFree".into(), cells));

    if ctx.device().supports_memory_pools().map_err(d2s)? {
        let default_pool = mempool::MemPool::device_default(ctx).map_err(d2s)?;
        default_pool
            .set_attribute(emm::sys::CUmemPool_attribute::RELEASE_THRESHOLD, u64::MAX)
            .map_err(d2s)?;
        let mut cells = Vec::new();
        for &(size, _) in SIZES {
            cells.push(Some(median_ns(20_000, || {
                let p = mempool::alloc_async(size, &stream).map_err(d2s)?;
                // SAFETY: allocated just above on `stream`, freed once there.
                unsafe { mempool::free_async(p, &stream) }.map_err(d2s)
            })?));
        }
        stream.synchronize().map_err(d2s)?;
        rows.push((
            "cuMemAllocAsync + cuMemFreeAsync (default pool)".into(),
            cells,
        ));

        let ho = build(backend, "hostonly")?;
        let mut cells = Vec::new();
        for &(size, _) in SIZES {
            cells.push(Some(median_ns(20_000, || {
                ho.memalloc_async(size, s).map(drop).map_err(e2s)
            })?));
        }
        stream.synchronize().map_err(d2s)?;
        rows.push(("emm hostonly (its own mempool), same stream".into(), cells));
    }

    let dm = build(backend, "default")?;
    let mut cells = Vec::new();
    for &(size, _) in SIZES {
        cells.push(Some(median_ns(500, || {
            dm.memalloc(size).map(drop).map_err(e2s)
        })?));
    }
    rows.push(("emm default (deferred cuMemFree)".into(), cells));

    let mut cells = Vec::new();
    for &(size, _) in SIZES {
        // glibc serves a request past its mmap threshold (32 MiB at most) with
        // mmap and munmap, microseconds a pair: the 14 M pairs of 2 M
        // iterations took 100 s on an H200's host.
        let iters = if size >= 32 << 20 { 20_000 } else { 2_000_000 };
        cells.push(Some(median_ns(iters, || {
            let v: Vec<u8> = Vec::with_capacity(size);
            std::hint::black_box(&v);
            Ok(())
        })?));
    }
    rows.push(("libc malloc + free (host floor)".into(), cells));
    Ok(rows)
}

/// Sixteen threads, each on its own stream, against one thread: aggregate pairs/s,
/// and the same loop over libc's allocator beside it, a reference for how a
/// general-purpose allocator scales on this host (not the host's ceiling: glibc
/// takes an arena lock on every call past its small per-thread cache).
fn threads(backend: &Backend, ctx: &Context, json: bool, out: &mut Out) -> io::Result<ExitCode> {
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
    let mut reps: [Vec<f64>; 4] = Default::default();
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
    let [one, sixteen, libc_one, libc_sixteen] = reps.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
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
            "pairs_per_second_1": one.round(),
            "pairs_per_second_16": sixteen.round(),
            "libc_pairs_per_second_1": libc_one.round(),
            "libc_pairs_per_second_16": libc_sixteen.round(),
            "available_cpus": cpus,
        }))?;
    } else {
        out.line(format_args!(
            "emm pool, mixed sizes, own stream per thread (median of {THREAD_REPS}): 1 thread {:.1} M pairs/s, 16 threads {:.1} M pairs/s ({:.1}x)",
            one / 1e6,
            sixteen / 1e6,
            sixteen / one
        ))?;
        out.line(format_args!(
            "libc malloc + free, the same loop (a reference): 1 thread {:.1} M pairs/s, 16 threads {:.1} M pairs/s ({:.1}x; {cpus} CPUs available to this process)",
            libc_one / 1e6,
            libc_sixteen / 1e6,
            libc_sixteen / libc_one,
            cpus = cpus.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
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

/// Aggregate pairs a second of `n` threads each running `body(t, ready)`:
/// `body` sets up, calls `ready()` once (the clock starts when every thread
/// has), then makes [`PER_THREAD`] pairs; the clock stops when the last is
/// done. `body` must call `ready()` exactly once and must not panic, or the
/// others wait at the barrier for good. The threads wait at a gate until all
/// `n` are started: where the system refuses one, those started leave without
/// running `body` and the error is returned.
fn scaling(n: usize, body: impl Fn(usize, &dyn Fn()) + Sync) -> std::io::Result<f64> {
    scaling_refusing(n, body, |_| None)
}

/// As [`scaling`]; `refuse(t)` stands for the system refusing thread `t`
/// (a test's refusal, where the system's cannot be had at will).
fn scaling_refusing(
    n: usize,
    body: impl Fn(usize, &dyn Fn()) + Sync,
    refuse: impl Fn(usize) -> Option<std::io::Error>,
) -> std::io::Result<f64> {
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
    std::thread::scope(|sc| {
        for t in 0..n {
            let (ready, done, body, gate) = (&ready, &done, &body, &gate);
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
                    body(t, &|| {
                        ready.wait();
                    });
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
    Ok((n * PER_THREAD) as f64 / elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_its_body_once_behind_the_gate() {
        let ran = AtomicUsize::new(0);
        let rate = scaling(3, |t, ready: &dyn Fn()| {
            assert!(t < 3);
            ran.fetch_add(1, Ordering::Relaxed);
            ready();
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
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
