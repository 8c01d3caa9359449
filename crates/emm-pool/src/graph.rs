//! A private pool for the memory of CUDA graphs (what PyTorch calls a graph's
//! memory pool).
//!
//! A graph replays with the addresses it was captured with. Every block handed
//! out during the capture, the intermediates freed before the capture ended
//! included, is written again at each replay, so that memory must not go to
//! anyone outside the graph while the graph lives. A [`GraphPool`] keeps it:
//!
//! - Blocks come from segments of the pool's own, never shared with the
//!   process's manager.
//! - A freed block is reused only by later allocations from the same pool on the
//!   stream it was freed on. Within a capture, stream order is captured into the
//!   graph, so the reuse replays in the same order; graphs that share a pool must
//!   be replayed in the order they were captured, as with PyTorch's own pools.
//! - Segments go back to the upstream only through [`GraphPool::reclaim`], once
//!   every user of the pool has released it ([`GraphPool::set_released`]) and
//!   nothing in the segment is live. Reclaiming synchronizes the device first, so
//!   no replay still running can touch the memory.
//!
//! Nothing on the allocation and free path records or queries an event,
//! synchronizes or frees: a capture in progress forbids those (they would fail
//! or invalidate it), and allocations during a capture are the pool's main use.
//! The only driver call on that path is the upstream's `cuMemAlloc` for a new
//! segment, made in CUDA's relaxed capture mode (PyTorch's own allocator makes
//! the same call the same way during captures: a capture leaves such memory to
//! the graph, which is safe as long as it is not freed before the graph is).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use emm_core::{DeviceAllocation, DeviceRelease, EmmError, Released, Result};
use emm_default::Upstream;
use emm_sys::{CUdeviceptr, CUstream};

use crate::heap::{BlockHeap, State};
use crate::kind::Kind;

/// Blocks are multiples of this many bytes (as the caching pool's are).
pub const GRAPH_ROUND: usize = 512;
/// Requests up to this size share segments of [`GRAPH_SMALL_SEGMENT`] bytes.
pub const GRAPH_SMALL_MAX: usize = 1 << 20;
/// The segment small requests are cut from.
pub const GRAPH_SMALL_SEGMENT: usize = 2 << 20;
/// Requests below this size (and above [`GRAPH_SMALL_MAX`]) are cut from
/// segments of [`GRAPH_MEDIUM_SEGMENT`] bytes; larger ones get a segment of their
/// own, rounded up to [`GRAPH_SMALL_SEGMENT`].
pub const GRAPH_MEDIUM_MAX: usize = 10 << 20;
/// The segment medium requests are cut from.
pub const GRAPH_MEDIUM_SEGMENT: usize = 20 << 20;

/// What a [`GraphPool`] holds, read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphPoolStats {
    /// Bytes handed out and not yet freed (rounded sizes).
    pub live_bytes: usize,
    /// Blocks handed out and not yet freed.
    pub live_blocks: usize,
    /// Bytes of the segments the pool holds.
    pub reserved_bytes: usize,
    /// Segments the pool holds.
    pub segments: usize,
    /// The largest `live_bytes` so far.
    pub peak_live_bytes: usize,
    /// The largest `reserved_bytes` so far.
    pub peak_reserved_bytes: usize,
    /// Segments taken from the upstream so far.
    pub segment_allocs: usize,
    /// Segments given back so far.
    pub segment_frees: usize,
}

/// The one kind of a graph pool's blocks: every request looks in one free set
/// per stream (the segment sizes keep small requests among small ones).
const GRAPH_KIND: Kind = Kind::Large;

#[derive(Default)]
struct PoolState {
    /// Base address to size.
    segments: BTreeMap<CUdeviceptr, usize>,
    /// Every block, free or handed out; a free block is reusable on the stream it
    /// was freed on only (the stream handle is its key).
    heap: BlockHeap,
    released: bool,
    stats: GraphPoolStats,
}

impl PoolState {
    /// Whether every block of the segment at `base` (of `size` bytes) is free.
    fn idle(&self, base: CUdeviceptr, size: usize) -> bool {
        let mut free = 0;
        for (_, b) in self.heap.blocks().walk(base, base + size as CUdeviceptr) {
            if !matches!(b.state, State::Free(_)) {
                return false;
            }
            free += b.size;
        }
        free == size
    }
}

/// A private pool for the memory of CUDA graphs; see the module documentation.
/// Shared through an `Arc`: the allocations it hands out keep it alive.
pub struct GraphPool {
    upstream: Box<dyn Upstream>,
    state: Mutex<PoolState>,
    /// Held for a whole `reclaim`, so two never give the same segment back.
    reclaiming: Mutex<()>,
}

impl core::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GraphPool")
            .field("upstream", &self.upstream.name())
            .field("stats", &self.stats())
            .finish()
    }
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

