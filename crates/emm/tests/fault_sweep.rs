//! Exhaustive fault injection into the conformance checks, on `emm-standin` (the
//! stand-in driver: host memory, no GPU): for each manager and each check, a run
//! counts the check's driver calls, then the check runs again failing the k-th call
//! for every k, for each kind of fault (out of memory, a failed free or unmap, a
//! lost context, a failed event call; see `common/sweep.rs`). After every run:
//!
//! - no panic anywhere (a check's outcome is its own business: a typed error or
//!   success), and no data corruption reported by the check;
//! - blocks held across the fault keep their data;
//! - the manager works again: new blocks of several sizes, plain and
//!   stream-ordered, overlap neither each other nor the held ones, and read back
//!   what was written;
//! - nothing leaked: after the manager's own cleanup (`release_cached`) the
//!   stand-in's live bytes equal the manager's reserved bytes, none allocated;
//!   once the manager is gone every stand-in resource is back where it was, and
//!   nothing was freed twice.
//!
//! The output gives each scenario's call counts, the number of injected faults, and
//! which positions were sampled rather than exhausted (`EMM_FAULT_SWEEP_MAX_K`).

mod common;

use std::time::Instant;

use common::managers::manager;
use common::sweep::{max_k, sweep, Kind, Probe, Tally};
use common::{fixture, snapshot, Fixture};

use emm::core::conformance;
use emm::{DeviceAllocation, MemoryManager, Stream};
use emm_driver::memory;

/// Positions tried per check and kind in CI (see `EMM_FAULT_SWEEP_MAX_K`).
const CI_MAX_K: u64 = 10;

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Bytes written at each end of a block (the whole block when smaller): enough to
/// see a block handed out twice, cheap enough for thousands of runs.
const WINDOW: usize = 4096;

/// The windows of `a` that [`fill`] writes: `(offset, bytes)`.
fn windows(a: &DeviceAllocation, seed: u64) -> Vec<(usize, Vec<u8>)> {
    let n = a.size();
    let mut w = vec![(0, n.min(WINDOW))];
    if n > WINDOW {
        let tail = (n - WINDOW).max(WINDOW);
        w.push((tail, n - tail));
    }
    w.into_iter()
        .enumerate()
        .map(|(j, (at, len))| {
            let data = (0..len)
                .map(|i| (i as u64 * 131 + seed * 7 + j as u64 * 3) as u8)
                .collect();
            (at, data)
        })
        .collect()
}

/// Writes a pattern of `seed` at both ends of `a`.
fn fill(ctx: &emm::Context, a: &DeviceAllocation, seed: u64) -> Result<(), String> {
    for (at, data) in windows(a, seed) {
        // SAFETY: the window lies within `a`.
        unsafe { memory::copy_htod(ctx, a.ptr() + at as u64, &data) }.map_err(e2s)?;
    }
    Ok(())
}

/// Reads both ends of `a` back and compares them with what [`fill`] wrote.
fn verify(ctx: &emm::Context, a: &DeviceAllocation, seed: u64) -> Result<(), String> {
    for (at, data) in windows(a, seed) {
        let mut back = vec![0u8; data.len()];
        // SAFETY: the window lies within `a`.
        unsafe { memory::copy_dtoh(ctx, &mut back, a.ptr() + at as u64) }.map_err(e2s)?;
        if back != data {
            return Err(format!(
                "{} bytes at {:#x} (+{at}) read back differently",
                data.len(),
                a.ptr()
            ));
        }
    }
    Ok(())
}

/// Fails when two of `blocks` overlap.
fn no_overlap(blocks: &[&DeviceAllocation]) -> Result<(), String> {
    let mut r: Vec<(u64, u64)> = blocks
        .iter()
        .filter(|a| a.size() > 0)
        .map(|a| (a.ptr(), a.ptr() + a.size() as u64))
        .collect();
    r.sort();
    match r.windows(2).find(|w| w[0].1 > w[1].0) {
        Some(w) => Err(format!(
            "live blocks overlap: {:#x?} and {:#x?}",
            w[0], w[1]
        )),
        None => Ok(()),
    }
}

/// Words of a check's failure that mean corrupted data, not a refused call.
const CORRUPTION: &[&str] = &["differ", "overlap", "overwritten", "panicked"];

