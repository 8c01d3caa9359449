//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`): a pickled dict
//! with `segments` (the allocator's state at dump time) and `device_traces` (per
//! device, the ring buffer of the last `max_entries` allocator events).
//!
//! The client's calls are replayed: `alloc`, and `free_requested` (the moment the
//! program dropped the tensor). Allocations made before recording began show up as
//! frees without an alloc, or as blocks still allocated in `segments`; both are
//! reconstructed as allocations at the start of the trace, so peak live is right.
//! A `free_completed` that does not follow its `free_requested` at once was held back
//! by a use on another stream (`record_stream`): counted as cross-stream. A
//! `free_completed` of a live block with no `free_requested` before it frees it.
//! PyTorch's own reserved bytes come from `segment_alloc`/`segment_free`/
//! `segment_map`/`segment_unmap`, anchored at the reserved bytes of the dump.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::rc::Rc;
use std::sync::Arc;

use crate::details::{DetailsBuilder, Frame, TraceDetails, MAX_FRAMES};
use crate::diagnostics::Diagnostics;
use crate::error::{excerpt, TraceError};
use crate::op::Op;
use crate::pickle::{decode, Pickle, Val};

/// The largest snapshot read (the decoded value is held in memory).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Deepest nesting of containers accepted in a snapshot pickle (PyTorch's nest 6).
pub const MAX_NESTING: usize = 256;

/// What PyTorch's caching allocator itself did, from the snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchFigures {
    /// Peak of reserved bytes over the trace (segments mapped from the device).
    pub peak_reserved_bytes: u128,
    /// Reserved bytes at the dump (sum of the segments' `total_size`).
    pub reserved_at_dump: u128,
    /// Bytes in blocks allocated to the program at the dump.
    pub allocated_at_dump: u128,
    /// Allocations made before recording began, reconstructed.
    pub reconstructed_allocs: u64,
    /// Frees held back by use on another stream.
    pub cross_stream_frees: u64,
    /// Out-of-memory events recorded.
    pub ooms: u64,
    /// Segment events recorded (`segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`).
    pub segment_events: u64,
}

impl TorchFigures {
    /// Whether the snapshot tells PyTorch's reserved bytes at all: it has
    /// segments at the dump or segment events. Without either,
    /// [`peak_reserved_bytes`](TorchFigures::peak_reserved_bytes) is 0 because
    /// nothing was said, not because PyTorch reserved nothing.
    pub fn reserved_known(&self) -> bool {
        self.reserved_at_dump > 0 || self.segment_events > 0
    }
}

/// The events of one device of a snapshot.
#[derive(Clone, Debug)]
pub struct DeviceTrace {
    /// The device's index.
    pub device: i64,
    /// The client's calls, reconstructed allocations first.
    pub ops: Vec<Op>,
    /// PyTorch's own figures.
    pub figures: TorchFigures,
    /// Records that could not be used.
    pub diagnostics: Diagnostics,
    /// When each event happened, each allocation's stack, PyTorch's reserved
    /// bytes along the trace.
    pub details: TraceDetails,
}

type Dict = HashMap<Rc<str>, Val>;

fn key<'v>(d: &'v Dict, k: &str) -> Option<&'v Val> {
    d.get(k)
}

struct Ctx<'a> {
    trace: &'a str,
    pickle: &'a Pickle,
}

impl<'a> Ctx<'a> {
    fn describe(&self, v: &Val) -> String {
        excerpt(&self.pickle.describe(v), 60)
    }

    fn bad(&self, at: impl Into<String>, expected: &'static str, found: &Val) -> TraceError {
        TraceError::Snapshot {
            trace: self.trace.to_owned(),
            at: at.into(),
            expected,
            found: self.describe(found),
        }
    }

    fn dict(&self, v: &Val) -> Option<&'a Dict> {
        self.pickle.dict(v)
    }

    fn list(&self, v: &Val) -> Option<&'a [Val]> {
        self.pickle.list(v)
    }
}

fn as_int(v: Option<&Val>) -> Option<i64> {
    match v {
        Some(Val::Int(i)) => Some(*i),
        Some(Val::Bool(b)) => Some(i64::from(*b)),
        _ => None,
    }
}

