//! The caching pool ([`PoolManager`]) over the host stand-in, running a program
//! read from the input: allocations of any size (none, a byte, a gigabyte,
//! `usize::MAX`) on four streams, frees in any order, trims, byte limits and
//! release thresholds set and lifted while blocks live, statistics, snapshots and
//! peak resets. The first two bytes choose the pool: with or without the
//! expandable segment, merging, stream pools, thread caches, the piece share,
//! replaced pieces, a device that runs behind the host (`host_lagged`), and a
//! capacity of 16 MiB to 2 GiB, so requests run out of memory.
//!
//! Checked after every step: the pool's own consistency check
//! ([`PoolManager::check`]: blocks tiling their segments, free sets, the family's
//! sums), no two live blocks overlapping, the blocks held counted as held, and a
//! refused request refused with an error that says so. At the end, with every
//! block freed and no limit: nothing is counted as held, a trim gives back every
//! byte, and the pool serves a request of half its capacity (the fault has
//! cleared, so the pool works again).

use std::sync::Arc;

use emm_core::{DeviceAllocation, HostClock, SYNC_STREAM};
use emm_pool::{PoolConfig, PoolManager, DEFAULT_LEGACY_MERGE, DEFAULT_PIECE_SHARE};
use emm_sys::CUstream;

use crate::cursor::Cursor;

/// Steps of one input at most (each checks the whole pool).
const MAX_STEPS: usize = 512;

/// The stream of number `n` (0-3): the legacy default stream, or a created
/// stream's handle (the stand-in uses them only as keys).
fn stream(n: u8) -> CUstream {
    match n % 4 {
        0 => SYNC_STREAM,
        k => CUstream((0x1000 + usize::from(k) * 0x100) as *mut _),
    }
}

/// A request's size: any power of two up to 1 GiB with a fuzzed fraction of it
/// added, or none, or more than any machine has.
fn request(c: &mut Cursor<'_>) -> usize {
    match c.u8() % 32 {
        30 => 0,
        31 => usize::MAX >> (c.u8() % 8),
        e => {
            let base = 1usize << e;
            base + (base >> 8) * usize::from(c.u8())
        }
    }
}

/// The pool the first two bytes describe, and its clock when its device lags.
fn pool(c: &mut Cursor<'_>) -> (PoolManager, Option<Arc<HostClock>>, usize) {
    let flags = c.u8();
    let capacity = (16usize << 20) << (c.u8() % 8);
    let mut config = PoolConfig::default();
    config.segments.expandable = flags & 1 != 0;
    config.segments.merge_quiet = (flags & 2 != 0).then_some(DEFAULT_LEGACY_MERGE);
    config.stream_pools = if flags & 4 != 0 { 8 } else { 0 };
    if flags & 8 == 0 {
        config.thread_cache_blocks = 0;
        config.thread_cache_bytes = 0;
    }
    config.segments.piece_share = if flags & 16 != 0 {
        DEFAULT_PIECE_SHARE
    } else {
        0
    };
    config.segments.replace_pieces = if flags & 32 != 0 { 4 } else { 0 };
    let lag = [0, 4, 64, 0][usize::from(flags >> 6)];
    let clock = (lag > 0).then(|| Arc::new(HostClock::new(lag)));
    let pool = match &clock {
        Some(clock) => PoolManager::host_lagged(capacity, config, clock.clone()),
        None => PoolManager::host(capacity, config),
    }
    .unwrap_or_else(|e| panic!("no pool over the host stand-in of {capacity} bytes: {e}"));
    (pool, clock, capacity)
}

/// The blocks an input holds.
#[derive(Default)]
struct Held {
    blocks: Vec<DeviceAllocation>,
}

