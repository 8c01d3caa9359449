//! The soak test's engine (issue 36 item 5), shared by `crates/emm/tests/soak.rs`
//! (the three managers through the façade) and `crates/emm-capi/tests/soak.rs`
//! (the C ABI), which include this file.
//!
//! Phases of random churn from several threads over a [`Device`] (the stand-in
//! driver, or a GPU: `crates/emm/tests/soak_gpu.rs`): blocks of mixed sizes
//! allocated and freed on a few streams (plain and stream ordered), patterns
//! written into both ends of every block and checked before it is freed, trims
//! from any thread, streams replaced between phases, and the device's free memory
//! cut down now and then (a limit: allocations then fail with a typed
//! out-of-memory error, and the managers' out-of-memory paths run). After every
//! phase: no two live blocks overlap, every live block's pattern is intact, and
//! the counters add up (the manager's allocated bytes cover the live blocks, the
//! device holds at least as much). Every few phases, and at the end, everything
//! is freed and trimmed: the manager then reports nothing allocated and the
//! device holds what the manager reserves (the stand-in exactly; a GPU within
//! [`Device::slack`]); once the manager is gone, the device is back where it
//! started.
//!
//! Seeded and reproducible: the seed is printed (`EMM_SOAK_SEED` replays it).
//! Each thread's sequence of operations is a function of the seed, the phase and
//! the thread; how the threads interleave is up to the scheduler. The length is
//! `EMM_SOAK_SECS` seconds per target (a short default for CI).

#![allow(dead_code)] // each including test file uses its own part

use std::time::{Duration, Instant};

use emm_driver::{memory, Context, Stream};
use emm_sys::{CUstream, StandIn};

/// The device under the manager, as the soak measures and limits it.
pub trait Device {
    /// Bytes the device holds beyond what it held before the manager was made.
    fn held(&self) -> u64;
    /// Leaves about `room` bytes of the device free until [`Device::unlimit`];
    /// whether the limit is in place (a ballast the device refused is none).
    fn limit(&mut self, room: u64) -> bool;
    /// Ends [`Device::limit`].
    fn unlimit(&mut self);
    /// How far [`Device::held`] may stray from the manager's reserved bytes
    /// after a drain (0: exactly).
    fn slack(&self) -> u64;
}

/// The stand-in: exact counts, and a limit by lowering its capacity.
pub struct StandInDevice<'a> {
    pub s: &'a StandIn<'a>,
    /// The stand-in's live bytes before the manager was made.
    pub base: u64,
}

impl Device for StandInDevice<'_> {
    fn held(&self) -> u64 {
        self.s
            .control("live_bytes")
            .unwrap_or(0)
            .saturating_sub(self.base)
    }
    fn limit(&mut self, room: u64) -> bool {
        let used = self.s.control("used_bytes").unwrap_or(0);
        self.s
            .control(&format!("capacity {}", used + room))
            .unwrap();
        true
    }
    fn unlimit(&mut self) {
        self.s.control("capacity 8G").unwrap();
    }
    fn slack(&self) -> u64 {
        0
    }
}

/// A GPU: what `cuMemGetInfo` says is used, and a limit by a ballast buffer
/// that takes all but `room` of the free memory (the device really runs out).
pub struct GpuDevice {
    pub ctx: Context,
    /// Used bytes before the manager was made.
    pub base: u64,
    pub ballast: Option<memory::DeviceBuffer>,
}

impl GpuDevice {
    /// The device of `ctx`, with what it uses now as the base.
    pub fn new(ctx: &Context) -> GpuDevice {
        let mut d = GpuDevice {
            ctx: ctx.clone(),
            base: 0,
            ballast: None,
        };
        d.base = d.used();
        d
    }
    fn used(&self) -> u64 {
        let (free, total) = self.ctx.mem_info().unwrap_or((0, 0));
        (total - free) as u64
    }
}

