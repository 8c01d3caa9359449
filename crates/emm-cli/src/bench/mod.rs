//! `emm bench`: allocate+free pairs through every path, side by side in one run.
//!
//! The managers are built as `emm replay` builds them ([`Backend::build`], so
//! `emm::build_manager` or `emm::build_host_standin`): configured from the
//! environment (`EMM_POOL_*`, `EMM_MAX_PENDING_DEALLOCS_*`,
//! `EMM_HOSTONLY_RELEASE_THRESHOLD`), and an invalid value stops the run with a
//! message naming it and exit status 1.

use std::io;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use emm::driver::{memory, mempool, Context, Stream};
use emm::{EmmError, MemoryManager};

use crate::backend::Backend;
use crate::out::{note, Out};

mod threads;
use threads::threads;

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
