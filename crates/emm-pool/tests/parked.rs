//! Free blocks parked for another stream stay their own stream's: when a stream
//! that misses asks for the free blocks of the others, those blocks wait for an
//! event on their stream before any stream may take them; until it completes
//! their own stream takes them back on its next request instead of reserving
//! more (stream order makes that safe). On a GPU the host runs ahead of the
//! device, so such events are seldom complete at once: without the take-back, an
//! FSDP2 step's three streams each went without their own free blocks and grew.
//! A stream about to grow past the peak waits on the host for the parked
//! blocks' events instead (`wait_parked`, on by default; a failed wait leaves
//! them parked), or, with `adopt_parked`, on the device. Events here complete
//! only when the test says so.

use std::sync::Arc;

use emm_core::MemoryManager;
use emm_default::HostUpstream;
use emm_pool::{
    EventId, EventSource, HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, VirtualMemory,
};
use emm_sys::CUstream;

mod common;
use common::manual_pool;

const MIB: usize = 1 << 20;

/// A pool whose streams grow rather than wait on the host for parked blocks
/// (`wait_parked` off): what stays parked, and who takes it, is what these
/// tests look at. `check_waiting` tests the wait.
fn pool(expandable: bool) -> (PoolManager, Arc<HostEvents>) {
    manual_pool(expandable, 0, |s| s.wait_parked = false)
}

fn pool_adopting(expandable: bool, adopt: bool) -> (PoolManager, Arc<HostEvents>) {
    manual_pool(expandable, 0, |s| {
        s.adopt_parked = adopt;
        s.wait_parked = false;
    })
}

/// The index of the last event recorded on `stream` (in `HostEvents::log`).
fn last_event_on(events: &HostEvents, stream: CUstream) -> usize {
    events
        .log()
        .iter()
        .rposition(|&(s, _)| s == stream.0 as usize)
        .expect("no event recorded on the stream")
}

/// A's 128 MiB goes free on A; then B asks for 64 MiB with nothing live.
/// Returns the reserved bytes before B asked, B's block and the stats after.
fn a_frees_then_b_asks(
    pool: &PoolManager,
) -> (usize, emm_core::DeviceAllocation, emm_pool::PoolStats) {
    let (a, b) = streams();
    drop(pool.memalloc_async(128 * MIB, a).unwrap());
    let peak = pool.stats().reserved_bytes;
    let y = pool.memalloc_async(64 * MIB, b).unwrap();
    (peak, y, pool.stats())
}

/// Two created streams (their events are recorded on them).
fn streams() -> (CUstream, CUstream) {
    (
        CUstream(0x100 as *mut core::ffi::c_void),
        CUstream(0x200 as *mut core::ffi::c_void),
    )
}

fn check_take_back(expandable: bool) {
    let (pool, events) = pool(expandable);
    let (a, b) = streams();
    // A's block goes free on A (an event is recorded at the free); B misses and
    // parks it behind that event, which has not completed: B grows.
    let x = pool.memalloc_async(64 * MIB, a).unwrap();
    let x_addr = x.ptr();
    drop(x);
    let y = pool.memalloc_async(64 * MIB, b).unwrap();
    let after_b = pool.stats().reserved_bytes;
    assert_ne!(
        y.ptr(),
        x_addr,
        "B took A's block before A's event completed"
    );
    assert!(
        events.outstanding() > 0,
        "no event stands between B and A's block"
    );
    // A asks again: its own parked block comes back, nothing more is reserved.
    let x2 = pool.memalloc_async(64 * MIB, a).unwrap();
    let stats = pool.stats();
    assert_eq!(
        stats.reserved_bytes, after_b,
        "A reserved more instead of taking back its own free block: {stats:?}"
    );
    assert_eq!(x2.ptr(), x_addr, "A did not get its own block back");
    assert!(
        stats.counts.parked_taken_back >= 1,
        "not counted: {stats:?}"
    );
    let listed = stats
        .counts
        .to_list()
        .into_iter()
        .find(|(n, _)| *n == emm_core::stat_names::PARKED_TAKEN_BACK)
        .map(|(_, v)| v);
    assert_eq!(listed, Some(stats.counts.parked_taken_back as u64));
    // The event completes while A's block is live again: it is not handed to
    // another stream (the parking was given up when A took the block back).
    events.complete_all();
    let z = pool.memalloc_async(64 * MIB, b).unwrap();
    assert_ne!(z.ptr(), x_addr, "a live block was handed to another stream");
    pool.check().unwrap();
    drop((x2, y, z));
    pool.check().unwrap();
}

