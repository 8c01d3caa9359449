//! Replaying a trace through a manager, and scanning one without a manager.
//!
//! Live bytes are summed in `u128`, so no trace can overflow them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use emm_sys::CUstream;

use crate::diagnostics::Diagnostics;
use crate::error::TraceError;
use crate::op::Op;
use crate::peak_map::{Held, PeakMap, PeakWatch};
use crate::sampling::{Sample, Sampler};
use crate::target::{DriverCalls, ReplayTarget};
use crate::trace::Trace;

/// What a pass over a trace alone (no manager) found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Events (allocations and frees).
    pub events: u64,
    /// Allocation requests.
    pub requests: u64,
    /// Peak of live requested bytes.
    pub peak_live_bytes: u128,
    /// Frees of ids that were not live.
    pub unknown_frees: u64,
    /// Allocations of an id that was still live: the earlier allocation is
    /// taken as freed there (a trace that names two live blocks alike is
    /// suspect, so this is counted and reported).
    pub reused_live_ids: u64,
    /// Distinct streams.
    pub streams: u64,
    /// Malformed lines or records.
    pub diagnostics: Diagnostics,
}

/// Live bytes as the trace sees them, and the trace's streams numbered densely.
#[derive(Default)]
struct Books {
    live: HashMap<u64, u64>,
    cur: u128,
    peak: u128,
    unknown: u64,
    reused: u64,
    requests: u64,
    streams: HashMap<u64, u64>,
    zero_seen: bool,
}

impl Books {
    /// Accounts `op`; for an allocation returns the dense stream number (the
    /// trace's stream 0 stays 0; others count up in order of appearance).
    fn apply(&mut self, op: Op) -> Option<u64> {
        match op {
            Op::Alloc { id, size, stream } => {
                if let Some(old) = self.live.insert(id, size) {
                    self.cur = self.cur.saturating_sub(u128::from(old));
                    self.reused += 1;
                }
                self.cur += u128::from(size);
                self.peak = self.peak.max(self.cur);
                self.requests += 1;
                let next = self.streams.len() as u64 + 1;
                let n = if stream == 0 {
                    self.zero_seen = true;
                    0
                } else {
                    *self.streams.entry(stream).or_insert(next)
                };
                Some(n)
            }
            Op::Free { id } => {
                match self.live.remove(&id) {
                    Some(s) => self.cur = self.cur.saturating_sub(u128::from(s)),
                    None => self.unknown += 1,
                }
                None
            }
        }
    }
}

fn no_events(trace: &Trace, d: &Diagnostics) -> TraceError {
    let why = match d.first.first() {
        Some(e) => format!(
            "all {} lines (or records) after the header are malformed; the first: {e}",
            d.bad
        ),
        None => "no allocation after the header".into(),
    };
    TraceError::NoUsableEvent {
        trace: trace.name().to_owned(),
        why,
    }
}

/// Reads `trace` once: counts, peak live bytes and diagnostics. A trace without a
/// single allocation is an error.
pub fn scan(trace: &Trace) -> Result<Summary, TraceError> {
    let mut books = Books::default();
    let mut events = trace.events()?;
    let mut n = 0u64;
    for op in &mut events {
        books.apply(op);
        n += 1;
    }
    let diagnostics = events.finish()?;
    if books.requests == 0 {
        return Err(no_events(trace, &diagnostics));
    }
    Ok(Summary {
        events: n,
        requests: books.requests,
        peak_live_bytes: books.peak,
        unknown_frees: books.unknown,
        reused_live_ids: books.reused,
        streams: books.streams.len() as u64 + u64::from(books.zero_seen),
        diagnostics,
    })
}

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Events in the trace (from [`scan`]), to space the samples; 0 if unknown.
    pub total_events: u64,
    /// About how many samples to take for the curves (0: none).
    pub samples: u64,
    /// How many times to replay the trace back to back through the manager, as
    /// the steps of a long run repeat (0 and 1: once). A pass after the first makes
    /// again what the trace frees, and keeps what it never frees and made in its
    /// first half (weights, optimizer state), which is made once; what it never
    /// frees but made in its second half (the last step's gradients, still live
    /// when the recording stopped) is freed at the end of each pass and made again
    /// in the next. Each `Alloc` event is an allocation of its own, so an id used
    /// again (as a CSV written by another tool may do) is kept only for its last.
    /// Ignored when [`until_steady`](ReplayOptions::until_steady) is set.
    pub passes: u32,
    /// Replay pass after pass, as [`passes`](ReplayOptions::passes) describes, until
    /// the manager's peak reserved bytes hold (see [`SteadyRule`]) instead of a fixed
    /// number of passes; [`ReplayResult::steady`] says why the replay stopped.
    /// `None`: exactly `passes` passes.
    pub until_steady: Option<SteadyRule>,
    /// Take a [`PeakMap`] of the manager's memory at its peak
    /// ([`ReplayResult::peak_map`]). This reads the manager's
    /// counters after every allocation; the time that takes is left out of the
    /// replay's times.
    pub peak_map: bool,
    /// The host stand-in's device clock, moved on by one at every request of the
    /// trace (allocation or free), so that a manager built over it
    /// (`emm::build_host_standin_lagged`) sees its events complete as late as a
    /// GPU running that many requests behind the host would. `None`: no clock.
    pub clock: Option<std::sync::Arc<emm_core::HostClock>>,
}

