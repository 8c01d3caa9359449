//! What the integration tests of `emm-trace` share.

use std::path::PathBuf;

use emm_trace::Trace;

/// Test data under `crates/`, found at run time: `EMM_TEST_DATA` (the checkout's
/// `crates/` beside the GPU bundle, set by its `run.sh`), else cargo's `CARGO_MANIFEST_DIR` of the running
/// test. Never a path compiled in: a GPU bundle finds the checkout it was carried
/// beside.
pub fn data(rel: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("EMM_TEST_DATA") {
        return PathBuf::from(d).join(rel);
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect(
        "run the tests through cargo, or set EMM_TEST_DATA to the checkout's crates/ folder",
    );
    PathBuf::from(manifest).join("..").join(rel)
}

/// The recorded trace `name` bundled with `emm-cli` (`crates/emm-cli/traces`).
#[allow(dead_code)] // not every test file replays a bundled trace
pub fn bundled(name: &str) -> Trace {
    Trace::open(&data("emm-cli/traces").join(name), None)
        .unwrap()
        .remove(0)
}

/// The stream a replay over the host stand-in uses for the trace's stream `n`, as
/// `emm replay` maps them: 0 the default stream, the others distinct handles of
/// created streams (the stand-in only uses them as keys).
#[allow(dead_code)] // only the pool's replays map streams
pub fn standin_stream(n: u64) -> emm_sys::CUstream {
    if n == 0 {
        return emm_core::SYNC_STREAM;
    }
    emm_sys::CUstream((0x1000 + n as usize * 0x100) as *mut _)
}

/// Peak reserved over peak live of the pool after each pass in `at` (1-based) of
/// `passes` passes of the trace or snapshot at `path` (under `crates/`), over the
/// host stand-in with the trace's streams honoured (as `emm replay` replays them:
/// stream 0 the default stream, the others created streams). With `lag` > 0 the
/// stand-in's device runs that many requests behind the host (`emm replay
/// --device-lag`): the pool's events complete that late.
#[allow(dead_code)] // only the footprint tests replay through the pool
pub fn pool_ratios(path: &str, passes: u32, at: &[usize], lag: u64) -> Vec<f64> {
    pool_ratios_with(path, passes, at, lag, emm_pool::PoolConfig::default())
}

/// [`pool_ratios`] of a pool built with `config`.
#[allow(dead_code)] // only the footprint tests replay through the pool
pub fn pool_ratios_with(
    path: &str,
    passes: u32,
    at: &[usize],
    lag: u64,
    config: emm_pool::PoolConfig,
) -> Vec<f64> {
    use std::sync::Arc;

    use emm_pool::PoolManager;
    use emm_trace::{replay, ReplayOptions};

    let t = Trace::open(&data(path), None).unwrap().remove(0);
    let clock = (lag > 0).then(|| Arc::new(emm_core::HostClock::new(lag)));
    let pool = match &clock {
        Some(c) => PoolManager::host_lagged(1 << 40, config, c.clone()),
        None => PoolManager::host(1 << 40, config),
    }
    .unwrap();
    let options = ReplayOptions {
        passes,
        clock,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &pool, &mut standin_stream, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
    pool.check().unwrap();
    at.iter()
        .map(|&n| {
            let p = &r.passes[n - 1];
            p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64
        })
        .collect()
}
