//! The footprint at steady state: every recorded trace and snapshot of a real
//! program in the repository, replayed 100 passes through the pool over the host
//! stand-in with its streams honoured (as `emm replay --passes 100` does), held at
//! 1, 10 and 100 passes to the steady-state bound: peak reserved at most 1.05x of
//! peak live and at or below PyTorch's expandable segments replaying the same
//! trace (a tie within 0.5 % counts).
//!
//! PyTorch's figures are its real allocator on the GPU
//! (`torch_replay TRACE 1 --passes 100 --streams` with
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, H100, PyTorch 2.11;
//! `docs/gpu-verification.md` run 137; the snapshots through
//! `python/gpu/benchmarks/snapshot_to_csv.py`). Its peak was the same after 1 and 100 passes
//! on every trace.
//!
//! Where the pool does not meet 1.05 yet, the test holds it to today's figure
//! instead (the third field of [`TRACES`]), so the gap cannot widen unseen; the
//! steady-state issue stays open for those.

use std::collections::HashMap;

use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;
use emm_trace::{replay, ReplayOptions, Trace};

mod common;
use common::data;

/// The bound the steady-state issue sets.
const BOUND: f64 = 1.05;
/// A tie with PyTorch's expandable segments: within half a percent.
const TIE: f64 = 1.005;

/// (trace under `crates/`, PyTorch's expandable segments at 100 passes, today's
/// ceiling where the pool misses [`BOUND`]: `None` where it meets it).
const TRACES: &[(&str, f64, Option<f64>)] = &[
    ("emm-cli/traces/gpt2_h200.csv", 1.123, None),
    ("emm-cli/traces/gpt2_infer_bucketed_h200.csv", 1.105, None),
    ("emm-cli/traces/gpt2_infer_h200.csv", 1.108, None),
    ("emm-cli/traces/gpt_train.csv", 1.086, None),
    ("emm-cli/traces/llama_h200.csv", 1.116, None),
    ("emm-cli/traces/resnet50_bucketed_h200.csv", 1.013, None),
    ("emm-cli/traces/resnet50_h200.csv", 1.019, None),
    // 165 MiB live: growth by at most a 32nd of the reserve (it was 1.091 with a
    // fixed 20 MiB step).
    ("emm-trace/tests/fixtures/h200_infer.pickle", 1.333, None),
    (
        "emm-trace/tests/fixtures/h200_train_midway.pickle",
        1.063,
        None,
    ),
    // LLM generation (`python/gpu/benchmarks/train_bench.py --workload llama-generate`: six
    // `generate` calls of 48 new tokens with transformers' dynamic KV cache, on an
    // H100, run 144), through `snapshot_to_csv.py`.
    (
        "emm-trace/tests/fixtures/llama_generate_h100.csv",
        1.094,
        None,
    ),
];

/// Peak reserved over peak live after pass 1, 10 and 100 of `path`.
fn ratios(path: &str) -> [f64; 3] {
    let t = Trace::open(&data(path), None).unwrap().remove(0);
    let pool = PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
    // Distinct handles the host stand-in only uses as keys (as `emm replay` does);
    // the trace's stream 0 is the default stream.
    let mut streams: HashMap<u64, CUstream> = HashMap::new();
    let mut stream = |n: u64| {
        if n == 0 {
            return emm_core::SYNC_STREAM;
        }
        *streams
            .entry(n)
            .or_insert_with(|| CUstream((0x1000 + n as usize * 0x100) as *mut _))
    };
    let options = ReplayOptions {
        passes: 100,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &pool, &mut stream, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
    let at = |n: usize| {
        let p = &r.passes[n - 1];
        p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64
    };
    [at(1), at(10), at(100)]
}

#[test]
fn every_recorded_trace_holds_its_footprint_at_1_10_and_100_passes() {
    // Each trace on a thread of its own (they take seconds each in a debug build).
    let results: Vec<(&str, f64, Option<f64>, [f64; 3])> = std::thread::scope(|s| {
        let handles: Vec<_> = TRACES
            .iter()
            .map(|&(path, expandable, known)| {
                s.spawn(move || (path, expandable, known, ratios(path)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, expandable, known, r) in results {
        println!(
            "{path}: reserved/live {:.3} (1 pass), {:.3} (10), {:.3} (100); expandable segments {expandable:.3}",
            r[0], r[1], r[2]
        );
        let ceiling = known.unwrap_or(BOUND).min(expandable * TIE);
        for (passes, ratio) in [1, 10, 100].into_iter().zip(r) {
            if ratio > ceiling {
                failures.push(format!(
                    "{path}: {ratio:.3} after {passes} passes > {ceiling:.3}"
                ));
            }
        }
        if let Some(k) = known {
            assert!(
                k > BOUND,
                "{path}: listed as missing the bound with a ceiling of {k}, below it"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
