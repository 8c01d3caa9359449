//! The sentences `emm replay` prints under its table (and the page shows): a
//! verdict per trace, why a replay failed or did not settle, where a pool's
//! peak went, the `--fit`, `--device-memory` and `--initial-size` answers.

use crate::{units, verdict};

use super::model::{FitReport, ManagerReport, PassReport, Report, SteadyRuleReport, TraceReport};

/// `FAILED: n of m requests` for a replay in which requests failed, else `None`.
pub fn failed_cell(m: &ManagerReport) -> Option<String> {
    m.failed
        .then(|| format!("FAILED: {} of {} requests", m.failures, m.requests))
}
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
        .map(|f| {
            let answer = match (f.with_overhead_bytes, f.larger_failed_bytes) {
                (Some(n), None) => format!("{} {}", f.manager, units::bytes(u128::from(n))),
                (Some(n), Some(l)) => format!(
                    "{} {} (but not {}: not monotone)",
                    f.manager,
                    units::bytes(u128::from(n)),
                    units::bytes(u128::from(l.saturating_add(r.overhead_bytes)))
                ),
                (None, _) if f.stopped_for_time => {
                    format!("{} not answered: no size tried ran", f.manager)
                }
                (None, _) => format!("{} does not run", f.manager),
            };
            format!(
                "{answer}{}",
                stopped_note(f.stopped_for_time, f.within_bytes, f.runs)
            )
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
        _ if h.stopped_for_time => format!(
            "no home segment tried held it over {} passes",
            h.passes
        ),
        _ => format!(
            "no home segment up to {} times the peak of live bytes held it over {} passes",
            2u64 << crate::fit::DOUBLINGS,
            h.passes
        ),
    };
    Some(format!(
        "{}: without virtual memory (EMM_POOL_EXPANDABLE=0): {what}; {} replays{}",
        t.trace,
        h.runs,
        stopped_note(h.stopped_for_time, h.within_bytes, h.runs)
    ))
}

/// ` (search stopped at its 120 s bound after N replays: at most X above the
/// smallest)` where a `--fit` or `--initial-size` search stopped for time.
fn stopped_note(stopped: bool, within: u64, runs: u32) -> String {
    if !stopped {
        return String::new();
    }
    let bound = crate::fit::SEARCH_TIME.as_secs();
    if within == 0 {
        format!(" (the search stopped at its {bound} s bound after {runs} replays)")
    } else {
        format!(
            " (the search stopped at its {bound} s bound after {runs} replays: at most {} above the smallest)",
            units::bytes(u128::from(within))
        )
    }
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
    let part = match m.abandoned_events {
        0 => String::new(),
        n => format!(
            " and {n} events of pass {} (stopped there; its part is in the figures)",
            m.steady_passes + 1
        ),
    };
    Some(format!(
        "stopped {bound} after {} passes{part}, before peak reserved held for {} in a row (it last rose in pass {}): the steady figure may still grow",
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
