//! The models of PyTorch's caching allocator against the real one: every recorded
//! trace and snapshot of a real program in the repository, replayed with its
//! streams honoured through `pytorch-native` and `pytorch-expandable`, must give
//! peak reserved over peak live within 1 % of what PyTorch 2.11's own allocator
//! gave replaying the same trace on an H100 (`torch_replay TRACE 1 --passes N
//! --streams`, `../shared/peers/torch_replay.cpp`; gpu-verification run 137,
//! `docs/benchmarks.md`, nineteenth session), at 1 pass and at 100 (10 in a debug
//! build; `EMM_TORCH_MODEL_PASSES` sets it).

use std::collections::HashMap;

use emm_sys::CUstream;
use emm_trace::torch_model::{TorchConf, TorchModel};
use emm_trace::{replay, ReplayOptions, Trace};

mod common;
use common::data;

/// Within 1 % of the real allocator.
const WITHIN: f64 = 0.01;

/// (trace under `crates/`, PyTorch native, PyTorch expandable segments): peak
/// reserved over peak live, the same after 1 and after 100 passes on the GPU.
const REAL: &[(&str, f64, f64)] = &[
    ("emm-cli/traces/gpt2_h200.csv", 2.024, 1.123),
    ("emm-cli/traces/gpt2_infer_bucketed_h200.csv", 1.851, 1.105),
    ("emm-cli/traces/gpt2_infer_h200.csv", 2.007, 1.108),
    ("emm-cli/traces/gpt_train.csv", 1.390, 1.086),
    ("emm-cli/traces/llama_h200.csv", 1.674, 1.116),
    ("emm-cli/traces/resnet50_bucketed_h200.csv", 1.301, 1.013),
    ("emm-cli/traces/resnet50_h200.csv", 1.861, 1.019),
    ("emm-trace/tests/fixtures/h200_infer.pickle", 2.315, 1.333),
    (
        "emm-trace/tests/fixtures/h200_train_midway.pickle",
        1.275,
        1.063,
    ),
    (
        "emm-trace/tests/fixtures/llama_generate_h100.csv",
        1.372,
        1.094,
    ),
    // A Numba job through emm's plugin, replayed by PyTorch's allocator on an
    // H200 (gpu-verification run 257).
    (
        "emm-trace/tests/fixtures/numba_particles_h200.csv",
        3.927,
        1.151,
    ),
    // ViT-B/16 inference and BERT-base training on an H200 (run 261; BERT under
    // expandable segments 1.129x after one pass, 1.130x after 100).
    ("emm-trace/tests/fixtures/vit_infer_h200.csv", 2.031, 1.122),
    ("emm-trace/tests/fixtures/bert_h200.csv", 1.491, 1.130),
    // A Mixtral-style mixture of experts and T5, trained on an H200 (runs 265-266;
    // T5 native 1.249x after one pass and after 100).
    ("emm-trace/tests/fixtures/moe_h200.csv", 1.407, 1.080),
    ("emm-trace/tests/fixtures/t5_h200.csv", 1.249, 1.076),
    // Faster R-CNN inference, DeepLabV3 training and GPT-2's beam search on an
    // H200 (runs 300-301; DeepLabV3 under expandable segments 1.035x after one
    // pass, 1.040x after 100).
    (
        "emm-trace/tests/fixtures/detect_infer_h200.csv",
        2.064,
        1.118,
    ),
    ("emm-trace/tests/fixtures/deeplab_h200.csv", 1.499, 1.040),
    ("emm-trace/tests/fixtures/gpt2_beam_h200.csv", 1.119, 1.042),
];

