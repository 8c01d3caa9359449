//! Each manager's memory at its peak (`emm_trace::PeakMap`), read for the page's
//! segment map and the JSON's `at_peak`: which blocks are live (the trace's
//! allocations), cached (free, but held in a thread's cache), free, or stranded.
//!
//! Stranded bytes are free bytes the allocator cannot give back to the device
//! while live blocks remain: those in a segment that also holds a live block, or,
//! in an expandable segment (memory mapped in pages), those in a 2 MiB page that
//! also holds live bytes. The rest of the free bytes could go back.

use std::collections::{HashMap, HashSet};

use emm::trace::{LiveBlock, PeakMap};

/// The page of an expandable segment's memory, for stranded bytes.
pub const PAGE: u64 = 2 << 20;

/// What a stretch of memory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of the trace's allocations.
    Live,
    /// Free to the program, held in a thread's cache of freed blocks.
    Cached,
    /// Free, and could go back to the device.
    Free,
    /// Free, but cannot go back while live blocks share its segment or page.
    Stranded,
    /// Reserved by a manager that shows no segments, and not live (the default
    /// manager: frees waiting in its queue; and rounding).
    Held,
}

/// A block of the map (free blocks may be cut where a page holds live bytes).
#[derive(Clone, Debug)]
pub struct Block {
    /// Where it starts (for a manager without segments, the allocation's
    /// address; 0 for what it holds besides).
    pub address: u64,
    /// Its bytes (the allocator's, rounded).
    pub size: u64,
    /// What holds it.
    pub kind: Kind,
    /// The trace's allocation in it (live blocks).
    pub live: Option<LiveBlock>,
    /// Its segment (index into [`Map::segments`]); `None` without segments.
    pub segment: Option<usize>,
}

/// A segment of the map.
#[derive(Clone, Debug)]
pub struct Segment {
    /// Its base address (a model's are numbers, not memory).
    pub address: u64,
    /// Its bytes backed by memory.
    pub size: u64,
    /// Holds large blocks (PyTorch's large pool) rather than small ones.
    pub large: bool,
    /// Memory mapped in pages as it grows (CUDA's virtual memory).
    pub expandable: bool,
    /// Its live blocks.
    pub live_blocks: u64,
}

/// Bytes by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// The manager's reserved bytes.
    pub reserved: u64,
    /// Bytes the live allocations asked for.
    pub live_requested: u128,
    /// Bytes of the blocks holding them (rounded by the allocator).
    pub live_blocks: u64,
    /// The live allocations.
    pub live_count: u64,
    /// Bytes of [`Kind::Cached`] blocks.
    pub cached: u64,
    /// Bytes of [`Kind::Free`] blocks.
    pub free: u64,
    /// Bytes of [`Kind::Stranded`] blocks.
    pub stranded: u64,
    /// Bytes of [`Kind::Held`] (a manager without segments).
    pub held: u64,
}

/// A manager's memory at its peak, blocks in the order drawn.
#[derive(Clone, Debug)]
pub struct Map {
    /// `None`: the manager keeps no segments of its own (only totals are known;
    /// the blocks are the live allocations by address, then what it holds besides).
    pub segments: Option<Vec<Segment>>,
    /// The blocks, tiling the segments in address order.
    pub blocks: Vec<Block>,
    /// Bytes by what holds them.
    pub totals: Totals,
}

/// Reads `m`.
pub fn read(m: &PeakMap) -> Map {
    let mut totals = Totals {
        reserved: m.reserved_bytes,
        live_requested: m.live.iter().map(|l| u128::from(l.size)).sum(),
        live_count: m.live.len() as u64,
        ..Totals::default()
    };
    let Some(segs) = &m.segments else {
        let mut live: Vec<LiveBlock> = m.live.clone();
        live.sort_by_key(|l| (l.address, l.event));
        let mut blocks: Vec<Block> = live
            .iter()
            .map(|l| Block {
                address: l.address.unwrap_or(0),
                size: l.size,
                kind: Kind::Live,
                live: Some(*l),
                segment: None,
            })
            .collect();
        totals.live_blocks = live.iter().map(|l| l.size).sum();
        totals.held = m.reserved_bytes.saturating_sub(totals.live_blocks);
        if totals.held > 0 {
            blocks.push(Block {
                address: 0,
                size: totals.held,
                kind: Kind::Held,
                live: None,
                segment: None,
            });
        }
        return Map {
            segments: None,
            blocks,
            totals,
        };
    };
    let by_address: HashMap<u64, LiveBlock> = m
        .live
        .iter()
        .filter_map(|l| Some((l.address?, *l)))
        .collect();
    // Pages of expandable segments that hold live bytes.
    let mut live_pages: HashSet<u64> = HashSet::new();
    let mut segments = Vec::with_capacity(segs.len());
    for s in segs {
        let mut live_blocks = 0;
        for b in s
            .blocks
            .iter()
            .filter(|b| by_address.contains_key(&b.address))
        {
            live_blocks += 1;
            if s.expandable && b.size > 0 {
                let end = b.address + b.size as u64 - 1;
                live_pages.extend(b.address / PAGE..=end / PAGE);
            }
        }
        segments.push(Segment {
            address: s.address,
            size: s.total_size as u64,
            large: s.large,
            expandable: s.expandable,
            live_blocks,
        });
    }
    let mut blocks = Vec::new();
    for (si, s) in segs.iter().enumerate() {
        for b in &s.blocks {
            let size = b.size as u64;
            let live = by_address.get(&b.address).copied().filter(|_| b.allocated);
            let kind = match (live, b.allocated) {
                (Some(_), _) => Kind::Live,
                (None, true) => Kind::Cached,
                (None, false) => Kind::Free,
            };
            let block = Block {
                address: b.address,
                size,
                kind,
                live,
                segment: Some(si),
            };
            if kind == Kind::Live {
                totals.live_blocks += size;
                blocks.push(block);
            } else if !s.expandable {
                let stranded = segments[si].live_blocks > 0;
                if stranded && kind == Kind::Free {
                    totals.stranded += size;
                    blocks.push(Block {
                        kind: Kind::Stranded,
                        ..block
                    });
                } else {
                    if kind == Kind::Cached {
                        totals.cached += size;
                    } else {
                        totals.free += size;
                    }
                    blocks.push(block);
                }
            } else {
                for piece in cut_at_live_pages(block, &live_pages) {
                    match piece.kind {
                        Kind::Cached => totals.cached += piece.size,
                        Kind::Stranded => totals.stranded += piece.size,
                        _ => totals.free += piece.size,
                    }
                    blocks.push(piece);
                }
            }
        }
    }
    Map {
        segments: Some(segments),
        blocks,
        totals,
    }
}