/// When a replay under [`ReplayOptions::until_steady`] stops: once the manager's
/// peak reserved bytes (from the start of the replay) have not moved for
/// `quiet_passes` passes in a row, or at `max_passes` passes, or when `max_time`
/// has run out, whichever comes first.
///
/// The quiet passes and the cap are checked after each pass. The time is checked
/// after each pass and, from the second pass on, every [`DEADLINE_EVERY`] events
/// within one: the first pass always runs whole (it is the first-pass figure),
/// and a later pass under way when the time runs out is abandoned there, its
/// figures in no [`PassResult`] (see [`ReplayResult::abandoned_events`]). So a
/// replay takes at most its first pass, or `max_time` and a few events, whichever
/// is longer, however slow the manager is on the trace's later passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SteadyRule {
    /// Passes in a row whose peak reserved bytes equal those of the pass before,
    /// after which the footprint is taken as steady (0 reads as 1).
    pub quiet_passes: u32,
    /// The most passes to replay (0 reads as 1).
    pub max_passes: u32,
    /// The most wall time for the whole replay: no pass begins once this much has
    /// passed since the first began, and a pass after the first stops where it
    /// is.
    pub max_time: Duration,
}

/// How many events of a pass after the first run between two readings of the
/// clock for [`SteadyRule::max_time`] (a reading costs tens of nanoseconds; a
/// request to a manager or model, more).
pub const DEADLINE_EVERY: u64 = 64;

impl SteadyRule {
    /// `emm replay`'s rule: 10 quiet passes, at most 100 passes and 60 s.
    pub const DEFAULT: SteadyRule = SteadyRule {
        quiet_passes: 10,
        max_passes: 100,
        max_time: Duration::from_secs(60),
    };
}

impl Default for SteadyRule {
    /// [`SteadyRule::DEFAULT`].
    fn default() -> Self {
        SteadyRule::DEFAULT
    }
}

/// Why a replay under a [`SteadyRule`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SteadyStop {
    /// Peak reserved bytes held for the rule's `quiet_passes` passes in a row.
    Settled,
    /// The rule's `max_passes` passes ran before peak reserved bytes held.
    MaxPasses,
    /// The rule's `max_time` ran out before peak reserved bytes held (after a
    /// pass, or within one: see [`ReplayResult::abandoned_events`]).
    MaxTime,
}

impl SteadyStop {
    /// Whether the footprint settled ([`SteadyStop::Settled`]).
    pub fn settled(self) -> bool {
        self == SteadyStop::Settled
    }
}

/// One pass of a replay (see [`ReplayOptions::passes`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PassResult {
    /// Allocation requests of this pass.
    pub requests: u64,
    /// Requests of this pass that failed.
    pub failures: u64,
    /// Driver calls the manager made during this pass.
    pub driver: DriverCalls,
    /// Peak of live requested bytes from the start of the replay to the end of
    /// this pass. A later pass can hold more than the first when what the trace
    /// keeps (see [`ReplayOptions::passes`]) is live beside steps that ran before
    /// it existed in the recording.
    pub peak_live_bytes: u128,
    /// Peak reserved bytes from the start of the replay to the end of this pass.
    pub peak_reserved_bytes: u64,
    /// Reserved bytes at the end of this pass.
    pub reserved_bytes: u64,
    /// Bytes the manager holds for its callers at the end of this pass (its
    /// `stats()`): what the replay kept and what the trace left live.
    pub allocated_bytes: u64,
    /// Wall time of this pass.
    pub elapsed: Duration,
}

