//! The entry points PyTorch's allocator hooks call (`emm_torch_*`): allocations
//! and frees by address on a device and stream, `record_stream`, the statistics,
//! `empty_cache` and `cacheInfo`, and the private pools of CUDA graphs and
//! `torch.cuda.MemPool` (create, begin and end routing, allocate into, release,
//! list live blocks, describe), driven by a program of up to 64 calls read from
//! the input over the stand-in driver. Sizes, devices, pool ids and addresses
//! are fuzzed; streams are the ones any caller may pass (none, the legacy and
//! the per-thread default stream), since a stream handle is the driver's to
//! check.
//!
//! Checked after every call: a known status, never `EMM_ERR_PANIC` or
//! `EMM_ERR_INTERNAL`, and a message for a failure ([`status`]); a block handed
//! out overlaps no block held; a block this input holds is freed when asked on
//! its device; a use of a private pool is given back when released, and a
//! route begun ends unless its pool's last use was released (which ends it).
//! At the end every route is ended, every block freed, every use released, the
//! caches emptied, and device 0's allocated bytes are back where they were.

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;

use emm_capi::*;

use crate::abi::{device, hooks_allocated, program, serial, status, Blocks};
use crate::cursor::Cursor;

/// The statistics a program may ask for (and a name no manager keeps).
const NAMES: [&std::ffi::CStr; 6] = [
    c"allocated_bytes.all.current",
    c"reserved_bytes.all.current",
    c"active_bytes.all.peak",
    c"num_ooms",
    c"emm.merges",
    c"no.such.statistic",
];

/// What an input holds: blocks by address with their device and size, a
/// private pool's id for each use it took (a create or a begin: each is one
/// use, which a release gives back) and for each route begun and not ended.
#[derive(Default)]
struct Held {
    blocks: Blocks,
    uses: Vec<(u64, u64)>,
    routes: Vec<(u64, u64)>,
}

impl Held {
    /// An address to pass: one this input holds, or any value.
    fn pointer(&self, c: &mut Cursor<'_>) -> (u64, Option<usize>) {
        let pick = c.u8();
        if pick % 4 != 0 && !self.blocks.0.is_empty() {
            let i = usize::from(pick) % self.blocks.0.len();
            (self.blocks.0[i].0, Some(i))
        } else {
            (c.u64(), None)
        }
    }
}

/// A stream any caller may pass: none, the legacy or the per-thread default.
fn stream(c: &mut Cursor<'_>) -> *mut c_void {
    // CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: handle values, not addresses.
    [
        null_mut(),
        std::ptr::without_provenance_mut(1),
        std::ptr::without_provenance_mut(2),
    ][usize::from(c.u8() % 3)]
}

/// A size as PyTorch passes it (`ssize_t`): small, large, none or negative.
fn size(c: &mut Cursor<'_>) -> isize {
    match c.u8() % 8 {
        0 => 0,
        1 => -(isize::from(c.u8()) + 1),
        2 => isize::MAX >> (c.u8() % 8),
        3 => (1isize << (c.u8() % 31)) + isize::from(c.u8()),
        _ => isize::from(c.u8()) * 4096 + isize::from(c.u8()),
    }
}

/// A private pool's id: few, so that calls meet the pools created.
fn pool_id(c: &mut Cursor<'_>) -> (u64, u64) {
    (u64::from(c.u8() % 3), u64::from(c.u8() % 2))
}

/// Runs the program in `data` against PyTorch's hooks.
pub fn torch_hooks(data: &[u8]) {
    let _one = serial();
    let before = hooks_allocated();
    let mut held = Held::default();
    program(data, |c| step(c, &mut held));
    for (a, b) in held.routes.drain(..) {
        status(
            "emm_torch_graph_pool_end (end)",
            emm_torch_graph_pool_end(0, a, b),
        );
    }
    for (ptr, device, _) in held.blocks.0.drain(..) {
        let code = emm_torch_release(ptr as *mut c_void, device);
        status("emm_torch_release (end)", code);
        assert_eq!(code, EMM_OK, "a held block of device {device} not freed");
    }
    for (a, b) in held.uses.drain(..) {
        let code = emm_torch_graph_pool_release(0, a, b);
        status("emm_torch_graph_pool_release (end)", code);
        assert_eq!(code, EMM_OK, "releasing a use taken");
    }
    let mut released = 0usize;
    // SAFETY: `released` is a live local.
    status("emm_torch_empty_cache (end)", unsafe {
        emm_torch_empty_cache(-1, &mut released)
    });
    assert_eq!(
        hooks_allocated(),
        before,
        "allocated bytes after freeing everything"
    );
}

