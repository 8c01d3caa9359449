//! What `emm replay` found, as data (serialised with `serde_json` for `--json`) and
//! as the text table.

use std::io;

use emm::trace::{Sample, Trace};
use serde::Serialize;

use crate::out::Out;
use crate::{peak, units, verdict};

/// The whole run.
#[derive(Serialize)]
pub struct Report {
    /// The version of this JSON document's layout (1: this one).
    pub schema_version: u32,
    /// The `emm` that wrote it.
    pub emm_version: String,
    /// The command line that made it.
    pub command: String,
    pub backend: &'static str,
    pub backend_detail: String,
    /// When each replay stopped on its own (without `--passes`); `null` with
    /// `--passes N`.
    pub steady_rule: Option<SteadyRuleReport>,
    /// `--device-memory`: the device size every manager replayed on; `null`:
    /// unlimited.
    pub device_memory_bytes: Option<u64>,
    /// How `--device-memory` and `--fit` capped the PyTorch models: `"device"`
    /// (a device of that size) or `"fraction"` (`--as-fraction`: as
    /// `set_per_process_memory_fraction` caps).
    pub pytorch_cap: &'static str,
    /// `--overhead`: what the process holds on the device besides the
    /// allocator, added to `--fit`'s answers.
    pub overhead_bytes: u64,
    /// `--device-lag`: requests the host stand-in's device ran behind the host
    /// (the pool's events completed that late); 0: at once.
    pub device_lag_requests: u64,
    /// `--ranks`: processes on one host whose pools grow in the same steps; the
    /// pieces' calls are estimated at that many times a lone process's cost.
    pub ranks: u32,
    /// Whether the run failed (it exits 1): a trace that could not be read, a
    /// replay in which requests failed, nothing replayed, …
    pub failed: bool,
    /// What failed, a line each.
    pub errors: Vec<String>,
    pub traces: Vec<TraceReport>,
    /// The pool replayed without its expandable segment and without an
    /// initial size (`EMM_POOL_EXPANDABLE=0`, no `EMM_POOL_INITIAL_SIZE`): a
    /// loose footprint gets a line naming `--initial-size` ([`home_hint_line`]).
    #[serde(skip)]
    pub pool_without_home: bool,
}

/// `--fit`: the smallest device on which a manager ran the trace.
#[derive(Serialize)]
pub struct FitReport {
    pub manager: String,
    /// Allocator memory needed (`null`: it did not run even at its own
    /// uncapped peak).
    pub needs_bytes: Option<u64>,
    /// The same with `--overhead` added: the device memory to have.
    pub with_overhead_bytes: Option<u64>,
    /// A larger device on which it failed (caching allocators are not monotone).
    pub larger_failed_bytes: Option<u64>,
    /// Replays the search made.
    pub runs: u32,
}

/// `--initial-size`: the smallest home segment of the pool without virtual
/// memory that held the trace.
#[derive(Serialize)]
pub struct HomeReport {
    /// `EMM_POOL_INITIAL_SIZE` to set (`null`: not even 16 times the peak of
    /// live bytes held it, `fit::DOUBLINGS`).
    pub bytes: Option<u64>,
    /// The same over the peak of live bytes.
    pub over_live: Option<f64>,
    /// A larger size that did not hold it (placement is not monotone).
    pub larger_failed_bytes: Option<u64>,
    /// Passes each size was judged on (the pool's in this replay).
    pub passes: u32,
    /// Replays the search made.
    pub runs: u32,
}

/// emm-trace's `SteadyRule`, as the report gives it.
#[derive(Serialize)]
pub struct SteadyRuleReport {
    /// Passes in a row without a move of peak reserved bytes that make it steady.
    pub quiet_passes: u32,
    /// The most passes a trace is replayed through one manager.
    pub max_passes: u32,
    /// The most seconds a trace is replayed through one manager (checked after
    /// each pass).
    pub max_seconds: f64,
}

/// One trace and its replays.
#[derive(Serialize)]
pub struct TraceReport {
    pub trace: String,
    pub format: &'static str,
    pub events: u64,
    pub requests: u64,
    pub streams: u64,
    pub peak_live_bytes: u128,
    pub malformed_lines: u64,
    /// Allocations of an id that was still live (the earlier one taken as freed).
    pub reused_live_ids: u64,
    pub pytorch: Option<TorchReport>,
    pub managers: Vec<ManagerReport>,
    pub skipped: Vec<Skipped>,
    /// Managers `--manager all` names that were not replayed because they would
    /// repeat another here (`pool-shared` on a trace of one stream, or with
    /// stream pools off), and why: in the JSON only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<Skipped>,
    /// `--fit`'s answers, one per manager that ran.
    pub fit: Vec<FitReport>,
    /// `--initial-size`'s answer, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_size: Option<HomeReport>,
    /// The trace itself, for what the page shows of it (times, stacks,
    /// PyTorch's reserved bytes along it).
    #[serde(skip)]
    pub source: Option<Trace>,
}

