//! A conformance suite any manager runs against itself on a GPU.
//!
//! ```no_run
//! # fn demo(manager: &dyn emm_core::MemoryManager, ctx: &emm_driver::Context) {
//! let report = emm_core::conformance::run(manager, ctx);
//! print!("{report}");
//! assert!(report.all_passed());
//! # }
//! ```
//!
//! Each check allocates through the manager and writes and reads the memory it gets
//! with the driver. A check fails with a message saying what was expected and what
//! was found; the suite never panics on a misbehaving manager.

use std::fmt;

use emm_driver::{memory, Context, Stream};

use crate::error::EmmError;
use crate::managed::{ManagedAttach, ManagedMemory};
use crate::manager::MemoryManager;
use crate::pointer::HostAllocFlags;

/// The outcome of one check.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// The check's name.
    pub name: &'static str,
    /// `Ok`, or what went wrong.
    pub outcome: Result<(), String>,
}

/// The outcome of every check.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One entry per check, in order.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// `true` when every check passed.
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome.is_ok())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match &c.outcome {
                Ok(()) => writeln!(f, "  ok    {}", c.name)?,
                Err(e) => writeln!(f, "  FAIL  {}: {e}", c.name)?,
            }
        }
        let passed = self.checks.iter().filter(|c| c.outcome.is_ok()).count();
        writeln!(
            f,
            "conformance: {passed} passed, {} failed",
            self.checks.len() - passed
        )
    }
}

type Check = fn(&dyn MemoryManager, &Context) -> Result<(), String>;

const CHECKS: &[(&str, Check)] = &[
    ("initialize_is_idempotent", initialize_is_idempotent),
    ("sizes_and_alignment", sizes_and_alignment),
    ("zero_size", zero_size),
    ("data_round_trip", data_round_trip),
    ("stream_ordered_round_trip", stream_ordered_round_trip),
    ("views", views),
    ("drop_returns_memory", drop_returns_memory),
    ("memory_info", memory_info),
    ("ipc_handle", ipc_handle),
    ("defer_guard", defer_guard),
    ("host_memory", host_memory),
    ("managed_memory", managed_memory),
    ("many_threads", many_threads),
    ("reset", reset),
];

/// Runs every check against `manager`, which serves `ctx`.
pub fn run(manager: &dyn MemoryManager, ctx: &Context) -> Report {
    Report {
        checks: CHECKS
            .iter()
            .map(|&(name, check)| run_one(name, check, manager, ctx))
            .collect(),
    }
}

/// The names of the checks, in the order [`run`] runs them (for running each alone
/// with [`run_check`], as a fault sweep does).
pub fn check_names() -> impl Iterator<Item = &'static str> {
    CHECKS.iter().map(|&(name, _)| name)
}

/// Runs the check `name` (one of [`check_names`]) alone against `manager`, which
/// serves `ctx`; `None` when there is no such check.
pub fn run_check(manager: &dyn MemoryManager, ctx: &Context, name: &str) -> Option<CheckResult> {
    let &(name, check) = CHECKS.iter().find(|(n, _)| *n == name)?;
    Some(run_one(name, check, manager, ctx))
}

fn run_one(
    name: &'static str,
    check: Check,
    manager: &dyn MemoryManager,
    ctx: &Context,
) -> CheckResult {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(manager, ctx)))
        .unwrap_or_else(|_| Err("the check panicked".to_owned()));
    CheckResult { name, outcome }
}

fn e2s(e: impl fmt::Display) -> String {
    e.to_string()
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_read(ctx: &Context, ptr: u64, data: &[u8]) -> Result<(), String> {
    // SAFETY: callers pass memory of at least `data.len()` bytes from the manager.
    unsafe { memory::copy_htod(ctx, ptr, data) }.map_err(e2s)?;
    let mut back = vec![0u8; data.len()];
    // SAFETY: as above.
    unsafe { memory::copy_dtoh(ctx, &mut back, ptr) }.map_err(e2s)?;
    if back != data {
        let at = back.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "read back differs from what was written at byte {at} of {}",
            data.len()
        ));
    }
    Ok(())
}

fn initialize_is_idempotent(m: &dyn MemoryManager, _: &Context) -> Result<(), String> {
    m.initialize().map_err(e2s)?;
    m.initialize().map_err(e2s)?;
    if m.interface_version() != crate::INTERFACE_VERSION {
        return Err(format!(
            "interface_version {} (expected {})",
            m.interface_version(),
            crate::INTERFACE_VERSION
        ));
    }
    Ok(())
}

