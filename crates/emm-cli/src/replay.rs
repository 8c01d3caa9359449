//! `emm replay`: traces through managers, on the GPU or the host stand-in.

use std::path::PathBuf;
use std::process::ExitCode;

use emm_core::MemoryManager;
use emm_default::{DefaultManager, HostUpstream, PendingConfig};
use emm_driver::{Context, Stream};
use emm_pool::replay::{replay, Target, Trace};
use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;

use crate::backend::Backend;

const BUNDLED: &[(&str, &str)] = &[(
    "gpt_train.csv",
    include_str!("../../../traces/gpt_train.csv"),
)];
const MANAGERS: &[&str] = &["default", "pool", "hostonly"];

struct Args {
    traces: Vec<PathBuf>,
    managers: Vec<String>,
    json: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        traces: vec![],
        managers: vec![],
        json: false,
    };
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match x.as_str() {
            "--json" => a.json = true,
            "--manager" | "-m" => {
                let v = it
                    .next()
                    .ok_or("--manager needs a value: default, pool, hostonly or all")?;
                match v.as_str() {
                    "all" => a.managers = MANAGERS.iter().map(|s| s.to_string()).collect(),
                    m if MANAGERS.contains(&m) => a.managers.push(m.to_owned()),
                    m => {
                        return Err(format!(
                            "unknown manager `{m}`; known: default, pool, hostonly, all"
                        ))
                    }
                }
            }
            f if f.starts_with('-') => return Err(format!("unknown option `{f}`")),
            path => a.traces.push(PathBuf::from(path)),
        }
    }
    if a.managers.is_empty() {
        a.managers = MANAGERS.iter().map(|s| s.to_string()).collect();
    }
    Ok(a)
}

fn gib(n: usize) -> String {
    format!("{:.3} GiB", n as f64 / (1u64 << 30) as f64)
}