/// PyTorch's own figures from a snapshot.
#[derive(Serialize)]
pub struct TorchReport {
    /// `null` when the snapshot has no segments and no segment events: it does
    /// not tell what PyTorch reserved.
    pub peak_reserved_bytes: Option<u128>,
    pub reserved_at_dump_bytes: u128,
    pub allocated_at_dump_bytes: u128,
    pub reconstructed_allocations: u64,
    pub cross_stream_frees: u64,
    pub ooms: u64,
    /// Segment events in the trace (`segment_alloc`, `segment_free`, …).
    pub segment_events: u64,
}

/// One manager's replay.
#[derive(Serialize)]
pub struct ManagerReport {
    pub manager: String,
    /// Allocation requests replayed, over every pass.
    pub requests: u64,
    /// Peak live bytes of this replay: the trace's, or more over several passes
    /// (what the trace never frees is kept from pass to pass).
    pub peak_live_bytes: u128,
    pub peak_reserved_bytes: u64,
    pub reserved_over_live: Option<f64>,
    pub upstream_allocs: u64,
    /// Driver calls for memory over the whole replay.
    pub driver: DriverReport,
    pub seconds: f64,
    /// Whether any request failed: the figures are then not the trace's (what
    /// failed was never held).
    pub failed: bool,
    /// Requests that failed, over every pass.
    pub failures: u64,
    /// The first failure's message (with the byte limit in effect, when one
    /// was set through the environment).
    pub first_failure: Option<String>,
    /// Live and reserved bytes along the replay (for the page).
    #[serde(skip)]
    pub curve: Vec<Sample>,
    /// The memory at the manager's peak: its most reserved bytes, and of those
    /// moments the one with the most live bytes (`--html` only;
    /// `null` without it).
    pub at_peak: Option<AtPeak>,
    /// emm's pool: its reserved bytes at the last growth that raised their peak,
    /// by what held them (`emm.peak_slack.*` without the prefix: live bytes,
    /// threads' caches, free blocks of the growing stream, of other streams,
    /// settled, parked behind events, in small segments; the request; the
    /// streams holding free blocks). `null` for a manager that does not say.
    pub peak_slack: Option<std::collections::BTreeMap<&'static str, u64>>,
    /// The same, block by block (for the page).
    #[serde(skip)]
    pub map: Option<peak::Map>,
    /// Each pass over the trace (one entry for a single pass).
    pub passes: Vec<PassReport>,
    /// Peak live bytes of the first pass.
    pub first_pass_peak_live_bytes: u128,
    /// Peak reserved bytes of the first pass: the footprint of one pass, beside
    /// `peak_reserved_bytes` over every pass.
    pub first_pass_peak_reserved_bytes: u64,
    /// `first_pass_peak_reserved_bytes / first_pass_peak_live_bytes`.
    pub first_pass_reserved_over_live: Option<f64>,
    /// Passes replayed (as many as `passes` has).
    pub steady_passes: u64,
    /// Whether peak reserved bytes held for the steady rule's quiet passes (false
    /// with `--passes N`, which does not look).
    pub steady_reached: bool,
    /// Why the passes ended: `steady` (peak reserved held), `max_passes` or
    /// `max_time` (the steady rule's bounds, before it held), `passes` (`--passes N`).
    pub stopped_by: &'static str,
    /// The pass (from 1) from which peak reserved bytes held their final value.
    pub steady_from_pass: u64,
}

/// A manager's memory at its peak: the first moment its reserved bytes were at
/// their most with live bytes at their most then (see
/// `peak.rs` for what is stranded).
#[derive(Serialize)]
pub struct AtPeak {
    /// Events replayed (over every pass) then.
    pub event: u64,
    /// The pass then (from 1).
    pub pass: u64,
    /// When that event happened in the recording (`time_us`; snapshots only).
    pub time_us: Option<u64>,
    /// The manager's reserved bytes then.
    pub reserved_bytes: u64,
    /// Live requested bytes then.
    pub live_bytes: u128,
    /// Segments (`null`: the manager keeps none of its own, only totals are known).
    pub segments: Option<u64>,
    /// Live allocations.
    pub live_blocks: u64,
    /// Free bytes held in threads' caches.
    pub cached_bytes: u64,
    /// Free bytes that could go back to the device.
    pub free_bytes: u64,
    /// Free bytes that cannot go back while live blocks share their segment (or,
    /// in an expandable segment, their 2 MiB page).
    pub stranded_bytes: u64,
    /// Reserved by a manager without segments besides its live bytes (frees it
    /// has queued, rounding).
    pub held_bytes: u64,
}

