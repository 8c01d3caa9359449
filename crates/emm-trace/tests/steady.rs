//! Replaying until the footprint holds (`ReplayOptions::until_steady`, `emm
//! replay`'s default): a replay stops once peak reserved bytes have not moved for
//! the rule's quiet passes, at its cap on passes, or when its time runs out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use emm_core::{
    DeferGuard, DeviceAllocation, DeviceView, HostAllocFlags, HostMemory, IpcHandle, ManagerStats,
    MemoryInfo, MemoryManager, Result, SYNC_STREAM,
};
use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;
use emm_trace::{replay, ReplayOptions, ReplayResult, SteadyRule, SteadyStop, Trace};

/// A trace that frees all it makes: 4 requests a pass, the same each pass.
const TRACE: &str =
    "op,id,size,stream\na,1,4096,0\na,2,1048576,0\nf,2,0,0\na,3,65536,0\nf,3,0,0\na,4,512,0\nf,1,0,0\nf,4,0,0\n";
const REQUESTS_PER_PASS: u64 = 4;
const GROWTH: usize = 1 << 20;

/// A host pool whose peak reserved bytes, as `stats()` tells them, grow by
/// [`GROWTH`] with each pass replayed (counted from its allocations) for its first
/// `growing` passes, then hold: a manager whose footprint settles when told to.
/// With `fast` allocations made, each later one sleeps [`Growing::NAP`]: a
/// manager slow on a trace's later passes.
struct Growing {
    inner: PoolManager,
    allocs: AtomicU64,
    growing: u64,
    fast: u64,
}

impl Growing {
    const NAP: Duration = Duration::from_millis(5);

    fn new(growing: u64) -> Self {
        Growing {
            inner: PoolManager::host(1 << 30, PoolConfig::default()).unwrap(),
            allocs: AtomicU64::new(0),
            growing,
            fast: u64::MAX,
        }
    }

    /// A pool that never grows and sleeps in every allocation after `fast`.
    fn slow_after(fast: u64) -> Self {
        Growing {
            fast,
            ..Growing::new(0)
        }
    }

    /// Counts an allocation, sleeping past the first `fast`.
    fn count(&self) {
        if self.allocs.fetch_add(1, Ordering::Relaxed) >= self.fast {
            std::thread::sleep(Growing::NAP);
        }
    }
}

impl MemoryManager for Growing {
    fn name(&self) -> &str {
        "growing"
    }
    fn initialize(&self) -> Result<()> {
        self.inner.initialize()
    }
    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        self.count();
        self.inner.memalloc(size)
    }
    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        self.count();
        self.inner.memalloc_async(size, stream)
    }
    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.inner.memhostalloc(size, flags)
    }
    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.mempin(ptr, len, mapped) }
    }
    fn get_memory_info(&self) -> Result<MemoryInfo> {
        self.inner.get_memory_info()
    }
    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        self.inner.get_ipc_handle(view)
    }
    fn reset(&self) -> Result<()> {
        self.inner.reset()
    }
    fn defer_cleanup(&self) -> DeferGuard {
        self.inner.defer_cleanup()
    }
    fn stats(&self) -> ManagerStats {
        let mut s = MemoryManager::stats(&self.inner);
        let passes = self.allocs.load(Ordering::Relaxed) / REQUESTS_PER_PASS;
        s.reserved_bytes_peak += passes.min(self.growing) as usize * GROWTH;
        s
    }
}