#[test]
fn a_stream_takes_back_its_parked_block_in_the_expandable_segment() {
    check_take_back(true);
}

#[test]
fn a_stream_takes_back_its_parked_block_without_virtual_memory() {
    check_take_back(false);
}

/// Once the event completes before the owner asks again, the parked block is
/// settled and the other stream takes it, as before: the take-back does not cost
/// cross-stream reuse.
#[test]
fn a_parked_block_whose_event_completed_goes_to_the_stream_that_asked() {
    let (pool, events) = pool(true);
    let (a, b) = streams();
    let x = pool.memalloc_async(64 * MIB, a).unwrap();
    let x_addr = x.ptr();
    drop(x);
    let y = pool.memalloc_async(64 * MIB, b).unwrap();
    events.complete_all();
    let z = pool.memalloc_async(64 * MIB, b).unwrap();
    assert_eq!(z.ptr(), x_addr, "B did not reuse A's block after its event");
    let stats = pool.stats();
    assert_eq!(stats.counts.parked_taken_back, 0);
    assert!(stats.counts.cross_stream_reuses >= 1, "{stats:?}");
    pool.check().unwrap();
    drop((y, z));
}

/// Each stream takes back only its own parked blocks: two streams' blocks parked
/// for a third come back to their own streams, each at its own address.
#[test]
fn each_stream_takes_back_only_its_own_parked_blocks() {
    let (pool, _events) = pool(true);
    let (a, b) = streams();
    let c = CUstream(0x300 as *mut core::ffi::c_void);
    let xa = pool.memalloc_async(64 * MIB, a).unwrap();
    let xc = pool.memalloc_async(64 * MIB, c).unwrap();
    let (addr_a, addr_c) = (xa.ptr(), xc.ptr());
    drop((xa, xc));
    // B parks both (neither event completes) and grows.
    let y = pool.memalloc_async(64 * MIB, b).unwrap();
    let before = pool.stats().reserved_bytes;
    let again_c = pool.memalloc_async(64 * MIB, c).unwrap();
    assert_eq!(again_c.ptr(), addr_c, "C did not get its own block back");
    let again_a = pool.memalloc_async(64 * MIB, a).unwrap();
    assert_eq!(again_a.ptr(), addr_a, "A did not get its own block back");
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes, before, "a stream grew: {stats:?}");
    assert_eq!(stats.counts.parked_taken_back, 2);
    pool.check().unwrap();
    drop((y, again_a, again_c));
}

/// With `adopt_parked`, a stream that would grow past the peak while live bytes
/// are far below theirs takes blocks parked for another stream instead, its work
/// made to wait for their event on the device (the host does not wait: the event
/// stays incomplete); without it, it grows. Near the peak of live bytes it grows
/// either way.
fn check_adoption(expandable: bool) {
    for adopt in [false, true] {
        let (pool, events) = pool_adopting(expandable, adopt);
        let (a, b) = streams();
        let (peak, y, stats) = a_frees_then_b_asks(&pool);
        // A's last event, recorded at its free, has not completed.
        let a_event = last_event_on(&events, a);
        assert!(!events.log()[a_event].1, "A's event completed");
        if adopt {
            assert_eq!(stats.reserved_bytes, peak, "B grew: {stats:?}");
            assert!(stats.counts.parked_adopted >= 1, "{stats:?}");
            assert_eq!(
                events.waits(),
                vec![(b.0 as usize, a_event)],
                "B did not wait for A's event on the device"
            );
        } else {
            assert!(stats.reserved_bytes > peak, "B did not grow: {stats:?}");
            assert_eq!(stats.counts.parked_adopted, 0);
            assert!(events.waits().is_empty());
        }
        pool.check().unwrap();
        drop(y);

        // Near the peak of live bytes: A keeps 96 MiB and frees 32; B's 32 MiB
        // then makes live bytes reach their peak, and B grows either way.
        let (pool, _events) = pool_adopting(expandable, adopt);
        let kept = pool.memalloc_async(96 * MIB, a).unwrap();
        drop(pool.memalloc_async(32 * MIB, a).unwrap());
        let before = pool.stats().reserved_bytes;
        let w = pool.memalloc_async(32 * MIB, b).unwrap();
        let stats = pool.stats();
        assert_eq!(
            stats.counts.parked_adopted, 0,
            "adopted near the peak: {stats:?}"
        );
        assert!(stats.reserved_bytes > before, "{stats:?}");
        pool.check().unwrap();
        drop((kept, w));
    }
}

