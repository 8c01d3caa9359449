//! A manager's segment map at its peak (`peak::Map`): its memory as one strip
//! wrapped into rows, segment after segment, each block a rectangle coloured by
//! what holds it (live, cached, free, stranded), with the data the page's script
//! shows on hover (size, stream, when it was made, its stack).
//!
//! A map is bounded whatever the trace: blocks too narrow to see are merged
//! into runs ("12 blocks: 3.1 MiB live, 0.2 MiB free") until at most
//! [`MAX_ENTRIES`] remain.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::axis::Axis;
use super::stacks::Stacks;
use super::text::{color, escape};
use crate::peak::{Block, Kind, Map};
use crate::report::ManagerReport;
use crate::units;

/// The most rectangles of one map.
pub const MAX_ENTRIES: usize = 1500;
const LEFT: f64 = 30.0;
const WIDTH: f64 = 900.0;
const ROWS: usize = 10;
const ROW_H: f64 = 16.0;
const ROW_GAP: f64 = 5.0;
/// The largest live blocks listed under a map.
const LISTED: usize = 5;

/// What one rectangle stands for: a block, or a run of small ones.
#[derive(Default)]
struct Entry<'a> {
    /// Where it starts in the strip (bytes).
    start: u64,
    size: u64,
    /// The block, when it is one.
    block: Option<&'a Block>,
    count: u64,
    /// Bytes of each kind: live, cached, free, stranded, held.
    bytes: [u64; 5],
    segment: Option<usize>,
}

fn slot(k: Kind) -> usize {
    match k {
        Kind::Live => 0,
        Kind::Cached => 1,
        Kind::Free => 2,
        Kind::Stranded => 3,
        Kind::Held => 4,
    }
}

const NAMES: [&str; 5] = ["live", "cached", "free", "stranded", "held"];

impl Entry<'_> {
    /// The kind holding most of its bytes.
    fn kind(&self) -> usize {
        (0..5).max_by_key(|&i| (self.bytes[i], 5 - i)).unwrap_or(2)
    }
}

/// The blocks of `map` as entries, blocks smaller than `th` bytes merged into
/// runs of about `th` (not across a segment of `th` or more).
fn entries(map: &Map, th: u64) -> Vec<Entry<'_>> {
    let seg_size = |b: &Block| {
        b.segment
            .and_then(|i| map.segments.as_ref()?.get(i))
            .map_or(0, |s| s.size)
    };
    let mut out: Vec<Entry<'_>> = Vec::new();
    let mut run: Option<Entry<'_>> = None;
    // Whether the run holds blocks of a segment of `th` or more.
    let mut run_in_big = false;
    let mut start = 0u64;
    let mut prev_segment = None;
    for b in &map.blocks {
        let new_segment = b.segment != prev_segment;
        prev_segment = b.segment;
        let big_segment = seg_size(b) >= th;
        let close = run.as_ref().is_some_and(|r| {
            r.size >= th || b.size >= th || (new_segment && (big_segment || run_in_big))
        });
        if close {
            out.extend(run.take());
            run_in_big = false;
        }
        if b.size >= th {
            let mut e = Entry {
                start,
                size: b.size,
                block: Some(b),
                count: 1,
                segment: b.segment,
                ..Entry::default()
            };
            e.bytes[slot(b.kind)] = b.size;
            out.push(e);
        } else {
            let r = run.get_or_insert_with(|| Entry {
                start,
                segment: b.segment,
                ..Entry::default()
            });
            run_in_big |= big_segment;
            r.size += b.size;
            r.count += 1;
            r.block = if r.count == 1 { Some(b) } else { None };
            r.bytes[slot(b.kind)] += b.size;
        }
        start += b.size;
    }
    out.extend(run);
    out
}

