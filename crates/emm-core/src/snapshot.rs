//! What memory tools read from a manager: named counters (PyTorch's
//! `memory_stats` names where they mean the same), and a snapshot of segments,
//! blocks and the recent allocation history (the data of PyTorch's
//! `torch.cuda.memory._snapshot()`), as plain data with a JSON rendering for the C
//! ABI.

use std::fmt::Write as _;

/// Named counters: `(key, value)` pairs, keys as in PyTorch's `memory_stats` where
/// they mean the same (`allocated_bytes.all.current`, ...), emm's own under `emm.`.
pub type StatList = Vec<(&'static str, u64)>;

/// What one trace entry records (PyTorch's `action` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A caller received a block.
    Alloc,
    /// A caller gave a block back.
    FreeRequested,
    /// The block became reusable (on its stream at once: emm records this right
    /// after `FreeRequested`).
    FreeCompleted,
    /// A segment was taken from the upstream (`cuMemAlloc`).
    SegmentAlloc,
    /// A segment was given back to the upstream.
    SegmentFree,
    /// Memory was mapped onto the expandable segment.
    SegmentMap,
    /// Memory was unmapped from the expandable segment.
    SegmentUnmap,
    /// An allocation failed for lack of memory.
    Oom,
}

impl TraceAction {
    /// PyTorch's name of the action (`"alloc"`, `"free_requested"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
        }
    }
}

/// One entry of the allocation history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The block's or segment's address (0 for `Oom`).
    pub addr: u64,
    /// Bytes (rounded for blocks; requested for `Oom`).
    pub size: usize,
    /// The stream (a `CUstream` as an integer; 0: the legacy default stream).
    pub stream: usize,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// For `Oom`: the device's free bytes then (0 otherwise).
    pub device_free: usize,
}

/// A block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotBlock {
    /// Its address.
    pub address: u64,
    /// Its size (rounded).
    pub size: usize,
    /// The size asked for (the pool keeps only rounded sizes: equal to `size`).
    pub requested_size: usize,
    /// Live (held by a caller, or parked in another thread's cache) rather than free.
    pub allocated: bool,
}

/// A segment from the upstream, with its blocks in address order (they tile it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSegment {
    /// Its base address.
    pub address: u64,
    /// Bytes backed by memory (for the expandable segment: mapped so far).
    pub total_size: usize,
    /// The stream it was first taken for (0 where not known).
    pub stream: usize,
    /// Holds large blocks (PyTorch's `'large'` pool) rather than small ones.
    pub large: bool,
    /// The expandable segment (virtual memory mapped as it grows).
    pub expandable: bool,
    /// Its blocks, in address order.
    pub blocks: Vec<SnapshotBlock>,
}

/// A manager's segments, blocks, recent history and counters, taken at one time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemorySnapshot {
    /// Segments in address order.
    pub segments: Vec<SnapshotSegment>,
    /// The recorded history, oldest first (empty unless recording was on).
    pub trace: Vec<TraceEntry>,
    /// The manager's counters at the same time (see [`StatList`]).
    pub stats: StatList,
}

fn json_stats(out: &mut String, stats: &[(&'static str, u64)]) {
    out.push('{');
    for (i, (k, v)) in stats.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Keys are static identifiers of ASCII letters, digits, '.' and '_'.
        let _ = write!(out, "\"{k}\":{v}");
    }
    out.push('}');
}

/// The counters as one JSON object (`{"allocated_bytes.all.current": 512, ...}`).
pub fn stats_json(stats: &[(&'static str, u64)]) -> String {
    let mut s = String::new();
    json_stats(&mut s, stats);
    s
}

impl MemorySnapshot {
    /// The snapshot as JSON: `{"segments": [{"address", "total_size", "stream",
    /// "large", "expandable", "blocks": [{"address", "size", "requested_size",
    /// "allocated"}]}], "trace": [{"action", "addr", "size", "stream", "time_us",
    /// "device_free"}], "stats": {key: value}}`. Integers are plain JSON numbers.
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(256 + 160 * self.trace.len());
        s.push_str("{\"segments\":[");
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"address\":{},\"total_size\":{},\"stream\":{},\"large\":{},\"expandable\":{},\"blocks\":[",
                seg.address, seg.total_size, seg.stream, seg.large, seg.expandable
            );
            for (j, b) in seg.blocks.iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                let _ = write!(
                    s,
                    "{{\"address\":{},\"size\":{},\"requested_size\":{},\"allocated\":{}}}",
                    b.address, b.size, b.requested_size, b.allocated
                );
            }
            s.push_str("]}");
        }
        s.push_str("],\"trace\":[");
        for (i, e) in self.trace.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"action\":\"{}\",\"addr\":{},\"size\":{},\"stream\":{},\"time_us\":{},\"device_free\":{}}}",
                e.action.name(),
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.device_free
            );
        }
        s.push_str("],\"stats\":");
        json_stats(&mut s, &self.stats);
        s.push('}');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field() {
        let snap = MemorySnapshot {
            segments: vec![SnapshotSegment {
                address: 4096,
                total_size: 1024,
                stream: 0,
                large: false,
                expandable: false,
                blocks: vec![
                    SnapshotBlock {
                        address: 4096,
                        size: 512,
                        requested_size: 512,
                        allocated: true,
                    },
                    SnapshotBlock {
                        address: 4608,
                        size: 512,
                        requested_size: 512,
                        allocated: false,
                    },
                ],
            }],
            trace: vec![TraceEntry {
                action: TraceAction::SegmentAlloc,
                addr: 4096,
                size: 1024,
                stream: 7,
                time_us: 1,
                device_free: 0,
            }],
            stats: vec![("segment.all.current", 1)],
        };
        let j = snap.to_json();
        assert_eq!(
            j,
            "{\"segments\":[{\"address\":4096,\"total_size\":1024,\"stream\":0,\"large\":false,\"expandable\":false,\"blocks\":[{\"address\":4096,\"size\":512,\"requested_size\":512,\"allocated\":true},{\"address\":4608,\"size\":512,\"requested_size\":512,\"allocated\":false}]}],\"trace\":[{\"action\":\"segment_alloc\",\"addr\":4096,\"size\":1024,\"stream\":7,\"time_us\":1,\"device_free\":0}],\"stats\":{\"segment.all.current\":1}}"
        );
        assert_eq!(stats_json(&[]), "{}");
    }
}