fn sizes_and_alignment(m: &dyn MemoryManager, _: &Context) -> Result<(), String> {
    let sizes = [
        1usize,
        7,
        255,
        256,
        257,
        4097,
        65_536,
        1 << 20,
        (33 << 20) + 5,
    ];
    let mut live = Vec::new();
    for &s in &sizes {
        let a = m.memalloc(s).map_err(|e| format!("memalloc({s}): {e}"))?;
        if a.size() != s {
            return Err(format!("memalloc({s}) returned {} bytes", a.size()));
        }
        if a.ptr() % 256 != 0 {
            return Err(format!(
                "memalloc({s}) returned {:#x}, not 256-byte aligned",
                a.ptr()
            ));
        }
        live.push(a);
    }
    let mut ranges: Vec<(u64, u64)> = live
        .iter()
        .map(|a| (a.ptr(), a.ptr() + a.size() as u64))
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(format!(
                "live allocations overlap: {:#x?} and {:#x?}",
                w[0], w[1]
            ));
        }
    }
    Ok(())
}

fn zero_size(m: &dyn MemoryManager, _: &Context) -> Result<(), String> {
    match m.memalloc(0) {
        Ok(a) if a.size() == 0 => Ok(()),
        Ok(a) => Err(format!("memalloc(0) returned {} bytes", a.size())),
        Err(e) => Err(format!("memalloc(0) failed: {e}")),
    }
}

fn data_round_trip(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    for (i, &s) in [1usize, 1000, 65_536, 3 << 20].iter().enumerate() {
        let a = m.memalloc(s).map_err(e2s)?;
        write_read(ctx, a.ptr(), &pattern(i as u64 + 11, s))?;
    }
    Ok(())
}

fn stream_ordered_round_trip(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let stream = Stream::new(ctx).map_err(e2s)?;
    for (i, &s) in [64usize, 4096, 1 << 20].iter().enumerate() {
        let a = m.memalloc_async(s, stream.raw()).map_err(e2s)?;
        if a.stream() != stream.raw() {
            return Err("memalloc_async did not remember its stream".into());
        }
        let data = pattern(i as u64 + 99, s);
        let mut back = vec![0u8; s];
        // SAFETY: `a` holds `s` bytes; host buffers outlive the synchronize below.
        unsafe {
            memory::copy_htod_async(a.ptr(), data.as_ptr(), s, &stream).map_err(e2s)?;
            memory::copy_dtoh_async(back.as_mut_ptr(), a.ptr(), s, &stream).map_err(e2s)?;
        }
        stream.synchronize().map_err(e2s)?;
        if back != data {
            return Err(format!("stream-ordered round trip of {s} bytes differs"));
        }
    }
    Ok(())
}

fn views(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let a = m.memalloc(4096).map_err(e2s)?;
    write_read(ctx, a.ptr(), &[0u8; 4096])?;
    let v = a.view(1000, 100).map_err(e2s)?;
    write_read(ctx, v.ptr(), &[0xAB; 100])?;
    let mut whole = vec![0u8; 4096];
    // SAFETY: `a` holds 4096 bytes.
    unsafe { memory::copy_dtoh(ctx, &mut whole, a.ptr()) }.map_err(e2s)?;
    let changed: Vec<usize> = whole
        .iter()
        .enumerate()
        .filter(|(_, &b)| b != 0)
        .map(|(i, _)| i)
        .collect();
    if changed.first() != Some(&1000) || changed.last() != Some(&1099) || changed.len() != 100 {
        return Err(format!(
            "writing through a view changed bytes {:?}..{:?}",
            changed.first(),
            changed.last()
        ));
    }
    match a.view(4000, 200) {
        Err(EmmError::OutOfRange { .. }) => Ok(()),
        other => Err(format!("a view past the end gave {other:?}")),
    }
}

fn drop_returns_memory(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let (free, _) = ctx.mem_info().map_err(e2s)?;
    let chunk = (free / 8).clamp(1 << 20, 4 << 30);
    // 12 rounds of 3 chunks each (~4.5x free memory in total): only possible if
    // dropped memory goes back.
    for round in 0..12 {
        let held: Vec<_> = (0..3)
            .map(|_| m.memalloc(chunk))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("round {round}: {e}"))?;
        drop(held);
    }
    Ok(())
}

