//! How the pool says no (issue 36, fast failure), on the stand-in driver: a request
//! the device cannot hold fails with a typed out-of-memory error before any driver
//! call tries to make memory for it (no `cuMemCreate`, no `cuMemAlloc`: a growth
//! made piece by piece would fail part-way and undo itself first), the error names
//! the device's free bytes, and a request that fits still succeeds afterwards.
//!
//! Build the stand-in first: `cargo build -p emm-standin` (`cargo xtask ci` does).

mod common;

use common::fixture;

use emm::{EmmError, MemoryManager};
use emm_pool::PoolManager;

const MIB: usize = 1 << 20;

#[test]
fn a_request_the_device_cannot_hold_fails_before_any_driver_allocation() {
    let f = fixture();
    f.s.control("capacity 1G").unwrap();
    let pool = PoolManager::new(&f.ctx).unwrap();
    // Most of the device, live: nothing the pool holds can be given back.
    let held: Vec<_> = (0..7).map(|_| pool.memalloc(128 * MIB).unwrap()).collect();
    let calls = |s: &emm_sys::StandIn<'_>| {
        ["cuMemCreate", "cuMemAlloc_v2", "cuMemMap"].map(|f| s.calls(f).unwrap())
    };
    for ask in [512 * MIB, 200 * MIB] {
        let before = calls(&f.s);
        let err = pool.memalloc(ask).map(drop).unwrap_err();
        let after = calls(&f.s);
        assert_eq!(
            before, after,
            "asking for {ask} bytes with {} free made driver allocations (cuMemCreate, cuMemAlloc, cuMemMap)",
            1024 * MIB - 7 * 128 * MIB
        );
        match err {
            EmmError::OutOfMemory {
                requested,
                free,
                total,
                ..
            } => {
                assert!(
                    requested > 0 && requested <= ask && free < ask,
                    "{requested} {free}"
                );
                assert_eq!(total, 1024 * MIB);
            }
            other => panic!("asking for {ask} bytes: expected OutOfMemory, got {other}"),
        }
    }
    // What fits still comes, and once memory is back, what did not fit fits.
    let small = pool.memalloc(64 * MIB).expect("64 MiB of the 128 MiB left");
    drop(small);
    drop(held);
    pool.release_cached().unwrap();
    let big = pool
        .memalloc(512 * MIB)
        .expect("512 MiB once the device is free again");
    drop(big);
    drop(pool);
    f.s.control("capacity 8G").unwrap();
}

#[test]
fn a_request_a_free_tail_nearly_covers_grows_the_tail_by_what_it_lacks() {
    // The expandable segment ends in a 60 MiB free block and the device has 10 MiB
    // free: a 64 MiB request lacks 4 MiB, less than the growth step (20 MiB). It
    // must be served at the segment's end, not refused and not moved to a plain
    // `cuMemAlloc` segment.
    let f = fixture();
    f.s.control("capacity 1G").unwrap();
    let pool = PoolManager::new(&f.ctx).unwrap();
    let fill = pool.memalloc(954 * MIB).unwrap();
    let tail = pool.memalloc(60 * MIB).unwrap();
    drop(tail);
    let allocs = f.s.calls("cuMemAlloc_v2").unwrap();
    let block = pool
        .memalloc(64 * MIB)
        .expect("60 MiB free at the end and 10 MiB on the device serve 64 MiB");
    assert_eq!(
        f.s.calls("cuMemAlloc_v2").unwrap(),
        allocs,
        "the request went to a plain segment instead of the expandable one's end"
    );
    drop((block, fill));
    drop(pool);
    f.s.control("capacity 8G").unwrap();
}