pub fn run(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("emm replay: {e}\nusage: emm replay [TRACE...] [--manager default|pool|hostonly|all] [--json]");
            return ExitCode::from(2);
        }
    };
    let backend = Backend::detect();
    if !args.json {
        println!("{}", backend.describe());
    }
    let mut traces = Vec::new();
    if args.traces.is_empty() {
        for (name, text) in BUNDLED {
            traces.push(Trace::parse(name, text));
        }
    }
    for p in &args.traces {
        match Trace::read(p) {
            Ok(t) => traces.push(t),
            Err(e) => {
                eprintln!("emm replay: cannot read {}: {e}", p.display());
                return ExitCode::from(1);
            }
        }
    }
    let mut failed = false;
    if !args.json {
        println!(
            "{:<20} {:<9} {:>9} {:>14} {:>14} {:>9} {:>9} {:>10}",
            "trace",
            "manager",
            "requests",
            "peak live",
            "peak reserved",
            "res/live",
            "upstream",
            "time"
        );
    }
    for t in &traces {
        for (line, err) in &t.errors {
            eprintln!("emm replay: {}:{line}: {err} (line skipped)", t.name);
        }
        for m in &args.managers {
            let r = match replay_one(&backend, t, m, args.json) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("emm replay: {} through {m}: {e}", t.name);
                    failed = true;
                    continue;
                }
            };
            let ratio = r.peak_reserved_bytes as f64 / r.peak_live_bytes.max(1) as f64;
            if args.json {
                println!(
                    "{{\"trace\":\"{}\",\"manager\":\"{m}\",\"backend\":\"{}\",\"requests\":{},\"peak_live_bytes\":{},\"peak_reserved_bytes\":{},\"upstream_allocs\":{},\"seconds\":{:.6}}}",
                    t.name.replace('"', "'"),
                    backend.name(),
                    r.requests,
                    r.peak_live_bytes,
                    r.peak_reserved_bytes,
                    r.upstream_allocs,
                    r.elapsed.as_secs_f64()
                );
            } else {
                println!(
                    "{:<20} {:<9} {:>9} {:>14} {:>14} {:>9.3} {:>9} {:>8.2}ms",
                    t.name,
                    m,
                    r.requests,
                    gib(r.peak_live_bytes),
                    gib(r.peak_reserved_bytes),
                    ratio,
                    r.upstream_allocs,
                    r.elapsed.as_secs_f64() * 1e3
                );
            }
            if r.failures > 0 {
                eprintln!(
                    "emm replay: {} through {m}: {} requests failed; first: {}",
                    t.name,
                    r.failures,
                    r.first_failure.as_deref().unwrap_or("?")
                );
                failed = true;
            }
            if r.unknown_frees > 0 {
                eprintln!(
                    "emm replay: {}: {} frees of ids that were not live (skipped)",
                    t.name, r.unknown_frees
                );
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Replays `t` through manager `m` from empty. `None` when `m` cannot run here.
fn replay_one(
    backend: &Backend,
    t: &Trace,
    m: &str,
    quiet: bool,
) -> Result<Option<emm_pool::replay::ReplayResult>, String> {
    let e2s = |e: emm_core::EmmError| e.to_string();
    let mut progress = |f: f64| {
        if !quiet {
            eprint!("\r  {}: {m}: {:.0}%", t.name, f * 100.0);
        }
    };
    match backend {
        Backend::Host { .. } => {
            let capacity = 1usize << 40; // a stand-in device large enough for any trace
            let streams = |_: u64| emm_core::SYNC_STREAM;
            match m {
                "pool" => {
                    let p = PoolManager::host(capacity, PoolConfig::default()).map_err(e2s)?;
                    Ok(Some(replay_pool(&p, t, &streams, &mut progress)))
                }
                "default" => {
                    let d = DefaultManager::over(
                        HostUpstream::new(capacity, false),
                        PendingConfig::from_env().map_err(e2s)?,
                    );
                    d.initialize().map_err(e2s)?;
                    let probe = || (d.stats().peak_held_bytes, d.upstream().alloc_count());
                    Ok(Some(replay_with(&d, &probe, t, &streams, &mut progress)))
                }
                _ => {
                    if !quiet {
                        println!(
                            "{:<20} {:<9} skipped: needs CUDA's stream-ordered allocator (a GPU)",
                            t.name, m
                        );
                    }
                    Ok(None)
                }
            }
        }
        Backend::Gpu { ctx, .. } => {
            let created: std::cell::RefCell<Vec<Stream>> = std::cell::RefCell::new(Vec::new());
            let streams = |n: u64| -> CUstream {
                if n == 0 {
                    return emm_core::SYNC_STREAM;
                }
                match Stream::new(ctx) {
                    Ok(s) => {
                        let raw = s.raw();
                        created.borrow_mut().push(s);
                        raw
                    }
                    Err(_) => emm_core::SYNC_STREAM,
                }
            };
            let r = replay_gpu(ctx, t, m, &streams, &mut progress)?;
            ctx.synchronize().map_err(|e| e.to_string())?;
            Ok(r)
        }
    }
}

/// Replays `t` through `manager`; `probe` reads (peak reserved, upstream calls).
fn replay_with(
    manager: &dyn MemoryManager,
    probe: &dyn Fn() -> (usize, usize),
    t: &Trace,
    streams: &dyn Fn(u64) -> CUstream,
    progress: &mut dyn FnMut(f64),
) -> emm_pool::replay::ReplayResult {
    let target = Target {
        manager,
        probe,
        sample: None,
    };
    replay(t, &target, streams, progress)
}

fn replay_pool(
    p: &PoolManager,
    t: &Trace,
    streams: &dyn Fn(u64) -> CUstream,
    progress: &mut dyn FnMut(f64),
) -> emm_pool::replay::ReplayResult {
    let probe = || {
        let s = p.stats();
        (s.reserved_bytes_peak, s.num_device_alloc)
    };
    replay_with(p, &probe, t, streams, progress)
}

fn replay_gpu(
    ctx: &Context,
    t: &Trace,
    m: &str,
    streams: &dyn Fn(u64) -> CUstream,
    progress: &mut dyn FnMut(f64),
) -> Result<Option<emm_pool::replay::ReplayResult>, String> {
    let e2s = |e: emm_core::EmmError| e.to_string();
    match m {
        "pool" => {
            let p = PoolManager::new(ctx).map_err(e2s)?;
            Ok(Some(replay_pool(&p, t, streams, progress)))
        }
        "default" => {
            let d = DefaultManager::new(ctx).map_err(e2s)?;
            d.initialize().map_err(e2s)?;
            let probe = || (d.stats().peak_held_bytes, d.stats().allocations);
            Ok(Some(replay_with(&d, &probe, t, streams, progress)))
        }
        "hostonly" => crate::backend::replay_hostonly(ctx, t, streams, progress),
        _ => Ok(None),
    }
}
