//! One trace's chart: live bytes, each manager's reserved bytes and PyTorch's
//! recorded reserved bytes over time, as hand-written SVG (see
//! docs/decisions/pytorch-snapshot.md), with the data the page's script needs
//! for hover details and zoom.
//!
//! Every manager's curve is put on one grid of buckets (the samples of the
//! longest replay: the replays thin their samples at the same event counts, so
//! a shorter one's buckets nest in it), each bucket's value the most of the
//! samples it covers: reserved bytes are then never drawn below live bytes.

use std::fmt::Write as _;

use emm::trace::Sample;
use serde_json::{json, Value};

use super::axis::{tick_label, tick_step, Axis};
use super::text::{color, escape};
use crate::report::TraceReport;
use crate::units;

/// The SVG's size and margins (pixels).
pub const W: f64 = 960.0;
const H: f64 = 380.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const LEGEND_LINE: f64 = 18.0;
const BOTTOM: f64 = 50.0;
/// The curves' x coordinates run over this many units across the plot (scaled
/// to its width), fine enough to zoom in 10,000 times.
const VX: f64 = 1_000_000.0;
/// The most points of PyTorch's recorded curve.
pub const MAX_POINTS: usize = 2000;

/// One curve on the grid: a value per grid point (`None` where its replay does
/// not cover the bucket).
struct Curve {
    name: String,
    color: &'static str,
    values: Vec<Option<u128>>,
    failed: bool,
}

/// The grid of buckets: the events ending each (the first, 0, is the start).
fn grid(t: &TraceReport) -> Vec<u64> {
    t.managers
        .iter()
        .max_by_key(|m| m.curve.last().map_or(0, |s| s.event))
        .map(|m| m.curve.iter().map(|s| s.event).collect())
        .unwrap_or_default()
}

/// `curve` on `grid`: for each bucket the most of the samples whose buckets
/// overlap it, with `pick` taking the figure; `None` for buckets the curve does
/// not reach to their end.
fn on_grid(curve: &[Sample], grid: &[u64], pick: impl Fn(&Sample) -> u128) -> Vec<Option<u128>> {
    let end = curve.last().map_or(0, |s| s.event);
    let mut out = Vec::with_capacity(grid.len());
    let mut r = 1;
    for (j, &g) in grid.iter().enumerate() {
        if j == 0 {
            out.push(curve.first().map(&pick));
            continue;
        }
        if g > end {
            out.push(None);
            continue;
        }
        let from = grid[j - 1];
        // Samples ending at or before the bucket's start do not overlap it.
        while r < curve.len() && curve[r].event <= from {
            r += 1;
        }
        let mut most = None;
        let mut k = r;
        while k < curve.len() && curve[k - 1].event < g {
            most = most.max(Some(pick(&curve[k])));
            k += 1;
        }
        out.push(most);
    }
    out
}

/// A round step in binary units (1, 2, 5, …, 500 of B, KiB, MiB, …) giving about
/// five ticks up to `max`.
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

/// A tick's bytes in the unit of the step (`1500 MiB` beside `500 MiB`, not
/// `1.46 GiB`).
fn bytes_tick(v: f64, step: f64) -> String {
    const NAMES: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 1.0;
    let mut i = 0;
    while step / unit >= 1024.0 && i + 1 < NAMES.len() {
        unit *= 1024.0;
        i += 1;
    }
    if v == 0.0 {
        "0".into()
    } else {
        format!("{} {}", (v / unit).round(), NAMES[i])
    }
}

/// A number for the script, rounded to a millionth (time in seconds keeps its
/// microseconds).
fn num(x: f64) -> Value {
    json!((x * 1e6).round() / 1e6)
}

