//! The text table of `emm replay`: its rows and columns, the legend under it,
//! and the order in which the sentences of `lines.rs` follow it.

use std::io;

use crate::out::Out;
use crate::units;

use super::lines::{
    device_memory_line, failed_cell, failed_line, failure_line, fit_line, home_hint_line,
    home_line, passes_line, peak_slack_line, reused_line, skipped_lines, torch_lines, unsettled,
    verdict_of,
};
use super::model::{ManagerReport, Report};

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