/// Driver calls for memory (emm-trace's `DriverCalls`, with their sum and what
/// they would take on a GPU).
#[derive(Clone, Copy, Serialize)]
pub struct DriverReport {
    pub total: u64,
    pub allocs: u64,
    pub frees: u64,
    pub pieces_mapped: u64,
    pub pieces_moved: u64,
    pub pieces_unmapped: u64,
    /// Seconds these calls take at an idle H100's per-call costs
    /// (`emm_trace::DriverCosts::IDLE_H100`), those of the pieces multiplied by
    /// `--ranks` (`DriverCosts::sharing_host_with`): a lone process's price
    /// for the pieces' calls without it, rough for allocations and frees.
    pub estimated_seconds: f64,
}

impl DriverReport {
    /// The calls `d`, timed at `costs`.
    pub fn priced(d: emm::trace::DriverCalls, costs: &emm::trace::DriverCosts) -> Self {
        DriverReport {
            total: d.total(),
            allocs: d.allocs,
            frees: d.frees,
            pieces_mapped: d.pieces_mapped,
            pieces_moved: d.pieces_moved,
            pieces_unmapped: d.pieces_unmapped,
            estimated_seconds: costs.time(&d).as_secs_f64(),
        }
    }
}

/// One pass of a replay.
#[derive(Serialize)]
pub struct PassReport {
    pub requests: u64,
    pub failures: u64,
    pub driver: DriverReport,
    /// Peak live from the start to the end of this pass.
    pub peak_live_bytes: u128,
    /// Peak reserved from the start to the end of this pass.
    pub peak_reserved_bytes: u64,
    /// Reserved at the end of this pass.
    pub reserved_bytes: u64,
    /// Held for callers at the end of this pass.
    pub allocated_bytes: u64,
    pub seconds: f64,
}

/// A manager that could not run here, and why.
#[derive(Serialize)]
pub struct Skipped {
    pub manager: String,
    pub why: String,
}