/// What one replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayResult {
    /// Allocation requests replayed, over every pass.
    pub requests: u64,
    /// Peak of live requested bytes, over every pass (see
    /// [`PassResult::peak_live_bytes`]).
    pub peak_live_bytes: u128,
    /// Peak of bytes the manager held from its upstream (its `stats()`).
    pub peak_reserved_bytes: u64,
    /// Upstream allocations the manager made (its `stats()`).
    pub upstream_allocs: u64,
    /// Driver calls for memory the manager made, over every pass (before what is
    /// still held at the end goes back).
    pub driver: DriverCalls,
    /// Wall time of the event loop.
    pub elapsed: Duration,
    /// Requests that failed (out of memory etc.).
    pub failures: u64,
    /// The first failure's message.
    pub first_failure: Option<String>,
    /// Frees of ids that were not live (in one pass of the trace).
    pub unknown_frees: u64,
    /// Live and reserved bytes along the trace (every pass, one after the other).
    pub samples: Vec<Sample>,
    /// Each pass's figures, in order (one entry for a single pass).
    pub passes: Vec<PassResult>,
    /// Why the replay stopped under [`ReplayOptions::until_steady`]; `None` for a
    /// fixed number of passes.
    pub steady: Option<SteadyStop>,
    /// Events of the pass the rule's `max_time` stopped part way (0: none was).
    /// That pass is in no [`PassResult`]; what it did is counted in this result's
    /// own figures (requests, failures, driver calls, peaks, samples, peak map),
    /// as what the manager did during the replay.
    pub abandoned_events: u64,
    /// The manager's memory at its peak (see [`PeakMap`]), with
    /// [`ReplayOptions::peak_map`] (`None` without it, or when its reserved bytes
    /// never rose).
    pub peak_map: Option<PeakMap>,
    /// Where the manager's reserved bytes were at its peak, by what held them
    /// ([`ReplayTarget::peak_slack`]; empty for a manager that does not say).
    pub peak_slack: Vec<(&'static str, u64)>,
}

impl ReplayResult {
    /// The pass (counted from 1) from which peak reserved bytes held their final
    /// value: the last pass that raised them, or 1.
    pub fn peak_reserved_from_pass(&self) -> usize {
        let last = self.passes.last().map_or(0, |p| p.peak_reserved_bytes);
        self.passes
            .iter()
            .position(|p| p.peak_reserved_bytes == last)
            .map_or(1, |i| i + 1)
    }
}

/// Where a replay under a [`SteadyRule`] stands after each pass.
struct Steady {
    rule: SteadyRule,
    /// Passes in a row, up to the last, whose peak reserved equalled the one before.
    quiet: u32,
}

impl Steady {
    /// Whether the replay stops after pass `done` (counted from 1), whose peak
    /// reserved bytes were `peak` against `before` for the pass before, with
    /// `elapsed` since the replay began; and why.
    fn after(
        &mut self,
        done: u32,
        before: Option<u64>,
        peak: u64,
        elapsed: Duration,
    ) -> Option<SteadyStop> {
        if before == Some(peak) {
            self.quiet += 1;
        } else {
            self.quiet = 0;
        }
        if self.quiet >= self.rule.quiet_passes.max(1) {
            Some(SteadyStop::Settled)
        } else if done >= self.rule.max_passes.max(1) {
            Some(SteadyStop::MaxPasses)
        } else if elapsed >= self.rule.max_time {
            Some(SteadyStop::MaxTime)
        } else {
            None
        }
    }
}

