//! Reading the model's memory: its segments and blocks, as emm's managers give
//! theirs ([`SnapshotSegment`]), for a map of the memory at the peak.

use emm_core::{SnapshotBlock, SnapshotSegment};

use super::State;

impl State {
    /// Every segment and its blocks, in address order (`snapshot()`'s
    /// `segments`): each run of mapped blocks of a segment, so an expandable
    /// segment's unmapped pages split it (as emm's pool reports its own) and the
    /// segments sum to what is reserved.
    pub fn segments(&self) -> Vec<SnapshotSegment> {
        let mut heads: Vec<(u64, usize)> = self
            .slab
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().filter(|b| b.prev.is_none()).map(|b| (b.ptr, i)))
            .collect();
        heads.sort_unstable();
        let mut out = Vec::new();
        for (_, head) in heads {
            let mut run: Option<SnapshotSegment> = None;
            let mut at = Some(head);
            // Links only name live blocks of one chain; were they to cycle (a bug
            // here), the walk stops after every block was seen once.
            let mut left = self.slab.len();
            while let (Some(i), true) = (at, left > 0) {
                left -= 1;
                let b = self.b(i);
                if b.mapped {
                    let r = run.get_or_insert_with(|| SnapshotSegment {
                        address: b.ptr,
                        total_size: 0,
                        stream: b.stream as usize,
                        large: !b.small,
                        expandable: b.segment.is_some(),
                        blocks: Vec::new(),
                    });
                    r.total_size += b.size as usize;
                    r.blocks.push(SnapshotBlock {
                        address: b.ptr,
                        size: b.size as usize,
                        requested_size: b.size as usize,
                        allocated: b.allocated,
                    });
                } else {
                    out.extend(run.take());
                }
                at = b.next;
            }
            out.extend(run);
        }
        out
    }

    /// Where block `i` (one handed out) starts.
    pub fn ptr(&self, i: usize) -> u64 {
        self.b(i).ptr
    }
}
