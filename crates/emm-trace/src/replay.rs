//! Replaying a trace through a manager, and scanning one without a manager.
//!
//! Live bytes are summed in `u128`, so no trace can overflow them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use emm_core::{DeviceAllocation, MemoryManager};
use emm_sys::CUstream;

use crate::diagnostics::Diagnostics;
use crate::error::TraceError;
use crate::op::Op;
use crate::trace::Trace;

/// What a pass over a trace alone (no manager) found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Events (allocations and frees).
    pub events: u64,
    /// Allocation requests.
    pub requests: u64,
    /// Peak of live requested bytes.
    pub peak_live_bytes: u128,
    /// Frees of ids that were not live.
    pub unknown_frees: u64,
    /// Distinct streams.
    pub streams: u64,
    /// Malformed lines or records.
    pub diagnostics: Diagnostics,
}

/// Live bytes as the trace sees them, and the trace's streams numbered densely.
#[derive(Default)]
struct Books {
    live: HashMap<u64, u64>,
    cur: u128,
    peak: u128,
    unknown: u64,
    requests: u64,
    streams: HashMap<u64, u64>,
    zero_seen: bool,
}

impl Books {
    /// Accounts `op`; for an allocation returns the dense stream number (the
    /// trace's stream 0 stays 0; others count up in order of appearance).
    fn apply(&mut self, op: Op) -> Option<u64> {
        match op {
            Op::Alloc { id, size, stream } => {
                if let Some(old) = self.live.insert(id, size) {
                    self.cur = self.cur.saturating_sub(u128::from(old));
                }
                self.cur += u128::from(size);
                self.peak = self.peak.max(self.cur);
                self.requests += 1;
                let next = self.streams.len() as u64 + 1;
                let n = if stream == 0 {
                    self.zero_seen = true;
                    0
                } else {
                    *self.streams.entry(stream).or_insert(next)
                };
                Some(n)
            }
            Op::Free { id } => {
                match self.live.remove(&id) {
                    Some(s) => self.cur = self.cur.saturating_sub(u128::from(s)),
                    None => self.unknown += 1,
                }
                None
            }
        }
    }
}

fn no_events(trace: &Trace, d: &Diagnostics) -> TraceError {
    let why = match d.first.first() {
        Some(e) => format!(
            "all {} lines (or records) after the header are malformed; the first: {e}",
            d.bad
        ),
        None => "no allocation after the header".into(),
    };
    TraceError::NoUsableEvent {
        trace: trace.name().to_owned(),
        why,
    }
}

/// Reads `trace` once: counts, peak live bytes and diagnostics. A trace without a
/// single allocation is an error.
pub fn scan(trace: &Trace) -> Result<Summary, TraceError> {
    let mut books = Books::default();
    let mut events = trace.events()?;
    let mut n = 0u64;
    for op in &mut events {
        books.apply(op);
        n += 1;
    }
    let diagnostics = events.finish()?;
    if books.requests == 0 {
        return Err(no_events(trace, &diagnostics));
    }
    Ok(Summary {
        events: n,
        requests: books.requests,
        peak_live_bytes: books.peak,
        unknown_frees: books.unknown,
        streams: books.streams.len() as u64 + u64::from(books.zero_seen),
        diagnostics,
    })
}

/// One point of the curves drawn: after `event` events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Events replayed so far.
    pub event: u64,
    /// The most live bytes since the previous sample.
    pub live_bytes: u128,
    /// The manager's reserved bytes at this point.
    pub reserved_bytes: u64,
}

/// How to replay.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Events in the trace (from [`scan`]), to space the samples; 0 if unknown.
    pub total_events: u64,
    /// About how many samples to take for the curves (0: none).
    pub samples: u64,
}

/// What one replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayResult {
    /// Allocation requests replayed.
    pub requests: u64,
    /// Peak of live requested bytes.
    pub peak_live_bytes: u128,
    /// Peak of bytes the manager held from its upstream (its `stats()`).
    pub peak_reserved_bytes: u64,
    /// Upstream allocations the manager made (its `stats()`).
    pub upstream_allocs: u64,
    /// Wall time of the event loop.
    pub elapsed: Duration,
    /// Requests that failed (out of memory etc.).
    pub failures: u64,
    /// The first failure's message.
    pub first_failure: Option<String>,
    /// Frees of ids that were not live.
    pub unknown_frees: u64,
    /// Live and reserved bytes along the trace.
    pub samples: Vec<Sample>,
}