/// The allocations a pass after the first keeps from the one before instead of
/// making them again: those the trace never frees and made in its first half
/// (weights, optimizer state). What it never frees but made in its second half is
/// the last step's (gradients the next step's `zero_grad` would free, outside the
/// recording): a pass frees those at its end, so that a later pass does not hold
/// two sets of them. Each `Alloc` event is an allocation of its own, so an id
/// used again (as a CSV written by another tool may do) is kept only for its last.
/// Memory: a map entry per allocation live at the trace's end.
fn pass_plan(trace: &Trace) -> Result<PassPlan, TraceError> {
    let mut live_at_end: HashMap<u64, u64> = HashMap::new();
    let mut n = 0u64;
    let mut events = trace.events()?;
    for op in &mut events {
        match op {
            Op::Alloc { id, .. } => {
                live_at_end.insert(id, n);
            }
            Op::Free { id } => {
                live_at_end.remove(&id);
            }
        }
        n += 1;
    }
    events.finish()?;
    let mut kept: Vec<(u64, u64)> = live_at_end
        .iter()
        .filter(|&(_, &at)| at < n / 2)
        .map(|(&id, &at)| (at, id))
        .collect();
    kept.sort_unstable();
    Ok(PassPlan {
        kept,
        made: live_at_end,
    })
}

/// What [`pass_plan`] found.
#[derive(Default)]
struct PassPlan {
    /// The kept allocations: their events (indices in the trace) and ids, in
    /// trace order.
    kept: Vec<(u64, u64)>,
    /// The event of each allocation live at the trace's end, by id.
    made: HashMap<u64, u64>,
}

impl PassPlan {
    /// Whether the allocation of event `k` is kept.
    fn keeps(&self, k: u64) -> bool {
        self.kept.binary_search_by_key(&k, |&(at, _)| at).is_ok()
    }

    /// Where `id` comes when allocations are given back in trace order (not in a
    /// hash map's), so that the frees a manager sees are the same from run to run.
    fn order(&self, id: u64) -> (Option<u64>, u64) {
        (self.made.get(&id).copied(), id)
    }
}

/// Drops `held`'s allocations in trace order (see [`PassPlan::order`]).
fn drop_in_trace_order<B>(held: HashMap<u64, B>, plan: &PassPlan) {
    let mut left: Vec<(u64, B)> = held.into_iter().collect();
    left.sort_unstable_by_key(|&(id, _)| plan.order(id));
    drop(left);
}