fn fit(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_owned()
    } else {
        let tail: String = s
            .chars()
            .rev()
            .take(w - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

/// The passes a replay took, marked when a bound of the steady rule stopped it.
fn passes_cell(m: &ManagerReport) -> String {
    match m.stopped_by {
        "max_passes" => format!("{} (cap)", m.steady_passes),
        "max_time" => format!("{} (time)", m.steady_passes),
        _ => m.steady_passes.to_string(),
    }
}

/// The head of the column of the footprint over every pass: `steady` without
/// `--passes`, `pass N` with it.
pub fn last_label(r: &Report) -> String {
    if r.steady_rule.is_some() {
        return "steady".into();
    }
    let mut counts = r
        .traces
        .iter()
        .flat_map(|t| t.managers.iter().map(|m| m.steady_passes));
    match counts.next() {
        Some(n) if counts.all(|c| c == n) => format!("pass {n}"),
        _ => "last".into(),
    }
}

/// `FAILED: n of m requests` for a replay in which requests failed, else `None`.
pub fn failed_cell(m: &ManagerReport) -> Option<String> {
    m.failed
        .then(|| format!("FAILED: {} of {} requests", m.failures, m.requests))
}

/// The rows of the text table: `[trace, manager, peak live, peak reserved,
/// reserved/live after pass 1, reserved/live over every pass (steady), passes,
/// driver calls, time, status]`. Peak live and peak reserved are over every
/// pass. A failed replay has `-` for its ratios and `FAILED: n of m requests`
/// as its status; the status is empty otherwise.
pub fn rows(r: &Report) -> Vec<[String; 10]> {
    let mut rows = Vec::new();
    for t in &r.traces {
        for m in &t.managers {
            let failed = failed_cell(m);
            let ratio = |reserved: u64, live: u128| {
                if failed.is_some() {
                    "-".to_owned()
                } else {
                    units::ratio(u128::from(reserved), live)
                }
            };
            rows.push([
                t.trace.clone(),
                m.manager.clone(),
                units::bytes(m.peak_live_bytes),
                units::bytes(u128::from(m.peak_reserved_bytes)),
                ratio(
                    m.first_pass_peak_reserved_bytes,
                    m.first_pass_peak_live_bytes,
                ),
                ratio(m.peak_reserved_bytes, m.peak_live_bytes),
                passes_cell(m),
                m.driver.total.to_string(),
                units::duration(std::time::Duration::from_secs_f64(m.seconds)),
                failed.unwrap_or_default(),
            ]);
        }
        if let Some(p) = &t.pytorch {
            rows.push([
                t.trace.clone(),
                "pytorch".into(),
                units::bytes(t.peak_live_bytes),
                p.peak_reserved_bytes
                    .map_or_else(|| "-".into(), units::bytes),
                p.peak_reserved_bytes
                    .map_or_else(|| "-".into(), |b| units::ratio(b, t.peak_live_bytes)),
                "-".into(),
                "-".into(),
                "-".into(),
                "(recorded)".into(),
                String::new(),
            ]);
        }
    }
    rows
}

/// What the table's terms mean, printed under it (lines of at most 120 columns).
pub const LEGEND: [&str; 4] = [
    "driver calls: the manager's calls to the driver for device memory over every pass (allocations, frees, pieces",
    "  of an expandable segment mapped, moved, unmapped); \"N passes:\" lines split them into pass 1 and the later passes,",
    "  timed at an idle H100's per-call costs (pieces: one process's; N times with --ranks N; allocations: rough).",
    "upstream (JSON upstream_allocs): allocations the manager took from what it sits on (driver, stand-in).",
];

/// Said of a snapshot whose PyTorch row has no reserved bytes.
pub const NO_SEGMENTS: &str =
    "PyTorch's reserved bytes are unknown (-): the snapshot has no segments and no segment events";

/// The verdict sentence for `t` (see `verdict.rs`), or `None` without a pool run.
pub fn verdict_of(r: &Report, t: &TraceReport) -> Option<String> {
    verdict::headline(&verdict::Facts {
        ran: t
            .managers
            .iter()
            .map(|m| verdict::Ran {
                manager: &m.manager,
                peak_reserved_bytes: m.peak_reserved_bytes,
                failed: m.failed,
            })
            .collect(),
        recorded: t
            .pytorch
            .as_ref()
            .and_then(|p| p.peak_reserved_bytes)
            .map(|b| u64::try_from(b).unwrap_or(u64::MAX)),
        fit: t
            .fit
            .iter()
            .map(|f| (f.manager.as_str(), f.with_overhead_bytes))
            .collect(),
        device_memory: r.device_memory_bytes,
    })
}

/// Writes the table.
pub fn table(out: &mut Out, r: &Report) -> io::Result<()> {
    let last = last_label(r);
    let head: [&str; 9] = [
        "trace",
        "manager",
        "peak live",
        "peak reserved",
        "pass 1",
        &last,
        "passes",
        "driver calls",
        "time",
    ];
    let rows = rows(r);
    // `pytorch-expandable` is the longest manager name.
    let man_w = rows
        .iter()
        .map(|r| r[1].chars().count())
        .max()
        .unwrap_or(7)
        .clamp(7, 18);
    let name_w = rows
        .iter()
        .map(|r| r[0].chars().count())
        .max()
        .unwrap_or(5)
        .clamp(5, 32 + 7 - man_w); // rows of at most 120 columns
    let line = |c: [&str; 9]| {
        format!(
            "{:<name_w$}  {:<man_w$} {:>11} {:>13} {:>8} {:>8} {:>9} {:>12} {:>10}",
            fit(c[0], name_w),
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8]
        )
    };
    // "reserved/live" over its two columns (pass 1 and steady).
    let group = format!(
        "{:w$}{:>17}",
        "",
        "reserved/live",
        w = name_w + 2 + man_w + 12 + 14 + 1
    );
    out.line(group)?;
    out.line(line(head))?;
    for c in &rows {
        let [cells @ .., status] = c;
        let row = line(cells.each_ref().map(String::as_str));
        if status.is_empty() {
            out.line(row)?;
        } else {
            out.line(format_args!("{row}  {status}"))?;
        }
    }
    for t in &r.traces {
        for m in &t.managers {
            if let Some(why) = failure_line(t, m) {
                out.line(why)?;
            }
        }
    }
    for l in skipped_lines(r) {
        out.line(l)?;
    }
    for t in &r.traces {
        for m in t.managers.iter().filter(|m| m.passes.len() > 1) {
            out.line(passes_line(t, m, r.ranks))?;
        }
    }
    for t in &r.traces {
        for l in t.managers.iter().filter_map(|m| peak_slack_line(t, m)) {
            out.line(l)?;
        }
    }
    for t in &r.traces {
        if let Some(v) = verdict_of(r, t) {
            out.line(format_args!("{}: {v}", t.trace))?;
        }
    }
    if r.device_memory_bytes.is_some() {
        for t in &r.traces {
            if let Some(l) = device_memory_line(r, t) {
                out.line(l)?;
            }
        }
    }
    for t in &r.traces {
        if let Some(l) = fit_line(r, t) {
            out.line(l)?;
        }
    }
    for t in &r.traces {
        if let Some(l) = home_line(t).or_else(|| home_hint_line(r, t)) {
            out.line(l)?;
        }
    }
    for t in &r.traces {
        if let Some(l) = reused_line(t) {
            out.line(l)?;
        }
    }
    for l in LEGEND {
        out.line(l)?;
    }
    if let Some(rule) = &r.steady_rule {
        out.line(format_args!(
            "steady: passes until peak reserved held for {} in a row (at most {} passes, {} s a manager); --passes N: exactly N",
            rule.quiet_passes, rule.max_passes, rule.max_seconds
        ))?;
        for t in &r.traces {
            for m in &t.managers {
                if let Some(why) = unsettled(m, rule) {
                    out.line(format_args!("{} through {}: {why}", t.trace, m.manager))?;
                }
            }
        }
    }
    for t in &r.traces {
        for l in torch_lines(t) {
            out.line(l)?;
        }
    }
    if let Some(l) = failed_line(r) {
        out.line(l)?;
    }
    Ok(())
}

/// The table's last line on a failed run: that it failed, and what failed.
pub fn failed_line(r: &Report) -> Option<String> {
    r.failed.then(|| {
        let what: Vec<&str> = r
            .errors
            .iter()
            .map(|e| e.strip_prefix("emm replay: ").unwrap_or(e))
            .collect();
        format!(
            "FAILED: this run exits with status 1; what failed: {}",
            what.join("; ")
        )
    })
}

/// `trace on a device of N: fits: …; does not fit: …` (`--device-memory`).
pub fn device_memory_line(r: &Report, t: &TraceReport) -> Option<String> {
    let cap = r.device_memory_bytes?;
    let (fits, not): (Vec<_>, Vec<_>) = t.managers.iter().partition(|m| !m.failed);
    let names = |v: &[&ManagerReport]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.iter()
                .map(|m| m.manager.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    Some(format!(
        "{} on a device of {}{}: fits: {}; does not fit: {}",
        t.trace,
        units::bytes(u128::from(cap)),
        fraction_note(r),
        names(&fits),
        names(&not),
    ))
}

/// What `--as-fraction` changes, said where a cap is reported.
fn fraction_note(r: &Report) -> &'static str {
    if r.pytorch_cap == "fraction" {
        " (PyTorch's models capped as set_per_process_memory_fraction)"
    } else {
        ""
    }
}

/// `trace: smallest device each needs (…): …` (`--fit`).
pub fn fit_line(r: &Report, t: &TraceReport) -> Option<String> {
    if t.fit.is_empty() {
        return None;
    }
    let mut answers: Vec<&FitReport> = t.fit.iter().collect();
    answers.sort_by_key(|f| f.needs_bytes.unwrap_or(u64::MAX));
    let parts: Vec<String> = answers
        .iter()
        .map(|f| match (f.with_overhead_bytes, f.larger_failed_bytes) {
            (Some(n), None) => format!("{} {}", f.manager, units::bytes(u128::from(n))),
            (Some(n), Some(l)) => format!(
                "{} {} (but not {}: not monotone)",
                f.manager,
                units::bytes(u128::from(n)),
                units::bytes(u128::from(l.saturating_add(r.overhead_bytes)))
            ),
            (None, _) => format!("{} does not run", f.manager),
        })
        .collect();
    Some(format!(
        "{}: smallest device each needs ({}){}: {}",
        t.trace,
        if r.overhead_bytes > 0 {
            format!(
                "allocator memory + {} --overhead",
                units::bytes(u128::from(r.overhead_bytes))
            )
        } else {
            "allocator memory; --overhead adds the CUDA context and libraries".to_owned()
        },
        fraction_note(r),
        parts.join("; ")
    ))
}

/// `trace: without virtual memory, EMM_POOL_INITIAL_SIZE=…` (`--initial-size`).
pub fn home_line(t: &TraceReport) -> Option<String> {
    let h = t.initial_size.as_ref()?;
    let what = match (h.bytes, h.over_live) {
        (Some(b), Some(x)) => format!(
            "EMM_POOL_INITIAL_SIZE={}M ({x:.3}x of peak live) is the smallest home segment that held it over {} passes with no segment beside it{}",
            b.div_ceil(1 << 20),
            h.passes,
            h.larger_failed_bytes.map_or(String::new(), |l| format!(
                " (but {} did not: placement is not monotone)",
                units::bytes(u128::from(l))
            )),
        ),
        _ => format!(
            "no home segment up to {} times the peak of live bytes held it over {} passes",
            2u64 << crate::fit::DOUBLINGS,
            h.passes
        ),
    };
    Some(format!(
        "{}: without virtual memory (EMM_POOL_EXPANDABLE=0): {what}; {} replays",
        t.trace, h.runs
    ))
}

/// Above this footprint (reserved over live) the pool without virtual memory
/// and without an initial size gets [`home_hint_line`]: the smallest home held
/// each of the 21 recorded traces at 1.009-1.139x of live.
const HOME_HINT_ABOVE: f64 = 1.10;

/// `trace: without virtual memory … --initial-size …`, where the pool replayed
/// without its expandable segment and without a home segment, and reserved
/// more than [`HOME_HINT_ABOVE`] times live: its peak is set before it knows
/// how large the steps get, and `--initial-size` names the size that holds the
/// trace in one segment (not run unasked: it takes about 15 replays).
pub fn home_hint_line(r: &Report, t: &TraceReport) -> Option<String> {
    if !r.pool_without_home || t.initial_size.is_some() {
        return None;
    }
    let m = t
        .managers
        .iter()
        .find(|m| m.manager == "pool" && !m.failed)?;
    let x = m.reserved_over_live.filter(|&x| x > HOME_HINT_ABOVE)?;
    Some(format!(
        "{}: without virtual memory (EMM_POOL_EXPANDABLE=0) the pool held {x:.3}x of live, its segments made before it knew how large the steps get; --initial-size names the EMM_POOL_INITIAL_SIZE whose one segment holds this trace",
        t.trace
    ))
}

/// The line on allocations of an id that was still live, when there were any.
pub fn reused_line(t: &TraceReport) -> Option<String> {
    (t.reused_live_ids > 0).then(|| {
        format!(
            "{}: {} allocations reused an id that was still live (the earlier allocation taken as freed)",
            t.trace, t.reused_live_ids
        )
    })
}

/// The snapshot's notes: PyTorch's figures at the dump, and that its reserved
/// bytes are unknown where they are.
pub fn torch_lines(t: &TraceReport) -> Vec<String> {
    let Some(p) = &t.pytorch else {
        return Vec::new();
    };
    let mut v = vec![format!(
        "{}: PyTorch: reserved {} at the dump; allocations from before the recording, reconstructed: {}; frees held back by another stream: {}; out-of-memory events: {}",
        t.trace,
        units::bytes(p.reserved_at_dump_bytes),
        p.reconstructed_allocations,
        p.cross_stream_frees,
        p.ooms
    )];
    if p.peak_reserved_bytes.is_none() {
        v.push(format!("{}: {NO_SEGMENTS}", t.trace));
    }
    v
}

/// The lines under the table on managers that could not run here, each said
/// once however many traces skipped it: `hostonly skipped: why`. Standard
/// error says it too, but a table kept in a file would not.
pub fn skipped_lines(r: &Report) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for s in r.traces.iter().flat_map(|t| &t.skipped) {
        let l = format!("{} skipped: {}", s.manager, s.why);
        if !lines.contains(&l) {
            lines.push(l);
        }
    }
    lines
}