/// A free block of an expandable segment, cut into the bytes in its first and
/// last pages where those pages hold live bytes (stranded) and the rest (free).
/// Only its first and last pages can: it covers the pages between whole. A
/// cached block stays whole.
fn cut_at_live_pages(b: Block, live_pages: &HashSet<u64>) -> Vec<Block> {
    if b.kind != Kind::Free || b.size == 0 {
        return vec![b];
    }
    let end = b.address + b.size;
    let (first, last) = (b.address / PAGE, (end - 1) / PAGE);
    let head_end = if live_pages.contains(&first) {
        ((first + 1) * PAGE).min(end)
    } else {
        b.address
    };
    let tail_start = if last != first && live_pages.contains(&last) {
        last * PAGE
    } else {
        end
    }
    .max(head_end);
    let piece = |from: u64, to: u64, kind: Kind| Block {
        address: from,
        size: to - from,
        kind,
        ..b.clone()
    };
    [
        piece(b.address, head_end, Kind::Stranded),
        piece(head_end, tail_start, Kind::Free),
        piece(tail_start, end, Kind::Stranded),
    ]
    .into_iter()
    .filter(|p| p.size > 0)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use emm::core::{SnapshotBlock, SnapshotSegment};

    fn live(address: u64, size: u64) -> LiveBlock {
        LiveBlock {
            address: Some(address),
            size,
            stream: 0,
            event: 0,
            pass: 0,
        }
    }

    fn block(address: u64, size: u64, allocated: bool) -> SnapshotBlock {
        SnapshotBlock {
            address,
            size: size as usize,
            requested_size: size as usize,
            allocated,
        }
    }

    const MIB: u64 = 1 << 20;

    /// A plain segment with a live block strands all its free bytes; a wholly
    /// free one could go back; in an expandable segment only the bytes sharing a
    /// 2 MiB page with live bytes are stranded; a block held but not live is a
    /// thread's cache.
    #[test]
    fn free_bytes_are_stranded_only_beside_live_blocks() {
        let base = 64 * PAGE;
        let map = PeakMap {
            event: 10,
            reserved_bytes: 60 * MIB,
            live_bytes: 3 << 20,
            segments: Some(vec![
                SnapshotSegment {
                    address: 0,
                    total_size: 20 << 20,
                    stream: 0,
                    large: true,
                    expandable: false,
                    blocks: vec![block(0, MIB, true), block(MIB, 19 * MIB, false)],
                },
                SnapshotSegment {
                    address: 32 * MIB,
                    total_size: 20 << 20,
                    stream: 0,
                    large: true,
                    expandable: false,
                    blocks: vec![block(32 * MIB, 20 * MIB, false)],
                },
                SnapshotSegment {
                    address: base,
                    total_size: 20 << 20,
                    stream: 0,
                    large: true,
                    expandable: true,
                    blocks: vec![
                        block(base, MIB, true),
                        block(base + MIB, 16 * MIB, false),
                        block(base + 17 * MIB, MIB, true),
                        block(base + 18 * MIB, 2 * MIB, true),
                    ],
                },
            ]),
            live: vec![live(0, 1000), live(base, MIB), live(base + 17 * MIB, MIB)],
        };
        let m = read(&map);
        let t = m.totals;
        assert_eq!(t.live_count, 3);
        assert_eq!(t.live_blocks, 3 * MIB);
        assert_eq!(t.cached, 2 * MIB);
        // 19 MiB beside the plain segment's live block; in the expandable one,
        // 1 MiB of the first page and 1 MiB of the page at 16-18 MiB.
        assert_eq!(t.stranded, 19 * MIB + 2 * MIB);
        assert_eq!(t.free, 20 * MIB + 14 * MIB);
        let sum: u64 = m.blocks.iter().map(|b| b.size).sum();
        assert_eq!(sum, 60 * MIB, "the blocks tile the segments");
        assert!(m.blocks.windows(2).all(|w| w[0].address < w[1].address));
    }

    /// Without segments, the map is the live allocations and what the manager
    /// holds besides.
    #[test]
    fn a_manager_without_segments_shows_live_and_held_bytes() {
        let map = PeakMap {
            event: 3,
            reserved_bytes: 10 * MIB,
            live_bytes: 3 << 20,
            segments: None,
            live: vec![live(5 * MIB, 2 * MIB), live(MIB, MIB)],
        };
        let m = read(&map);
        assert!(m.segments.is_none());
        let kinds: Vec<(Kind, u64)> = m.blocks.iter().map(|b| (b.kind, b.size)).collect();
        assert_eq!(
            kinds,
            [
                (Kind::Live, MIB),
                (Kind::Live, 2 * MIB),
                (Kind::Held, 7 * MIB)
            ]
        );
        assert_eq!(m.totals.held, 7 * MIB);
    }
}