/// Replays `trace` through `manager`, which should be fresh (its statistics are
/// read as the replay's). The trace's streams are numbered densely (0: the default
/// stream) and `streams(n)` gives the handle for number `n`. `progress` is called
/// with the events done, every few thousand events.
pub fn replay(
    trace: &Trace,
    manager: &dyn MemoryManager,
    streams: &mut dyn FnMut(u64) -> CUstream,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayResult, TraceError> {
    let mut held: HashMap<u64, DeviceAllocation> = HashMap::with_capacity(1024);
    let mut handles: HashMap<u64, CUstream> = HashMap::new();
    let mut books = Books::default();
    let (mut failures, mut first) = (0u64, None);
    let step = options
        .total_events
        .checked_div(options.samples)
        .map_or(u64::MAX, |s| s.max(1));
    let mut samples = Vec::new();
    if options.samples > 0 {
        samples.push(Sample {
            event: 0,
            live_bytes: 0,
            reserved_bytes: manager.stats().reserved_bytes as u64,
        });
    }
    let mut bucket_max = 0u128;
    let mut events = trace.events()?;
    let mut i = 0u64;
    let start = Instant::now();
    for op in &mut events {
        if let Op::Free { id } = op {
            held.remove(&id);
        }
        if let (Some(n), Op::Alloc { id, size, .. }) = (books.apply(op), op) {
            held.remove(&id);
            let s = *handles.entry(n).or_insert_with(|| streams(n));
            let got = usize::try_from(size)
                .map_err(|_| format!("{size} bytes does not fit this machine's address space"))
                .and_then(|size| manager.memalloc_async(size, s).map_err(|e| e.to_string()));
            match got {
                Ok(a) => {
                    held.insert(id, a);
                }
                Err(e) => {
                    failures += 1;
                    first.get_or_insert(e);
                }
            }
        }
        i += 1;
        bucket_max = bucket_max.max(books.cur);
        if i % step == 0 {
            samples.push(Sample {
                event: i,
                live_bytes: bucket_max,
                reserved_bytes: manager.stats().reserved_bytes as u64,
            });
            bucket_max = books.cur;
        }
        if i % 4096 == 0 {
            progress(i);
        }
    }
    let elapsed = start.elapsed();
    events.finish()?;
    if options.samples > 0 && samples.last().is_some_and(|s| s.event != i) {
        samples.push(Sample {
            event: i,
            live_bytes: bucket_max,
            reserved_bytes: manager.stats().reserved_bytes as u64,
        });
    }
    progress(i);
    drop(held);
    let stats = manager.stats();
    Ok(ReplayResult {
        requests: books.requests,
        peak_live_bytes: books.peak,
        peak_reserved_bytes: stats.reserved_bytes_peak as u64,
        upstream_allocs: stats.upstream_allocs,
        elapsed,
        failures,
        first_failure: first,
        unknown_frees: books.unknown,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_live_does_not_overflow() {
        let ops = vec![
            Op::Alloc {
                id: 1,
                size: u64::MAX,
                stream: 0,
            },
            Op::Alloc {
                id: 2,
                size: u64::MAX,
                stream: 7,
            },
            Op::Free { id: 1 },
            Op::Free { id: 9 },
        ];
        let s = scan(&Trace::from_ops("big", ops)).unwrap();
        assert_eq!(s.peak_live_bytes, 2 * u128::from(u64::MAX));
        assert_eq!(s.unknown_frees, 1);
        assert_eq!(s.streams, 2);
    }

    #[test]
    fn streams_are_numbered_densely_with_zero_kept() {
        let mut b = Books::default();
        let st = |stream| Op::Alloc {
            id: stream,
            size: 1,
            stream,
        };
        assert_eq!(b.apply(st(0x7f00)), Some(1));
        assert_eq!(b.apply(st(0)), Some(0));
        assert_eq!(b.apply(st(0x7e00)), Some(2));
        assert_eq!(b.apply(st(0x7f00)), Some(1));
    }
}