#[test]
fn a_stream_adopts_parked_blocks_far_below_the_peak_in_the_expandable_segment() {
    check_adoption(true);
}

#[test]
fn a_stream_adopts_parked_blocks_far_below_the_peak_without_virtual_memory() {
    check_adoption(false);
}

fn pool_waiting(expandable: bool, wait: bool) -> (PoolManager, Arc<HostEvents>) {
    manual_pool(expandable, 0, |s| s.wait_parked = wait)
}

/// With `wait_parked`, a stream that would grow past the peak waits on the host
/// for the event of blocks parked for another stream and takes them settled
/// (the event is complete afterwards, no stream was made to wait on the
/// device); without it, it grows and the event stays incomplete. A growth that
/// stays under the peak does not wait.
fn check_waiting(expandable: bool) {
    for wait in [false, true] {
        let (pool, events) = pool_waiting(expandable, wait);
        let (a, b) = streams();
        let (peak, y, stats) = a_frees_then_b_asks(&pool);
        let a_event = last_event_on(&events, a);
        assert!(events.waits().is_empty(), "a stream waited on the device");
        if wait {
            assert_eq!(stats.reserved_bytes, peak, "B grew: {stats:?}");
            assert_eq!(stats.counts.parked_waited, 1, "{stats:?}");
            assert!(
                events.log()[a_event].1,
                "the host did not wait for A's event"
            );
            assert_eq!(stats.counts.parked_adopted, 0);
        } else {
            assert!(stats.reserved_bytes > peak, "B did not grow: {stats:?}");
            assert_eq!(stats.counts.parked_waited, 0);
            assert!(!events.log()[a_event].1, "A's event completed");
        }
        pool.check().unwrap();
        drop(y);

        // Under the peak: after a trim gives A's 128 MiB back (the peak stays),
        // A's 32 MiB goes free on A and B's 64 MiB fits under the peak: B grows
        // without waiting for A's event.
        let (pool, events) = pool_waiting(expandable, wait);
        drop(pool.memalloc_async(128 * MIB, a).unwrap());
        pool.trim();
        drop(pool.memalloc_async(32 * MIB, a).unwrap());
        let w = pool.memalloc_async(64 * MIB, b).unwrap();
        let stats = pool.stats();
        assert!(
            stats.reserved_bytes <= stats.reserved_bytes_peak,
            "{stats:?}"
        );
        assert_eq!(
            stats.counts.parked_waited, 0,
            "waited under the peak: {stats:?}"
        );
        let a_event = last_event_on(&events, a);
        assert!(!events.log()[a_event].1, "A's last event completed");
        pool.check().unwrap();
        drop(w);

        // A reset of the statistics' peaks (as `reset_peak_memory_stats` each
        // step) does not lower the peak the wait is judged by: B's request that
        // stays under the most ever reserved grows without waiting.
        let (pool, events) = pool_waiting(expandable, wait);
        drop(pool.memalloc_async(128 * MIB, a).unwrap());
        pool.trim();
        pool.reset_peak_stats();
        drop(pool.memalloc_async(32 * MIB, a).unwrap());
        let w = pool.memalloc_async(64 * MIB, b).unwrap();
        let stats = pool.stats();
        assert_eq!(
            stats.counts.parked_waited, 0,
            "waited after a reset of peaks: {stats:?}"
        );
        let a_event = last_event_on(&events, a);
        assert!(!events.log()[a_event].1, "A's last event completed");
        pool.check().unwrap();
        drop(w);
    }
}