impl Device for GpuDevice {
    fn held(&self) -> u64 {
        self.used().saturating_sub(self.base)
    }
    fn limit(&mut self, room: u64) -> bool {
        let free = match self.ctx.mem_info() {
            Ok((free, _)) => free,
            Err(e) => {
                println!("soak: no limit this phase: cuMemGetInfo failed: {e}");
                return false;
            }
        };
        // The driver keeps some memory for itself: leave `room` plus a margin.
        let take = (free as u64).saturating_sub(room + (64 << 20)) & !((2 << 20) - 1);
        if take == 0 {
            return true; // no more than that is free already
        }
        self.ballast = match memory::DeviceBuffer::new(&self.ctx, take as usize) {
            Ok(b) => Some(b),
            Err(e) => {
                // (Under compute-sanitizer, which keeps device memory of its own,
                // a ballast of nearly all that is free can be refused.)
                println!("soak: no ballast of {take} bytes this phase: {e}");
                None
            }
        };
        self.ballast.is_some()
    }
    fn unlimit(&mut self) {
        self.ballast = None;
    }
    fn slack(&self) -> u64 {
        // Streams, events and the driver's own bookkeeping come and go in 2 MiB
        // pages beside the manager's memory.
        64 << 20
    }
}
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// What the soak drives: a manager through the façade or the C ABI.
pub trait Target: Sync {
    /// Allocates `size` bytes on `stream` (null: a plain allocation); the address.
    fn alloc(&self, size: usize, stream: CUstream) -> Result<u64, String>;
    /// Frees the block at `ptr` (allocated with `size` bytes on `stream`).
    fn free(&self, ptr: u64, size: usize, stream: CUstream) -> Result<(), String>;
    /// Gives cached memory back.
    fn trim(&self) -> Result<(), String>;
    /// `(allocated, reserved)` bytes as the manager reports them.
    fn bytes(&self) -> Result<(u64, u64), String>;
}

/// The soak's length and seed, from the environment.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Seconds per target.
    pub secs: u64,
    /// The seed.
    pub seed: u64,
    /// Threads of churn.
    pub threads: usize,
}

impl Config {
    /// `EMM_SOAK_SECS` (default `default_secs`), `EMM_SOAK_SEED` (default: from
    /// the clock), `EMM_SOAK_THREADS` (default 4). Prints what it uses.
    pub fn from_env(default_secs: u64) -> Config {
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let seed = var("EMM_SOAK_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        let c = Config {
            secs: var("EMM_SOAK_SECS").unwrap_or(default_secs),
            seed,
            threads: var("EMM_SOAK_THREADS").unwrap_or(4).max(1) as usize,
        };
        println!(
            "soak: seed {} ({} s per target, {} threads; EMM_SOAK_SEED={} replays it)",
            c.seed, c.secs, c.threads, c.seed
        );
        c
    }
}

/// A deterministic RNG for `(seed, a, b)`.
fn rng(seed: u64, a: u64, b: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&a.to_le_bytes());
    bytes[16..24].copy_from_slice(&b.to_le_bytes());
    bytes[24..].copy_from_slice(b"emm-soak");
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// A live block: address, size, stream slot, pattern tag.
#[derive(Debug, Clone, Copy)]
struct Live {
    ptr: u64,
    size: usize,
    slot: usize,
    tag: u64,
}

/// Bytes written at each end of a block.
const WINDOW: usize = 192;

fn windows(b: &Live) -> Vec<(u64, Vec<u8>)> {
    let n = b.size.min(WINDOW);
    let mut w = vec![(b.ptr, n)];
    if b.size > WINDOW {
        let at = b.size - n.min(b.size - WINDOW);
        w.push((b.ptr + at as u64, b.size - at));
    }
    w.into_iter()
        .enumerate()
        .map(|(j, (at, len))| {
            let data = (0..len)
                .map(|i| (b.tag.wrapping_mul(31) ^ (i as u64 * 7 + j as u64 * 131)) as u8)
                .collect();
            (at, data)
        })
        .collect()
}

