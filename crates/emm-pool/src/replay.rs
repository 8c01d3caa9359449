//! Reading allocation traces and replaying them through managers.
//!
//! Two formats are read, told apart by their header:
//! - emm's (and `traces/README.md`'s): `op,id,size,stream` with `op` `a` or `f`;
//! - RMM's replay log (`logging_resource_adaptor`):
//!   `Thread,Time,Action,Pointer,Size,Stream` with `allocate` / `free` actions.
//!
//! A malformed line is reported with its line number and skipped; every other line
//! still counts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use emm_core::{DeviceAllocation, MemoryManager};
use emm_sys::CUstream;

/// One event of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes as `id` on `stream`.
    Alloc {
        /// The allocation's name while live.
        id: u64,
        /// Bytes.
        size: usize,
        /// The trace's stream number (0: default stream).
        stream: u64,
    },
    /// Free `id`.
    Free {
        /// The allocation's name.
        id: u64,
    },
}

/// A parsed trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// A name for reports (the file name).
    pub name: String,
    /// The events in order.
    pub ops: Vec<Op>,
    /// Lines that could not be read: `(line number, what was wrong)`.
    pub errors: Vec<(usize, String)>,
}

impl Trace {
    /// Parses `text` (either format).
    pub fn parse(name: &str, text: &str) -> Trace {
        let mut t = Trace {
            name: name.to_owned(),
            ..Trace::default()
        };
        let mut lines = text.lines().enumerate();
        let Some((_, header)) = lines.next() else {
            return t;
        };
        let header = header.trim().to_ascii_lowercase();
        let rmm = header.starts_with("thread");
        if !rmm && header != "op,id,size,stream" {
            t.errors.push((
                1,
                format!(
                    "unknown header {header:?}: expected \"op,id,size,stream\" or RMM's log header"
                ),
            ));
            return t;
        }
        let mut rmm_ids: HashMap<u64, u64> = HashMap::new();
        let mut next_id = 0u64;
        for (i, line) in lines {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let parsed = if rmm {
                parse_rmm(&f, &mut rmm_ids, &mut next_id)
            } else {
                parse_emm(&f)
            };
            match parsed {
                Ok(Some(op)) => t.ops.push(op),
                Ok(None) => {}
                Err(e) => t.errors.push((n, e)),
            }
        }
        t
    }

    /// Reads and parses a file.
    pub fn read(path: &std::path::Path) -> std::io::Result<Trace> {
        let text = std::fs::read_to_string(path)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        Ok(Trace::parse(&name, &text))
    }

    /// Peak of live bytes (sum of live requested sizes), from the trace alone.
    pub fn peak_live_bytes(&self) -> usize {
        let mut live: HashMap<u64, usize> = HashMap::new();
        let (mut cur, mut peak) = (0usize, 0usize);
        for op in &self.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    if let Some(old) = live.insert(id, size) {
                        cur -= old;
                    }
                    cur += size;
                    peak = peak.max(cur);
                }
                Op::Free { id } => cur -= live.remove(&id).unwrap_or(0),
            }
        }
        peak
    }

    /// Allocation requests in the trace.
    pub fn requests(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Alloc { .. }))
            .count()
    }
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{what} {s:?} is not a number"))
}

fn parse_emm(f: &[&str]) -> Result<Option<Op>, String> {
    if f.len() != 4 {
        return Err(format!(
            "expected 4 fields (op,id,size,stream), found {}",
            f.len()
        ));
    }
    let id = num(f[1], "id")?;
    match f[0] {
        "a" => Ok(Some(Op::Alloc {
            id,
            size: num(f[2], "size")?,
            stream: num(f[3], "stream")?,
        })),
        "f" => Ok(Some(Op::Free { id })),
        other => Err(format!("op {other:?} is neither \"a\" nor \"f\"")),
    }
}

fn parse_rmm(
    f: &[&str],
    ids: &mut HashMap<u64, u64>,
    next: &mut u64,
) -> Result<Option<Op>, String> {
    if f.len() < 6 {
        return Err(format!(
            "expected 6 fields (Thread,Time,Action,Pointer,Size,Stream), found {}",
            f.len()
        ));
    }
    let ptr = u64::from_str_radix(f[3].trim_start_matches("0x"), 16)
        .map_err(|_| format!("pointer {:?} is not hex", f[3]))?;
    let stream = u64::from_str_radix(f[5].trim_start_matches("0x"), 16).unwrap_or(0);
    match f[2] {
        "allocate" => {
            *next += 1;
            ids.insert(ptr, *next);
            Ok(Some(Op::Alloc {
                id: *next,
                size: num(f[4], "size")?,
                stream,
            }))
        }
        "free" => match ids.remove(&ptr) {
            Some(id) => Ok(Some(Op::Free { id })),
            None => Err(format!("free of pointer {ptr:#x} that was never allocated")),
        },
        "allocate failure" => Ok(None),
        other => Err(format!("action {other:?} is not allocate/free")),
    }
}