/// A byte count or stream of the snapshot: `Ok(None)` when absent, `Ok(n)`
/// for a non-negative integer, `Err(())` for anything else (a negative
/// number, a bool, a string: PyTorch writes none of them there).
fn as_count(v: Option<&Val>) -> Result<Option<u64>, ()> {
    match v {
        None => Ok(None),
        Some(Val::Int(i)) => u64::try_from(*i).map(Some).map_err(|_| ()),
        Some(_) => Err(()),
    }
}

impl Ctx<'_> {
    /// [`as_count`] of `d[name]`, a present value that is not a count being a
    /// typed error naming where it is (`at`).
    fn count(
        &self,
        d: &Dict,
        name: &str,
        at: impl Fn() -> String,
    ) -> Result<Option<u64>, TraceError> {
        let v = key(d, name);
        as_count(v).map_err(|()| {
            let v = v.unwrap_or(&Val::None);
            self.bad(format!("{}.{name}", at()), "a non-negative integer", v)
        })
    }
}

fn as_str(v: Option<&Val>) -> Option<&str> {
    match v {
        Some(Val::Str(s)) => Some(s),
        _ => None,
    }
}

/// Reads a snapshot pickle into one [`DeviceTrace`] per device with any activity.
pub fn read_snapshot(mut reader: impl Read, trace: &str) -> Result<Vec<DeviceTrace>, TraceError> {
    let mut data = Vec::new();
    reader
        .read_to_end(&mut data)
        .map_err(|e| TraceError::Pickle {
            trace: trace.to_owned(),
            reason: format!("reading it failed: {e}"),
        })?;
    // A pickle nested deeper than any snapshot (they nest 6 levels) is not one.
    crate::nesting::depth(&data, MAX_NESTING).map_err(|reason| TraceError::Pickle {
        trace: trace.to_owned(),
        reason,
    })?;
    // Objects the pickle shares (memo references) stay shared: see `pickle`.
    let pickle = decode(&data).map_err(|e| TraceError::Pickle {
        trace: trace.to_owned(),
        reason: excerpt(&e, 200),
    })?;
    from_value(&pickle, trace)
}

/// An allocation made before recording began, put at the start of the trace;
/// returns its id.
fn reconstruct(
    next: &mut u64,
    pre: &mut Vec<Op>,
    fig: &mut TorchFigures,
    size: u64,
    stream: u64,
) -> u64 {
    *next += 1;
    pre.push(Op::Alloc {
        id: *next,
        size,
        stream,
    });
    fig.reconstructed_allocs += 1;
    *next
}

fn from_value(pickle: &Pickle, trace: &str) -> Result<Vec<DeviceTrace>, TraceError> {
    let cx = Ctx { trace, pickle };
    let value = &pickle.root;
    let top = cx
        .dict(value)
        .ok_or_else(|| cx.bad("the top", "a dict with `segments`", value))?;
    let segments = match key(top, "segments") {
        Some(v) => cx.list(v).ok_or_else(|| cx.bad("segments", "a list", v))?,
        None => return Err(cx.bad("the top", "a dict with `segments`", value)),
    };
    let traces: &[Val] = match key(top, "device_traces") {
        Some(v) => cx
            .list(v)
            .ok_or_else(|| cx.bad("device_traces", "a list of lists", v))?,
        None => &[],
    };
    // Segments per device.
    let mut devices: BTreeMap<i64, Vec<&Dict>> = BTreeMap::new();
    for (i, s) in segments.iter().enumerate() {
        let d = cx
            .dict(s)
            .ok_or_else(|| cx.bad(format!("segments[{i}]"), "a dict", s))?;
        let dev = as_int(key(d, "device")).unwrap_or(0);
        devices.entry(dev).or_default().push(d);
    }
    for (i, t) in traces.iter().enumerate() {
        if cx.list(t).is_some_and(|l| !l.is_empty()) {
            devices.entry(i as i64).or_default();
        }
    }
    let mut out = Vec::new();
    // Each blocks list is read once, however many segments (of any device) hold it.
    let mut blocks = HashMap::new();
    // Entries and blocks at the dump walked over all devices: an unshared
    // snapshot has at most one per byte (each is pushed by an opcode), so more
    // means devices share one list, which would cost time and memory quadratic
    // in the file.
    let mut walked = 0usize;
    for (dev, segs) in devices {
        let entries = match usize::try_from(dev).ok().and_then(|i| traces.get(i)) {
            Some(v) => cx
                .list(v)
                .ok_or_else(|| cx.bad(format!("device_traces[{dev}]"), "a list", v))?,
            None => &[],
        };
        walked = walked.saturating_add(entries.len());
        if walked > pickle.len {
            return Err(TraceError::Snapshot {
                trace: trace.to_owned(),
                at: format!("device_traces[{dev}]"),
                expected: "at most one trace entry per byte of the file over all devices (each device's own list)",
                found: format!("{walked} entries so far in a file of {} bytes", pickle.len),
            });
        }
        out.push(device_trace(
            &cx,
            dev,
            &segs,
            entries,
            &mut blocks,
            &mut walked,
        )?);
    }
    if out.is_empty() {
        return Err(TraceError::NoUsableEvent {
            trace: trace.to_owned(),
            why: "the snapshot has no segments and no trace entries (was _record_memory_history() called before the work?)".into(),
        });
    }
    Ok(out)
}