/// Replays `trace` through `manager` (a [`MemoryManager`](emm_core::MemoryManager),
/// or a model such as [`TorchModel`](crate::TorchModel)), which should be fresh
/// (its statistics are read as the replay's), for the passes `options` asks for: a fixed number, or
/// until the footprint holds ([`ReplayOptions::until_steady`]). The trace's
/// streams are numbered densely (0: the default stream) and `streams(n)` gives the
/// handle for number `n`. `progress` is called with the events done (over every
/// pass), every few thousand events.
pub fn replay<T: ReplayTarget + ?Sized>(
    trace: &Trace,
    manager: &T,
    streams: &mut dyn FnMut(u64) -> CUstream,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayResult, TraceError> {
    // The most passes: the rule's cap under `until_steady`, else exactly these.
    let passes = match options.until_steady {
        Some(rule) => rule.max_passes.max(1),
        None => options.passes.max(1),
    };
    let mut steady = options.until_steady.map(|rule| Steady { rule, quiet: 0 });
    let mut stop = None;
    let plan = if passes > 1 {
        pass_plan(trace)?
    } else {
        PassPlan::default()
    };
    let mut held: HashMap<u64, Held<T::Block>> = HashMap::with_capacity(1024);
    // The kept allocations after the first pass, apart from `held` and from the
    // books' ids (a later pass may use their ids again; their bytes stay live).
    let mut kept_held: Vec<Held<T::Block>> = Vec::new();
    let mut handles: HashMap<u64, CUstream> = HashMap::new();
    let mut books = Books::default();
    let (mut failures, mut first) = (0u64, None);
    // No periodic sample when the trace's length is unknown (`total_events` 0).
    // Under `until_steady` the passes to come are unknown: the samples are spaced
    // for one pass, and halved (the step doubled) whenever they reach twice as
    // many as asked for.
    let spaced_passes = if steady.is_some() { 1 } else { passes };
    let step = options
        .total_events
        .saturating_mul(u64::from(spaced_passes))
        .checked_div(options.samples)
        .filter(|&s| s > 0 || options.total_events > 0)
        .map_or(u64::MAX, |s| s.max(1));
    let start_stats = manager.stats();
    let mut sampler = Sampler::new(options.samples, step, &start_stats);
    let mut watch = options
        .peak_map
        .then(|| PeakWatch::new(start_stats.reserved_bytes as u64));
    let mut i = 0u64;
    let mut unknown_frees = 0;
    let mut pass_results = Vec::with_capacity(passes.min(1024) as usize);
    // Events of a pass abandoned when the rule's time ran out (0: none).
    let mut abandoned = 0u64;
    let driver_start = manager.driver_calls();
    let mut driver_before = driver_start;
    let start = Instant::now();
    for pass in 0..passes {
        let pass_start = Instant::now();
        let spent_before = watch.as_ref().map_or(Duration::ZERO, |w| w.spent);
        let (requests_before, failures_before) = (books.requests, failures);
        let mut events = trace.events()?;
        for (k, op) in (&mut events).enumerate() {
            if let Some(c) = &options.clock {
                c.tick();
            }
            // Before memory goes back: the reserved bytes at the most live bytes
            // of the bucket, and a map the watch is waiting for.
            let frees = match op {
                Op::Free { .. } => true,
                Op::Alloc { id, .. } => books.live.contains_key(&id),
            };
            if frees {
                before_free(
                    manager,
                    &mut sampler,
                    watch.as_mut(),
                    &held,
                    &kept_held,
                    i,
                    books.cur,
                );
            }
            // A later pass keeps what the first kept (weights, optimizer state).
            let replayed = match op {
                Op::Alloc { .. } => pass == 0 || !plan.keeps(k as u64),
                Op::Free { .. } => true,
            };
            if let (false, Op::Alloc { id, .. }) = (replayed, op) {
                // What the kept allocation replaced in the first pass (an id
                // allocated again while live) goes now as it went then.
                if books.live.contains_key(&id) {
                    held.remove(&id);
                    books.apply(Op::Free { id });
                }
            }
            if let Op::Free { id } = op {
                held.remove(&id);
            }
            let dense = if replayed { books.apply(op) } else { None };
            if let (Some(n), Op::Alloc { id, size, stream }) = (dense, op) {
                held.remove(&id);
                let s = *handles.entry(n).or_insert_with(|| streams(n));
                let got = usize::try_from(size)
                    .map_err(|_| format!("{size} bytes does not fit this machine's address space"))
                    .and_then(|size| manager.alloc(size, s));
                match got {
                    Ok(block) => {
                        held.insert(
                            id,
                            Held {
                                block,
                                size,
                                stream,
                                event: k as u64,
                                pass,
                            },
                        );
                    }
                    Err(e) => {
                        failures += 1;
                        first.get_or_insert(e);
                    }
                }
            }
            i += 1;
            // From the second pass on, a pass stops where it is once the rule's
            // time has run out (its clock leaves out the peak map's time, as below).
            if let Some(st) = steady
                .as_ref()
                .filter(|_| pass > 0 && (k as u64 + 1) % DEADLINE_EVERY == 0)
            {
                let spent = watch.as_ref().map_or(Duration::ZERO, |w| w.spent);
                if start.elapsed().saturating_sub(spent) >= st.rule.max_time {
                    abandoned = k as u64 + 1;
                    break;
                }
            }
            sampler.live(books.cur);
            if let (Some(w), Some(_)) = (watch.as_mut(), dense) {
                sampler.reserved(w.read(manager, books.cur));
            }
            if sampler.due(i) {
                sampler.push(i, &manager.stats(), books.cur);
            }
            if i % 4096 == 0 {
                progress(i);
            }
        }
        if abandoned > 0 {
            stop = Some(SteadyStop::MaxTime);
            break;
        }
        events.finish()?;
        if pass == 0 {
            unknown_frees = books.unknown;
        }
        if passes > 1 {
            before_free(
                manager,
                &mut sampler,
                watch.as_mut(),
                &held,
                &kept_held,
                i,
                books.cur,
            );
            if pass == 0 {
                for (_, id) in &plan.kept {
                    books.live.remove(id);
                    kept_held.extend(held.remove(id));
                }
            }
            // What the trace left live and a later pass makes again (see `pass_plan`).
            let mut late: Vec<u64> = books.live.keys().copied().collect();
            late.sort_unstable_by_key(|&id| plan.order(id));
            for id in late {
                held.remove(&id);
                books.apply(Op::Free { id });
            }
        }
        let stats = manager.stats();
        let driver = manager.driver_calls();
        let spent = watch
            .as_ref()
            .map_or(Duration::ZERO, |w| w.spent)
            .saturating_sub(spent_before);
        pass_results.push(PassResult {
            requests: books.requests - requests_before,
            failures: failures - failures_before,
            driver: driver.since(&driver_before),
            peak_live_bytes: books.peak,
            peak_reserved_bytes: stats.reserved_bytes_peak as u64,
            reserved_bytes: stats.reserved_bytes as u64,
            allocated_bytes: stats.allocated_bytes as u64,
            elapsed: pass_start.elapsed().saturating_sub(spent),
        });
        driver_before = driver;
        if let Some(st) = steady.as_mut() {
            let before = pass_results
                .iter()
                .rev()
                .nth(1)
                .map(|p| p.peak_reserved_bytes);
            // The rule's clock leaves out the peak map's time too, so `--html`
            // stops a replay where a run without it stops.
            let spent = watch.as_ref().map_or(Duration::ZERO, |w| w.spent);
            stop = st.after(
                pass + 1,
                before,
                stats.reserved_bytes_peak as u64,
                start.elapsed().saturating_sub(spent),
            );
            if stop.is_some() {
                break;
            }
        }
    }
    let spent = watch.as_ref().map_or(Duration::ZERO, |w| w.spent);
    let elapsed = start.elapsed().saturating_sub(spent);
    if let Some(w) = watch.as_mut().filter(|w| w.pending()) {
        w.take(manager, held.values().chain(&kept_held), i, books.cur);
    }
    let samples = sampler.finish(i, &manager.stats(), books.cur);
    progress(i);
    // The replay's driver calls, before what is still held goes back.
    let driver = manager.driver_calls().since(&driver_start);
    let peak_slack = manager.peak_slack();
    drop_in_trace_order(held, &plan);
    drop(kept_held);
    let stats = manager.stats();
    Ok(ReplayResult {
        requests: books.requests,
        peak_live_bytes: books.peak,
        peak_reserved_bytes: stats.reserved_bytes_peak as u64,
        upstream_allocs: stats.upstream_allocs,
        driver,
        elapsed,
        failures,
        first_failure: first,
        unknown_frees,
        samples,
        passes: pass_results,
        steady: stop,
        abandoned_events: abandoned,
        peak_map: watch.and_then(PeakWatch::finish),
        peak_slack,
    })
}

/// Before an event that frees memory: the sampler reads reserved bytes if live
/// bytes just reached the bucket's most, and the watch takes the map it waits
/// for.
fn before_free<T: ReplayTarget + ?Sized>(
    manager: &T,
    sampler: &mut Sampler,
    watch: Option<&mut PeakWatch>,
    held: &HashMap<u64, Held<T::Block>>,
    kept_held: &[Held<T::Block>],
    event: u64,
    live: u128,
) {
    if sampler.wants_reserved() {
        sampler.reserved(manager.stats().reserved_bytes as u64);
    }
    if let Some(w) = watch.filter(|w| w.pending()) {
        w.take(manager, held.values().chain(kept_held), event, live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_live_does_not_overflow() {
        let ops = vec![
            Op::Alloc {
                id: 1,
                size: u64::MAX,
                stream: 0,
            },
            Op::Alloc {
                id: 2,
                size: u64::MAX,
                stream: 7,
            },
            Op::Free { id: 1 },
            Op::Free { id: 9 },
        ];
        let s = scan(&Trace::from_ops("big", ops)).unwrap();
        assert_eq!(s.peak_live_bytes, 2 * u128::from(u64::MAX));
        assert_eq!(s.unknown_frees, 1);
        assert_eq!(s.streams, 2);
    }

    #[test]
    fn streams_are_numbered_densely_with_zero_kept() {
        let mut b = Books::default();
        let st = |stream| Op::Alloc {
            id: stream,
            size: 1,
            stream,
        };
        assert_eq!(b.apply(st(0x7f00)), Some(1));
        assert_eq!(b.apply(st(0)), Some(0));
        assert_eq!(b.apply(st(0x7e00)), Some(2));
        assert_eq!(b.apply(st(0x7f00)), Some(1));
    }
}