/// What one replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayResult {
    /// Allocation requests replayed.
    pub requests: usize,
    /// Peak of live requested bytes.
    pub peak_live_bytes: usize,
    /// Peak of bytes the manager held from its upstream.
    pub peak_reserved_bytes: usize,
    /// Upstream allocations the manager made.
    pub upstream_allocs: usize,
    /// Wall time of the event loop.
    pub elapsed: Duration,
    /// Requests that failed (out of memory etc.), with the first message.
    pub failures: usize,
    /// The first failure's message.
    pub first_failure: Option<String>,
    /// Frees of ids that were not live.
    pub unknown_frees: usize,
}

/// A manager to replay through, with how to read its reserved bytes.
pub struct Target<'a> {
    /// The manager.
    pub manager: &'a dyn MemoryManager,
    /// `(peak reserved bytes, upstream allocations)` after the replay.
    pub probe: &'a dyn Fn() -> (usize, usize),
    /// Called after every event (for managers whose peak must be sampled).
    pub sample: Option<&'a dyn Fn()>,
}

/// Replays `trace` through `target`, mapping trace stream `n` to `streams(n)`.
/// `progress` is called with the fraction done on long traces.
pub fn replay(
    trace: &Trace,
    target: &Target<'_>,
    streams: &dyn Fn(u64) -> CUstream,
    progress: &mut dyn FnMut(f64),
) -> ReplayResult {
    let mut live: HashMap<u64, DeviceAllocation> = HashMap::with_capacity(1024);
    let mut stream_cache: HashMap<u64, CUstream> = HashMap::new();
    let (mut failures, mut unknown, mut first) = (0usize, 0usize, None);
    let step = (trace.ops.len() / 10).max(1);
    let start = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, stream } => {
                let s = *stream_cache
                    .entry(stream)
                    .or_insert_with(|| streams(stream));
                match target.manager.memalloc_async(size, s) {
                    Ok(a) => {
                        live.insert(id, a);
                    }
                    Err(e) => {
                        failures += 1;
                        first.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            Op::Free { id } => {
                if live.remove(&id).is_none() {
                    unknown += 1;
                }
            }
        }
        if let Some(s) = target.sample {
            s();
        }
        if trace.ops.len() > 1_000_000 && i % step == 0 {
            progress(i as f64 / trace.ops.len() as f64);
        }
    }
    let elapsed = start.elapsed();
    drop(live);
    let (peak_reserved_bytes, upstream_allocs) = (target.probe)();
    ReplayResult {
        requests: trace.requests(),
        peak_live_bytes: trace.peak_live_bytes(),
        peak_reserved_bytes,
        upstream_allocs,
        elapsed,
        failures,
        first_failure: first,
        unknown_frees: unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse_and_bad_lines_are_reported_with_numbers() {
        let t = Trace::parse(
            "t",
            "op,id,size,stream\na,1,100,0\na,2,50,1\nx,3,1,0\na,4\nf,1,100,0\n",
        );
        assert_eq!(t.ops.len(), 3);
        assert_eq!(t.errors.iter().map(|e| e.0).collect::<Vec<_>>(), vec![4, 5]);
        assert!(t.errors[0].1.contains("neither"));
        assert_eq!(t.peak_live_bytes(), 150);
        assert_eq!(t.requests(), 2);
        let r = Trace::parse(
            "r",
            "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,0x0\n1,0.2,allocate,0x7f10,64,0x0\n1,0.3,free,0x7f00,256,0x0\n1,0.4,free,0xdead,1,0x0\n",
        );
        assert_eq!(
            r.ops,
            vec![
                Op::Alloc {
                    id: 1,
                    size: 256,
                    stream: 0
                },
                Op::Alloc {
                    id: 2,
                    size: 64,
                    stream: 0
                },
                Op::Free { id: 1 }
            ]
        );
        assert_eq!(r.errors.len(), 1);
        assert_eq!(r.errors[0].0, 5);
        assert!(Trace::parse("bad", "hello\n").errors[0]
            .1
            .contains("unknown header"));
    }
}