/// What a segment's `blocks` list holds, read once per list (a list the pickle
/// shares between segments is not walked again).
struct Blocks {
    /// Active blocks: address -> requested size (the last block of an address wins).
    active: Vec<(i64, u64)>,
    /// Bytes in active blocks with an address, each block counted.
    allocated: u128,
}

fn read_blocks(cx: &Ctx<'_>, si: usize, blocks: &[Val]) -> Result<Blocks, TraceError> {
    let mut active: HashMap<i64, u64> = HashMap::new();
    let mut allocated = 0u128;
    for (bi, b) in blocks.iter().enumerate() {
        let b = cx
            .dict(b)
            .ok_or_else(|| cx.bad(format!("segments[{si}].blocks[{bi}]"), "a dict", b))?;
        let state = as_str(key(b, "state")).unwrap_or("");
        if state.starts_with("active") {
            let at = || format!("segments[{si}].blocks[{bi}]");
            let requested = cx.count(b, "requested_size", at)?;
            let size = match requested {
                Some(n) => n,
                None => cx.count(b, "size", at)?.unwrap_or(0),
            };
            if let Some(addr) = as_int(key(b, "address")) {
                active.insert(addr, size);
                allocated += u128::from(size);
            }
        }
    }
    Ok(Blocks {
        active: active.into_iter().collect(),
        allocated,
    })
}

