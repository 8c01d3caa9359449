//! The pool without its expandable segment (`expandable: false`,
//! `EMM_POOL_EXPANDABLE=0`: the path of legacy CUDA IPC, and of a driver without
//! virtual memory management), with its default policy, which merges free
//! segments when the pool is quiet (`merge_quiet`, `EMM_POOL_LEGACY_MERGE=6`,
//! [`emm_pool::DEFAULT_LEGACY_MERGE`]): every recorded trace of at least 64 MiB peak live,
//! replayed pass after pass over the host stand-in, makes no driver allocation in
//! a steady pass (after pass [`SETTLED_BY`]) and holds its footprint after 1, 10
//! and the last pass to the steady-state bound of 1.15x of peak live, or to
//! today's figure where it misses the bound (the second field of [`TRACES`]), so the
//! gap cannot widen unseen. Given an initial size from a previous run
//! (`EMM_POOL_INITIAL_SIZE`, the home segment), every trace holds the bound in
//! one segment.
//!
//! 100 passes in an optimized build (`cargo test --release`); 12 in a debug build
//! (written when each pass of the largest traces took about a second there;
//! `emm-pool` and `emm-trace` are optimized in dev builds now). Every trace
//! settles by pass 10.

use emm_core::MemoryManager;
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};
use emm_trace::{replay, ReplayOptions, Trace};

mod common;
use common::{data, standin_stream};

/// The bound the steady-state issue sets for the path without VMM.
const BOUND: f64 = 1.15;
/// Slack over today's figure (half a percent).
const TIE: f64 = 1.005;
/// The last pass that may allocate from the driver.
const SETTLED_BY: usize = 10;

/// (trace under `crates/`, today's ceiling where the pool misses [`BOUND`] at any
/// of the passes checked: `None` where it meets it).
///
/// Beside the model of PyTorch's own allocator (also without virtual memory;
/// `emm replay TRACE -m pytorch-native --passes 30`, flat over the passes, in
/// this order): 2.024, 1.851, 2.007, 1.390, 1.674, 1.301, 1.861, 2.315, 1.561,
/// 1.288, 1.222, 1.275, 1.372, 3.927, 2.031, 1.491, 1.407, 1.252, 2.064, 1.499
/// and 1.120x. The pool is tighter on every one but the last, GPT-2's beam
/// search.
const TRACES: &[(&str, Option<f64>)] = &[
    ("emm-cli/traces/gpt2_h200.csv", Some(1.206)),
    ("emm-cli/traces/gpt2_infer_bucketed_h200.csv", Some(1.180)),
    // 1.817 while a merge waited for live bytes to fall to a sixth of reserved:
    // the weights kept them above it, and the pool merged only three times;
    // 1.213 before a free joined settled neighbours (the one trace looser
    // since: its peak comes with a 5.17 GiB request that the joined holes
    // happen not to hold).
    ("emm-cli/traces/gpt2_infer_h200.csv", Some(1.506)),
    ("emm-cli/traces/gpt_train.csv", Some(1.174)),
    ("emm-cli/traces/llama_h200.csv", Some(1.185)),
    ("emm-cli/traces/resnet50_bucketed_h200.csv", None),
    ("emm-cli/traces/resnet50_h200.csv", None),
    // 165 MiB live: a 20 MiB shared segment and the small segments are an eighth
    // of it (1.600 while merges waited for a sixth of reserved).
    ("emm-trace/tests/fixtures/h200_infer.pickle", Some(1.576)),
    // FSDP2 (four streams); its peak is set in the first pass.
    ("emm-trace/tests/fixtures/fsdp2_gpt2_h100.csv", Some(1.288)),
    ("emm-trace/tests/fixtures/fsdp2_llama1b_4gpu_h100.csv", None),
    ("emm-trace/tests/fixtures/fsdp2_llama1b_h100.csv", None),
    (
        "emm-trace/tests/fixtures/h200_train_midway.pickle",
        Some(1.159),
    ),
    (
        "emm-trace/tests/fixtures/llama_generate_h100.csv",
        Some(1.175),
    ),
    // The Numba job (`numba_long.py`), the workload of the path's own users; its
    // peak is set in the first pass, as on the GPU (1.916x in run 258, before
    // merges followed the program's low). The history buffer, which outlives its
    // batch, pins a segment made for the batch's arrays.
    (
        "emm-trace/tests/fixtures/numba_particles_h200.csv",
        Some(1.374),
    ),
    // ViT-B/16 inference and BERT-base trained with its masked-LM head
    // (`train_bench.py --snapshot`, run 261).
    ("emm-trace/tests/fixtures/vit_infer_h200.csv", Some(1.240)),
    ("emm-trace/tests/fixtures/bert_h200.csv", Some(1.152)),
    // Held out until they were recorded (runs 265-266): a Mixtral-style mixture of
    // experts and T5, trained. The experts' share of the tokens changes every
    // step; before merges followed the program's low and every large segment
    // served any request, the pool gave back and made about 250 segments in every
    // pass of the first (1.31x of live at pass 100, still rising).
    ("emm-trace/tests/fixtures/moe_h200.csv", None),
    ("emm-trace/tests/fixtures/t5_h200.csv", None),
    // Held out until they were recorded (runs 300-301): Faster R-CNN inference,
    // DeepLabV3 trained, GPT-2's beam search. The beam search's peak (1.182x,
    // set in the first pass) is looser than the model of PyTorch's own
    // allocator (1.120x), the one trace where it is: a merge at a false quiet
    // in the middle of a chain of KV caches gives back the segment the next
    // cache needs (`MergeClock::grew` takes live bytes before the growing
    // request as the low; docs/ARCHITECTURE.md, forty-sixth session).
    (
        "emm-trace/tests/fixtures/detect_infer_h200.csv",
        Some(1.284),
    ),
    ("emm-trace/tests/fixtures/deeplab_h200.csv", None),
    ("emm-trace/tests/fixtures/gpt2_beam_h200.csv", Some(1.182)),
];

