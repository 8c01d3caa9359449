//! The trace readers: PyTorch snapshot pickles, emm's CSV, RMM's replay log.
//!
//! Each input goes through the public entry point a user's file takes
//! ([`Trace::from_reader`], which detects the format or takes the one forced), then
//! every trace read is passed over twice and scanned, and the events are checked
//! against the summary.

use std::collections::{HashMap, HashSet};

use emm_trace::{scan, Format, Op, Trace};

/// PyTorch memory snapshots (the pickle decoder, its input bounds, the
/// reconstruction of the allocator's events).
pub fn pickle_snapshot(data: &[u8]) {
    read(data, Some(Format::TorchSnapshot));
}

/// emm's CSV, forced and detected.
pub fn csv_trace(data: &[u8]) {
    read(data, Some(Format::EmmCsv));
    read(data, None);
}

/// RMM's replay log, forced and detected.
pub fn rmm_log(data: &[u8]) {
    read(data, Some(Format::RmmLog));
    read(data, None);
}

fn read(data: &[u8], format: Option<Format>) {
    let Ok(traces) = Trace::from_reader("fuzz-input", data, format) else {
        return;
    };
    assert!(
        !traces.is_empty(),
        "a trace read without error has no trace"
    );
    for t in &traces {
        check(t);
    }
}

/// Reads `t` twice and scans it; the passes agree, and the summary matches the
/// events. Returns the pass.
fn check(t: &Trace) -> Pass {
    let first = pass(t);
    let second = pass(t);
    assert_eq!(first, second, "two passes over one trace differ");
    let Some((ops, _diag)) = &first else {
        // A fatal error during the pass (too many bad lines): scan says so too.
        assert!(scan(t).is_err(), "scan passed a trace whose pass failed");
        return None;
    };
    let allocs: Vec<(u64, u64)> = ops
        .iter()
        .filter_map(|op| match *op {
            Op::Alloc { id, size, .. } => Some((id, size)),
            Op::Free { .. } => None,
        })
        .collect();
    match scan(t) {
        Ok(s) => {
            assert_eq!(s.events, ops.len() as u64, "scan's event count");
            assert_eq!(s.requests, allocs.len() as u64, "scan's request count");
            let largest = allocs.iter().map(|&(_, s)| u128::from(s)).max();
            let sum: u128 = allocs.iter().map(|&(_, s)| u128::from(s)).sum();
            assert!(
                largest.is_some_and(|l| s.peak_live_bytes >= l) && s.peak_live_bytes <= sum,
                "peak live {} outside [largest {largest:?}, sum {sum}]",
                s.peak_live_bytes
            );
            assert!(s.streams <= s.requests, "more streams than requests");
            assert!(s.diagnostics.first.len() as u64 <= s.diagnostics.bad);
            if t.format() == Format::TorchSnapshot {
                assert_eq!(s.unknown_frees, 0, "a snapshot's free of an unknown id");
                assert_eq!(s.reused_live_ids, 0, "a snapshot's id reused while live");
                let fig = t.torch_figures().expect("a snapshot has PyTorch's figures");
                assert!(fig.reconstructed_allocs <= s.requests);
                assert!(fig.peak_reserved_bytes >= fig.reserved_at_dump);
            }
        }
        Err(_) => assert!(allocs.is_empty(), "scan failed on a trace with allocations"),
    }
    if t.format() == Format::TorchSnapshot {
        snapshot_ids(ops);
    }
    first
}

type Pass = Option<(Vec<Op>, emm_trace::Diagnostics)>;

fn pass(t: &Trace) -> Pass {
    let mut events = t.events().ok()?;
    let ops: Vec<Op> = (&mut events).collect();
    let diag = events.finish().ok()?;
    Some((ops, diag))
}

/// A snapshot's events name each allocation once and free only live ones.
fn snapshot_ids(ops: &[Op]) {
    let mut seen = HashSet::new();
    let mut live = HashMap::new();
    for op in ops {
        match *op {
            Op::Alloc { id, size, .. } => {
                assert!(seen.insert(id), "snapshot id {id} allocated twice");
                live.insert(id, size);
            }
            Op::Free { id } => {
                assert!(
                    live.remove(&id).is_some(),
                    "snapshot frees id {id}, not live"
                );
            }
        }
    }
}