fn until_steady(manager: &dyn MemoryManager, rule: SteadyRule, samples: u64) -> ReplayResult {
    let t = Trace::from_text("t.csv", TRACE).unwrap();
    let options = ReplayOptions {
        total_events: 8,
        samples,
        // Ignored under `until_steady`.
        passes: 3,
        until_steady: Some(rule),
        ..ReplayOptions::default()
    };
    let r = replay(&t, manager, &mut |_| SYNC_STREAM, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{:?}", r.first_failure);
    assert_eq!(r.requests, REQUESTS_PER_PASS * r.passes.len() as u64);
    r
}

fn peaks(r: &ReplayResult) -> Vec<u64> {
    r.passes.iter().map(|p| p.peak_reserved_bytes).collect()
}

/// Peak reserved grows for 3 passes, then holds: the replay stops after the 10th
/// pass in a row that did not move it, pass 13.
#[test]
fn a_replay_stops_once_peak_reserved_holds_for_the_quiet_passes() {
    let m = Growing::new(3);
    let r = until_steady(&m, SteadyRule::DEFAULT, 0);
    assert_eq!(r.steady, Some(SteadyStop::Settled));
    assert_eq!(r.passes.len(), 13, "{:?}", peaks(&r));
    let p = peaks(&r);
    assert!(p[0] < p[1] && p[1] < p[2], "{p:?}");
    assert!(p[2..].iter().all(|&x| x == p[2]), "{p:?}");
    assert_eq!(r.peak_reserved_from_pass(), 3);
    assert_eq!(r.peak_reserved_bytes, p[12]);
}

/// A footprint that settles at once takes the first pass and the quiet ones.
#[test]
fn a_warm_pool_settles_after_the_first_pass_and_the_quiet_ones() {
    let pool = PoolManager::host(1 << 30, PoolConfig::default()).unwrap();
    let rule = SteadyRule {
        quiet_passes: 4,
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&pool, rule, 0);
    assert_eq!((r.steady, r.passes.len()), (Some(SteadyStop::Settled), 5));
    assert_eq!(r.peak_reserved_from_pass(), 1);
    assert!(r.steady.unwrap().settled());
}

/// A footprint that never holds stops at the cap on passes.
#[test]
fn a_replay_that_never_settles_stops_at_the_cap() {
    let m = Growing::new(u64::MAX);
    let rule = SteadyRule {
        max_passes: 20,
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&m, rule, 0);
    assert_eq!(r.steady, Some(SteadyStop::MaxPasses));
    assert!(!r.steady.unwrap().settled());
    assert_eq!(r.passes.len(), 20);
    assert_eq!(r.peak_reserved_from_pass(), 20);
    // Settling on the last pass allowed counts as settling.
    let m = Growing::new(2);
    let rule = SteadyRule {
        quiet_passes: 10,
        max_passes: 12,
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&m, rule, 0);
    assert_eq!((r.steady, r.passes.len()), (Some(SteadyStop::Settled), 12));
}

/// A replay whose time runs out stops after the pass under way: with no time at
/// all, after the first.
#[test]
fn a_replay_stops_when_its_time_runs_out() {
    let m = Growing::new(u64::MAX);
    let rule = SteadyRule {
        max_time: Duration::ZERO,
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&m, rule, 0);
    assert_eq!((r.steady, r.passes.len()), (Some(SteadyStop::MaxTime), 1));
    let rule = SteadyRule {
        max_time: Duration::from_nanos(1),
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&Growing::new(u64::MAX), rule, 0);
    assert_eq!((r.steady, r.passes.len()), (Some(SteadyStop::MaxTime), 1));
}

/// A pass after the first stops where it is once the time has run out, not at
/// its end: the first pass runs whole, the second (200 requests of 5 ms each,
/// a second in all) stops at the first reading of the clock, after
/// `DEADLINE_EVERY` events, and is in no pass's figures.
#[test]
fn a_slow_later_pass_stops_part_way_when_the_time_runs_out() {
    let pairs = 200u64;
    let mut text = String::from("op,id,size,stream\n");
    for id in 0..pairs {
        text += &format!("a,{id},4096,0\nf,{id},0,0\n");
    }
    let t = Trace::from_text("t.csv", text).unwrap();
    let slow = Growing::slow_after(pairs);
    let options = ReplayOptions {
        until_steady: Some(SteadyRule {
            max_time: Duration::from_millis(20),
            ..SteadyRule::DEFAULT
        }),
        ..ReplayOptions::default()
    };
    let r = replay(&t, &slow, &mut |_| SYNC_STREAM, &options, &mut |_| {}).unwrap();
    assert_eq!(r.steady, Some(SteadyStop::MaxTime));
    assert_eq!(r.passes.len(), 1, "the first pass only is whole");
    assert_eq!(r.abandoned_events, emm_trace::DEADLINE_EVERY);
    // Every other event of the abandoned part is an allocation.
    assert_eq!(r.requests, pairs + emm_trace::DEADLINE_EVERY / 2);
    assert_eq!(r.failures, 0, "{:?}", r.first_failure);
    let whole_pass = Growing::NAP * pairs as u32;
    assert!(
        r.elapsed < whole_pass,
        "{:?} took a whole slow pass",
        r.elapsed
    );
    // Everything the abandoned part made went back.
    assert_eq!(MemoryManager::stats(&slow).allocated_bytes, 0);
    // A replay that ends between passes abandons nothing.
    let r = until_steady(&Growing::new(u64::MAX), SteadyRule::DEFAULT, 0);
    assert_eq!(r.abandoned_events, 0);
}

/// Without `until_steady` a replay makes exactly its passes and says nothing of
/// steadiness, also where the footprint never holds.
#[test]
fn a_fixed_number_of_passes_is_kept() {
    let t = Trace::from_text("t.csv", TRACE).unwrap();
    let m = Growing::new(u64::MAX);
    let options = ReplayOptions {
        passes: 3,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &m, &mut |_| SYNC_STREAM, &options, &mut |_| {}).unwrap();
    assert_eq!((r.passes.len(), r.steady), (3, None));
}

/// The curves' samples are spaced for one pass and halved as the passes go on:
/// never more than twice as many as asked for, in order, the last at the end of
/// the last pass.
#[test]
fn samples_stay_bounded_over_an_open_number_of_passes() {
    let m = Growing::new(u64::MAX);
    let rule = SteadyRule {
        max_passes: 50,
        ..SteadyRule::DEFAULT
    };
    let r = until_steady(&m, rule, 4);
    assert_eq!(r.passes.len(), 50);
    let events: Vec<u64> = r.samples.iter().map(|s| s.event).collect();
    assert!(events.len() > 4 && events.len() <= 2 * 4 + 2, "{events:?}");
    assert_eq!(events.first(), Some(&0));
    assert_eq!(events.last(), Some(&(8 * 50)));
    assert!(events.windows(2).all(|w| w[0] < w[1]), "{events:?}");
    // Live bytes of a merged sample are the larger of the pair: the trace's peak
    // shows in the curve.
    let live = r.samples.iter().map(|s| s.live_bytes).max();
    assert_eq!(live, Some(4096 + 1_048_576));
}