fn memory_info(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    match m.get_memory_info() {
        Ok(info) => {
            let total = ctx.device().total_memory().map_err(e2s)?;
            if info.total != total || info.free > info.total {
                return Err(format!("memory info {info:?} vs device total {total}"));
            }
            Ok(())
        }
        Err(EmmError::Unsupported { .. }) => Ok(()),
        Err(e) => Err(format!("get_memory_info: {e}")),
    }
}

fn ipc_handle(m: &dyn MemoryManager, _: &Context) -> Result<(), String> {
    let a = m.memalloc(1 << 20).map_err(e2s)?;
    let v = a.view(4096, 8192).map_err(e2s)?;
    match m.get_ipc_handle(v) {
        Ok(h) => {
            if h.size() != 8192 {
                return Err(format!("handle size {} (expected 8192)", h.size()));
            }
            let back = crate::IpcHandle::from_bytes(&h.to_bytes()).map_err(e2s)?;
            if back != h {
                return Err("handle did not round-trip through bytes".into());
            }
            Ok(())
        }
        Err(EmmError::Unsupported { .. }) => Ok(()),
        Err(e) => Err(format!("get_ipc_handle: {e}")),
    }
}

fn defer_guard(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let outer = m.defer_cleanup();
    {
        let _inner = m.defer_cleanup();
        for i in 0..32 {
            let a = m.memalloc(4096 + i).map_err(e2s)?;
            write_read(ctx, a.ptr(), &pattern(i as u64, 64))?;
        }
    }
    drop(outer);
    let a = m.memalloc(1 << 20).map_err(e2s)?;
    write_read(ctx, a.ptr(), &pattern(5, 1 << 20))
}

fn host_memory(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let n = 1 << 16;
    let data = pattern(77, n);
    let dev = m.memalloc(n).map_err(e2s)?;
    // Pinned, not mapped: a host buffer the copy engine reads directly.
    let pinned = m
        .memhostalloc(
            n,
            HostAllocFlags {
                portable: true,
                ..Default::default()
            },
        )
        .map_err(e2s)?;
    if pinned.device_ptr().is_some() {
        return Err("unmapped memhostalloc returned a device pointer".into());
    }
    // SAFETY: the manager gave `n` writable bytes at host_ptr.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), pinned.host_ptr(), n) };
    // SAFETY: `dev` holds n bytes; the pinned buffer n bytes.
    unsafe {
        memory::copy_htod(
            ctx,
            dev.ptr(),
            core::slice::from_raw_parts(pinned.host_ptr(), n),
        )
    }
    .map_err(e2s)?;
    write_read(ctx, dev.ptr(), &data)?;
    // Mapped: the device reads the host bytes through its own address.
    let mapped = m
        .memhostalloc(
            n,
            HostAllocFlags {
                mapped: true,
                ..Default::default()
            },
        )
        .map_err(e2s)?;
    let dptr = mapped
        .device_ptr()
        .ok_or("mapped memhostalloc returned no device pointer")?;
    // SAFETY: n writable bytes.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), mapped.host_ptr(), n) };
    let mut back = vec![0u8; n];
    // SAFETY: `dptr` maps the same n bytes.
    unsafe { memory::copy_dtoh(ctx, &mut back, dptr) }.map_err(e2s)?;
    if back != data {
        return Err("mapped memory read through its device pointer differs".into());
    }
    // mempin: the caller's own buffer, pinned and mapped.
    let mut own = data.clone();
    // SAFETY: `own` outlives `pinned_own` (dropped first, below).
    let pinned_own = unsafe { m.mempin(own.as_mut_ptr(), n, true) }.map_err(e2s)?;
    let dp = pinned_own
        .device_ptr()
        .ok_or("mempin(mapped=true) returned no device pointer")?;
    let mut back2 = vec![0u8; n];
    // SAFETY: `dp` maps `own`'s n bytes.
    unsafe { memory::copy_dtoh(ctx, &mut back2, dp) }.map_err(e2s)?;
    drop(pinned_own);
    if back2 != own {
        return Err("pinned user memory read through its device pointer differs".into());
    }
    // Pinning the same buffer again works once it was unpinned.
    // SAFETY: as above.
    let again =
        unsafe { m.mempin(own.as_mut_ptr(), n, false) }.map_err(|e| format!("re-pinning: {e}"))?;
    drop(again);
    Ok(())
}