/// The segment a request of `rounded` bytes gets when no free block fits.
fn segment_size(rounded: usize) -> Option<usize> {
    if rounded <= GRAPH_SMALL_MAX {
        Some(GRAPH_SMALL_SEGMENT)
    } else if rounded < GRAPH_MEDIUM_MAX {
        Some(GRAPH_MEDIUM_SEGMENT)
    } else {
        round_up(rounded, GRAPH_SMALL_SEGMENT)
    }
}

impl GraphPool {
    /// An empty pool whose segments come from `upstream`.
    pub fn new(upstream: Box<dyn Upstream>) -> Arc<GraphPool> {
        Arc::new(GraphPool {
            upstream,
            state: Mutex::new(PoolState::default()),
            reclaiming: Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is consistent between statements that can panic, so a
        // poisoned lock's data is still good.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `size` bytes (more than 0) ordered on `stream`, from a block freed on that
    /// stream or from a new segment. Out of memory is the upstream's error (the
    /// pool gives nothing back on its own: that would synchronize). A pool that was
    /// released takes no new allocations.
    pub fn alloc(self: &Arc<Self>, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        // In a forked child the graph pool's blocks are the parent's.
        emm_core::check_not_forked()?;
        let invalid_size = |reason| EmmError::InvalidSize {
            requested: size,
            reason,
        };
        if size == 0 {
            return Err(invalid_size(
                "a graph pool hands out blocks of at least one byte",
            ));
        }
        let rounded = round_up(size, GRAPH_ROUND)
            .ok_or_else(|| invalid_size("larger than the address space"))?;
        let key = stream.0 as usize;
        let mut st = self.lock();
        if st.released {
            return Err(EmmError::InvalidArgument {
                what: "graph pool",
                found: "a pool every user has released".into(),
                expected: "a pool that is still in use (begin a new one)".into(),
            });
        }
        let fit = st.heap.fits(rounded, GRAPH_KIND, key).next();
        let ptr = match fit {
            Some((_, ptr)) => ptr,
            None => {
                let seg_size = segment_size(rounded)
                    .ok_or_else(|| invalid_size("larger than the address space"))?;
                // cuMemAlloc in a capture is safe (the segment is never freed
                // before the graph is released), but the driver refuses it in
                // the global capture mode PyTorch captures in: relaxed for
                // the call, as PyTorch's own allocator does. Holding the lock
                // across it keeps two threads from making a segment each.
                let _relaxed = match self.upstream.context() {
                    Some(ctx) => Some(emm_driver::RelaxedCapture::new(ctx)?),
                    None => None,
                };
                let base = self.upstream.alloc(seg_size)?;
                st.segments.insert(base, seg_size);
                st.heap
                    .insert_free(base, seg_size, base, key, GRAPH_KIND, None);
                let s = &mut st.stats;
                s.segments += 1;
                s.segment_allocs += 1;
                s.reserved_bytes += seg_size;
                s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
                base
            }
        };
        // Sizes and segments are multiples of GRAPH_ROUND: any rest stays a free
        // block of the stream.
        let Some(segment) = st.heap.take(ptr, rounded) else {
            return Err(EmmError::Internal {
                operation: "graph pool allocation",
                detail: format!("free block {ptr:#x} of {rounded} bytes is not in the pool's heap"),
            });
        };
        let seg_size = st.segments.get(&segment).copied().unwrap_or(0);
        let s = &mut st.stats;
        s.live_bytes += rounded;
        s.live_blocks += 1;
        s.peak_live_bytes = s.peak_live_bytes.max(s.live_bytes);
        drop(st);
        // SAFETY: [ptr, ptr+size) lies in the pool's segment [segment,
        // segment+seg_size) and is this pool's until `release` is called for it.
        Ok(unsafe {
            DeviceAllocation::with_releaser(
                ptr,
                size,
                stream,
                segment,
                seg_size,
                self.clone() as Arc<dyn DeviceRelease>,
                0,
            )
        })
    }

    /// Whether `ptr` is the address of a block this pool handed out and that is
    /// not yet freed.
    pub fn owns(&self, ptr: CUdeviceptr) -> bool {
        self.lock()
            .heap
            .get(ptr)
            .is_some_and(|b| b.state == State::Live)
    }

    /// The addresses of the blocks handed out and not yet freed, in address
    /// order.
    pub fn live_blocks(&self) -> Vec<CUdeviceptr> {
        let mut live: Vec<CUdeviceptr> = self
            .lock()
            .heap
            .blocks()
            .iter()
            .filter(|(_, b)| b.state == State::Live)
            .map(|(&a, _)| a)
            .collect();
        live.sort_unstable();
        live
    }

    /// Marks the pool as released by every user: it takes no new allocations, and
    /// [`GraphPool::reclaim`] gives back each segment nothing live is left in.
    pub fn set_released(&self) {
        self.lock().released = true;
    }

    /// Whether the pool was released.
    pub fn is_released(&self) -> bool {
        self.lock().released
    }

    /// Gives back to the upstream every segment of a released pool that holds
    /// nothing live, after synchronizing the device (a replay still queued may
    /// use any of them); the bytes given back. A pool still in use keeps all its
    /// segments: its free blocks are what its graphs' replays write into. Call it
    /// only while no capture is under way: a synchronization would invalidate it.
    pub fn reclaim(&self) -> Result<usize> {
        let _one_at_a_time = self.reclaiming.lock().unwrap_or_else(|p| p.into_inner());
        let idle: Vec<(CUdeviceptr, usize)> = {
            let st = self.lock();
            if !st.released {
                return Ok(0);
            }
            st.segments
                .iter()
                .filter(|&(&base, &size)| st.idle(base, size))
                .map(|(&b, &s)| (b, s))
                .collect()
        };
        if idle.is_empty() {
            return Ok(0);
        }
        if let Some(ctx) = self.upstream.context() {
            ctx.synchronize_for_manager()?;
        }
        let mut freed = 0;
        let mut first_error = None;
        for (base, size) in idle {
            {
                let mut st = self.lock();
                let end = base + size as CUdeviceptr;
                // Still there and still idle (a block cannot be handed out of a
                // released pool, but check rather than free a live one).
                let idle_now = st.segments.get(&base) == Some(&size) && st.idle(base, size);
                if !idle_now {
                    continue;
                }
                let gone: Vec<CUdeviceptr> =
                    st.heap.blocks().walk(base, end).map(|(a, _)| a).collect();
                for addr in gone {
                    st.heap.remove(addr);
                }
                st.segments.remove(&base);
                let s = &mut st.stats;
                s.segments -= 1;
                s.segment_frees += 1;
                s.reserved_bytes -= size;
            }
            // SAFETY: `base` came from this upstream's alloc(size), is given back
            // once (it left the pool's state above), and nothing uses it: every
            // block in it is free and the device was synchronized.
            match unsafe { self.upstream.free(base, size) } {
                Ok(()) => freed += size,
                Err(e) => {
                    tracing::error!(
                        "a graph pool could not give back its segment {base:#x} ({size} bytes): {e}"
                    );
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(freed),
        }
    }

    /// What the pool holds now.
    pub fn stats(&self) -> GraphPoolStats {
        self.lock().stats
    }

    /// Checks the pool's bookkeeping: the heap's indexes agree, every segment is
    /// tiled by its blocks and no block lies outside one, and the live and
    /// reserved counters match the blocks and segments. Returns what is wrong (for
    /// tests; it walks every block).
    pub fn check(&self) -> std::result::Result<(), String> {
        let st = self.lock();
        st.heap.check()?;
        let (mut tiled, mut live, mut live_blocks) = (0, 0, 0);
        for (&base, &size) in &st.segments {
            let mut at = base;
            for (a, b) in st.heap.blocks().walk(base, base + size as CUdeviceptr) {
                if b.segment != base {
                    return Err(format!(
                        "block {a:#x} names segment {:#x}, lies in {base:#x}",
                        b.segment
                    ));
                }
                if b.state == State::Live {
                    live += b.size;
                    live_blocks += 1;
                }
                tiled += 1;
                at = a + b.size as CUdeviceptr;
            }
            if at != base + size as CUdeviceptr {
                return Err(format!(
                    "segment {base:#x} of {size} bytes: its blocks end at {at:#x}"
                ));
            }
        }
        if tiled != st.heap.blocks().len() {
            return Err(format!(
                "{} blocks, {tiled} of them in a segment",
                st.heap.blocks().len()
            ));
        }
        let reserved: usize = st.segments.values().sum();
        let s = &st.stats;
        if (live, live_blocks, reserved) != (s.live_bytes, s.live_blocks, s.reserved_bytes) {
            return Err(format!(
                "blocks say {live} bytes live in {live_blocks} blocks of {reserved} reserved; counters {} in {} of {}",
                s.live_bytes, s.live_blocks, s.reserved_bytes
            ));
        }
        Ok(())
    }
}

impl DeviceRelease for GraphPool {
    fn release(&self, r: Released) {
        let mut st = self.lock();
        let key = r.stream.0 as usize;
        let Some(block) = st
            .heap
            .get(r.ptr)
            .copied()
            .filter(|b| b.state == State::Live)
        else {
            tracing::error!(
                "a graph pool was handed back {:#x}, which is not one of its live blocks; ignored",
                r.ptr
            );
            return;
        };
        let s = &mut st.stats;
        s.live_bytes -= block.size;
        s.live_blocks -= 1;
        // Joined with the free neighbours of the same segment freed on the same
        // stream (other streams' blocks are reusable only on theirs).
        st.heap
            .insert_free(r.ptr, block.size, block.segment, key, GRAPH_KIND, None);
    }
}