/// The line under the table on a failed replay: how many requests failed and
/// the first failure.
pub fn failure_line(t: &TraceReport, m: &ManagerReport) -> Option<String> {
    let cell = failed_cell(m)?;
    Some(format!(
        "{} through {}: {cell} failed; the first: {}",
        t.trace,
        m.manager,
        m.first_failure.as_deref().unwrap_or("(no message)")
    ))
}

/// Why `m` did not reach a steady footprint under `rule`, when it did not.
pub fn unsettled(m: &ManagerReport, rule: &SteadyRuleReport) -> Option<String> {
    let bound = match m.stopped_by {
        "max_passes" => format!("at the cap of {} passes", rule.max_passes),
        "max_time" => format!("by the time bound ({} s)", rule.max_seconds),
        _ => return None,
    };
    Some(format!(
        "stopped {bound} after {} passes, before peak reserved held for {} in a row (it last rose in pass {}): the steady figure may still grow",
        m.steady_passes, rule.quiet_passes, m.steady_from_pass
    ))
}

/// The line on where a pool's peak went: at the growth that raised its reserved
/// bytes to their most, the live bytes and each kind of free memory beside them
/// (see [`ManagerReport::peak_slack`]); `None` for a manager that does not say, or
/// one that never grew.
pub fn peak_slack_line(t: &TraceReport, m: &ManagerReport) -> Option<String> {
    let s = m.peak_slack.as_ref()?;
    let get = |k: &str| s.get(k).copied().unwrap_or(0);
    let reserved = get("reserved_bytes");
    if reserved == 0 {
        return None;
    }
    let cached = get("thread_cached_bytes");
    let b = |v: u64| units::bytes(u128::from(v));
    Some(format!(
        "{} through {}: its peak of {} came with a request of {} while {} was live; beside it {} in threads' caches, free: {} on the stream that grew, {} on {} other streams, {} settled, {} parked for another stream, {} in small segments",
        t.trace,
        m.manager,
        b(reserved),
        b(get("request_bytes")),
        b(get("live_bytes").saturating_sub(cached)),
        b(cached),
        b(get("own_stream_free_bytes")),
        b(get("other_streams_free_bytes")),
        // `streams` counts the one that grew only when it held free blocks.
        get("streams").saturating_sub(u64::from(get("own_stream_free_bytes") > 0)),
        b(get("settled_free_bytes")),
        b(get("parked_bytes")),
        b(get("small_free_bytes")),
    ))
}