/// The chart of trace `t`, number `id` on the page: its SVG and its data.
pub fn chart(t: &TraceReport, axis: &Axis<'_>, id: usize) -> (String, Value) {
    let grid = grid(t);
    let mut curves: Vec<Curve> = Vec::new();
    let longest = t
        .managers
        .iter()
        .max_by_key(|m| m.curve.last().map_or(0, |s| s.event));
    if let Some(m) = longest {
        curves.push(Curve {
            name: "live".into(),
            color: "#222",
            values: on_grid(&m.curve, &grid, |s| s.live_bytes),
            failed: false,
        });
    }
    for m in &t.managers {
        curves.push(Curve {
            name: m.manager.clone(),
            color: color(&m.manager),
            values: on_grid(&m.curve, &grid, |s| u128::from(s.reserved_bytes)),
            failed: m.failed,
        });
    }
    let xs: Vec<f64> = grid.iter().map(|&e| axis.at(e)).collect();
    let passes = t
        .managers
        .iter()
        .map(|m| m.steady_passes)
        .max()
        .unwrap_or(1);
    // PyTorch's reserved bytes as recorded: one pass, the recording.
    let recorded = recorded(t, axis);
    let x_max = xs
        .last()
        .copied()
        .unwrap_or(0.0)
        .max(recorded.as_ref().map_or(0.0, |r| r.2))
        .max(f64::MIN_POSITIVE);
    let mut y_max = 0.0f64;
    for c in &curves {
        y_max = y_max.max(c.values.iter().flatten().max().copied().unwrap_or(0) as f64);
    }
    if let Some((_, ys, _)) = &recorded {
        y_max = y_max.max(ys.iter().copied().max().unwrap_or(0) as f64);
    }
    let y_step = nice_step(y_max);
    let y_max = ((y_max / y_step).ceil() * y_step).max(y_step);

    let entries = curves.len() + usize::from(recorded.is_some());
    let top = 12.0 + LEGEND_LINE * entries as f64 + 10.0;
    let h = H + top;
    let (pw, ph) = (W - LEFT - RIGHT, H - BOTTOM);
    let vx = |x: f64| x / x_max * VX;
    let y = |b: f64| top + ph - b / y_max * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"chart{id}\" data-chart=\"{id}\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" role=\"img\" aria-label=\"live and reserved bytes over {}\">\n\
         <defs><clipPath id=\"clip{id}\"><rect x=\"{LEFT}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\"/></clipPath></defs>\n\
         <rect x=\"{LEFT}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n",
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
            bytes_tick(b, y_step)
        );
        b += y_step;
    }
    // Tick labels along x (the script writes them again when zoomed).
    let _ = write!(s, "<g class=\"xticks\">");
    let step = tick_step(x_max, 6.0);
    let mut e = 0.0;
    while e <= x_max * 1.0001 {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            LEFT + e / x_max * pw,
            top + ph + 18.0,
            tick_label(e, step)
        );
        e += step;
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        "<text class=\"xlabel\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        LEFT + pw / 2.0,
        h - 8.0,
        escape(&axis.label(passes))
    );
    // The curves, in a group the script scales to zoom.
    let _ = writeln!(
        s,
        "<g clip-path=\"url(#clip{id})\"><g class=\"zoom\" transform=\"translate({LEFT} 0) scale({} 1)\">",
        pw / VX
    );
    if passes > 1 && passes <= 200 && axis.pass_span() > 0.0 {
        for p in 1..passes {
            let xx = vx(p as f64 * axis.pass_span());
            let _ = write!(
                s,
                "<line class=\"pass\" x1=\"{xx:.0}\" y1=\"{top}\" x2=\"{xx:.0}\" y2=\"{:.1}\" stroke=\"#ddd\" vector-effect=\"non-scaling-stroke\"/>",
                top + ph
            );
        }
        s.push('\n');
    }
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    let mut recorded_line = String::new();
    if let Some((rx, ry, end)) = &recorded {
        let pts = steps(
            rx.iter().map(|&x| vx(x)),
            ry.iter().map(|&b| y(b as f64)),
            vx(*end),
        );
        // Drawn over the managers' curves (a model that matches it would hide it).
        recorded_line = format!(
            "<polyline class=\"series\" data-series=\"recorded\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"6 4\" vector-effect=\"non-scaling-stroke\" points=\"{pts}\"/>\n",
            color("pytorch")
        );
        let peak = t
            .pytorch
            .as_ref()
            .and_then(|p| p.peak_reserved_bytes)
            .unwrap_or(0);
        legend.push((
            format!(
                "PyTorch reserved, as recorded (segment events; peak {})",
                units::bytes(peak)
            ),
            color("pytorch"),
            true,
        ));
    }
    for (k, c) in curves.iter().enumerate().skip(1) {
        let pts = grid_steps(&xs, &c.values, &vx, &y);
        let dash = if c.failed {
            " stroke-dasharray=\"2 3\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline class=\"series\" data-series=\"{k}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash} vector-effect=\"non-scaling-stroke\" points=\"{pts}\"/>",
            c.color
        );
        let m = &t.managers[k - 1];
        legend.push((
            format!(
                "{} reserved (peak {}){}",
                m.manager,
                units::bytes(u128::from(m.peak_reserved_bytes)),
                if m.failed {
                    " FAILED: requests were refused"
                } else {
                    ""
                }
            ),
            c.color,
            c.failed,
        ));
    }
    s.push_str(&recorded_line);
    if let Some(c) = curves.first() {
        let pts = grid_steps(&xs, &c.values, &vx, &y);
        let _ = writeln!(
            s,
            "<polyline class=\"series\" data-series=\"0\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.5\" vector-effect=\"non-scaling-stroke\" points=\"{pts}\"/>"
        );
        legend.push((
            format!("live (peak {})", units::bytes(t.peak_live_bytes)),
            "#222",
            false,
        ));
    }
    // Where each manager's segment map below was taken.
    for m in &t.managers {
        if let Some(p) = &m.at_peak {
            let xx = vx(axis.at(p.event));
            let _ = write!(
                s,
                "<line class=\"peak\" x1=\"{xx:.0}\" y1=\"{top}\" x2=\"{xx:.0}\" y2=\"{:.1}\" stroke=\"{}\" stroke-dasharray=\"1 3\" vector-effect=\"non-scaling-stroke\"/>",
                top + ph,
                color(&m.manager)
            );
        }
    }
    let _ = writeln!(
        s,
        "</g><line class=\"cursor\" x1=\"0\" y1=\"{top}\" x2=\"0\" y2=\"{:.1}\" stroke=\"#888\" visibility=\"hidden\"/><rect class=\"select\" x=\"0\" y=\"{top}\" width=\"0\" height=\"{ph}\" fill=\"#1f77b4\" fill-opacity=\"0.12\" visibility=\"hidden\"/></g>",
        top + ph
    );
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
            "<line x1=\"{LEFT:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{c}\" stroke-width=\"2\"{dash}/><text class=\"legend\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + 24.0,
            LEFT + 30.0,
            yy + 4.0,
            escape(label)
        );
    }
    let _ = writeln!(
        s,
        "<rect class=\"hover\" x=\"{LEFT}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"transparent\"/>\n</svg>"
    );
    let data = json!({
        "id": id,
        "left": LEFT,
        "top": top,
        "pw": pw,
        "ph": ph,
        "vx": VX,
        "xmax": num(x_max),
        "time": axis.is_time(),
        "span": num(axis.pass_span()),
        "passes": passes,
        "x": xs.iter().map(|&x| num(x)).collect::<Vec<_>>(),
        "series": curves.iter().map(|c| json!({
            "name": c.name,
            "color": c.color,
            "failed": c.failed,
            "y": c.values.iter().map(|v| v.map(|b| u64::try_from(b).unwrap_or(u64::MAX))).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "recorded": recorded.as_ref().map(|(rx, ry, end)| json!({
            "x": rx.iter().map(|&x| num(x)).collect::<Vec<_>>(),
            "y": ry.iter().map(|&b| u64::try_from(b).unwrap_or(u64::MAX)).collect::<Vec<_>>(),
            "end": num(*end),
        })),
    });
    (s, data)
}

/// PyTorch's recorded reserved bytes on the axis: where each value starts,
/// the values, and where the last ends (the end of the recording); at most
/// [`MAX_POINTS`] values, each the most of the ones it stands for.
fn recorded(t: &TraceReport, axis: &Axis<'_>) -> Option<(Vec<f64>, Vec<u128>, f64)> {
    t.pytorch.as_ref()?.peak_reserved_bytes?;
    let points = t.source.as_ref()?.details()?.torch_reserved();
    if points.is_empty() {
        return None;
    }
    let per = points.len().div_ceil(MAX_POINTS);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for chunk in points.chunks(per) {
        xs.push(axis.at(chunk[0].event));
        ys.push(chunk.iter().map(|p| p.bytes).max().unwrap_or(0));
    }
    Some((xs, ys, axis.at(t.events)))
}

/// The points of a step curve whose value `j` holds from `x[j]` to `x[j+1]`
/// (the last to `end`), in the curves' units.
fn steps(x: impl Iterator<Item = f64>, y: impl Iterator<Item = f64>, end: f64) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut prev: Option<f64> = None;
    for (xx, yy) in x.zip(y) {
        if let Some(py) = prev {
            out.push(format!("{xx:.0},{py:.1}"));
        }
        out.push(format!("{xx:.0},{yy:.1}"));
        prev = Some(yy);
    }
    if let Some(py) = prev {
        out.push(format!("{end:.0},{py:.1}"));
    }
    out.join(" ")
}

/// The points of a curve on the grid: bucket `j`'s value held from `xs[j-1]` to
/// `xs[j]`.
fn grid_steps(
    xs: &[f64],
    values: &[Option<u128>],
    vx: &impl Fn(f64) -> f64,
    y: &impl Fn(f64) -> f64,
) -> String {
    let mut out: Vec<String> = Vec::new();
    for j in 1..xs.len().min(values.len()) {
        if let Some(v) = values[j] {
            let yy = y(v as f64);
            out.push(format!("{:.0},{yy:.1}", vx(xs[j - 1])));
            out.push(format!("{:.0},{yy:.1}", vx(xs[j])));
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(event: u64, live: u128, reserved: u64) -> Sample {
        Sample {
            event,
            live_bytes: live,
            reserved_bytes: reserved,
        }
    }

    #[test]
    fn binary_ticks_are_round() {
        assert_eq!(
            nice_step(3.6 * f64::from(1u32 << 30)),
            f64::from(1u32 << 30)
        );
        assert_eq!(nice_step(24.0 * 1048576.0), 5.0 * 1048576.0);
        assert_eq!(nice_step(4.0), 1.0);
        let mib = 1048576.0;
        assert_eq!(bytes_tick(1500.0 * mib, 500.0 * mib), "1500 MiB");
        assert_eq!(bytes_tick(2048.0 * mib, 1024.0 * mib), "2 GiB");
        assert_eq!(bytes_tick(0.0, mib), "0");
    }

    /// A shorter replay's finer buckets put on a longer one's coarser grid take
    /// the most of the buckets they cover, so its reserved bytes stay at or above
    /// the grid's live bytes; buckets past its end are empty.
    #[test]
    fn curves_on_the_grid_keep_reserved_above_live() {
        let long = [
            sample(0, 0, 0),
            sample(4, 90, 100),
            sample(8, 50, 100),
            sample(12, 70, 100),
        ];
        let short = [
            sample(0, 0, 0),
            sample(2, 10, 20),
            sample(4, 90, 95),
            sample(6, 50, 60),
            sample(8, 40, 70),
            sample(10, 70, 80),
        ];
        let grid: Vec<u64> = long.iter().map(|s| s.event).collect();
        let live = on_grid(&long, &grid, |s| s.live_bytes);
        let reserved = on_grid(&short, &grid, |s| u128::from(s.reserved_bytes));
        assert_eq!(reserved, [Some(0), Some(95), Some(70), None]);
        for (l, r) in live.iter().zip(&reserved) {
            if let (Some(l), Some(r)) = (l, r) {
                assert!(r >= l, "{r} < {l}");
            }
        }
        assert_eq!(
            steps([0.0, 10.0].into_iter(), [1.0, 3.0].into_iter(), 20.0),
            "0,1.0 10,1.0 10,3.0 20,3.0"
        );
    }
}
