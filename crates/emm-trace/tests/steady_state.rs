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
//! `python/gpu/benchmarks/snapshot_to_csv.py`; the traces recorded since on an
//! H200, runs 257 and 261, as each entry says). Its peak was the same after 1
//! and 100 passes on every trace but BERT's (1.129x, then 1.130x).
//!
//! Where the pool does not meet 1.05 yet, the test holds it to today's figure
//! instead (the third field of [`TRACES`]), so the gap cannot widen unseen; the
//! steady-state issue stays open for those.

mod common;
use common::{pool_ratios, pool_ratios_with};

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
    // FSDP2 on two H100s (`fully_shard` on each block and the model, bf16
    // parameters; the all-gather and reduce-scatter buffers on FSDP's own streams),
    // rank 0, recorded under expandable segments (`train_bench.py --ddp --fsdp
    // --snapshot`, run 196) through `snapshot_to_csv.py`. PyTorch's figure is its
    // peak reserved in that recording (16 and 28 steps), not a 100-pass replay.
    // The 1.1 B-parameter Llama (TinyLlama's shape): with stream pools (the
    // default) 1.033 / 1.035 / 1.041 after 1 / 10 / 100 passes (1.039 / 1.041 /
    // 1.042 before the fifty-eighth session's defaults); with one shared pool
    // 1.017 / 1.033 / 1.035 with events that complete at once
    // (`with_one_shared_pool_the_multi_stream_traces_hold_todays_ceilings`).
    (
        "emm-trace/tests/fixtures/fsdp2_llama1b_h100.csv",
        1.062,
        None,
    ),
    ("emm-trace/tests/fixtures/fsdp2_gpt2_h100.csv", 1.122, None),
    // The same model under FSDP2 on four H100s, rank 0 (run 219: 12 steps under
    // expandable segments, `train_bench.py --ddp --fsdp --snapshot`, through
    // `snapshot_to_csv.py`); PyTorch's figure is its peak reserved in that
    // recording. With stream pools (the default) 1.037 / 1.039 / 1.047 after 1 /
    // 10 / 100 passes (1.042 / 1.043 / 1.044 before the fifty-eighth session's
    // defaults); one shared pool 1.023 / 1.040 / 1.044.
    (
        "emm-trace/tests/fixtures/fsdp2_llama1b_4gpu_h100.csv",
        1.069,
        None,
    ),
    // A Numba job through emm's NBEP 7 plugin: 400 particle batches of variable
    // size with a growing history buffer (`python/gpu/benchmarks/numba_long.py`,
    // recorded with `EMM_RECORD` on an H200, run 256). PyTorch's figure is its
    // real allocator replaying the trace (run 257, H200: 1.151 after 1 and 100
    // passes). On the GPU the pool replayed it at 1.005x / 1.017x after 1 / 100
    // passes (run 258).
    (
        "emm-trace/tests/fixtures/numba_particles_h200.csv",
        1.151,
        None,
    ),
    // Two of issue 33's workloads that had no trace here, recorded on an H200
    // with `train_bench.py --variant native --snapshot` (run 261) through
    // `snapshot_to_csv.py`: ViT-B/16 inference, 100 batches of 1-127 images, and
    // BERT-base with its masked-LM head trained, 30 steps of sequence 32-512 and
    // batch 8-39.
    // PyTorch's figures: its allocator replaying each on that H200 (1.129x after
    // one pass of the BERT trace, 1.130x after 100).
    ("emm-trace/tests/fixtures/vit_infer_h200.csv", 1.122, None),
    ("emm-trace/tests/fixtures/bert_h200.csv", 1.130, None),
    // Held out from every policy until they were recorded (runs 265-266): a
    // Mixtral-style mixture of experts and T5, trained (`train_bench.py
    // --workload moe|t5 --snapshot`); PyTorch's allocator replaying each on that
    // H200 held the same figure after 1 and 100 passes.
    ("emm-trace/tests/fixtures/moe_h200.csv", 1.080, None),
    ("emm-trace/tests/fixtures/t5_h200.csv", 1.076, None),
    // Three more held out from every policy until they were recorded (runs
    // 300-301, `train_bench.py --variant native --snapshot` on an H200, through
    // `snapshot_to_csv.py`): Faster R-CNN inference (60 batches of 1-8 images,
    // 480 high and 320-1024 wide), DeepLabV3 trained (60 steps, batch 2-16 of
    // 256-512 square images) and GPT-2's beam search (4 beams, 10 generations of
    // 48 tokens). PyTorch's allocator replaying each there: DeepLabV3 1.035x
    // after one pass, 1.040x after 100; the others the same after both.
    (
        "emm-trace/tests/fixtures/detect_infer_h200.csv",
        1.118,
        None,
    ),
    ("emm-trace/tests/fixtures/deeplab_h200.csv", 1.040, None),
    ("emm-trace/tests/fixtures/gpt2_beam_h200.csv", 1.042, None),
];

/// Peak reserved over peak live after pass 1, 10 and 100 of `path`.
fn ratios(path: &str) -> [f64; 3] {
    let r = pool_ratios(path, 100, &[1, 10, 100], 0);
    [r[0], r[1], r[2]]
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

/// The traces of jobs whose streams allocate apart (FSDP2's all-gather and
/// reduce-scatter streams; the midway snapshot's side stream) with one shared
/// pool (`pool_stream_pools` 0, the setting for streams that share memory by
/// turns): held at 1, 10 and 100 passes to the bound, or to today's ceiling
/// where the shared pool misses it (FSDP2's GPT-2, which stream pools, the
/// default, hold to the bound in
/// [`every_recorded_trace_holds_its_footprint_at_1_10_and_100_passes`]).
#[test]
fn with_one_shared_pool_the_multi_stream_traces_hold_todays_ceilings() {
    // New pieces by the pool's size (`pool_piece_share`, on by default since
    // runs 291-292) moved the two Llamas from 1.056x and 1.068x after 100
    // passes to 1.065x and 1.062x; the defaults of the fifty-eighth session
    // (a thread keeping a large block only until its next call, growth by
    // what a request lacks, pieces of at most four pages) to 1.035x and
    // 1.044x, within the bound, and FSDP2's GPT-2 from 1.042x to 1.052x, past
    // it, in a setting that is not the default; with stream pools all three
    // hold the bound.
    const MULTI_STREAM: &[(&str, Option<f64>)] = &[
        ("emm-trace/tests/fixtures/fsdp2_llama1b_h100.csv", None),
        ("emm-trace/tests/fixtures/fsdp2_llama1b_4gpu_h100.csv", None),
        ("emm-trace/tests/fixtures/fsdp2_gpt2_h100.csv", Some(1.054)),
        ("emm-trace/tests/fixtures/h200_train_midway.pickle", None),
    ];
    let config = emm_pool::PoolConfig {
        stream_pools: 0,
        ..emm_pool::PoolConfig::default()
    };
    let results: Vec<(&str, Option<f64>, Vec<f64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = MULTI_STREAM
            .iter()
            .map(|&(path, known)| {
                s.spawn(move || {
                    (
                        path,
                        known,
                        pool_ratios_with(path, 100, &[1, 10, 100], 0, config),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, known, r) in results {
        let expandable = TRACES.iter().find(|t| t.0 == path).map(|t| t.1).unwrap();
        println!(
            "{path} with one shared pool: reserved/live {:.3} (1 pass), {:.3} (10), {:.3} (100); expandable segments {expandable:.3}",
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
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