fn device_trace(
    cx: &Ctx<'_>,
    device: i64,
    segs: &[&Dict],
    entries: &[Val],
    cache: &mut HashMap<u32, Blocks>,
    walked: &mut usize,
) -> Result<DeviceTrace, TraceError> {
    let mut fig = TorchFigures::default();
    let mut diag = Diagnostics::default();
    // Each segment's blocks list (its node, if a list) and stream, in order.
    let mut held: Vec<(Option<u32>, u64)> = Vec::with_capacity(segs.len());
    for (si, s) in segs.iter().enumerate() {
        let at = || format!("the segments of device {device}: [{si}]");
        let total = u128::from(cx.count(s, "total_size", at)?.unwrap_or(0));
        fig.reserved_at_dump += total;
        let stream = cx.count(s, "stream", at)?.unwrap_or(0);
        let node = match key(s, "blocks") {
            Some(v @ Val::Node(i)) => cx.list(v).map(|l| (*i, l)),
            _ => None,
        };
        if let Some((i, list)) = node {
            let b = match cache.entry(i) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(read_blocks(cx, si, list)?),
            };
            fig.allocated_at_dump += b.allocated;
        }
        held.push((node.map(|(i, _)| i), stream));
    }
    // Blocks allocated at the dump: address -> (requested size, stream). Read in
    // order, the last segment holding an address would win; so, walking back,
    // the first one does, and each list is applied once, at its last segment.
    let mut at_dump: HashMap<i64, (u64, u64)> = HashMap::new();
    let mut applied: HashSet<u32> = HashSet::new();
    for &(node, stream) in held.iter().rev() {
        let Some(i) = node else { continue };
        if !applied.insert(i) {
            continue;
        }
        let active = cache.get(&i).map_or(&[][..], |b| &b.active);
        *walked = walked.saturating_add(active.len());
        if *walked > cx.pickle.len {
            return Err(TraceError::Snapshot {
                trace: cx.trace.to_owned(),
                at: format!("the segments of device {device}"),
                expected: "at most one trace entry or allocated block per byte of the file over all devices (each device's own blocks lists)",
                found: format!("{walked} so far in a file of {} bytes", cx.pickle.len),
            });
        }
        for &(addr, size) in active {
            at_dump.entry(addr).or_insert((size, stream));
        }
    }
    let mut next = 0u64;
    let mut pre: Vec<Op> = Vec::new();
    let mut ops: Vec<Op> = Vec::with_capacity(entries.len());
    let mut live: HashMap<i64, u64> = HashMap::new();
    let mut requested: HashMap<i64, usize> = HashMap::new();
    let (mut delta, mut max_delta, mut min_delta) = (0i128, 0i128, 0i128);
    let mut details = DetailsBuilder::default();
    // Each frames list read once (by its container), however many entries share it.
    let mut stacks = StackCache::default();
    for (i, e) in entries.iter().enumerate() {
        let Some(d) = cx.dict(e) else {
            diag.push_with(i as u64, || {
                format!(
                    "record device_traces[{device}][{i}] is {}, not a dict",
                    cx.describe(e)
                )
            });
            continue;
        };
        let Some(action) = as_str(key(d, "action")) else {
            diag.push_with(i as u64, || {
                format!(
                    "record device_traces[{device}][{i}] has no string `action` (found {})",
                    key(d, "action").map_or_else(|| "none".to_owned(), |v| cx.describe(v))
                )
            });
            continue;
        };
        let addr = as_int(key(d, "addr"));
        // A byte count: a non-negative integer (PyTorch's are); anything else is
        // said, not read as 0, where the event needs it.
        let size = as_count(key(d, "size")).ok().flatten();
        let need_size = |diag: &mut Diagnostics| -> Option<u64> {
            if size.is_none() {
                diag.push_with(i as u64, || {
                    format!(
                        "record device_traces[{device}][{i}] ({action}) has no non-negative integer `size` (found {})",
                        key(d, "size").map_or_else(|| "none".to_owned(), |v| cx.describe(v))
                    )
                });
            }
            size
        };
        let Ok(stream) = as_count(key(d, "stream")).map(Option::unwrap_or_default) else {
            diag.push_with(i as u64, || {
                format!(
                    "record device_traces[{device}][{i}] ({action}) has a `stream` that is not a non-negative integer (found {})",
                    key(d, "stream").map_or_else(|| "none".to_owned(), |v| cx.describe(v))
                )
            });
            continue;
        };
        let time = as_int(key(d, "time_us")).and_then(|t| u64::try_from(t).ok());
        let need_addr = |diag: &mut Diagnostics| -> Option<i64> {
            if addr.is_none() {
                diag.push_with(i as u64, || {
                    format!("record device_traces[{device}][{i}] ({action}) has no integer `addr`")
                });
            }
            addr
        };
        match action {
            "alloc" => {
                let Some(a) = need_addr(&mut diag) else {
                    continue;
                };
                let Some(size) = need_size(&mut diag) else {
                    continue;
                };
                next += 1;
                if let Some(old) = live.insert(a, next) {
                    ops.push(Op::Free { id: old });
                    details.event(time, None);
                }
                ops.push(Op::Alloc {
                    id: next,
                    size,
                    stream,
                });
                let stack = stack_of(cx, d, &mut details, &mut stacks);
                details.event(time, stack);
                diag.events += 1;
            }
            "free_requested" => {
                let Some(a) = need_addr(&mut diag) else {
                    continue;
                };
                let id = match live.remove(&a) {
                    Some(id) => id,
                    // Allocated before recording began: its size makes it.
                    None => {
                        let Some(size) = need_size(&mut diag) else {
                            continue;
                        };
                        reconstruct(&mut next, &mut pre, &mut fig, size, stream)
                    }
                };
                ops.push(Op::Free { id });
                details.event(time, None);
                requested.insert(a, i);
                diag.events += 1;
            }
            "free_completed" => {
                let Some(a) = need_addr(&mut diag) else {
                    continue;
                };
                match requested.remove(&a) {
                    Some(j) => {
                        if j + 1 != i {
                            fig.cross_stream_frees += 1;
                        }
                    }
                    // No `free_requested` freed it (a trace edited or written by
                    // another tool): the block is free from here on.
                    None => {
                        if let Some(id) = live.remove(&a) {
                            ops.push(Op::Free { id });
                            details.event(time, None);
                            diag.events += 1;
                        }
                    }
                }
            }
            "segment_alloc" | "segment_map" => {
                let Some(size) = need_size(&mut diag) else {
                    continue;
                };
                fig.segment_events += 1;
                delta += i128::from(size);
                max_delta = max_delta.max(delta);
                details.reserved(delta);
            }
            "segment_free" | "segment_unmap" => {
                let Some(size) = need_size(&mut diag) else {
                    continue;
                };
                fig.segment_events += 1;
                delta -= i128::from(size);
                min_delta = min_delta.min(delta);
                details.reserved(delta);
            }
            "oom" => fig.ooms += 1,
            "snapshot" | "user_defined" => {}
            other => diag.push_with(i as u64, || {
                format!(
                    "record device_traces[{device}][{i}] has unknown action {}",
                    crate::pickle::short_str(&excerpt(other, 30))
                )
            }),
        }
    }
    // Blocks allocated at the dump that the trace never allocated: live throughout.
    // A block whose free the trace requested but PyTorch had not completed at the
    // dump (a cross-stream free still pending) is that same block, not an older one.
    let mut still: Vec<(&i64, &(u64, u64))> = at_dump
        .iter()
        .filter(|(a, _)| !live.contains_key(a) && !requested.contains_key(a))
        .collect();
    still.sort();
    for (_, &(size, stream)) in still {
        reconstruct(&mut next, &mut pre, &mut fig, size, stream);
    }
    // PyTorch's reserved bytes: anchored at the dump, never below zero.
    let dump = fig.reserved_at_dump as i128;
    let start = (dump - delta).max(-min_delta).max(0);
    fig.peak_reserved_bytes = (start + max_delta).max(dump).max(0) as u128;
    let details = details.finish(pre.len(), if fig.reserved_known() { start } else { 0 });
    pre.extend(ops);
    Ok(DeviceTrace {
        device,
        ops: pre,
        figures: fig,
        diagnostics: diag,
        details,
    })
}

