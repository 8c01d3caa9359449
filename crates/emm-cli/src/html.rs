//! `--html FILE`: a self-contained page (inline CSS and SVG, no script, nothing
//! fetched) with, per trace, the table and a chart of live and reserved bytes over
//! the trace for each manager. The SVG is written by hand: a few polylines, axes and
//! a legend need no plotting library (see docs/decisions/pytorch-snapshot.md).

use std::fmt::Write as _;

use crate::report::{rows, Report, TraceReport};
use crate::units;

const W: f64 = 960.0;
const H: f64 = 380.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
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
         .note{{color:#555;font-size:90%}}svg text{{font-size:12px;fill:#333}}\n\
         </style></head><body>\n<h1>emm replay</h1>\n<p class=\"note\">{}</p>\n",
        escape(&r.backend_detail)
    );
    let all = rows(r);
    for t in &r.traces {
        let _ = write!(
            h,
            "<h2>{}</h2>\n<p class=\"note\">{}: {} events, {} allocation requests, {} streams, peak live {}</p>\n<table><tr><th>manager</th><th>peak reserved</th><th>reserved/live</th><th>upstream</th><th>time</th></tr>\n",
            escape(&t.trace),
            t.format,
            t.events,
            t.requests,
            t.streams,
            units::bytes(t.peak_live_bytes)
        );
        for row in all.iter().filter(|row| row[0] == t.trace) {
            let _ = writeln!(
                h,
                "<tr><td><span style=\"color:{}\">&#9632;</span> {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                color(&row[1]),
                escape(&row[1]),
                escape(&row[4]),
                escape(&row[5]),
                escape(&row[6]),
                escape(&row[7])
            );
        }
        h.push_str("</table>\n");
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
    h.push_str("</body></html>\n");
    h
}

/// The chart of one trace.
pub fn chart(t: &TraceReport) -> String {
    let x_max = t.events.max(1) as f64;
    let mut y_max = t.live_curve.iter().map(|p| p.1).max().unwrap_or(0) as f64;
    for m in &t.managers {
        y_max = y_max.max(m.reserved_curve.iter().map(|p| p.1).max().unwrap_or(0) as f64);
    }
    if let Some(p) = &t.pytorch {
        y_max = y_max.max(p.peak_reserved_bytes as f64);
    }
    let y_max = (y_max * 1.08).max(1.0);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |e: f64| LEFT + e / x_max * pw;
    let y = |b: f64| TOP + ph - b / y_max * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"live and reserved bytes over {}\">\n<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n",
        escape(&t.trace)
    );
    for i in 0..=5 {
        let b = y_max / 1.08 * f64::from(i) / 5.0;
        let yy = y(b);
        let _ = write!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            units::bytes(b as u128)
        );
        let e = x_max * f64::from(i) / 5.0;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}</text>\n",
            x(e),
            H - BOTTOM + 18.0,
            e
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">events replayed</text>\n",
        LEFT + pw / 2.0,
        H - 8.0
    );
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    if let Some(p) = &t.pytorch {
        let yy = y(p.peak_reserved_bytes as f64);
        let _ = write!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n",
            W - RIGHT,
            color("pytorch")
        );
        legend.push((
            format!("PyTorch peak reserved ({})", units::bytes(p.peak_reserved_bytes)),
            color("pytorch"),
            true,
        ));
    }
    for m in &t.managers {
        let pts: Vec<String> = m
            .reserved_curve
            .iter()
            .map(|&(e, b)| format!("{:.1},{:.1}", x(e as f64), y(b as f64)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            color(&m.manager),
            pts.join(" ")
        );
        legend.push((
            format!("{} reserved (peak {})", m.manager, units::bytes(u128::from(m.peak_reserved_bytes))),
            color(&m.manager),
            false,
        ));
    }
    let pts: Vec<String> = t
        .live_curve
        .iter()
        .map(|&(e, b)| format!("{:.1},{:.1}", x(e as f64), y(b as f64)))
        .collect();
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#222\" stroke-width=\"1.5\" points=\"{}\"/>",
        pts.join(" ")
    );
    legend.push((
        format!("live (peak {})", units::bytes(t.peak_live_bytes)),
        "#222",
        false,
    ));
    let lh = 18.0;
    let box_h = lh * legend.len() as f64 + 8.0;
    let _ = writeln!(
        s,
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"300\" height=\"{box_h:.1}\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>",
        LEFT + 10.0,
        TOP + 10.0
    );
    for (i, (label, c, dashed)) in legend.iter().enumerate() {
        let yy = TOP + 10.0 + 4.0 + lh * (i as f64 + 0.5);
        let dash = if *dashed { " stroke-dasharray=\"6 4\"" } else { "" };
        let _ = write!(
            s,
            "<line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{c}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            LEFT + 18.0,
            LEFT + 42.0,
            LEFT + 48.0,
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
    fn text_is_escaped() {
        assert_eq!(
            escape("a<b>&\"c'.csv"),
            "a&lt;b&gt;&amp;&quot;c&#39;.csv"
        );
    }
}