/// One run of conformance check `check` on a fresh `name` manager, with the
/// probe's fault, and every invariant checked after it.
fn run(f: &Fixture, name: &str, check: &str, p: &mut Probe<'_>) -> Result<(), String> {
    let before = snapshot(&f.s);
    let ctx = &f.ctx;
    let r = std::thread::scope(|sc| {
        sc.spawn(|| -> Result<(), String> {
            let m = manager(name, ctx);
            let stream = Stream::new(ctx).map_err(e2s)?;
            // Held across the fault (not for `reset`, which invalidates them).
            let mut held = Vec::new();
            if check != "reset" {
                for (i, &n) in [4097usize, 1 << 20, (3 << 20) + 5].iter().enumerate() {
                    let a = if i == 1 {
                        m.memalloc_async(n, stream.raw()).map_err(e2s)?
                    } else {
                        m.memalloc(n).map_err(e2s)?
                    };
                    let seed = i as u64 + 1;
                    fill(ctx, &a, seed)?;
                    verify(ctx, &a, seed)?;
                    held.push((a, seed));
                }
                stream.synchronize().map_err(e2s)?;
            }

            p.arm();
            let outcome = if check == STREAM_POOLS {
                stream_pools_scenario(m.as_ref(), ctx)
            } else {
                conformance::run_check(m.as_ref(), ctx, check)
                    .expect("a check of check_names")
                    .outcome
            };
            p.clear()?;
            // Errors of releases in `Drop` under the fault, kept for the next call
            // to report (a typed outcome, as any other): taken here.
            let _reported = ctx.take_deferred_errors();

            if let Err(e) = &outcome {
                if p.fault().is_none() || CORRUPTION.iter().any(|w| e.contains(w)) {
                    return Err(format!("the check failed: {e}"));
                }
            }
            ctx.synchronize().map_err(|e| format!("synchronize after: {e}"))?;
            for (a, seed) in &held {
                check_held(ctx, a, *seed)?;
            }
            // The manager works again.
            let mut fresh = Vec::new();
            for (i, &n) in [1usize, 4097, 1 << 20, (5 << 20) + 3].iter().enumerate() {
                let a = if i % 2 == 1 {
                    m.memalloc_async(n, stream.raw())
                } else {
                    m.memalloc(n)
                }
                .map_err(|e| format!("allocating {n} bytes after the fault: {e}"))?;
                fresh.push((a, i as u64 + 40));
            }
            let all: Vec<&DeviceAllocation> = held.iter().chain(&fresh).map(|(a, _)| a).collect();
            no_overlap(&all)?;
            for (a, seed) in &fresh {
                fill(ctx, a, *seed)?;
            }
            for (a, seed) in &fresh {
                verify(ctx, a, *seed)?;
            }
            for (a, seed) in &held {
                check_held(ctx, a, *seed)?;
            }
            drop(fresh);
            drop(held);
            drop(stream);
            // The manager's own cleanup; a free that failed under the fault may be
            // reported by the first call after it, the next one succeeds.
            if let Err(first) = m.release_cached() {
                m.release_cached()
                    .map_err(|e| format!("release_cached: {first}, then {e}"))?;
            }
            ctx.synchronize().map_err(e2s)?;
            let (st, managed) = (m.stats(), m.managed_stats());
            let live = f.s.control("live_bytes").unwrap() - before.live.bytes;
            let reported = st.reserved_bytes + managed.allocated_bytes + managed.pending_bytes;
            if st.allocated_bytes != 0 || managed.allocated_bytes != 0 || live != reported as u64 {
                return Err(format!(
                    "after cleanup the stand-in holds {live} bytes, the manager reports {} reserved and {} allocated, managed {managed:?}",
                    st.reserved_bytes, st.allocated_bytes
                ));
            }
            drop(m);
            Ok(())
        })
        .join()
        .unwrap_or_else(|_| Err("panicked".into()))
    });
    r?;
    ctx.synchronize()
        .map_err(|e| format!("an error with no fault planned: {e}"))?;
    let after = snapshot(&f.s);
    let mut streams_aside = snapshot(&f.s);
    streams_aside.live.streams = before.live.streams;
    if after != before && streams_aside == before {
        return Err(format!(
            "{} stream(s) leaked, nothing else",
            after.live.streams - before.live.streams
        ));
    }
    if after != before {
        return Err(format!(
            "with the manager gone, the stand-in's resources went from {before:?} to {after:?}"
        ));
    }
    Ok(())
}