/// The segment map of manager `m` (map number `id`), trace number `trace` with
/// `axis`; stacks go to the page's table. Empty without a map.
pub fn map_section(
    m: &ManagerReport,
    trace: usize,
    id: usize,
    axis: &Axis<'_>,
    details: Option<&emm::trace::TraceDetails>,
    stacks: &mut Stacks,
) -> Option<(String, Value)> {
    let map = m.map.as_ref()?;
    let at = m.at_peak.as_ref()?;
    let total: u64 = map.blocks.iter().map(|b| b.size).sum::<u64>().max(1);
    let per_px = (total as f64 / (WIDTH * ROWS as f64)).ceil() as u64;
    let mut th = per_px.max(1);
    let list = loop {
        let e = entries(map, th);
        if e.len() <= MAX_ENTRIES || th >= total {
            break e;
        }
        th = th.saturating_mul(2);
    };
    let t = &map.totals;
    let mut h = String::new();
    let when = if axis.is_time() {
        format!(" at {:.3} s", axis.at(at.event))
    } else {
        String::new()
    };
    let failed = if m.failed {
        " <strong class=\"failed\">FAILED: requests were refused; the map holds what was granted</strong>"
    } else {
        ""
    };
    let _ = write!(
        h,
        "<h3 id=\"map{id}\"><span style=\"color:{}\">&#9632;</span> {} at its peak: {} reserved{failed}</h3>\n<p class=\"note\">",
        color(&m.manager),
        escape(&m.manager),
        units::bytes(u128::from(at.reserved_bytes))
    );
    match &map.segments {
        Some(segs) => {
            let _ = write!(
                h,
                "{} segments; live {} in {} blocks ({} with the allocator's rounding); free {} (could go back to the device), stranded {} (free, but beside live blocks in their segment or, in an expandable segment, their 2 MiB page){}. ",
                segs.len(),
                units::bytes(t.live_requested),
                t.live_count,
                units::bytes(u128::from(t.live_blocks)),
                units::bytes(u128::from(t.free)),
                units::bytes(u128::from(t.stranded)),
                if t.cached > 0 {
                    format!(", cached in a thread's cache of freed blocks {}", units::bytes(u128::from(t.cached)))
                } else {
                    String::new()
                }
            );
        }
        None => {
            // What the manager's other bytes are, where emm knows it.
            let (how, besides) = match m.manager.as_str() {
                "default" => (
                    " (each allocation is its own <code>cuMemAlloc</code>)",
                    "frees waiting in its queue",
                ),
                "hostonly" => (
                    " (CUDA's stream-ordered pool keeps them)",
                    "memory CUDA's pool keeps",
                ),
                _ => ("", "memory it keeps that is not live"),
            };
            let _ = write!(
                h,
                "{} shows no segments{how}: only its totals are known. Live {} in {} allocations, shown by address; held besides {} ({besides}). ",
                escape(&m.manager),
                units::bytes(t.live_requested),
                t.live_count,
                units::bytes(u128::from(t.held))
            );
        }
    }
    let _ = write!(
        h,
        "Taken at the peak: of the moments reserved bytes were at their most, the first with the most live bytes, after event {} (pass {}){when}.",
        at.event, at.pass
    );
    if list.len() < map.blocks.len() {
        let _ = write!(
            h,
            " Blocks under {} are merged into runs ({} rectangles for {} blocks).",
            units::bytes(u128::from(th)),
            list.len(),
            map.blocks.len()
        );
    }
    h.push_str("</p>\n");
    let per_row = total as f64 / ROWS as f64;
    let height = ROWS as f64 * (ROW_H + ROW_GAP) + 24.0;
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"map\" data-map=\"{id}\" width=\"{}\" height=\"{height}\" viewBox=\"0 0 {} {height}\" role=\"img\" aria-label=\"{} at its peak\">",
        LEFT + WIDTH + 10.0,
        LEFT + WIDTH + 10.0,
        escape(&m.manager)
    );
    let live_color = color(&m.manager);
    let fill = |k: usize| match k {
        0 => live_color,
        1 => "#f3d36b",
        2 => "#e6e6e6",
        3 => "#f08c8c",
        _ => "#b9b9b9",
    };
    // A rectangle per row an entry reaches.
    let rects = |from: u64, size: u64, f: &mut dyn FnMut(f64, f64, f64)| {
        let (a, b) = (from as f64, (from + size) as f64);
        let mut row = (a / per_row).floor() as usize;
        let mut x = a;
        while x < b && row < ROWS {
            let row_end = (row + 1) as f64 * per_row;
            let end = b.min(row_end);
            let px = LEFT + (x - row as f64 * per_row) / per_row * WIDTH;
            let w = ((end - x) / per_row * WIDTH).max(0.6);
            f(px, row as f64 * (ROW_H + ROW_GAP), w);
            x = end;
            row += 1;
        }
    };
    for (i, e) in list.iter().enumerate() {
        let k = e.kind();
        let run = if e.count > 1 { " run" } else { "" };
        rects(e.start, e.size, &mut |x, y, w| {
            let _ = write!(
                h,
                "<rect class=\"b {}{run}\" data-i=\"{i}\" x=\"{x:.1}\" y=\"{y:.0}\" width=\"{w:.1}\" height=\"{ROW_H}\" fill=\"{}\"/>",
                NAMES[k],
                fill(k)
            );
        });
    }
    h.push('\n');
    // Where each segment starts.
    if let Some(segs) = &map.segments {
        let mut start = 0u64;
        for s in segs {
            if s.size >= th {
                rects(start, 1, &mut |x, y, _| {
                    let _ = write!(
                        h,
                        "<line x1=\"{x:.1}\" y1=\"{:.0}\" x2=\"{x:.1}\" y2=\"{:.0}\" stroke=\"#333\"/>",
                        y - 2.0,
                        y + ROW_H + 2.0
                    );
                });
            }
            start += s.size;
        }
    }
    // The key.
    let ky = ROWS as f64 * (ROW_H + ROW_GAP) + 12.0;
    let mut kx = LEFT;
    for (k, name) in NAMES.iter().enumerate() {
        if list.iter().all(|e| e.bytes[k] == 0) {
            continue;
        }
        let _ = write!(
            h,
            "<rect x=\"{kx}\" y=\"{:.0}\" width=\"12\" height=\"10\" fill=\"{}\"/><text x=\"{:.0}\" y=\"{ky:.0}\">{}</text>",
            ky - 9.0,
            fill(k),
            kx + 16.0,
            name
        );
        kx += 90.0;
    }
    let _ = writeln!(
        h,
        "<text x=\"{kx}\" y=\"{ky:.0}\">| a dark line: a segment starts; hover for details</text>\n</svg>"
    );
    // The largest live allocations, for a reader who does not hover.
    let mut largest: Vec<&Block> = map.blocks.iter().filter(|b| b.live.is_some()).collect();
    largest.sort_by_key(|b| std::cmp::Reverse(b.live.map_or(0, |l| l.size)));
    if !largest.is_empty() {
        h.push_str(
            "<details><summary>The largest live allocations then</summary><ul class=\"note\">",
        );
        for b in largest.iter().take(LISTED) {
            let Some(l) = b.live else { continue };
            let frame = details
                .and_then(|d| d.stack_of(l.event).map(|s| (d, s)))
                .and_then(|(d, s)| d.stack(s).find(|f| f.filename.ends_with(".py")).cloned());
            let _ = write!(
                h,
                "<li>{} on stream {}, made {}{}</li>",
                units::bytes(u128::from(l.size)),
                l.stream,
                made(axis, l.pass, l.event),
                frame.map_or(String::new(), |f| escape(&format!(
                    " by {} ({}:{})",
                    f.name, f.filename, f.line
                )))
            );
        }
        h.push_str("</ul></details>\n");
    }
    // The data the script shows on hover.
    let segs_json: Vec<Value> = map
        .segments
        .iter()
        .flatten()
        .map(|s| {
            json!([
                format!("{:#x}", s.address),
                s.size,
                s.large,
                s.expandable,
                s.live_blocks
            ])
        })
        .collect();
    let entries_json: Vec<Value> = list
        .iter()
        .map(|e| match e.block.filter(|_| e.count == 1) {
            Some(b) => match b.live {
                Some(l) => json!({
                    "k": "live",
                    "s": b.size,
                    "r": l.size,
                    "st": l.stream,
                    "w": made(axis, l.pass, l.event),
                    "sk": details
                        .and_then(|d| d.stack_of(l.event).map(|s| (d, s)))
                        .and_then(|(d, s)| stacks.id(trace, d, s)),
                    "g": b.segment,
                }),
                None => json!({ "k": NAMES[slot(b.kind)], "s": b.size, "g": b.segment }),
            },
            None => json!({
                "k": "run",
                "s": e.size,
                "n": e.count,
                "b": e.bytes,
                "g": e.segment,
            }),
        })
        .collect();
    let data = json!({
        "id": id,
        "manager": m.manager,
        "segments": segs_json,
        "entries": entries_json,
    });
    Some((h, data))
}

