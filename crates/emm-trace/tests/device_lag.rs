//! The footprint with a device that runs behind the host, as a GPU does while the
//! host queues work ahead: the recorded traces and snapshots of programs with more
//! than one stream, replayed through the pool with the stand-in's events
//! completing 300 and 3,000 requests after they are recorded (`emm replay
//! --device-lag`), held to the steady-state bound (1.05x of live, and at or below
//! PyTorch's expandable segments on the same recording) after 1 and 10 passes.
//!
//! With events that complete at once, a stream that misses takes the others' free
//! blocks at once. On a GPU those blocks wait for their stream's event, and until
//! it completes the pool keeps them out of every free set; their own stream used
//! to go without them and reserve more, and so did the next. An FSDP2 step of a
//! 1.1 B-parameter Llama on two H100s reached 1.083x of live that way (run 188)
//! where the replay said 1.024x; this replay of its recording said 1.088x at a
//! lag of 300 and 1.210x at 3,000. The pool now gives a stream its own parked
//! blocks back (`emm.parked_taken_back`): 1.055x on the GPU (run 197). Each
//! trace replays twice: with stream pools (the default: each created stream's
//! large blocks in a pool of its own) and with one shared pool
//! (`pool_stream_pools` 0). Where a configuration does not meet the bound (none
//! today; the shared pool on the 1.1 B Llama on four GPUs until the
//! fifty-eighth session's defaults), the test holds it to its figure then, so
//! the gap cannot widen unseen.

mod common;
use common::{pool_ratios, pool_ratios_with};

/// The bound the steady-state issue sets.
const BOUND: f64 = 1.05;
/// A tie with PyTorch's expandable segments: within half a percent.
const TIE: f64 = 1.005;
/// Requests the device runs behind the host.
const LAGS: [u64; 2] = [300, 3_000];

/// (trace under `crates/`, PyTorch's expandable segments on that recording (see
/// `steady_state.rs` for where each comes from), today's ceiling where one
/// shared pool misses [`BOUND`]: `None` where it meets it). Stream pools meet
/// it on every one.
const MULTI_STREAM: &[(&str, f64, Option<f64>)] = &[
    (
        "emm-trace/tests/fixtures/h200_train_midway.pickle",
        1.063,
        None,
    ),
    (
        "emm-trace/tests/fixtures/fsdp2_llama1b_h100.csv",
        1.062,
        None,
    ),
    ("emm-trace/tests/fixtures/fsdp2_gpt2_h100.csv", 1.122, None),
    // FSDP2 of the 1.1 B Llama on four GPUs (run 219). Before `pool_wait_parked`
    // its peak came at a lag of 300 as on the GPU (runs 218-219: 1.087-1.142x
    // there; 1.056x here, which understated it): a 125 MiB request while 4.8 GiB
    // were live and 22.4 GiB parked for another stream, whose event had not
    // completed. Now the stream waits for that event instead of growing, and the
    // peak comes at the peak of live bytes, for want of a hole: 1.058-1.059x
    // here, 1.053-1.062x on the GPU (run 224, every rank of three rounds), all
    // with one shared pool; stream pools hold 1.043x here (1.043-1.044x of
    // PyTorch's allocated peak on the GPU, runs 236-238). With the defaults of
    // the fifty-eighth session (pieces of at most four pages among them) the
    // shared pool holds 1.037-1.047x after 10 passes, stream pools 1.040x.
    (
        "emm-trace/tests/fixtures/fsdp2_llama1b_4gpu_h100.csv",
        1.069,
        None,
    ),
];

/// One replay's result: trace, expandable segments' figure, today's ceiling,
/// lag, stream pools, and the pool's ratios after 1 and 10 passes.
type Lagged = (&'static str, f64, Option<f64>, u64, usize, Vec<f64>);

#[test]
fn multi_stream_traces_hold_their_footprint_with_a_device_behind_the_host() {
    let default = emm_pool::PoolConfig::default();
    let results: Vec<Lagged> = std::thread::scope(|s| {
        let handles: Vec<_> = MULTI_STREAM
            .iter()
            .flat_map(|&(path, expandable, known)| {
                // Stream pools (the default) meet the bound on every trace.
                [(None, default.stream_pools), (known, 0)]
                    .into_iter()
                    .flat_map(move |(known, pools)| {
                        LAGS.map(|lag| (path, expandable, known, lag, pools))
                    })
            })
            .map(|(path, expandable, known, lag, pools)| {
                s.spawn(move || {
                    let config = emm_pool::PoolConfig {
                        stream_pools: pools,
                        ..emm_pool::PoolConfig::default()
                    };
                    let r = pool_ratios_with(path, 10, &[1, 10], lag, config);
                    (path, expandable, known, lag, pools, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (path, expandable, known, lag, pools, r) in results {
        let path = format!("{path} ({pools} stream pools)");
        println!(
            "{path}, device {lag} requests behind: reserved/live {:.3} (1 pass), {:.3} (10); expandable segments {expandable:.3}",
            r[0], r[1]
        );
        let ceiling = known.unwrap_or(BOUND).min(expandable * TIE);
        if let Some(k) = known {
            assert!(
                k > BOUND,
                "{path}: listed as missing the bound with a ceiling of {k}, below it"
            );
        }
        for (passes, ratio) in [1, 10].into_iter().zip(r) {
            if ratio > ceiling {
                failures.push(format!(
                    "{path} at a lag of {lag}: {ratio:.3} after {passes} passes > {ceiling:.3}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A replay with a lagging device gives the same figures every time: the pool
/// over the stand-in unmaps moved pieces on the replaying thread, not on a helper
/// thread whose timing would move them (`PoolConfig::background_unmap`). A
/// helper once made the midway snapshot's figure at a lag of 3,000 come out
/// 1.046 or 1.053 from one run to the next.
#[test]
fn a_replay_with_a_lagging_device_gives_the_same_figures_every_time() {
    let path = "emm-trace/tests/fixtures/h200_train_midway.pickle";
    let runs: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| s.spawn(move || pool_ratios(path, 10, &[1, 5, 10], 3_000)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        runs.windows(2).all(|w| w[0] == w[1]),
        "the same replay gave {runs:?}"
    );
}