#[test]
fn a_stream_waits_for_parked_blocks_instead_of_growing_past_the_peak_in_the_expandable_segment() {
    check_waiting(true);
}

#[test]
fn a_stream_waits_for_parked_blocks_instead_of_growing_past_the_peak_without_it() {
    check_waiting(false);
}

/// The stand-in's manual events, except that every host wait fails (as a
/// driver's `cuEventSynchronize` can), or with `.1`, every bounded wait runs
/// out of time (as one for a collective a peer never joins does).
struct FailingWaits(Arc<HostEvents>, bool);

impl EventSource for FailingWaits {
    fn record(&self, stream: CUstream) -> emm_core::Result<EventId> {
        self.0.record(stream)
    }
    fn is_complete(&self, id: EventId) -> emm_core::Result<bool> {
        self.0.is_complete(id)
    }
    fn wait(&self, id: EventId) -> emm_core::Result<()> {
        Err(emm_core::EmmError::InvalidArgument {
            what: "event wait (a failure the test injects)",
            found: format!("event {}", id.0),
            expected: "a wait that succeeds".into(),
        })
    }
    fn wait_for(&self, id: EventId, _limit: std::time::Duration) -> emm_core::Result<bool> {
        if self.1 {
            return Ok(false);
        }
        self.wait(id).map(|()| true)
    }
    fn stream_wait(&self, stream: CUstream, id: EventId) -> emm_core::Result<()> {
        self.0.stream_wait(stream, id)
    }
    fn recycle(&self, id: EventId) {
        self.0.recycle(id)
    }
    fn synchronize_all(&self) -> emm_core::Result<()> {
        self.0.synchronize_all()
    }
}

/// A wait for parked blocks that fails, or runs out of time, leaves them
/// parked: the stream grows instead, the request is served, and the pool stays
/// consistent; once the event completes, the blocks settle as before.
fn check_failed_wait(expandable: bool, times_out: bool) {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let events = Arc::new(HostEvents::manual());
    let vmm = expandable.then(|| Box::new(HostVmm::new(host.clone())) as Box<dyn VirtualMemory>);
    let mut config = PoolConfig {
        thread_cache_blocks: 0,
        background_unmap: false,
        ..PoolConfig::default()
    };
    config.segments.expandable = expandable;
    // (A merge would synchronize, completing A's event: see `manual_pool`.)
    config.segments.merge_quiet = None;
    assert!(config.segments.wait_parked, "the wait is on by default");
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(host),
            Box::new(FailingWaits(events.clone(), times_out)),
            vmm,
            None,
        ),
        config,
    )
    .unwrap();
    let (_, b) = streams();
    let (peak, y, stats) = a_frees_then_b_asks(&pool);
    assert!(stats.reserved_bytes > peak, "B did not grow: {stats:?}");
    assert_eq!(stats.counts.parked_waited, 0, "{stats:?}");
    assert!(events.outstanding() > 0, "A's event completed");
    pool.check().unwrap();
    // The device gets there: B's next request takes A's settled block.
    events.complete_all();
    let before = pool.stats().reserved_bytes;
    let z = pool.memalloc_async(128 * MIB, b).unwrap();
    assert_eq!(pool.stats().reserved_bytes, before, "B grew again");
    pool.check().unwrap();
    drop((y, z));
}

#[test]
fn a_failed_wait_for_parked_blocks_leaves_them_parked_in_the_expandable_segment() {
    check_failed_wait(true, false);
    check_failed_wait(true, true);
}

#[test]
fn a_failed_wait_for_parked_blocks_leaves_them_parked_without_it() {
    check_failed_wait(false, false);
    check_failed_wait(false, true);
}
