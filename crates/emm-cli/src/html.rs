//! `--html FILE`: a self-contained page (inline CSS and SVG, no script, nothing
//! fetched) with, per trace, the table and a chart of live and reserved bytes over
//! the trace for each manager. The SVG is written by hand: a few polylines, axes and
//! a legend need no plotting library (see docs/decisions/pytorch-snapshot.md).

use std::fmt::Write as _;

use crate::report::{
    failure_line, last_label, passes_line, rows, unsettled, verdict_of, Report, TraceReport,
    NO_SEGMENTS,
};
use crate::units;

const W: f64 = 960.0;
const H: f64 = 380.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const LEGEND_LINE: f64 = 18.0;
const BOTTOM: f64 = 50.0;

/// Escapes text for HTML and SVG (element content and attribute values).
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn color(manager: &str) -> &'static str {
    match manager {
        "default" => "#d62728",
        "pool" => "#1f77b4",
        "hostonly" => "#2ca02c",
        "pytorch" => "#ff7f0e",
        "pytorch-native" => "#e377c2",
        "pytorch-expandable" => "#8c564b",
        _ => "#9467bd",
    }
}

/// The whole page.
pub fn page(r: &Report) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>emm replay</title>\n<style>\n\
         body{{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}}\n\
         table{{border-collapse:collapse;margin:8px 0 16px}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}}\n\
         td:first-child,th:first-child,td:nth-child(2),th:nth-child(2){{text-align:left}}\n\
         .note{{color:#555;font-size:90%}}.failed{{color:#b00}}svg text{{font-size:12px;fill:#333}}\n\
         </style></head><body>\n<h1>emm replay</h1>\n<p class=\"note\">{}</p>\n",
        escape(&r.backend_detail)
    );
    let all = rows(r);
    let last = escape(&last_label(r));
    for t in &r.traces {
        let _ = write!(
            h,
            "<h2>{}</h2>\n<p class=\"note\">{}: {} events, {} allocation requests, streams: {}, peak live {}</p>\n<table><tr><th>manager</th><th>peak reserved</th><th>reserved/live (pass 1)</th><th>reserved/live ({last})</th><th>passes</th><th>driver calls</th><th>time</th></tr>\n",
            escape(&t.trace),
            t.format,
            t.events,
            t.requests,
            t.streams,
            units::bytes(t.peak_live_bytes)
        );
        if let Some(v) = verdict_of(r, t) {
            let _ = writeln!(h, "<p><strong>{}</strong></p>", escape(&v));
        }
        for row in all.iter().filter(|row| row[0] == t.trace) {
            let status = if row[9].is_empty() {
                String::new()
            } else {
                format!(" <strong class=\"failed\">{}</strong>", escape(&row[9]))
            };
            let _ = writeln!(
                h,
                "<tr><td><span style=\"color:{}\">&#9632;</span> {}{status}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
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
        for m in &t.managers {
            if let Some(why) = failure_line(t, m) {
                let _ = writeln!(h, "<p class=\"note failed\">{}</p>", escape(&why));
            }
        }
        for m in t.managers.iter().filter(|m| m.passes.len() > 1) {
            let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(&passes_line(t, m)));
        }
        for m in &t.managers {
            if let Some(why) = r.steady_rule.as_ref().and_then(|rule| unsettled(m, rule)) {
                let _ = writeln!(
                    h,
                    "<p class=\"note\">{} {}</p>",
                    escape(&m.manager),
                    escape(&why)
                );
            }
        }
        if t.pytorch
            .as_ref()
            .is_some_and(|p| p.peak_reserved_bytes.is_none())
        {
            let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(NO_SEGMENTS));
        }
        for s in &t.skipped {
            let _ = writeln!(
                h,
                "<p class=\"note\">{} skipped: {}</p>",
                escape(&s.manager),
                escape(&s.why)
            );
        }
        h.push_str(&chart(t));
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">emm {} &mdash; <code>{}</code></p>",
        escape(&r.emm_version),
        escape(&r.command)
    );
    h.push_str("</body></html>\n");
    h
}

/// A round tick step (1, 2, 5, 10, …, 500 of a binary unit, or the next unit)
/// giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1.0);
    let mut unit = 1.0;
    while raw / unit >= 1024.0 {
        unit *= 1024.0;
    }
    let m = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]
        .into_iter()
        .find(|m| m * unit >= raw)
        .unwrap_or(1024.0);
    m * unit
}

