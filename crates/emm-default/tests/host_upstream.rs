//! The host stand-in's made-up addresses near the top of the address space, and the
//! default manager's statistics over it. Its own test binary: exhausting the
//! process-wide range of made-up addresses must not starve other tests.

use emm_core::{EmmError, MemoryManager, SYNC_STREAM};
use emm_default::{DefaultManager, HostUpstream, PendingConfig, Upstream};

#[test]
fn made_up_addresses_never_wrap_or_overlap_near_usize_max() {
    let up = HostUpstream::new(usize::MAX, false);
    // Sizes whose rounding would overflow are typed errors, and reserve nothing.
    for size in [usize::MAX, usize::MAX - 1, usize::MAX - 511, 1 << 63] {
        match up.alloc(size) {
            Err(EmmError::OutOfMemory {
                requested, detail, ..
            }) => {
                assert_eq!(requested, size);
                assert!(detail.contains("made-up addresses"), "{detail}");
            }
            other => panic!("alloc({size:#x}): expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(up.used(), 0, "a failed allocation must not stay counted");
    }
    // Huge blocks until the range is used up: each is inside the range, ascending,
    // and none overlaps another.
    let mut blocks: Vec<(u64, usize)> = Vec::new();
    let mut failures = 0;
    for size in [1usize << 61, 1 << 61, 1 << 61, 1 << 61, 1 << 60, 4096, 1] {
        match up.alloc(size) {
            Ok(p) => {
                assert_eq!(p % 256, 0);
                assert!(p.checked_add(size as u64).is_some_and(|end| end <= 1 << 63));
                blocks.push((p, size));
            }
            Err(e) => {
                assert!(e.is_out_of_memory(), "{e}");
                failures += 1;
            }
        }
    }
    assert!(
        failures > 0,
        "2^63 bytes of made-up addresses cannot hold {blocks:?}"
    );
    for w in blocks.windows(2) {
        assert!(w[0].0 + w[0].1 as u64 <= w[1].0, "overlap: {w:?}");
    }
    let live: usize = blocks.iter().map(|b| b.1).sum();
    assert_eq!(up.used(), live);
    for (p, s) in blocks {
        // SAFETY: each block came from `alloc(s)` of `up` and is freed once.
        unsafe { up.free(p, s) }.unwrap();
    }
    assert_eq!(up.used(), 0);
    assert_eq!(up.misuse(), 0);
}

#[test]
fn a_foreign_free_is_an_invalid_argument() {
    let up = HostUpstream::new(1 << 20, true);
    let p = up.alloc(512).unwrap();
    // SAFETY: the wrong size is refused before anything is freed.
    let e = unsafe { up.free(p, 256) }.unwrap_err();
    assert!(
        matches!(&e, EmmError::InvalidArgument { what: "block to free", found, .. } if found.contains("allocated with 512 bytes")),
        "{e}"
    );
    // SAFETY: the right size this time; freed once.
    unsafe { up.free(p, 512) }.unwrap();
    // SAFETY: a double free is refused (the block is not live).
    let e = unsafe { up.free(p, 512) }.unwrap_err();
    assert!(e.to_string().contains("not live"), "{e}");
    assert_eq!(up.misuse(), 2);
}

#[test]
fn default_manager_reports_the_peak_of_allocated_bytes() {
    let m = DefaultManager::over(HostUpstream::new(1 << 30, true), PendingConfig::default());
    assert_eq!(MemoryManager::stats(&m).allocated_bytes_peak, 0);
    let a = m.memalloc_async(1000, SYNC_STREAM).unwrap();
    let b = m.memalloc_async(3000, SYNC_STREAM).unwrap();
    let s = MemoryManager::stats(&m);
    assert_eq!((s.allocated_bytes, s.allocated_bytes_peak), (4000, 4000));
    drop(b);
    let c = m.memalloc_async(500, SYNC_STREAM).unwrap();
    let s = MemoryManager::stats(&m);
    assert_eq!((s.allocated_bytes, s.allocated_bytes_peak), (1500, 4000));
    assert!(s.reserved_bytes_peak >= s.allocated_bytes_peak);
    drop((a, c));
    m.flush();
    let s = MemoryManager::stats(&m);
    assert_eq!((s.allocated_bytes, s.allocated_bytes_peak), (0, 4000));
    assert_eq!(s.reserved_bytes, 0);
}