/// The most bytes of a frame's function or file name kept: PyTorch's are a few
/// dozen; a longer one is cut at a character boundary and ends with `…`.
const MAX_FRAME_TEXT: usize = 1024;

/// `s` cut to at most [`MAX_FRAME_TEXT`] bytes (and the `…` after them).
fn frame_text(s: &str) -> Arc<str> {
    if s.len() <= MAX_FRAME_TEXT {
        return s.into();
    }
    let mut end = MAX_FRAME_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

/// What the snapshot's frames and frame lists already gave, by container
/// (a snapshot shares them through the pickle's memo).
#[derive(Default)]
struct StackCache {
    /// A frames list's stack.
    lists: HashMap<u32, Option<u32>>,
    /// A frame's number (`DetailsBuilder::frame`).
    frames: HashMap<u32, Option<u32>>,
    /// A name or file name as kept ([`frame_text`]), by the pickle's string
    /// (its address: one string the memo shares among many frames that differ
    /// in their line is copied once, not 1 KiB a frame).
    texts: HashMap<usize, Arc<str>>,
}

impl StackCache {
    /// String `v` as a frame keeps it (`absent` when it is not a string).
    fn text(&mut self, v: Option<&Val>, absent: &'static str) -> Arc<str> {
        match v {
            Some(Val::Str(rc)) => self
                .texts
                .entry(std::rc::Rc::as_ptr(rc).cast::<u8>() as usize)
                .or_insert_with(|| frame_text(rc))
                .clone(),
            _ => absent.into(),
        }
    }
}

/// The stack of the allocation entry `d` (its `frames`), kept once in `details`.
/// Each frames list and each frame dict is read once: a frame whose name is one
/// long string shared by many frames through the memo was copied and hashed
/// again for every list, seconds for a file of a few megabytes.
fn stack_of(
    cx: &Ctx<'_>,
    d: &Dict,
    details: &mut DetailsBuilder,
    cache: &mut StackCache,
) -> Option<u32> {
    let v = key(d, "frames")?;
    let Val::Node(node) = v else { return None };
    if let Some(&s) = cache.lists.get(node) {
        return s;
    }
    let mut ids = Vec::new();
    for f in cx.list(v)?.iter() {
        if ids.len() == MAX_FRAMES {
            break;
        }
        let id = match f {
            Val::Node(n) => match cache.frames.get(n) {
                Some(&id) => id,
                None => {
                    let id = frame_of(cx, f, cache).and_then(|fr| details.frame(fr));
                    cache.frames.insert(*n, id);
                    id
                }
            },
            _ => None,
        };
        ids.extend(id);
    }
    let s = details.stack_of_frames(ids);
    cache.lists.insert(*node, s);
    s
}

/// Frame dict `f` as a [`Frame`], its texts shared through `cache`.
fn frame_of(cx: &Ctx<'_>, f: &Val, cache: &mut StackCache) -> Option<Frame> {
    let f = cx.dict(f)?;
    Some(Frame {
        name: cache.text(key(f, "name"), "?"),
        filename: cache.text(key(f, "filename"), "??"),
        line: as_int(key(f, "line")).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protocol 2 pickle, written by hand.
    #[derive(Default)]
    struct Writer(Vec<u8>);

    impl Writer {
        fn op(&mut self, b: &[u8]) -> &mut Self {
            self.0.extend_from_slice(b);
            self
        }
        fn str(&mut self, s: &str) -> &mut Self {
            self.op(b"X");
            let n = u32::try_from(s.len()).unwrap().to_le_bytes();
            self.op(&n).op(s.as_bytes())
        }
        fn int(&mut self, v: i32) -> &mut Self {
            self.op(b"J").op(&v.to_le_bytes())
        }
        fn put(&mut self, memo: u32) -> &mut Self {
            self.op(b"r").op(&memo.to_le_bytes())
        }
        fn get(&mut self, memo: u32) -> &mut Self {
            self.op(b"j").op(&memo.to_le_bytes())
        }
        /// The top dict's start, no segments, and device 0's trace list opened.
        fn traces_only(&mut self) -> &mut Self {
            self.op(b"\x80\x02}(")
                .str("segments")
                .op(b"]")
                .str("device_traces")
                .op(b"](](")
        }
        /// An alloc entry's dict opened, with its action and address.
        fn alloc_at(&mut self, addr: i32) -> &mut Self {
            self.op(b"}(")
                .str("action")
                .str("alloc")
                .str("addr")
                .int(addr)
        }
    }

    #[test]
    fn a_long_name_shared_by_many_frames_is_read_once_and_cut() {
        // One frame dict with a 4 MiB name, memoized; then 50 allocations,
        // each with its own list of 64 references to it.
        let long = "n".repeat(4 << 20);
        let mut w = Writer::default();
        w.traces_only();
        for k in 0..50 {
            w.alloc_at(4096 * (k + 1));
            w.str("size")
                .int(512)
                .str("stream")
                .int(0)
                .str("frames")
                .op(b"](");
            for i in 0..64 {
                if k == 0 && i == 0 {
                    w.op(b"}(")
                        .str("name")
                        .str(&long)
                        .str("filename")
                        .str("f.py");
                    w.str("line").int(7).op(b"u").put(1);
                } else {
                    w.get(1);
                }
            }
            w.op(b"e").op(b"u");
        }
        w.op(b"e").op(b"e").op(b"u.");
        let traces = read_snapshot(&w.0[..], "t.pickle").unwrap();
        let d = &traces[0].details;
        assert_eq!(traces[0].ops.len(), 50);
        let stacks: Vec<_> = (0..50).map(|e| d.stack_of(e).unwrap()).collect();
        assert!(
            stacks.iter().all(|&s| s == stacks[0]),
            "one stack: {stacks:?}"
        );
        let frames: Vec<_> = d.stack(stacks[0]).collect();
        assert_eq!(frames.len(), MAX_FRAMES);
        let name = &frames[0].name;
        assert_eq!(name.len(), MAX_FRAME_TEXT + '…'.len_utf8(), "cut to 1 KiB");
        assert!(name.ends_with('…') && name.starts_with("nnn"));
        assert_eq!((&*frames[0].filename, frames[0].line), ("f.py", 7));
    }

    /// One long name memoized and named by 2,000 frame dicts that differ in
    /// their line: each frame is its own, but they keep one copy of the name
    /// (a copy of up to 1 KiB a frame once made a 10 MB file take 1.3 GB).
    #[test]
    fn frames_sharing_a_name_keep_one_copy_of_it() {
        let long = "n".repeat(4 << 10);
        let mut w = Writer::default();
        w.traces_only();
        for k in 0..100 {
            w.alloc_at(4096 * (k + 1));
            w.str("size").int(512).str("frames").op(b"](");
            for i in 0..20 {
                w.op(b"}(").str("name");
                if k == 0 && i == 0 {
                    w.str(&long).put(1).str("filename").str("f.py").put(2);
                } else {
                    w.get(1).str("filename").get(2);
                }
                w.str("line").int(20 * k + i).op(b"u");
            }
            w.op(b"e").op(b"u");
        }
        w.op(b"e").op(b"e").op(b"u.");
        let traces = read_snapshot(&w.0[..], "t.pickle").unwrap();
        let d = &traces[0].details;
        let mut frames = Vec::new();
        for e in 0..100 {
            frames.extend(d.stack(d.stack_of(e).unwrap()).cloned());
        }
        assert_eq!(frames.len(), 2_000, "every frame its own (its line)");
        let first = &frames[0];
        assert!(first.name.ends_with('…'));
        assert!(
            frames
                .iter()
                .all(|f| Arc::ptr_eq(&f.name, &first.name)
                    && Arc::ptr_eq(&f.filename, &first.filename)),
            "one copy of the shared name and file name"
        );
    }

    /// A snapshot with `seg` as its one segment's extra fields and one alloc
    /// entry with `entry` as its extra fields.
    fn with_fields(
        seg: &[(&str, i32)],
        block: &[(&str, i32)],
        entry: &[(&str, Option<i32>)],
    ) -> Vec<u8> {
        let mut w = Writer::default();
        w.op(b"\x80\x02}(").str("segments").op(b"](}(");
        for &(k, v) in seg {
            w.str(k).int(v);
        }
        w.str("blocks")
            .op(b"](}(")
            .str("state")
            .str("active_allocated")
            .str("address")
            .int(4096);
        for &(k, v) in block {
            w.str(k).int(v);
        }
        w.op(b"ueu").op(b"e").str("device_traces").op(b"](](");
        w.alloc_at(8192);
        for &(k, v) in entry {
            match v {
                Some(v) => w.str(k).int(v),
                None => w.str(k).op(b"\x88"), // True
            };
        }
        w.op(b"ueeu.");
        w.0
    }

    /// Negative sizes and streams, and a bool as a size, were read as 0,
    /// `u64::MAX` and 1 without a word; PyTorch writes none of them. In a
    /// segment or a block they are a typed error; in a trace entry, a
    /// diagnostic and the entry skipped, as a missing size was.
    #[test]
    fn counts_that_are_not_counts_are_said_not_coerced() {
        let ok = with_fields(
            &[("total_size", 4096)],
            &[("size", 512)],
            &[("size", Some(512)), ("stream", Some(0))],
        );
        let traces = read_snapshot(&ok[..], "t.pickle").unwrap();
        assert_eq!(traces[0].diagnostics.bad, 0);
        for (seg, block, what) in [
            (
                &[("total_size", -4096)][..],
                &[("size", 512)][..],
                "total_size",
            ),
            (&[("stream", -1)][..], &[("size", 512)][..], "stream"),
            (&[][..], &[("size", -100)][..], "blocks[0].size"),
            (&[][..], &[("requested_size", -1)][..], "requested_size"),
        ] {
            let p = with_fields(seg, block, &[("size", Some(512))]);
            let e = read_snapshot(&p[..], "t.pickle").unwrap_err();
            assert!(matches!(e, TraceError::Snapshot { .. }), "{what}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(what) && m.contains("a non-negative integer"),
                "{m}"
            );
        }
        for (entry, what) in [
            (&[("size", None)][..], "`size`"),
            (&[("size", Some(-5))][..], "`size`"),
            (&[("size", Some(512)), ("stream", Some(-1))][..], "`stream`"),
        ] {
            let p = with_fields(&[], &[], entry);
            let t = read_snapshot(&p[..], "t.pickle").unwrap();
            let d = &t[0].diagnostics;
            assert_eq!(d.bad, 1, "{what}");
            assert!(d.first[0].message.contains(what), "{}", d.first[0].message);
        }
    }

    #[test]
    fn frame_text_cuts_at_a_character_boundary() {
        let s = format!("{}é", "a".repeat(MAX_FRAME_TEXT - 1));
        let t = frame_text(&s);
        assert_eq!(&*t, format!("{}…", "a".repeat(MAX_FRAME_TEXT - 1)));
        assert_eq!(&*frame_text("short"), "short");
    }
}