/// Points of a step curve: each value holds until the next sample.
fn steps(points: impl Iterator<Item = (f64, f64)>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut prev: Option<f64> = None;
    for (x, y) in points {
        if let Some(py) = prev {
            out.push(format!("{x:.1},{py:.1}"));
        }
        out.push(format!("{x:.1},{y:.1}"));
        prev = Some(y);
    }
    out.join(" ")
}

/// The chart of one trace.
pub fn chart(t: &TraceReport) -> String {
    let torch_reserved = t.pytorch.as_ref().and_then(|p| p.peak_reserved_bytes);
    let entries = t.managers.len() + 1 + usize::from(torch_reserved.is_some());
    let top = 12.0 + LEGEND_LINE * entries as f64 + 10.0;
    let h = H + top;
    // Every pass's events (`--passes`): the curves run to the last sample.
    let last_sample = t
        .managers
        .iter()
        .filter_map(|m| m.reserved_curve.last().map(|p| p.0))
        .chain(t.live_curve.last().map(|p| p.0))
        .max()
        .unwrap_or(0);
    let x_max = t.events.max(last_sample).max(1) as f64;
    let mut y_max = t.live_curve.iter().map(|p| p.1).max().unwrap_or(0) as f64;
    for m in &t.managers {
        y_max = y_max.max(m.reserved_curve.iter().map(|p| p.1).max().unwrap_or(0) as f64);
    }
    if let Some(p) = torch_reserved {
        y_max = y_max.max(p as f64);
    }
    let y_step = nice_step(y_max);
    let y_max = ((y_max / y_step).ceil() * y_step).max(y_step);
    let (pw, ph) = (W - LEFT - RIGHT, H - BOTTOM);
    let x = |e: f64| LEFT + e / x_max * pw;
    let y = |b: f64| top + ph - b / y_max * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" role=\"img\" aria-label=\"live and reserved bytes over {}\">\n<rect x=\"{LEFT}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n",
        escape(&t.trace)
    );
    let mut b = 0.0;
    while b <= y_max * 1.0001 {
        let yy = y(b);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            units::bytes(b as u128)
        );
        b += y_step;
    }
    let x_step = (x_max / 5.0).ceil().max(1.0);
    let mut e = 0.0;
    while e <= x_max {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}</text>",
            x(e),
            top + ph + 18.0,
            e
        );
        e += x_step;
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">events replayed</text>",
        LEFT + pw / 2.0,
        h - 8.0
    );
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    if let Some(p) = torch_reserved {
        let yy = y(p as f64);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>",
            W - RIGHT,
            color("pytorch")
        );
        legend.push((
            format!("PyTorch peak reserved ({})", units::bytes(p)),
            color("pytorch"),
            true,
        ));
    }
    for m in &t.managers {
        let pts = steps(
            m.reserved_curve
                .iter()
                .map(|&(e, b)| (x(e as f64), y(b as f64))),
        );
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{pts}\"/>",
            color(&m.manager)
        );
        legend.push((
            format!(
                "{} reserved (peak {})",
                m.manager,
                units::bytes(u128::from(m.peak_reserved_bytes))
            ),
            color(&m.manager),
            false,
        ));
    }
    let pts = steps(
        t.live_curve
            .iter()
            .map(|&(e, b)| (x(e as f64), y(b as f64))),
    );
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#222\" stroke-width=\"1.5\" points=\"{pts}\"/>"
    );
    legend.push((
        format!("live (peak {})", units::bytes(t.peak_live_bytes)),
        "#222",
        false,
    ));
    // The legend sits above the plot, where no curve can cross it.
    for (i, (label, c, dashed)) in legend.iter().enumerate() {
        let yy = 12.0 + LEGEND_LINE * (i as f64 + 0.5);
        let dash = if *dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{c}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT,
            LEFT + 24.0,
            LEFT + 30.0,
            yy + 4.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_in_binary_units() {
        assert_eq!(
            nice_step(3.6 * f64::from(1u32 << 30)),
            f64::from(1u32 << 30)
        );
        assert_eq!(nice_step(24.0 * 1048576.0), 5.0 * 1048576.0);
        assert_eq!(nice_step(4.0), 1.0);
        assert_eq!(
            steps([(0.0, 1.0), (2.0, 3.0)].into_iter()),
            "0.0,1.0 2.0,1.0 2.0,3.0"
        );
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b>&\"c'.csv"), "a&lt;b&gt;&amp;&quot;c&#39;.csv");
    }
}
