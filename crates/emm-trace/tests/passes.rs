//! Replaying a trace pass after pass (`ReplayOptions::passes`, `emm replay
//! --passes`): what each pass makes again, what it keeps, and the driver calls
//! counted per pass.

use emm_core::SYNC_STREAM;
use emm_pool::{PoolConfig, PoolManager};
use emm_trace::{replay, PassResult, ReplayOptions, ReplayResult, Trace};

fn run(text: &str, passes: u32) -> ReplayResult {
    let t = Trace::from_text("t.csv", text).unwrap();
    let pool = PoolManager::host(1 << 30, PoolConfig::default()).unwrap();
    let options = ReplayOptions {
        passes,
        ..ReplayOptions::default()
    };
    replay(&t, &pool, &mut |_| SYNC_STREAM, &options, &mut |_| {}).unwrap()
}

/// Replays `text` 3 passes; checks the requests of each pass, that peak live is
/// `peak` in each, and that nothing failed.
fn three_passes(text: &str, requests: [u64; 3], peak: u128) -> ReplayResult {
    let r = run(text, 3);
    assert_eq!(per_pass(&r, |p| p.requests), requests.to_vec());
    assert_eq!(per_pass(&r, |p| p.peak_live_bytes), vec![peak; 3]);
    assert_eq!(r.failures, 0);
    r
}

/// One figure of each pass of `r`, in order.
fn per_pass<T>(r: &ReplayResult, figure: impl Fn(&PassResult) -> T) -> Vec<T> {
    r.passes.iter().map(figure).collect()
}

/// What the trace never frees (id 1: weights) is made once and kept; what it
/// frees (id 2) is made again each pass; a free of an id never made is counted
/// once, as in the trace.
#[test]
fn later_passes_make_again_what_the_trace_frees_and_keep_the_rest() {
    let text = "op,id,size,stream\na,1,4096,0\na,2,1048576,0\nf,2,1048576,0\nf,9,1,0\n";
    let r = three_passes(text, [2, 1, 1], 4096 + 1_048_576);
    // The kept allocation stays with the manager from pass to pass.
    let held = per_pass(&r, |p| p.allocated_bytes);
    assert_eq!(held, vec![4096; 3]);
    assert_eq!(r.requests, 4);
    assert_eq!(r.unknown_frees, 1);
    assert_eq!(r.peak_live_bytes, 4096 + 1_048_576);
}

/// What the trace never frees but made in its second half (id 3: the last step's
/// gradients, still live when the recording stopped) is freed at the end of each
/// pass and made again in the next, so a later pass does not hold two sets of it:
/// peak live is the same in every pass.
#[test]
fn the_last_steps_leftovers_are_made_again_not_kept_twice() {
    let text = "op,id,size,stream\na,1,4096,0\na,2,1048576,0\nf,2,1048576,0\na,3,1048576,0\n";
    three_passes(text, [3, 2, 2], 4096 + 1_048_576);
}

/// An id used again (as a CSV written by another tool may do) is an allocation
/// per `Alloc` event: only its last one is kept, and a later pass makes and frees its
/// earlier ones as the trace does, beside the kept one.
#[test]
fn an_id_used_again_keeps_only_its_last_allocation() {
    let text = "op,id,size,stream\na,7,4096,0\nf,7,4096,0\na,7,8192,0\na,2,1048576,0\nf,2,1048576,0\na,3,65536,0\nf,3,65536,0\n";
    three_passes(text, [4, 3, 3], 8192 + 1_048_576);
}

/// An id allocated again while live (the first allocation replaced, as `scan`
/// counts it) goes in every pass as it went in the first, also when its second
/// allocation is the one kept: a later pass does not hold both.
#[test]
fn an_id_allocated_again_while_live_is_replaced_in_every_pass() {
    let text = "op,id,size,stream\na,7,4096,0\na,7,8192,0\na,2,1048576,0\nf,2,1048576,0\na,3,65536,0\nf,3,65536,0\n";
    let r = run(text, 3);
    let peaks = per_pass(&r, |p| p.peak_live_bytes);
    assert_eq!(peaks, vec![8192 + 1_048_576; 3]);
    let held = per_pass(&r, |p| p.allocated_bytes);
    assert_eq!(
        held,
        vec![8192; 3],
        "the manager holds the kept allocation alone"
    );
}

/// A warm pool calls the driver in the first pass only: later passes reuse what
/// it holds, and the per-pass counts add up to the replay's.
#[test]
fn driver_calls_are_counted_per_pass_and_a_warm_pool_makes_none() {
    let mut text = String::from("op,id,size,stream\n");
    for i in 0..64u64 {
        text.push_str(&format!("a,{i},{},0\n", (i + 1) << 18));
    }
    for i in 0..64u64 {
        text.push_str(&format!("f,{i},0,0\n"));
    }
    let r = run(&text, 4);
    assert_eq!(r.failures, 0, "{:?}", r.first_failure);
    let calls = per_pass(&r, |p| p.driver.total());
    assert!(
        calls[0] > 0,
        "the first pass made no driver call: {calls:?}"
    );
    assert_eq!(&calls[1..], &[0, 0, 0], "a warm pool called the driver");
    assert_eq!(calls.iter().sum::<u64>(), r.driver.total());
    let last = r.passes.last().unwrap();
    assert_eq!(last.peak_reserved_bytes, r.peak_reserved_bytes);
    assert!(last.peak_reserved_bytes as u128 >= r.peak_live_bytes);
}

/// One pass, or none asked for, replays the trace once.
#[test]
fn zero_and_one_pass_replay_once() {
    let text = "op,id,size,stream\na,1,512,0\nf,1,512,0\n";
    for passes in [0, 1] {
        let r = run(text, passes);
        assert_eq!((r.passes.len(), r.requests), (1, 1));
    }
}