/// One managed allocation: the host writes through its address and the device
/// reads it (a copy from the managed address), then the device writes (a memset)
/// and the host reads.
fn managed_round_trip(ctx: &Context, a: &ManagedMemory, seed: u64) -> Result<(), String> {
    let n = a.size();
    let data = pattern(seed, n);
    // The host must not touch managed memory while a kernel runs on a device
    // without concurrent managed access: nothing of ours runs after this.
    ctx.synchronize_keeping_deferred().map_err(e2s)?;
    // SAFETY: the manager gave `n` bytes that the host may write (synchronized).
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), a.host_ptr(), n) };
    let mut back = vec![0u8; n];
    // SAFETY: `a` holds `n` bytes at a device-usable address.
    unsafe { memory::copy_dtoh(ctx, &mut back, a.ptr()) }.map_err(e2s)?;
    if back != data {
        return Err(format!(
            "{n} bytes of managed memory written by the host read back differently through a device copy"
        ));
    }
    // SAFETY: as above.
    unsafe { memory::memset_d8(ctx, a.ptr(), 0xC3, n) }.map_err(e2s)?;
    ctx.synchronize_keeping_deferred().map_err(e2s)?;
    // SAFETY: `n` bytes the host may read now (synchronized).
    let host = unsafe { core::slice::from_raw_parts(a.host_ptr(), n) };
    match host.iter().position(|&b| b != 0xC3) {
        None => Ok(()),
        Some(at) => Err(format!(
            "byte {at} of {n} bytes of managed memory set by the device reads {:#x} on the host (expected 0xc3)",
            host[at]
        )),
    }
}

fn managed_memory(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let device_before = m.stats().allocated_bytes;
    let before = m.managed_stats();
    let mut held: Vec<ManagedMemory> = Vec::new();
    for attach in [ManagedAttach::Global, ManagedAttach::Host] {
        for (i, &s) in [1usize, 4097, 1 << 20].iter().enumerate() {
            let a = match m.memallocmanaged(s, attach) {
                Ok(a) => a,
                // A manager may not serve managed memory; it must say so, typed,
                // from the first request on.
                Err(EmmError::Unsupported { .. }) if held.is_empty() => return Ok(()),
                Err(e) => return Err(format!("memallocmanaged({s}, {attach:?}): {e}")),
            };
            if a.size() != s || a.attach() != attach {
                return Err(format!(
                    "memallocmanaged({s}, {attach:?}) returned {} bytes attached {:?}",
                    a.size(),
                    a.attach()
                ));
            }
            if a.ptr() == 0 || a.ptr() % 256 != 0 {
                return Err(format!(
                    "memallocmanaged({s}) returned {:#x}, not a 256-byte aligned address",
                    a.ptr()
                ));
            }
            managed_round_trip(ctx, &a, 31 + i as u64)?;
            held.push(a);
        }
    }
    let mut ranges: Vec<(u64, u64)> = held
        .iter()
        .map(|a| (a.ptr(), a.ptr() + a.size() as u64))
        .collect();
    ranges.sort();
    if let Some(w) = ranges.windows(2).find(|w| w[0].1 > w[1].0) {
        return Err(format!(
            "live managed allocations overlap: {:#x?} and {:#x?}",
            w[0], w[1]
        ));
    }
    let bytes: usize = held.iter().map(ManagedMemory::size).sum();
    let during = m.managed_stats();
    if during.allocated_bytes < before.allocated_bytes + bytes
        || during.live != before.live + held.len()
        || during.allocations < before.allocations + held.len() as u64
        || during.allocated_bytes_peak < during.allocated_bytes
    {
        return Err(format!(
            "managed stats {during:?} with {} allocations of {bytes} bytes held (before: {before:?})",
            held.len()
        ));
    }
    if m.stats().allocated_bytes != device_before {
        return Err(format!(
            "allocated_bytes went from {device_before} to {} with only managed memory held: managed memory is counted apart",
            m.stats().allocated_bytes
        ));
    }
    // Dropped inside a defer_cleanup guard: freed once the guard is gone.
    {
        let _guard = m.defer_cleanup();
        held.clear();
    }
    let after = m.managed_stats();
    if after.allocated_bytes != before.allocated_bytes
        || after.live != before.live
        || after.pending_bytes != before.pending_bytes
    {
        return Err(format!(
            "managed stats {after:?} after every allocation was dropped (before: {before:?})"
        ));
    }
    match m.memallocmanaged(0, ManagedAttach::Global) {
        Ok(a) if a.size() == 0 => {}
        Ok(a) => return Err(format!("memallocmanaged(0) returned {} bytes", a.size())),
        Err(EmmError::InvalidSize { .. }) => {}
        Err(e) => return Err(format!("memallocmanaged(0) failed untyped: {e}")),
    }
    match m.memallocmanaged(usize::MAX, ManagedAttach::Global) {
        Err(e) if e.is_out_of_memory() || matches!(e, EmmError::InvalidSize { .. }) => {}
        Err(e) => return Err(format!("memallocmanaged(usize::MAX): {e}")),
        Ok(a) => return Err(format!("memallocmanaged(usize::MAX) returned {a:?}")),
    }
    Ok(())
}

