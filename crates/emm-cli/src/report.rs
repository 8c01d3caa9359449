//! What `emm replay` found, as data (serialised with `serde_json` for `--json`) and
//! as the text table.

use std::io;

use serde::Serialize;

use crate::out::Out;
use crate::units;

/// The whole run.
#[derive(Serialize)]
pub struct Report {
    pub backend: &'static str,
    pub backend_detail: String,
    pub traces: Vec<TraceReport>,
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
    pub pytorch: Option<TorchReport>,
    pub managers: Vec<ManagerReport>,
    pub skipped: Vec<Skipped>,
    /// Live bytes along the trace: `[event, bytes]` (for the page).
    #[serde(skip)]
    pub live_curve: Vec<(u64, u128)>,
}

/// PyTorch's own figures from a snapshot.
#[derive(Serialize)]
pub struct TorchReport {
    pub peak_reserved_bytes: u128,
    pub reserved_at_dump_bytes: u128,
    pub allocated_at_dump_bytes: u128,
    pub reconstructed_allocations: u64,
    pub cross_stream_frees: u64,
    pub ooms: u64,
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
    pub failures: u64,
    pub first_failure: Option<String>,
    /// Reserved bytes along the trace: `[event, bytes]` (for the page).
    #[serde(skip)]
    pub reserved_curve: Vec<(u64, u64)>,
    /// Each pass over the trace (`--passes`; one entry for a single pass).
    pub passes: Vec<PassReport>,
}

/// Driver calls for memory (emm-trace's `DriverCalls`, with their sum).
#[derive(Clone, Copy, Serialize)]
pub struct DriverReport {
    pub total: u64,
    pub allocs: u64,
    pub frees: u64,
    pub pieces_mapped: u64,
    pub pieces_moved: u64,
    pub pieces_unmapped: u64,
}

impl From<emm::trace::DriverCalls> for DriverReport {
    fn from(d: emm::trace::DriverCalls) -> Self {
        DriverReport {
            total: d.total(),
            allocs: d.allocs,
            frees: d.frees,
            pieces_mapped: d.pieces_mapped,
            pieces_moved: d.pieces_moved,
            pieces_unmapped: d.pieces_unmapped,
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

/// The rows of the text table: `[trace, manager, requests, peak live, peak
/// reserved, reserved/live, upstream, driver calls, time]`.
pub fn rows(r: &Report) -> Vec<[String; 9]> {
    let mut rows = Vec::new();
    for t in &r.traces {
        for m in &t.managers {
            rows.push([
                t.trace.clone(),
                m.manager.clone(),
                m.requests.to_string(),
                units::bytes(m.peak_live_bytes),
                units::bytes(u128::from(m.peak_reserved_bytes)),
                units::ratio(u128::from(m.peak_reserved_bytes), m.peak_live_bytes),
                m.upstream_allocs.to_string(),
                m.driver.total.to_string(),
                units::duration(std::time::Duration::from_secs_f64(m.seconds)),
            ]);
        }
        if let Some(p) = &t.pytorch {
            rows.push([
                t.trace.clone(),
                "pytorch".into(),
                t.requests.to_string(),
                units::bytes(t.peak_live_bytes),
                units::bytes(p.peak_reserved_bytes),
                units::ratio(p.peak_reserved_bytes, t.peak_live_bytes),
                "-".into(),
                "-".into(),
                "(recorded)".into(),
            ]);
        }
    }
    rows
}

/// Writes the table.
pub fn table(out: &mut Out, r: &Report) -> io::Result<()> {
    const HEAD: [&str; 9] = [
        "trace",
        "manager",
        "requests",
        "peak live",
        "peak reserved",
        "reserved/live",
        "upstream",
        "driver calls",
        "time",
    ];
    let rows = rows(r);
    let name_w = rows
        .iter()
        .map(|r| r[0].chars().count())
        .max()
        .unwrap_or(5)
        .clamp(5, 40);
    out.line(format_args!(
        "{:<name_w$}  {:<8} {:>9} {:>11} {:>13} {:>13} {:>9} {:>12} {:>10}",
        HEAD[0], HEAD[1], HEAD[2], HEAD[3], HEAD[4], HEAD[5], HEAD[6], HEAD[7], HEAD[8]
    ))?;
    for c in &rows {
        out.line(format_args!(
            "{:<name_w$}  {:<8} {:>9} {:>11} {:>13} {:>13} {:>9} {:>12} {:>10}",
            fit(&c[0], name_w),
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8]
        ))?;
    }
    for t in &r.traces {
        for m in t.managers.iter().filter(|m| m.passes.len() > 1) {
            out.line(passes_line(t, m))?;
        }
    }
    for t in &r.traces {
        if let Some(p) = &t.pytorch {
            out.line(format_args!(
                "{}: PyTorch: reserved {} at the dump; allocations from before the recording, reconstructed: {}; frees held back by another stream: {}; out-of-memory events: {}",
                t.trace,
                units::bytes(p.reserved_at_dump_bytes),
                p.reconstructed_allocations,
                p.cross_stream_frees,
                p.ooms
            ))?;
        }
    }
    Ok(())
}

/// One line on a replay of several passes: the driver calls of the first pass
/// (the manager growing to its size) beside those of the later ones (what a
/// warm manager pays each pass), and the footprint after the first and the last.
pub fn passes_line(t: &TraceReport, m: &ManagerReport) -> String {
    let (Some(first), Some(last)) = (m.passes.first(), m.passes.last()) else {
        return String::new();
    };
    let later: Vec<u64> = m.passes[1..].iter().map(|p| p.driver.total).collect();
    let (lo, hi) = (
        later.iter().min().copied().unwrap_or(0),
        later.iter().max().copied().unwrap_or(0),
    );
    let d = &last.driver;
    // Three decimals: a pass's drift is often under 1 %.
    let ratio = |reserved: u64, live: u128| {
        if live == 0 {
            "-".to_owned()
        } else {
            format!("{:.3}x", reserved as f64 / live as f64)
        }
    };
    format!(
        "{} through {}, {} passes: driver calls in pass 1 {}, in each later pass {}; the last: {} pieces mapped, {} moved, {} unmapped, {} allocations, {} frees, {}; peak reserved/live {} after pass 1, {} after pass {}",
        t.trace,
        m.manager,
        m.passes.len(),
        first.driver.total,
        if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        },
        d.pieces_mapped,
        d.pieces_moved,
        d.pieces_unmapped,
        d.allocs,
        d.frees,
        units::duration(std::time::Duration::from_secs_f64(last.seconds)),
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