/// A trace's path, its ceiling, its ratios and its driver allocations per pass.
type Outcome = (&'static str, Option<f64>, [f64; 3], Vec<u64>);

/// Passes replayed: 100 optimized, 12 in a debug build.
fn passes() -> usize {
    if cfg!(debug_assertions) {
        12
    } else {
        100
    }
}

/// The pool's defaults without the expandable segment.
fn legacy_config() -> PoolConfig {
    PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            ..SegmentPolicy::default()
        },
        ..PoolConfig::default()
    }
}

/// Peak reserved over peak live after pass 1, 10 and the last, and the driver
/// allocations of each pass.
fn replay_legacy(path: &str) -> ([f64; 3], Vec<u64>) {
    let t = Trace::open(&data(path), None).unwrap().remove(0);
    let config = legacy_config();
    let pool = PoolManager::host(1 << 40, config).unwrap();
    let options = ReplayOptions {
        passes: passes() as u32,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &pool, &mut standin_stream, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
    let at = |n: usize| {
        let p = &r.passes[n - 1];
        p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64
    };
    let allocs = r.passes.iter().map(|p| p.driver.allocs).collect();
    ([at(1), at(10), at(r.passes.len())], allocs)
}

#[test]
fn legacy_path_holds_its_footprint_and_makes_no_driver_allocation_when_steady() {
    let results: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = TRACES
            .iter()
            .map(|&(path, known)| {
                s.spawn(move || {
                    let (r, allocs) = replay_legacy(path);
                    (path, known, r, allocs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    let last = passes();
    for (path, known, r, allocs) in results {
        let late: u64 = allocs[SETTLED_BY..].iter().sum();
        println!(
            "{path}: reserved/live {:.3} (1 pass), {:.3} (10), {:.3} ({last}); driver allocations {} (pass 1), {} (passes 2-{SETTLED_BY}), {late} after",
            r[0],
            r[1],
            r[2],
            allocs[0],
            allocs[1..SETTLED_BY].iter().sum::<u64>(),
        );
        let ceiling = known.map_or(BOUND, |k| k * TIE);
        for (passes, ratio) in [1, 10, last].into_iter().zip(r) {
            if ratio > ceiling {
                failures.push(format!(
                    "{path}: {ratio:.3} after {passes} passes > {ceiling:.3}"
                ));
            }
        }
        if late > 0 {
            failures.push(format!(
                "{path}: {late} driver allocations after pass {SETTLED_BY}"
            ));
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

/// What a user sets the initial size to from a previous run: 1.15x of its peak
/// of live bytes.
const FROM_PREVIOUS_RUN: f64 = 1.15;

/// With an initial size (`SegmentPolicy::initial_size`, `EMM_POOL_INITIAL_SIZE`)
/// of [`FROM_PREVIOUS_RUN`] times the peak of live bytes a previous run showed
/// (here a first pass of the same trace), every trace of [`TRACES`] holds the
/// bound at the first, tenth and last pass, and the pool makes one driver
/// allocation in all of them: its home segment, which every step fits in. (The
/// smallest home each trace needed over ten passes: 1.009-1.139x of live, mean
/// 1.080x, fifty-second session; without an initial size the same path reaches
/// up to 1.576x, [`TRACES`].)
#[test]
fn an_initial_size_from_a_previous_run_holds_every_trace_in_one_segment() {
    let results: Vec<(&str, [f64; 3], Vec<u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = TRACES
            .iter()
            .map(|&(path, _)| {
                s.spawn(move || {
                    let t = Trace::open(&data(path), None).unwrap().remove(0);
                    let previous = replay_passes(&t, legacy_config(), 1);
                    let live = previous.passes[0].peak_live_bytes as f64;
                    let mut config = legacy_config();
                    // Rounded down to whole pages: the pool rounds up.
                    config.segments.initial_size =
                        (live * FROM_PREVIOUS_RUN) as usize / (2 << 20) * (2 << 20);
                    let r = replay_passes(&t, config, passes() as u32);
                    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
                    let at = |n: usize| {
                        let p = &r.passes[n - 1];
                        p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64
                    };
                    let allocs = r.passes.iter().map(|p| p.driver.allocs).collect();
                    (path, [at(1), at(10), at(r.passes.len())], allocs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, r, allocs) in results {
        println!(
            "{path}: with its home, reserved/live {:.3} (1 pass), {:.3} (10), {:.3} (last); driver allocations {}",
            r[0],
            r[1],
            r[2],
            allocs.iter().sum::<u64>()
        );
        if r.iter().any(|&x| x > BOUND) {
            failures.push(format!("{path}: {r:.3?} > {BOUND}"));
        }
        if allocs.iter().sum::<u64>() != 1 {
            failures.push(format!(
                "{path}: driver allocations per pass {allocs:?}, not the home alone"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `passes` passes of `t` through a pool over the host stand-in with `config`.
fn replay_passes(t: &Trace, config: PoolConfig, passes: u32) -> emm_trace::ReplayResult {
    let pool = PoolManager::host(1 << 40, config).unwrap();
    let options = ReplayOptions {
        passes,
        ..ReplayOptions::default()
    };
    replay(t, &pool, &mut standin_stream, &options, &mut |_| {}).unwrap()
}

/// Peak reserved over peak live after each of 12 passes of `path` through the
/// path without the expandable segment, with `policy` changed from the default,
/// and the driver allocations after pass [`SETTLED_BY`].
fn replay_with(path: &str, policy: impl FnOnce(&mut SegmentPolicy)) -> (Vec<f64>, u64) {
    let t = Trace::open(&data(path), None).unwrap().remove(0);
    let mut config = legacy_config();
    policy(&mut config.segments);
    let pool = PoolManager::host(1 << 40, config).unwrap();
    let options = ReplayOptions {
        passes: 12,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &pool, &mut standin_stream, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{path}: {:?}", r.first_failure);
    let ratios = r
        .passes
        .iter()
        .map(|p| p.peak_reserved_bytes as f64 / p.peak_live_bytes as f64)
        .collect();
    let late = r.passes[SETTLED_BY..].iter().map(|p| p.driver.allocs).sum();
    (ratios, late)
}

/// Merging is a setting: off, the same path holds a far looser footprint on the
/// trace that gains most from it (so the test above measures the policy): the
/// segments made for past batches' shapes pile up. (Before a free joined settled
/// neighbours, the trace that gained most was `h200_train_midway.pickle`, 1.96x
/// unmerged against 1.15x; joining holds it at 1.18x unmerged.)
#[test]
fn without_merging_the_legacy_path_holds_a_looser_footprint() {
    let path = "emm-cli/traces/gpt2_infer_bucketed_h200.csv";
    let (merged, _) = replay_with(path, |_| {});
    let (unmerged, _) = replay_with(path, |p| p.merge_quiet = None);
    let (m, u) = (merged[11], unmerged[11]);
    assert!(m <= 1.180 * TIE, "merged: {m:.3}x of live after 12 passes");
    assert!(u > m + 0.3, "unmerged {u:.3}x against merged {m:.3}x");
}

/// Exclusive segments (`SegmentPolicy::exclusive`, off by default): a large
/// segment made for a request of 256 MiB or more serving only requests of about
/// its size keeps the mixture of experts, whose experts' shares of the tokens
/// change every step, giving back and making segments in every pass, where the
/// default makes none after pass [`SETTLED_BY`].
#[test]
fn exclusive_segments_keep_the_mixture_of_experts_allocating() {
    let path = "emm-trace/tests/fixtures/moe_h200.csv";
    let (_, default_late) = replay_with(path, |_| {});
    let (_, exclusive_late) = replay_with(path, |p| p.exclusive = 256 << 20);
    assert_eq!(default_late, 0);
    assert!(
        exclusive_late > 100,
        "{exclusive_late} driver allocations after pass {SETTLED_BY}"
    );
}

/// The host stand-in with its addresses falling as segments are made (the plain
/// stand-in's rise), as a driver may hand them out.
struct FallingAddresses {
    host: emm_default::HostUpstream,
    /// Falling address -> the stand-in's.
    lent: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
}

/// Addresses mirrored below this one.
const MIRROR: u64 = 1 << 62;

impl emm_default::Upstream for FallingAddresses {
    fn name(&self) -> &'static str {
        "host, falling addresses"
    }

    fn alloc(&self, size: usize) -> emm_core::Result<emm_sys::CUdeviceptr> {
        let a = self.host.alloc(size)?;
        // 512-aligned like the stand-in's own (its blocks are 512-aligned sizes
        // apart, with a gap after each): the mirrored ranges do not overlap.
        let falling = MIRROR - a - (size as u64).next_multiple_of(512);
        self.lent.lock().unwrap().insert(falling, a);
        Ok(falling)
    }

    unsafe fn free(&self, ptr: emm_sys::CUdeviceptr, size: usize) -> emm_core::Result<()> {
        let a = self
            .lent
            .lock()
            .unwrap()
            .remove(&ptr)
            .expect("a block this upstream lent");
        // SAFETY: `a` came from `self.host.alloc(size)` and is freed once (its
        // entry is gone), as the caller's contract for `ptr` says.
        unsafe { self.host.free(a, size) }
    }

    fn mem_info(&self) -> emm_core::Result<emm_core::MemoryInfo> {
        self.host.mem_info()
    }
}

/// Without the expandable segment, the pool's choices do not depend on the order
/// of its segments' addresses: replaying a trace over a stand-in whose addresses
/// fall gives the same peak in every pass as over the plain stand-in, whose
/// addresses rise. (Best fit broke ties between equal free blocks by address:
/// `gpt2_h200.csv` then settled at 1.615x of live with falling addresses against
/// 1.449x with rising ones, and at 1.532x on an H200.)
#[test]
fn without_the_expandable_segment_the_address_order_changes_nothing() {
    let t = Trace::open(&data("emm-cli/traces/gpt2_h200.csv"), None)
        .unwrap()
        .remove(0);
    let config = legacy_config();
    let options = ReplayOptions {
        passes: 12,
        ..ReplayOptions::default()
    };
    let peaks = |pool: &PoolManager| -> Vec<u64> {
        let r = replay(&t, pool, &mut standin_stream, &options, &mut |_| {}).unwrap();
        assert_eq!(r.failures, 0, "{:?}", r.first_failure);
        r.passes.iter().map(|p| p.peak_reserved_bytes).collect()
    };
    let rising = peaks(&PoolManager::host(1 << 40, config).unwrap());
    let falling_upstream = FallingAddresses {
        host: emm_default::HostUpstream::new(1 << 40, false),
        lent: Default::default(),
    };
    let falling = PoolManager::with_config(
        emm_pool::PoolUpstream::Custom(
            Box::new(falling_upstream),
            Box::new(emm_pool::HostEvents::immediate()),
            None,
            None,
        ),
        config,
    )
    .unwrap();
    // The addresses do fall.
    let (a, b) = (
        falling
            .memalloc_async(64 << 20, emm_core::SYNC_STREAM)
            .unwrap(),
        falling
            .memalloc_async(64 << 20, emm_core::SYNC_STREAM)
            .unwrap(),
    );
    assert!(b.ptr() < a.ptr(), "{:#x} then {:#x}", a.ptr(), b.ptr());
    drop((a, b));
    falling.trim();
    assert_eq!(peaks(&falling), rising);
}