impl Held {
    /// Takes a new block for a request of `size` bytes: at least that large, and
    /// overlapping no live block.
    fn take(&mut self, a: DeviceAllocation, size: usize) {
        let (start, end) = (a.ptr(), a.ptr() + a.size() as u64);
        assert!(
            a.size() >= size,
            "a block of {} bytes for a request of {size}",
            a.size()
        );
        for b in &self.blocks {
            let (s, e) = (b.ptr(), b.ptr() + b.size() as u64);
            assert!(
                e <= start || s >= end,
                "[{start:#x}, {end:#x}) overlaps the live [{s:#x}, {e:#x})"
            );
        }
        self.blocks.push(a);
    }

    /// Frees the block at `index` (any number: taken modulo the blocks held).
    fn free(&mut self, index: usize) {
        if !self.blocks.is_empty() {
            self.blocks.swap_remove(index % self.blocks.len());
        }
    }
}

/// The pool is consistent and counts what the input holds.
#[track_caller]
fn check(pool: &PoolManager, held: &Held) {
    if let Err(e) = pool.check() {
        panic!("the pool is inconsistent: {e}");
    }
    let s = pool.stats();
    assert_eq!(
        s.allocated_blocks,
        held.blocks.len(),
        "blocks counted as held"
    );
    assert!(s.active_bytes >= s.allocated_bytes && s.reserved_bytes >= s.active_bytes);
}

/// The target (see the module docs).
pub fn pool_ops(data: &[u8]) {
    let mut c = Cursor(data);
    let (pool, clock, capacity) = pool(&mut c);
    let mut held = Held::default();
    for _ in 0..MAX_STEPS {
        if c.done() {
            break;
        }
        if let Some(clock) = &clock {
            clock.tick();
        }
        match c.u8() % 8 {
            0..=2 => {
                let size = request(&mut c);
                let on = stream(c.u8());
                match pool.alloc(size, on) {
                    // Nothing asked, nothing held: a block of no bytes at 0.
                    Ok(a) if size == 0 => assert_eq!((a.ptr(), a.size()), (0, 0)),
                    Ok(a) => held.take(a, size),
                    Err(e) => {
                        let text = e.to_string();
                        // Refused: too large for the device or the limit, or a
                        // size no device has; said in the error.
                        assert!(
                            e.is_out_of_memory() || size > capacity,
                            "{size} bytes refused with {capacity} of capacity: {text}"
                        );
                        assert!(!text.is_empty());
                    }
                }
            }
            3 | 4 => held.free(usize::from(c.u8())),
            5 => {
                pool.trim();
            }
            6 => match c.u8() % 4 {
                0 => {
                    pool.set_limit(None);
                }
                1 => {
                    pool.set_limit(Some(capacity >> (c.u8() % 4)));
                }
                2 => {
                    pool.set_release_threshold(capacity >> (c.u8() % 4));
                }
                _ => {
                    pool.set_release_threshold(usize::MAX);
                }
            },
            _ => {
                let before = pool.stats();
                let total: usize = pool.snapshot().segments.iter().map(|s| s.total_size).sum();
                assert_eq!(
                    total, before.reserved_bytes,
                    "the snapshot's segments against the bytes reserved"
                );
                pool.reset_peak_stats();
                let after = pool.stats();
                assert_eq!(after.allocated_bytes_peak, after.allocated_bytes);
                assert_eq!(after.reserved_bytes_peak, after.reserved_bytes);
            }
        }
        check(&pool, &held);
    }
    drop(held);
    let held = Held::default();
    check(&pool, &held);
    assert_eq!(
        pool.stats().allocated_bytes,
        0,
        "bytes counted as held with none held"
    );
    pool.set_limit(None);
    pool.set_release_threshold(usize::MAX);
    pool.trim();
    let s = pool.stats();
    assert_eq!(
        s.reserved_bytes, 0,
        "a trim with nothing held kept {} bytes",
        s.reserved_bytes
    );
    let half = capacity / 2;
    match pool.alloc(half, SYNC_STREAM) {
        Ok(a) => drop(a),
        Err(e) => panic!("{half} bytes of an empty pool of {capacity} refused: {e}"),
    }
    check(&pool, &held);
}