/// One line on a replay of several passes: the driver calls of the first pass
/// (the manager growing to its size) beside those of the later ones (what a
/// warm manager pays each pass), and the footprint after the first and the last;
/// `ranks`: `--ranks`, named where the estimate counts other processes.
pub fn passes_line(t: &TraceReport, m: &ManagerReport, ranks: u32) -> String {
    let (Some(first), Some(last)) = (m.passes.first(), m.passes.last()) else {
        return String::new();
    };
    // The later passes' least and most, as one figure where they print alike.
    fn span<T: Ord + Default>(
        later: impl Iterator<Item = T> + Clone,
        show: impl Fn(T) -> String,
    ) -> String {
        let (lo, hi) = (
            show(later.clone().min().unwrap_or_default()),
            show(later.max().unwrap_or_default()),
        );
        if lo == hi {
            lo
        } else {
            format!("{lo}-{hi}")
        }
    }
    let secs = |p: &PassReport| std::time::Duration::from_secs_f64(p.driver.estimated_seconds);
    let later = &m.passes[1..];
    let d = &last.driver;
    let ratio = |reserved: u64, live: u128| units::ratio(u128::from(reserved), live);
    let costs = if ranks > 1 {
        format!("at an H100's driver costs with {ranks} ranks growing together")
    } else {
        "at an idle H100's driver costs".to_owned()
    };
    format!(
        "{} through {}, {} passes: driver calls in pass 1 {}, in each later pass {}; the last: {} pieces mapped, {} moved, {} unmapped, {} allocations, {} frees, {}; {costs} those calls take {} in pass 1 and {} in each later pass; peak reserved/live {} after pass 1, {} after pass {}",
        t.trace,
        m.manager,
        m.passes.len(),
        first.driver.total,
        span(later.iter().map(|p| p.driver.total), |n| n.to_string()),
        d.pieces_mapped,
        d.pieces_moved,
        d.pieces_unmapped,
        d.allocs,
        d.frees,
        units::duration(std::time::Duration::from_secs_f64(last.seconds)),
        units::duration(secs(first)),
        span(later.iter().map(secs), units::duration),
        ratio(first.peak_reserved_bytes, first.peak_live_bytes),
        ratio(last.peak_reserved_bytes, last.peak_live_bytes),
        m.passes.len()
    )
}