fn fill(ctx: &Context, b: &Live) -> Result<(), String> {
    for (at, data) in windows(b) {
        // SAFETY: the window lies within the live block `b`.
        unsafe { memory::copy_htod(ctx, at, &data) }.map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn verify(ctx: &Context, b: &Live) -> Result<(), String> {
    for (at, data) in windows(b) {
        let mut back = vec![0u8; data.len()];
        // SAFETY: the window lies within the live block `b`.
        unsafe { memory::copy_dtoh(ctx, &mut back, at) }.map_err(|e| e.to_string())?;
        if back != data {
            return Err(format!(
                "block {:#x} ({} bytes): {} bytes at {at:#x} changed",
                b.ptr,
                b.size,
                data.len()
            ));
        }
    }
    Ok(())
}

fn no_overlap(all: &[Live]) -> Result<(), String> {
    let mut r: Vec<(u64, u64)> = all.iter().map(|b| (b.ptr, b.ptr + b.size as u64)).collect();
    r.sort_unstable();
    match r.windows(2).find(|w| w[0].1 > w[1].0) {
        Some(w) => Err(format!(
            "live blocks overlap: {:#x?} and {:#x?}",
            w[0], w[1]
        )),
        None => Ok(()),
    }
}

/// Whether `e` says the device (or the limit) is out of memory: the typed
/// refusal a limit causes.
fn is_oom(e: &str) -> bool {
    let e = e.to_lowercase();
    e.contains("out of") && e.contains("memory")
}

/// A size: mostly small, some medium, a few large.
fn size(r: &mut TestRng) -> usize {
    let k = r.next_u64() % 100;
    let v = r.next_u64();
    match k {
        0..=49 => 1 + (v % (64 << 10)) as usize,
        50..=89 => (64 << 10) + (v % (4 << 20)) as usize,
        _ => (4 << 20) + (v % (20 << 20)) as usize,
    }
}

/// What one soak did.
#[derive(Debug, Default)]
pub struct Report {
    pub phases: u64,
    pub allocs: u64,
    pub frees: u64,
    pub refused: u64,
    pub trims: u64,
    pub drains: u64,
    pub streams_replaced: u64,
    /// Phases run under a limit that was in place.
    pub limits: u64,
    /// Phases meant to run under a limit the device could not set (no ballast).
    pub limits_missed: u64,
}

/// Streams the threads allocate on: slot 0 is the legacy default stream, the
/// others are created streams, replaced now and then.
struct Streams(Vec<Option<Stream>>);

impl Streams {
    fn raw(&self, slot: usize) -> CUstream {
        match &self.0[slot] {
            Some(s) => s.raw(),
            None => CUstream(std::ptr::null_mut()),
        }
    }
}

const SLOTS: usize = 4;

/// One thread's churn for a phase over its own blocks; `Err` stops the soak.
#[allow(clippy::too_many_arguments)]
fn churn(
    target: &dyn Target,
    ctx: &Context,
    streams: &Streams,
    mine: &mut Vec<Live>,
    r: &mut TestRng,
    ops: usize,
    report: &mut Report,
) -> Result<(), String> {
    for _ in 0..ops {
        match r.next_u64() % 100 {
            0..=47 if mine.len() < 48 => {
                let n = size(r);
                let slot = (r.next_u64() % SLOTS as u64) as usize;
                match target.alloc(n, streams.raw(slot)) {
                    Ok(ptr) => {
                        let b = Live {
                            ptr,
                            size: n,
                            slot,
                            tag: r.next_u64(),
                        };
                        if slot != 0 {
                            // Ordered on its stream: wait before the host writes.
                            if let Some(s) = &streams.0[slot] {
                                s.synchronize().map_err(|e| e.to_string())?;
                            }
                        }
                        fill(ctx, &b)?;
                        mine.push(b);
                        report.allocs += 1;
                    }
                    Err(e) if is_oom(&e) => report.refused += 1,
                    Err(e) => return Err(format!("allocating {n} bytes: {e}")),
                }
            }
            0..=84 if !mine.is_empty() => {
                let i = (r.next_u64() % mine.len() as u64) as usize;
                let b = mine.swap_remove(i);
                verify(ctx, &b)?;
                target.free(b.ptr, b.size, streams.raw(b.slot))?;
                report.frees += 1;
            }
            85..=92 if !mine.is_empty() => {
                let i = (r.next_u64() % mine.len() as u64) as usize;
                verify(ctx, &mine[i])?;
            }
            93..=95 => {
                target.trim()?;
                report.trims += 1;
            }
            _ => {
                let slot = 1 + (r.next_u64() % (SLOTS as u64 - 1)) as usize;
                if let Some(s) = &streams.0[slot] {
                    s.synchronize().map_err(|e| e.to_string())?;
                }
            }
        }
    }
    Ok(())
}

/// Frees every block of `lives` (checking it first).
fn free_all(
    target: &dyn Target,
    ctx: &Context,
    streams: &Streams,
    lives: &mut [Vec<Live>],
    pred: impl Fn(&Live) -> bool,
    report: &mut Report,
) -> Result<(), String> {
    for mine in lives.iter_mut() {
        let (gone, keep): (Vec<Live>, Vec<Live>) = mine.drain(..).partition(|b| pred(b));
        *mine = keep;
        for b in gone {
            verify(ctx, &b)?;
            target.free(b.ptr, b.size, streams.raw(b.slot))?;
            report.frees += 1;
        }
    }
    Ok(())
}

/// Soaks `target` (a fresh manager whose memory `device` serves in `ctx`) for
/// `cfg.secs` seconds. Returns what it did, or the first broken invariant (with
/// the phase and the seed).
pub fn soak(
    label: &str,
    target: &dyn Target,
    ctx: &Context,
    device: &mut dyn Device,
    cfg: Config,
) -> Result<Report, String> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(cfg.secs);
    let mut report = Report::default();
    let mut streams = Streams(
        (0..SLOTS)
            .map(|i| (i > 0).then(|| Stream::new(ctx).expect("a stream")))
            .collect(),
    );
    let mut lives: Vec<Vec<Live>> = vec![Vec::new(); cfg.threads];
    let mut phase = 0u64;
    let err = |phase: u64, e: String| format!("{label}, phase {phase} (seed {}): {e}", cfg.seed);
    loop {
        let mut pr = rng(cfg.seed, 0, phase);
        // A limit now and then: the device's capacity a little above what it
        // holds, so that some allocations fail for lack of memory.
        let limited = pr.next_u64() % 4 == 0;
        if limited {
            let room = (pr.next_u64() % (48 << 20)) + (1 << 20);
            if device.limit(room) {
                report.limits += 1;
            } else {
                report.limits_missed += 1;
            }
        }
        let ops = 40 + (pr.next_u64() % 80) as usize;
        let results: Vec<(Vec<Live>, Report, Result<(), String>)> = std::thread::scope(|sc| {
            let handles: Vec<_> = std::mem::take(&mut lives)
                .into_iter()
                .enumerate()
                .map(|(t, mut mine)| {
                    let streams = &streams;
                    sc.spawn(move || {
                        let mut r = rng(cfg.seed, 1 + t as u64, phase);
                        let mut rep = Report::default();
                        let res = churn(target, ctx, streams, &mut mine, &mut r, ops, &mut rep);
                        (mine, rep, res)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (
                            Vec::new(),
                            Report::default(),
                            Err("a thread panicked".into()),
                        )
                    })
                })
                .collect()
        });
        if limited {
            device.unlimit();
        }
        for (mine, rep, res) in results {
            lives.push(mine);
            report.allocs += rep.allocs;
            report.frees += rep.frees;
            report.refused += rep.refused;
            report.trims += rep.trims;
            res.map_err(|e| err(phase, e))?;
        }
        // Invariants after the phase.
        let all: Vec<Live> = lives.iter().flatten().copied().collect();
        no_overlap(&all).map_err(|e| err(phase, e))?;
        for b in &all {
            verify(ctx, b).map_err(|e| err(phase, e))?;
        }
        let live_bytes: u64 = all.iter().map(|b| b.size as u64).sum();
        let (allocated, _) = target.bytes().map_err(|e| err(phase, e))?;
        let held = device.held();
        if allocated < live_bytes || held + device.slack() < live_bytes {
            return Err(err(
                phase,
                format!(
                    "{} live blocks of {live_bytes} bytes, the manager reports {allocated} allocated, the device holds {held}",
                    all.len(),
                ),
            ));
        }
        // Streams churn: one created stream replaced, its blocks freed first.
        if pr.next_u64() % 3 == 0 {
            let slot = 1 + (pr.next_u64() % (SLOTS as u64 - 1)) as usize;
            free_all(
                target,
                ctx,
                &streams,
                &mut lives,
                |b| b.slot == slot,
                &mut report,
            )
            .map_err(|e| err(phase, e))?;
            if let Some(old) = streams.0[slot].take() {
                old.synchronize().map_err(|e| err(phase, e.to_string()))?;
            }
            streams.0[slot] = Some(Stream::new(ctx).map_err(|e| err(phase, e.to_string()))?);
            report.streams_replaced += 1;
        }
        let last = Instant::now() >= deadline;
        if last || phase % 6 == 5 {
            drain(target, ctx, &*device, &streams, &mut lives, &mut report)
                .map_err(|e| err(phase, e))?;
        }
        phase += 1;
        report.phases = phase;
        if last {
            break;
        }
    }
    println!(
        "soak {label}: {:.1} s, {report:?}",
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

/// Frees everything, synchronizes and trims: nothing allocated, and the device
/// holds what the manager reserves (within [`Device::slack`]).
fn drain(
    target: &dyn Target,
    ctx: &Context,
    device: &dyn Device,
    streams: &Streams,
    lives: &mut [Vec<Live>],
    report: &mut Report,
) -> Result<(), String> {
    free_all(target, ctx, streams, lives, |_| true, report)?;
    ctx.synchronize().map_err(|e| e.to_string())?;
    target.trim()?;
    let (allocated, reserved) = target.bytes()?;
    let held = device.held();
    if allocated != 0 || held.abs_diff(reserved) > device.slack() {
        return Err(format!(
            "after freeing everything and a trim the manager reports {allocated} allocated and {reserved} reserved, the device holds {held} (allowed to differ by {})",
            device.slack()
        ));
    }
    report.drains += 1;
    Ok(())
}
