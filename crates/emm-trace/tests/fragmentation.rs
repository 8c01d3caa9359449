//! Fragmentation on the bundled trace and on synthetic traces of other workloads,
//! through the pool over the host stand-in: deterministic, so a regression fails here.

use emm_pool::{PoolConfig, PoolManager};

use emm_trace::{replay, scan, synth, ReplayOptions, ReplayResult, Summary, Trace};

mod common;
use common::{bundled, data};

/// Replays `t` through a fresh pool over the host stand-in, all on one stream:
/// the trace's figures, the replay's, and peak reserved over peak live.
fn through_the_pool(t: &Trace, samples: u64) -> (Summary, ReplayResult, f64) {
    let (summary, r, ratio, _) = through_the_pool_counting(t, samples);
    (summary, r, ratio)
}

/// `through_the_pool`, also giving the driver mapping calls the expandable segment
/// made (pieces mapped with new memory, pieces moved, old mappings unmapped).
fn through_the_pool_counting(t: &Trace, samples: u64) -> (Summary, ReplayResult, f64, usize) {
    let summary = scan(t).unwrap();
    let pool = PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
    let opts = ReplayOptions {
        total_events: summary.events,
        samples,
        passes: 1,
        ..ReplayOptions::default()
    };
    let r = replay(t, &pool, &mut |_| emm_core::SYNC_STREAM, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{}", t.name());
    assert_eq!(r.peak_live_bytes, summary.peak_live_bytes, "{}", t.name());
    let ratio = r.peak_reserved_bytes as f64 / r.peak_live_bytes as f64;
    let d = r.driver;
    let maps = d.pieces_mapped + d.pieces_moved + d.pieces_unmapped;
    (summary, r, ratio, maps as usize)
}

#[test]
fn peak_reserved_stays_within_ten_percent_of_peak_live() {
    let root = data("emm-cli/traces/gpt_train.csv");
    let traces = vec![
        Trace::open(&root, None).unwrap().remove(0),
        synth::inference(7, 100),
        synth::inference(11, 100),
        synth::conv_training(3, 20),
    ];
    for t in traces {
        let (summary, r, ratio) = through_the_pool(&t, 100);
        assert!(
            ratio <= 1.10,
            "{}: peak reserved / peak live = {ratio:.3}",
            t.name()
        );
        assert!(
            r.upstream_allocs < summary.requests / 20,
            "{}: {} upstream calls",
            t.name(),
            r.upstream_allocs
        );
        assert!(
            (100..=110).contains(&r.samples.len()),
            "{}",
            r.samples.len()
        );
        let last = r.samples.last().unwrap();
        assert_eq!(last.event, summary.events);
        assert!(r
            .samples
            .iter()
            .all(|s| s.live_bytes <= summary.peak_live_bytes));
    }
}

/// The traces recorded on an H200 from `python/gpu/benchmarks/train_bench.py` (PyTorch's memory
/// history of real GPT-2, Llama-style and ResNet-50 training with shapes drawn per
/// step, and GPT-2 inference with variable batch): peak reserved over peak live
/// through the pool stays within 1.05 (issue 12's goal for real training), and each
/// within a hair of what it is today (1.003-1.015), so a regression fails; and
/// the driver mapping calls of the expandable segment stay bounded (2,331-6,398
/// in this first pass today, old mappings unmapped included; 2,331-5,948 before
/// growth mapped only what a request lacks, in the fifty-eighth session). New memory comes in
/// pieces of a 64th of the request (1-4 pages), so a pool growing from empty makes
/// about three times the calls it made in pieces of a 32nd of the segment (469-1,905):
/// 2,600 pieces mapped cost about 0.1 s once, at a run's start, on an H200 (run
/// 83's prices), for a footprint that holds 1.01-1.05x at steady state instead of
/// drifting to 1.03-1.21x (`steady_state.rs`).
#[test]
fn recorded_h200_traces_stay_within_their_bounds() {
    // (trace, bound on peak reserved / peak live, bound on the expandable
    // segment's pieces mapped, moved or unmapped: each costs 19-44 us on an H200
    // (run 83), so thousands of them show in a step's time)
    let mut failures = Vec::new();
    for (name, bound, calls) in [
        ("gpt2_h200.csv", 1.015, 6_500),
        ("llama_h200.csv", 1.02, 7_000),
        ("resnet50_h200.csv", 1.005, 3_200),
        ("gpt2_infer_h200.csv", 1.006, 4_700),
        // The benchmark's own bucketed ResNet-50 run (run 91): PyTorch with
        // expandable segments reserved 4.33 GiB for its 4.27 GiB (run 88), 1.014.
        ("resnet50_bucketed_h200.csv", 1.01, 2_600),
        // The benchmark's own bucketed inference run (run 91): expandable
        // segments reserved 6.88 GiB for its 6.22 (run 88), 1.105.
        ("gpt2_infer_bucketed_h200.csv", 1.01, 6_000),
    ] {
        let t = bundled(name);
        let (_, _, ratio, maps) = through_the_pool_counting(&t, 10);
        println!("{name}: reserved/live {ratio:.4}, {maps} mapping calls");
        if maps > calls {
            failures.push(format!("{name}: {maps} mapping calls > {calls}"));
        }
        if ratio > bound {
            failures.push(format!(
                "{name}: peak reserved / peak live = {ratio:.3} > {bound}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Without the expandable segment (what IPC of every block needs), in one pass,
/// without merging and with exclusive segments of 256 MiB (off by default since
/// the pool merges after a step: `SegmentPolicy::exclusive`), the recorded
/// traces stay well below PyTorch's default allocator's looseness (1.57-2.02 on the
/// same workloads on an H200): a large segment made for one big tensor serves only
/// tensors of about its size (so it comes free whole), and wholly free large
/// segments are given back, after one synchronization, instead of growing past
/// 1.15x of the peak of live. Today 1.14-1.15 (1.14-1.21 before a free joined
/// its settled neighbours; it was 1.38-1.43 on the training traces and 1.42 on
/// inference before segments were kept for their size), with 5-21
/// synchronizations and 164-823 driver allocations per trace (ResNet-50's 358
/// since small segments are 2 MiB); the
/// bounds catch a pool that loosens or starts to churn.
#[test]
fn without_virtual_memory_the_recorded_traces_stay_below_pytorch_defaults() {
    // (trace, bound on reserved / live, on the synchronizations it costs, on the
    // segments it allocates)
    for (name, bound, syncs, allocs) in [
        ("gpt2_h200.csv", 1.23, 30, 600),
        ("llama_h200.csv", 1.16, 20, 850),
        ("resnet50_h200.csv", 1.16, 10, 420),
        ("gpt2_infer_h200.csv", 1.16, 28, 210),
    ] {
        let t = bundled(name);
        let summary = scan(&t).unwrap();
        let mut config = PoolConfig::default();
        config.segments.expandable = false;
        // These two policies alone: the default also merges free segments when
        // the pool is quiet, which `legacy_steady.rs` measures over 100 passes.
        config.segments.merge_quiet = None;
        config.segments.exclusive = 256 << 20;
        // At 115 % of the peak of live bytes, the default before frees joined
        // settled neighbours (120 % since: `SegmentPolicy::tight_percent`).
        config.segments.tight_percent = Some(115);
        let pool = PoolManager::host(1 << 40, config).unwrap();
        let opts = ReplayOptions {
            total_events: summary.events,
            samples: 10,
            passes: 1,
            ..ReplayOptions::default()
        };
        let r = replay(
            &t,
            &pool,
            &mut |_| emm_core::SYNC_STREAM,
            &opts,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(r.failures, 0, "{name}");
        let ratio = r.peak_reserved_bytes as f64 / r.peak_live_bytes as f64;
        let st = pool.stats();
        println!(
            "{name} without VMM: reserved/live {ratio:.4}, {} synchronizations to give segments back, {} driver allocations",
            st.counts.tightenings, st.num_device_alloc
        );
        assert!(ratio <= bound, "{name}: {ratio:.3} > {bound}");
        assert!(
            st.counts.tightenings <= syncs,
            "{name}: {} synchronizations",
            st.counts.tightenings
        );
        assert!(
            st.num_device_alloc <= allocs,
            "{name}: {} driver allocations",
            st.num_device_alloc
        );
    }
}