/// Writes the report as one JSON document.
pub fn json(out: &mut Out, r: &Report) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(r).map_err(io::Error::other)?;
    text.push('\n');
    out.bytes(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(stopped_by: &'static str, passes: u64) -> ManagerReport {
        ManagerReport {
            manager: "pool".into(),
            requests: 10 * passes,
            peak_live_bytes: 1000,
            peak_reserved_bytes: 1200,
            reserved_over_live: Some(1.2),
            upstream_allocs: 3,
            driver: DriverReport::priced(
                emm::trace::DriverCalls::default(),
                &emm::trace::DriverCosts::IDLE_H100,
            ),
            seconds: 1.0,
            failed: false,
            failures: 0,
            first_failure: None,
            curve: Vec::new(),
            at_peak: None,
            peak_slack: None,
            map: None,
            passes: Vec::new(),
            first_pass_peak_live_bytes: 1000,
            first_pass_peak_reserved_bytes: 1050,
            first_pass_reserved_over_live: Some(1.05),
            steady_passes: passes,
            steady_reached: stopped_by == "steady",
            stopped_by,
            steady_from_pass: passes,
        }
    }

    fn report(m: ManagerReport, steady: bool) -> Report {
        Report {
            schema_version: 1,
            emm_version: String::new(),
            command: String::new(),
            backend: "host",
            backend_detail: String::new(),
            steady_rule: steady.then_some(SteadyRuleReport {
                quiet_passes: 10,
                max_passes: 100,
                max_seconds: 60.0,
            }),
            device_memory_bytes: None,
            pytorch_cap: "device",
            overhead_bytes: 0,
            device_lag_requests: 0,
            ranks: 1,
            failed: false,
            errors: Vec::new(),
            traces: vec![TraceReport {
                trace: "t.csv".into(),
                format: "emm-csv",
                events: 20,
                requests: 10,
                streams: 1,
                peak_live_bytes: 1000,
                malformed_lines: 0,
                reused_live_ids: 0,
                pytorch: None,
                managers: vec![m],
                skipped: Vec::new(),
                left_out: Vec::new(),
                fit: Vec::new(),
                initial_size: None,
                source: None,
            }],
            pool_without_home: false,
        }
    }

    /// A replay stopped by a bound of the steady rule is marked in the passes
    /// column and explained; one that settled, or ran a fixed number of passes,
    /// is not.
    #[test]
    fn a_replay_stopped_by_a_bound_is_marked_and_explained() {
        let rule = SteadyRuleReport {
            quiet_passes: 10,
            max_passes: 100,
            max_seconds: 60.0,
        };
        for (stopped_by, passes, cell, why) in [
            ("steady", 13, "13", None),
            (
                "max_passes",
                100,
                "100 (cap)",
                Some("at the cap of 100 passes"),
            ),
            (
                "max_time",
                37,
                "37 (time)",
                Some("by the time bound (60 s)"),
            ),
            ("passes", 3, "3", None),
        ] {
            let r = report(manager(stopped_by, passes), stopped_by != "passes");
            let row = &rows(&r)[0];
            assert_eq!(row[4], "1.050x");
            assert_eq!(row[5], "1.200x");
            assert_eq!(row[6], cell);
            let said = unsettled(&r.traces[0].managers[0], &rule);
            match why {
                Some(w) => assert!(said.is_some_and(|s| s.contains(w)), "{stopped_by}"),
                None => assert_eq!(said, None),
            }
        }
        assert_eq!(last_label(&report(manager("steady", 13), true)), "steady");
        assert_eq!(last_label(&report(manager("passes", 3), false)), "pass 3");
    }

    /// The pool without virtual memory and without a home, looser than the
    /// smallest homes were, names `--initial-size`; not with a home or the
    /// expandable segment, not once `--initial-size` answered, not for a tight
    /// footprint or another manager.
    #[test]
    fn a_loose_pool_without_virtual_memory_names_the_initial_size() {
        let mut r = report(manager("passes", 3), false);
        assert_eq!(home_hint_line(&r, &r.traces[0]), None);
        r.pool_without_home = true;
        let line = home_hint_line(&r, &r.traces[0]).expect("1.2x is loose");
        assert!(
            line.starts_with("t.csv: ")
                && line.contains("1.200x")
                && line.contains("--initial-size"),
            "{line}"
        );
        r.traces[0].managers[0].reserved_over_live = Some(1.08);
        assert_eq!(home_hint_line(&r, &r.traces[0]), None);
        r.traces[0].managers[0].reserved_over_live = Some(1.2);
        r.traces[0].managers[0].manager = "default".into();
        assert_eq!(home_hint_line(&r, &r.traces[0]), None);
        r.traces[0].managers[0].manager = "pool".into();
        r.traces[0].initial_size = Some(HomeReport {
            bytes: Some(1100),
            over_live: Some(1.1),
            larger_failed_bytes: None,
            passes: 3,
            runs: 9,
        });
        assert_eq!(home_hint_line(&r, &r.traces[0]), None);
    }

    /// Where no home held the trace, the line says how far the search looked.
    #[test]
    fn the_home_line_says_how_far_the_search_looked_when_nothing_held() {
        let mut r = report(manager("passes", 3), false);
        r.traces[0].initial_size = Some(HomeReport {
            bytes: None,
            over_live: None,
            larger_failed_bytes: None,
            passes: 3,
            runs: 4,
        });
        let line = home_line(&r.traces[0]).expect("a line");
        assert!(
            line.contains("no home segment up to 16 times the peak"),
            "{line}"
        );
    }
}