/// Random traces (`fixtures/random_traces.py`): (trace, streams honoured,
/// native after 1 and 100 passes, expandable after 1 and 100 passes), PyTorch's
/// allocator on an H100 (gpu-verification run 164, `python/gpu/benchmarks/model_check.sh`).
/// Unlike the recorded ones, some drift over the passes.
const RANDOM: &[(&str, bool, [f64; 2], [f64; 2])] = &[
    (
        "emm-trace/tests/fixtures/random/random_1.csv",
        true,
        [1.5953, 1.5953],
        [1.4656, 1.4656],
    ),
    (
        "emm-trace/tests/fixtures/random/random_1.csv",
        false,
        [1.2959, 1.2968],
        [1.2062, 1.2549],
    ),
    (
        "emm-trace/tests/fixtures/random/random_2.csv",
        true,
        [1.3929, 1.4291],
        [1.2439, 1.2439],
    ),
    (
        "emm-trace/tests/fixtures/random/random_2.csv",
        false,
        [1.1864, 1.1864],
        [1.1225, 1.1225],
    ),
    (
        "emm-trace/tests/fixtures/random/random_3.csv",
        true,
        [1.5024, 1.5024],
        [1.2898, 1.2898],
    ),
    (
        "emm-trace/tests/fixtures/random/random_3.csv",
        false,
        [1.1703, 1.1703],
        [1.0752, 1.0853],
    ),
    (
        "emm-trace/tests/fixtures/random/random_4.csv",
        true,
        [1.5324, 1.5332],
        [1.2449, 1.2706],
    ),
    (
        "emm-trace/tests/fixtures/random/random_4.csv",
        false,
        [1.2381, 1.2381],
        [1.1302, 1.1302],
    ),
];

/// Peak reserved over peak live after pass 1 and pass `passes`, the trace's
/// streams honoured.
fn ratios(path: &str, conf: &str, passes: u32) -> (f64, f64) {
    ratios_with(path, conf, passes, true)
}

/// The same, with every request on one stream when `streams` is false (as
/// `torch_replay` without `--streams`).
fn ratios_with(path: &str, conf: &str, passes: u32, streams_honoured: bool) -> (f64, f64) {
    let t = Trace::open(&data(path), None).unwrap().remove(0);
    let model = TorchModel::new(TorchConf::parse(conf).unwrap());
    let mut streams: HashMap<u64, CUstream> = HashMap::new();
    let mut stream = |n: u64| {
        let n = if streams_honoured { n } else { 0 };
        *streams
            .entry(n)
            .or_insert_with(|| CUstream(n as usize as *mut _))
    };
    let options = ReplayOptions {
        passes,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &model, &mut stream, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
    let at = |n: usize| {
        let p = &r.passes[n - 1];
        p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64
    };
    (at(1), at(passes as usize))
}

#[test]
fn the_models_match_pytorchs_allocator_on_every_recorded_trace() {
    // 100 passes take minutes in a debug build: CI's debug run checks 10, the
    // release build (the GPU bundle, `cargo test --release`) 100.
    let passes: u32 = std::env::var("EMM_TORCH_MODEL_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 10 } else { 100 });
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = REAL
            .iter()
            .flat_map(|&(path, native, expandable)| {
                [("", native), ("expandable_segments:True", expandable)].map(|(conf, real)| {
                    s.spawn(move || (path, conf, real, ratios(path, conf, passes)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, conf, real, (first, last)) in results {
        let name = if conf.is_empty() {
            "native"
        } else {
            "expandable"
        };
        println!(
            "{path} {name}: model {first:.3} (1 pass), {last:.3} ({passes}); PyTorch {real:.3}"
        );
        for (n, got) in [(1, first), (passes, last)] {
            if (got / real - 1.0).abs() > WITHIN {
                failures.push(format!(
                    "{path} {name} after {n} passes: the model gives {got:.3}, PyTorch {real:.3}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_models_match_pytorchs_allocator_on_random_traces_with_and_without_streams() {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = RANDOM
            .iter()
            .flat_map(|&(path, streams, native, expandable)| {
                [("", native), ("expandable_segments:True", expandable)].map(|(conf, real)| {
                    s.spawn(move || {
                        (
                            path,
                            streams,
                            conf,
                            real,
                            ratios_with(path, conf, 100, streams),
                        )
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, streams, conf, real, (first, last)) in results {
        let name = if conf.is_empty() {
            "native"
        } else {
            "expandable"
        };
        println!(
            "{path} {name} streams {streams}: model {first:.4} / {last:.4}, PyTorch {:.4} / {:.4} (1 / 100 passes)",
            real[0], real[1]
        );
        for (n, got, want) in [(1, first, real[0]), (100, last, real[1])] {
            if (got / want - 1.0).abs() > WITHIN {
                failures.push(format!(
                    "{path} {name} streams {streams} after {n} passes: the model gives {got:.4}, PyTorch {want:.4}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