fn many_threads(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                s.spawn(move || -> Result<(), String> {
                    ctx.set_current().map_err(e2s)?;
                    let stream = Stream::new(ctx).map_err(e2s)?;
                    for i in 0..100u64 {
                        let size = 256 + ((t * 7919 + i * 104_729) % 200_000) as usize;
                        let a = m.memalloc_async(size, stream.raw()).map_err(e2s)?;
                        let word = (t << 16 | i) as u32;
                        // SAFETY: `a` holds at least size/4 words, until synchronize.
                        unsafe { memory::memset_d32_async(a.ptr(), word, size / 4, &stream) }
                            .map_err(e2s)?;
                        let mut back = vec![0u8; size / 4 * 4];
                        // SAFETY: as above; `back` outlives the synchronize.
                        unsafe {
                            memory::copy_dtoh_async(back.as_mut_ptr(), a.ptr(), back.len(), &stream)
                        }
                        .map_err(e2s)?;
                        stream.synchronize().map_err(e2s)?;
                        if !back.chunks_exact(4).all(|w| w == word.to_le_bytes()) {
                            return Err(format!(
                                "thread {t} iteration {i}: block of {size} bytes was overwritten"
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("thread panicked".into()))
                    .err()
            })
            .collect()
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn reset(m: &dyn MemoryManager, ctx: &Context) -> Result<(), String> {
    let held = m.memalloc(1 << 20).map_err(e2s)?;
    // Managed memory held across the reset too, where the manager serves it.
    let held_managed = match m.memallocmanaged(1 << 16, ManagedAttach::Global) {
        Ok(a) => Some(a),
        Err(EmmError::Unsupported { .. }) => None,
        Err(e) => return Err(format!("memallocmanaged before reset: {e}")),
    };
    m.reset().map_err(|e| format!("reset: {e}"))?;
    drop(held_managed); // invalidated: dropping must do nothing harmful
    let fresh = m
        .memalloc(1 << 20)
        .map_err(|e| format!("memalloc after reset: {e}"))?;
    write_read(ctx, fresh.ptr(), &pattern(3, 1 << 20))?;
    drop(held); // invalidated: dropping must do nothing harmful
    write_read(ctx, fresh.ptr(), &pattern(4, 1 << 20))?;
    Ok(())
}

/// The environment variable through which [`run_child_test`] passes an IPC handle.
pub const CHILD_HANDLE_ENV: &str = "EMM_TEST_IPC_HANDLE";

/// For cross-process IPC tests: runs the test `name` of the current test binary in
/// a child process, with `handle` (as hex) in [`CHILD_HANDLE_ENV`]. Returns the
/// child's output when it passed, or its output as the error.
pub fn run_child_test(name: &str, handle: &crate::IpcHandle) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))?;
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            name,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_HANDLE_ENV, handle.to_hex())
        .output()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() && text.contains("1 passed") {
        Ok(text)
    } else {
        Err(text)
    }
}

/// In the child started by [`run_child_test`]: the handle it was given, or `None`
/// when the test runs on its own (then it has nothing to do).
pub fn child_handle() -> Option<Result<crate::IpcHandle, crate::EmmError>> {
    std::env::var(CHILD_HANDLE_ENV)
        .ok()
        .map(|h| crate::IpcHandle::from_hex(&h))
}