fn step(c: &mut Cursor<'_>, held: &mut Held) {
    match c.u8() % 12 {
        0..=2 => {
            let (n, d, s) = (size(c), device(c), stream(c));
            let ptr = emm_torch_alloc(n, d, s);
            if ptr.is_null() {
                if n != 0 {
                    status("emm_torch_alloc", emm_last_error_code());
                    assert_ne!(
                        emm_last_error_code(),
                        EMM_OK,
                        "a null block without a failure"
                    );
                }
            } else {
                assert!(n > 0, "a block for a request of {n} bytes");
                held.blocks.take(ptr as u64, d, n as usize);
            }
        }
        3 => {
            let (ptr, i) = held.pointer(c);
            let (d, s) = match i {
                Some(i) if c.u8() % 4 != 0 => (held.blocks.0[i].1, stream(c)),
                _ => (device(c), stream(c)),
            };
            emm_torch_free(ptr as *mut c_void, size(c), d, s);
            let code = emm_last_error_code();
            status("emm_torch_free", code);
            if code == EMM_OK {
                held.blocks.0.retain(|&(p, _, _)| p != ptr);
            }
        }
        4 => {
            let (ptr, i) = held.pointer(c);
            let d = match i {
                Some(i) if c.u8() % 4 != 0 => held.blocks.0[i].1,
                _ => device(c),
            };
            let code = emm_torch_release(ptr as *mut c_void, d);
            status("emm_torch_release", code);
            if let Some(i) = i {
                if d == held.blocks.0[i].1 || d == -1 {
                    assert_eq!(code, EMM_OK, "a held block not freed on its device");
                }
            }
            if code == EMM_OK {
                held.blocks.0.retain(|&(p, _, _)| p != ptr);
            }
        }
        5 => {
            let (ptr, _) = held.pointer(c);
            let code = emm_torch_record_stream(ptr as *mut c_void, device(c), stream(c));
            status("emm_torch_record_stream", code);
        }
        6 => {
            let n = usize::from(c.u8() % 7);
            let keys: Vec<*const c_char> = (0..n)
                .map(|_| NAMES[usize::from(c.u8()) % NAMES.len()].as_ptr())
                .collect();
            let mut values = vec![u64::MAX; n];
            let mut found = 0usize;
            let d = device(c);
            // SAFETY: `n` names and room for `n` values; `found` a live local.
            let code = unsafe {
                emm_torch_memory_stats(d, keys.as_ptr(), values.as_mut_ptr(), n, &mut found)
            };
            status("emm_torch_memory_stats", code);
            if code == EMM_OK {
                assert!(found <= n);
            }
        }
        7 => {
            let d = device(c);
            status("emm_torch_reset_peak_stats", emm_torch_reset_peak_stats(d));
            let (mut largest, mut released) = (0usize, 0usize);
            // SAFETY: a live local.
            let code = unsafe { emm_torch_cache_info(d, &mut largest) };
            status("emm_torch_cache_info", code);
            // SAFETY: a live local.
            let code = unsafe { emm_torch_empty_cache(d, &mut released) };
            status("emm_torch_empty_cache", code);
        }
        8 => {
            let (a, b) = pool_id(c);
            let code = emm_torch_graph_pool_create(0, a, b);
            status("emm_torch_graph_pool_create", code);
            if code == EMM_OK {
                held.uses.push((a, b));
            }
        }
        9 => {
            let (a, b) = pool_id(c);
            if c.u8() % 2 == 0 {
                let code = emm_torch_graph_pool_begin(0, a, b);
                status("emm_torch_graph_pool_begin", code);
                if code == EMM_OK {
                    held.uses.push((a, b));
                    held.routes.push((a, b));
                }
            } else {
                let code = emm_torch_graph_pool_end(0, a, b);
                status("emm_torch_graph_pool_end", code);
                if let Some(i) = held.routes.iter().position(|&r| r == (a, b)) {
                    assert_eq!(code, EMM_OK, "ending a route begun");
                    held.routes.swap_remove(i);
                }
            }
        }
        10 => {
            let (a, b) = pool_id(c);
            let (n, s) = (size(c), stream(c));
            let ptr = emm_torch_graph_pool_alloc(n, 0, s, a, b);
            if ptr.is_null() {
                if n != 0 {
                    status("emm_torch_graph_pool_alloc", emm_last_error_code());
                }
            } else {
                assert!(n > 0, "a graph block for a request of {n} bytes");
                held.blocks.take(ptr as u64, 0, n as usize);
            }
        }
        _ => {
            let (a, b) = pool_id(c);
            match c.u8() % 3 {
                0 => {
                    let code = emm_torch_graph_pool_release(0, a, b);
                    status("emm_torch_graph_pool_release", code);
                    if let Some(i) = held.uses.iter().position(|&p| p == (a, b)) {
                        assert_eq!(code, EMM_OK, "releasing a use taken");
                        held.uses.swap_remove(i);
                        if !held.uses.contains(&(a, b)) {
                            // Its last use: a pool released routes no more.
                            held.routes.retain(|&r| r != (a, b));
                        }
                    }
                }
                1 => {
                    let cap = usize::from(c.u8() % 8);
                    let mut ptrs = vec![null_mut::<c_void>(); cap];
                    let mut count = 0usize;
                    // SAFETY: room for `cap` addresses; `count` a live local.
                    let code = unsafe {
                        emm_torch_graph_pool_live(0, a, b, ptrs.as_mut_ptr(), cap, &mut count)
                    };
                    status("emm_torch_graph_pool_live", code);
                    if code == EMM_OK {
                        for p in ptrs.iter().take(count.min(cap)) {
                            assert!(
                                held.blocks.0.iter().any(|&(q, _, _)| q == *p as u64),
                                "a live graph block {p:p} this input does not hold"
                            );
                        }
                    }
                }
                _ => {
                    let mut info = emm_graph_pool_info::default();
                    // SAFETY: `info` is a live local.
                    let code = unsafe { emm_torch_graph_pool_info(0, a, b, &mut info) };
                    status("emm_torch_graph_pool_info", code);
                    if code == EMM_OK {
                        assert!(info.live_bytes <= info.reserved_bytes);
                        assert!(info.peak_live_bytes <= info.peak_reserved_bytes);
                    }
                }
            }
        }
    }
}
