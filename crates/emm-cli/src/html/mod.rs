//! `--html FILE`: one self-contained page (inline CSS, SVG and a small script;
//! nothing fetched) with, per trace, the verdict, the table, the notes, a chart
//! of live and reserved bytes over time (`axis.rs`, `chart.rs`) and each
//! manager's segment map at its peak (`segments.rs`), hover details (with the
//! snapshot's stacks, `stacks.rs`) and zoom (`script.js`); the emm version and
//! the command at the foot. The page is bounded in size whatever the trace:
//! curves of at most a few thousand points, maps of at most
//! [`segments::MAX_ENTRIES`] rectangles, stacks kept once within
//! [`stacks::FRAME_BUDGET`].

mod axis;
mod chart;
mod segments;
mod stacks;
mod text;

use std::fmt::Write as _;

use serde_json::json;

use crate::report::{
    device_memory_line, failure_line, fit_line, last_label, passes_line, reused_line, rows,
    torch_lines, unsettled, verdict_of, Report, TraceReport,
};
use crate::units;
use axis::Axis;
use stacks::Stacks;
use text::{color, escape, json_for_script};

const STYLE: &str = include_str!("style.css");
const SCRIPT: &str = include_str!("script.js");

/// The whole page.
pub fn page(r: &Report) -> String {
    let names: Vec<&str> = r.traces.iter().map(|t| t.trace.as_str()).collect();
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>emm replay: {}</title>\n<style>\n{STYLE}</style></head><body>\n<h1>emm replay</h1>\n<p class=\"note\">{}</p>\n",
        escape(&names.join(", ")),
        escape(&r.backend_detail)
    );
    if r.failed {
        let _ = write!(
            h,
            "<div class=\"banner failed\" id=\"failed\"><strong>This run FAILED</strong> (exit status 1); the figures of a failed replay are not the trace's.<ul>"
        );
        for e in &r.errors {
            let _ = write!(h, "<li>{}</li>", escape(e));
        }
        h.push_str("</ul></div>\n");
    }
    let mut stacks = Stacks::default();
    let (mut charts, mut maps) = (Vec::new(), Vec::new());
    for (ti, t) in r.traces.iter().enumerate() {
        h.push_str(&trace_head(r, t));
        let details = t.source.as_ref().and_then(|s| s.details());
        let axis = Axis::new(details, t.events);
        if !t.managers.is_empty() {
            let (svg, data) = chart::chart(t, &axis, ti);
            let _ = write!(
                h,
                "<p class=\"tools\"><button type=\"button\" class=\"reset\" data-chart=\"{ti}\">Reset zoom</button> <span class=\"note\">Hover for the figures at a moment; drag across the chart to zoom into a span, or turn the wheel over it; a double click resets. Dotted lines: where each segment map below was taken.</span></p>\n{svg}"
            );
            charts.push(data);
        }
        for m in &t.managers {
            if let Some((section, data)) =
                segments::map_section(m, ti, maps.len(), &axis, details, &mut stacks)
            {
                h.push_str(&section);
                maps.push(data);
            }
        }
        if t.managers.iter().any(|m| m.map.is_none()) && !t.managers.is_empty() {
            let none: Vec<&str> = t
                .managers
                .iter()
                .filter(|m| m.map.is_none())
                .map(|m| m.manager.as_str())
                .collect();
            let _ = writeln!(
                h,
                "<p class=\"note\">No map of {}: its reserved bytes never rose above where they started.</p>",
                escape(&none.join(", "))
            );
        }
        h.push_str("</section>\n");
    }
    if stacks.left_out > 0 {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} stacks are left out, to keep the page small; the blocks they made show no frames.</p>",
            stacks.left_out
        );
    }
    let _ = writeln!(
        h,
        "<footer class=\"note\">emm {} &mdash; <code>{}</code></footer>",
        escape(&r.emm_version),
        escape(&r.command)
    );
    let data = json!({
        "charts": charts,
        "maps": maps,
        "stacks": stacks.json(),
    });
    let _ = write!(
        h,
        "<div id=\"tip\" class=\"tip\" hidden></div>\n<script type=\"application/json\" id=\"emm-data\">{}</script>\n<script>\n{SCRIPT}</script>\n</body></html>\n",
        json_for_script(&data)
    );
    h
}

/// A trace's heading, verdict, table and notes.
fn trace_head(r: &Report, t: &TraceReport) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<section class=\"trace\">\n<h2>{}</h2>\n",
        escape(&t.trace)
    );
    if let Some(v) = verdict_of(r, t) {
        let _ = writeln!(
            h,
            "<p class=\"verdict\"><strong>{}</strong></p>",
            escape(&v)
        );
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">{}: {} events, {} allocation requests, streams: {}, peak live {}</p>",
        t.format,
        t.events,
        t.requests,
        t.streams,
        units::bytes(t.peak_live_bytes)
    );
    let last = escape(&last_label(r));
    let _ = writeln!(
        h,
        "<table><tr><th>manager</th><th>peak reserved</th><th>reserved/live (pass 1)</th><th>reserved/live ({last})</th><th>passes</th><th>driver calls</th><th>time</th></tr>"
    );
    for row in rows(r).iter().filter(|row| row[0] == t.trace) {
        let (class, status) = if row[9].is_empty() {
            ("", String::new())
        } else {
            (
                " class=\"failed-row\"",
                format!(" <strong class=\"failed\">{}</strong>", escape(&row[9])),
            )
        };
        let _ = writeln!(
            h,
            "<tr{class}><td><span style=\"color:{}\">&#9632;</span> {}{status}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            color(&row[1]),
            escape(&row[1]),
            escape(&row[3]),
            escape(&row[4]),
            escape(&row[5]),
            escape(&row[6]),
            escape(&row[7]),
            escape(&row[8])
        );
    }
    h.push_str("</table>\n");
    // The notes, as the table's lines say them.
    let mut notes: Vec<(String, bool)> = Vec::new();
    for m in &t.managers {
        if let Some(why) = failure_line(t, m) {
            notes.push((why, true));
        }
    }
    for m in t.managers.iter().filter(|m| m.passes.len() > 1) {
        notes.push((passes_line(t, m, r.ranks), false));
    }
    for m in &t.managers {
        if let Some(why) = r.steady_rule.as_ref().and_then(|rule| unsettled(m, rule)) {
            notes.push((format!("{} {why}", m.manager), false));
        }
    }
    notes.extend(device_memory_line(r, t).map(|l| (l, false)));
    notes.extend(fit_line(r, t).map(|l| (l, false)));
    notes.extend(reused_line(t).map(|l| (l, false)));
    notes.extend(torch_lines(t).into_iter().map(|l| (l, false)));
    for s in &t.skipped {
        notes.push((format!("{} skipped: {}", s.manager, s.why), false));
    }
    if t.malformed_lines > 0 {
        notes.push((
            format!(
                "{}: {} malformed lines or records skipped",
                t.trace, t.malformed_lines
            ),
            false,
        ));
    }
    if !notes.is_empty() {
        h.push_str("<ul class=\"notes\">\n");
        for (n, failed) in notes {
            let class = if failed { " class=\"failed\"" } else { "" };
            let _ = writeln!(h, "<li{class}>{}</li>", escape(&n));
        }
        h.push_str("</ul>\n");
    }
    h
}