/// The scenario of stream pools, swept as a check of its own.
const STREAM_POOLS: &str = "stream_pools";

/// Large blocks on two created streams (a pool of its own each) and on the
/// null stream, written and read back; the first stream's freed on the
/// second; a trim; large blocks again on both. Any call may fail under the
/// fault: a typed error ends the scenario (the caller checks what is left).
fn stream_pools_scenario(m: &dyn MemoryManager, ctx: &emm::Context) -> Result<(), String> {
    let streams = [
        Stream::new(ctx).map_err(e2s)?,
        Stream::new(ctx).map_err(e2s)?,
    ];
    let mut held = Vec::new();
    for (i, &n) in [(2 << 20) + 9, 6 << 20, (3 << 20) + 1].iter().enumerate() {
        for (j, s) in streams.iter().enumerate() {
            let a = m.memalloc_async(n, s.raw()).map_err(e2s)?;
            let seed = (i * 2 + j) as u64 + 70;
            fill(ctx, &a, seed)?;
            held.push((a, seed));
        }
    }
    let big = m.memalloc(4 << 20).map_err(e2s)?;
    for s in &streams {
        s.synchronize().map_err(e2s)?;
    }
    let all: Vec<&DeviceAllocation> = held.iter().map(|(a, _)| a).chain([&big]).collect();
    no_overlap(&all)?;
    for (a, seed) in &held {
        verify(ctx, a, *seed)?;
    }
    // Stream 0's blocks freed after stream 1's work (record_stream's pattern).
    held.retain(|(a, _)| a.stream() != streams[0].raw());
    m.release_cached().map_err(e2s)?;
    for (j, s) in streams.iter().enumerate() {
        let a = m.memalloc_async(5 << 20, s.raw()).map_err(e2s)?;
        fill(ctx, &a, 90 + j as u64)?;
        held.push((a, 90 + j as u64));
    }
    for s in &streams {
        s.synchronize().map_err(e2s)?;
    }
    for (a, seed) in &held {
        verify(ctx, a, *seed)?;
    }
    drop(big);
    Ok(())
}

fn check_held(ctx: &emm::Context, a: &DeviceAllocation, seed: u64) -> Result<(), String> {
    verify(ctx, a, seed).map_err(|e| format!("a block held across the fault: {e}"))
}

/// Known defects excluded from the sweep: none (those it found, issue 36, are
/// fixed); any failure fails the test.
const KNOWN: &[(&str, Kind, &str, &str)] = &[];

fn sweep_manager(name: &str) {
    let f = fixture();
    let started = Instant::now();
    let cap = max_k(CI_MAX_K);
    let mut tally = Tally {
        known: KNOWN.to_vec(),
        ..Tally::default()
    };
    for check in conformance::check_names() {
        sweep(&format!("{name}/{check}"), f.s, cap, &mut tally, |p| {
            run(&f, name, check, p)
        });
    }
    tally.finish(&format!("conformance on `{name}`"), started);
}

#[test]
fn faults_in_the_conformance_checks_of_default() {
    sweep_manager("default");
}

#[test]
fn faults_in_the_conformance_checks_of_pool() {
    sweep_manager("pool");
}

/// The pool with one shared arena for every stream (`pool_stream_pools` 0):
/// created streams' blocks then share the arena's free sets, events and
/// parked blocks, which stream pools (the default) keep apart.
#[test]
fn faults_in_the_conformance_checks_of_the_shared_pool() {
    sweep_manager("pool-shared");
}

/// Stream pools under every fault of their scenario ([`stream_pools_scenario`]):
/// the pools' making (events, reservations), growth and trim.
#[test]
fn faults_in_stream_pools() {
    let f = fixture();
    let started = Instant::now();
    let mut tally = Tally {
        known: KNOWN.to_vec(),
        ..Tally::default()
    };
    sweep("pool/stream_pools", f.s, max_k(CI_MAX_K), &mut tally, |p| {
        run(&f, "pool", STREAM_POOLS, p)
    });
    tally.finish("stream pools", started);
}

#[test]
fn faults_in_the_conformance_checks_of_hostonly() {
    sweep_manager("hostonly");
}