/// When event `k` of pass `pass` happened, for a reader: `at 1.234 s (event
/// 812, pass 2)`, or `at event 812` for a trace without times.
fn made(axis: &Axis<'_>, pass: u32, k: u64) -> String {
    let pass_note = if pass > 0 {
        format!(", pass {}", pass + 1)
    } else {
        String::new()
    };
    if axis.is_time() {
        format!(
            "at {:.3} s (event {k}{pass_note})",
            axis.of_event(u64::from(pass), k)
        )
    } else {
        format!("at event {k}{pass_note}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peak::{Segment, Totals};

    fn block(address: u64, size: u64, kind: Kind, segment: usize) -> Block {
        Block {
            address,
            size,
            kind,
            live: None,
            segment: Some(segment),
        }
    }

    /// Small blocks merge into runs within a segment, a large block stays
    /// itself, and the runs keep their bytes by kind.
    #[test]
    fn small_blocks_merge_into_runs_and_large_ones_stay() {
        let seg = |address, size| Segment {
            address,
            size,
            large: true,
            expandable: false,
            live_blocks: 1,
        };
        let mut blocks: Vec<Block> = (0..100)
            .map(|i| {
                block(
                    i * 10,
                    10,
                    if i % 2 == 0 {
                        Kind::Live
                    } else {
                        Kind::Stranded
                    },
                    0,
                )
            })
            .collect();
        blocks.push(block(1000, 5000, Kind::Free, 1));
        let map = Map {
            segments: Some(vec![seg(0, 1000), seg(1000, 5000)]),
            blocks,
            totals: Totals::default(),
        };
        let e = entries(&map, 100);
        assert_eq!(e.len(), 11, "ten runs of ten blocks and the large block");
        assert_eq!(e[0].count, 10);
        assert_eq!(e[0].bytes, [50, 0, 0, 50, 0]);
        assert_eq!(e[10].block.map(|b| b.size), Some(5000));
        assert_eq!(e[10].start, 1000);
        let all = entries(&map, 1);
        assert_eq!(all.len(), 101);
    }
}
