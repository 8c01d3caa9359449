//! [`PoolConfig`]: what a pool is built with, read from its settings
//! (`settings.rs`).

use emm_core::Result;

use crate::arena::SegmentPolicy;
use crate::settings;

/// Configuration of a [`PoolManager`](crate::PoolManager).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolConfig {
    /// Segment sizes.
    pub segments: SegmentPolicy,
    /// Largest number of bytes the pool may reserve (`None`: the device's memory).
    pub limit: Option<usize>,
    /// Blocks a thread keeps per stream for immediate reuse.
    pub thread_cache_blocks: usize,
    /// Bytes a thread keeps per stream for immediate reuse.
    pub thread_cache_bytes: usize,
    /// The largest block a thread files in its cache with the expandable
    /// segment (`pool_thread_cache_largest`; [`DEFAULT_THREAD_CACHE_LARGEST`]
    /// by default, `usize::MAX` for any): a larger one waits only as the
    /// block freed last, taken back if its size is asked for next, and goes
    /// on to the shared arena at the stream's next free or next allocation
    /// that misses, where it joins its free neighbours. Without the
    /// expandable segment a thread keeps any block within its cache's bytes:
    /// plain segments cannot move pieces, and blocks taken again at their own
    /// size keep their layout.
    pub thread_cache_largest: usize,
    /// Bytes below which a thread's cache of a stream is kept at a small
    /// request's miss (`pool_thread_cache_keep`; [`DEFAULT_THREAD_CACHE_KEEP`]
    /// by default; 0: never kept): when the request finds no free small block
    /// in the arena, a free block of the expandable segment serves it before
    /// the stream's cached blocks go back to the arena to coalesce. They go
    /// back first, as before, where the cache is empty or holds this much or
    /// more, where another thread holds blocks of the stream, where the arena
    /// has served another stream, with stream pools turned off, and where the
    /// expandable segment has no block for the request.
    pub thread_cache_keep: usize,
    /// Reserved bytes above which the pool gives free memory back to the device
    /// once the streams that freed it are idle (`usize::MAX`, the default: only
    /// on `trim()`, `release_cached` or out of memory). Checked at each free that
    /// reaches the shared arena: the free blocks of a stream whose last free's
    /// event has completed are settled (queried, never waited for), and wholly
    /// free segments and pieces of the expandable segment go back until the pool
    /// reserves no more than the threshold (by whole free ranges of the expandable
    /// segment: it may give back more than the excess). Blocks kept in thread caches (at most
    /// `thread_cache_bytes` per thread and stream) are not given back by it.
    /// CUDA's mempool attribute of the same name releases at synchronizations,
    /// which a pool cannot see. `pool_release_threshold`; may change while the
    /// pool serves.
    pub release_threshold: usize,
    /// The expandable segment's pieces are created exportable as POSIX file
    /// descriptors, so that `get_ipc_handle` of a block there gives an
    /// [`IpcHandle::Vmm`](emm_core::IpcHandle::Vmm) another process opens (legacy CUDA IPC cannot export
    /// virtual memory). Off by default (`EMM_POOL_EXPORTABLE`; `emm.numba_plugin`
    /// turns it on); see `export.rs` for the contract.
    pub exportable: bool,
    /// Old mappings of moved pieces of the expandable segment are unmapped by a
    /// helper thread once their work is done, instead of by the next growth on
    /// the allocating thread (`pool_background_unmap`, on by default; only with
    /// virtual memory, and never over the host stand-in of
    /// [`PoolUpstream::Host`](crate::PoolUpstream::Host) or
    /// [`PoolManager::host_lagged`](crate::PoolManager::host_lagged), whose
    /// replays stay deterministic). Each pool and tag pool has its own thread,
    /// started by its first move. An unmap costs the driver 20-30 us a mapping on an H100
    /// (`python/gpu/benchmarks/vmm_moves.cu`), about a fifth of a move.
    pub background_unmap: bool,
    /// Each created stream, up to this many, allocates its large blocks (over
    /// [`SMALL_MAX`](crate::SMALL_MAX)) from a pool of its own in the pool's
    /// family (sharing its byte limit and release threshold); small blocks,
    /// the default streams and the streams past the bound share the pool itself
    /// (`pool_stream_pools`; [`DEFAULT_STREAM_POOLS`] by default, 0 turns them
    /// off). See `pool/streams.rs` for why: streams that allocate in different
    /// rhythms then keep no holes in each other's memory. Statistics, snapshots, trim, reset and the release
    /// threshold cover every stream's pool; on out of memory, the other pools'
    /// free memory goes back before the request fails.
    pub stream_pools: usize,
}

impl PoolConfig {
    /// The defaults, with the pool's settings applied (each the environment's
    /// value when its variable is set, else the one configured in code; see
    /// [`crate::settings`]): `pool_expandable` (`0` turns the expandable segment
    /// off, e.g. for legacy IPC of every block), `pool_exportable`,
    /// `pool_legacy_merge` (without the expandable segment: merge wholly free
    /// large segments when live bytes fall to 1/n of reserved, or back within
    /// 1/n of the way from their low to reserved after a step; 0 off, see
    /// `SegmentPolicy::merge_quiet`), `pool_thread_cache` (bytes per thread and
    /// stream; 0 turns thread caches off), `pool_thread_cache_largest`,
    /// `pool_thread_cache_keep`,
    /// `pool_expand_step`, `pool_adopt_parked`, `pool_wait_parked`,
    /// `pool_replace_pieces`, `pool_piece_share`, `pool_piece_pages`, `pool_background_unmap`, `pool_stream_pools`, `pool_limit`,
    /// `pool_release_threshold` and `pool_initial_size`. An invalid value is an error naming the variable.
    pub fn from_env() -> Result<PoolConfig> {
        let mut c = PoolConfig::default();
        c.segments.expandable = settings::EXPANDABLE.get(c.segments.expandable)?;
        c.exportable = settings::EXPORTABLE.get(c.exportable)?;
        if let Some(bytes) = settings::THREAD_CACHE.value()? {
            c.thread_cache_bytes = bytes;
            if bytes == 0 {
                c.thread_cache_blocks = 0;
            }
        }
        c.thread_cache_largest = settings::THREAD_CACHE_LARGEST.get(c.thread_cache_largest)?;
        c.thread_cache_keep = settings::THREAD_CACHE_KEEP.get(c.thread_cache_keep)?;
        c.segments.expand_step = settings::EXPAND_STEP.get(c.segments.expand_step)?;
        if let Some(n) = settings::LEGACY_MERGE.value()? {
            c.segments.merge_quiet = (n > 0).then_some(n);
        }
        c.segments.adopt_parked = settings::ADOPT_PARKED.get(c.segments.adopt_parked)?;
        c.segments.wait_parked = settings::WAIT_PARKED.get(c.segments.wait_parked)?;
        c.segments.replace_pieces = settings::REPLACE_PIECES.get(c.segments.replace_pieces)?;
        c.segments.piece_share = settings::PIECE_SHARE.get(c.segments.piece_share)?;
        c.segments.piece_pages = settings::PIECE_PAGES.get(c.segments.piece_pages)?;
        c.background_unmap = settings::BACKGROUND_UNMAP.get(c.background_unmap)?;
        c.stream_pools = settings::STREAM_POOLS.get(c.stream_pools)?;
        c.limit = settings::LIMIT.get(c.limit)?;
        c.release_threshold = settings::RELEASE_THRESHOLD.get(c.release_threshold)?;
        c.segments.initial_size = settings::INITIAL_SIZE.get(c.segments.initial_size)?;
        Ok(c)
    }

    /// The stream pools the pool makes: none where it keeps a home segment
    /// (an initial size without the expandable segment,
    /// `SegmentPolicy::initial_size`), whose blocks every stream shares, else
    /// [`PoolConfig::stream_pools`]. Decided when the pool is made: with the
    /// expandable segment turned on over a driver that turns out to lack
    /// virtual memory, the home comes with stream pools beside it.
    pub fn stream_pools_made(&self) -> usize {
        if self.segments.initial_size > 0 && !self.segments.expandable {
            0
        } else {
            self.stream_pools
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            segments: SegmentPolicy::default(),
            limit: None,
            thread_cache_blocks: 256,
            thread_cache_bytes: 512 << 20,
            thread_cache_largest: DEFAULT_THREAD_CACHE_LARGEST,
            thread_cache_keep: DEFAULT_THREAD_CACHE_KEEP,
            release_threshold: usize::MAX,
            exportable: false,
            background_unmap: true,
            stream_pools: DEFAULT_STREAM_POOLS,
        }
    }
}

/// The largest block a thread files in its cache by default
/// ([`PoolConfig::thread_cache_largest`]): 1 MiB
/// ([`SMALL_MAX`](crate::SMALL_MAX)). A larger block waits only in the slot
/// for the block freed last: taken back without the lock when its size is
/// asked for next, else sent on to the arena at the stream's next free or
/// next allocation that misses, where it joins its free neighbours. With
/// growth by what a request lacks (`SegmentPolicy::expand_step` of a page) and
/// pieces of at most four pages (`SegmentPolicy::piece_pages`), replayed 100
/// passes: the 21 recorded traces 1.0300x to 1.0215x of live on the mean,
/// every one within 1.05x (BERT 1.046x to 1.026x, T5 1.034x to 1.022x), the
/// 42 held-out traces 1.0448x to 1.0338x with 7 above 1.05x instead of 15,
/// and the driver's estimated time in a later pass of the 21 traces 861 to
/// 546 ms. With pieces of up to eight pages, FSDP2 of the 1.1 B Llama drifted
/// past 1.05x (1.043x to 1.059x): its gathered parameters went back to the
/// arena among pieces of eight pages, which move only when wholly free. The
/// held-out GPT-NeoX generation of seed 7 went from 1.049x to 1.095x
/// (`docs/benchmarks.md`, fifty-seventh and fifty-eighth sessions). `max`
/// keeps every block, as before.
pub const DEFAULT_THREAD_CACHE_LARGEST: usize = crate::SMALL_MAX;

/// Bytes below which a thread's cache of a stream is kept at a small
/// request's miss by default ([`PoolConfig::thread_cache_keep`]): 1 MiB
/// ([`SMALL_MAX`](crate::SMALL_MAX)). Where a job's small blocks live in the
/// expandable segment (its small segments full), every small request whose
/// size the cache lacked had sent the cache back to the arena, so the next
/// requests of the sizes it held missed too: replaying the recorded
/// Llama-style generation through `emm_torch_alloc` over the host stand-in,
/// the thread's cache served 48 % of allocations, 82 % with this, and a
/// request took 255-267 ns against 169 (734 against 485 with the host's
/// caches emptied between requests, as a job's work between calls empties
/// them). On an H100, six rotated rounds of that generation: emm's time
/// inside PyTorch's hooks 17.4 to 12.6 ms a generation, the generation 1.071
/// to 1.006 times expandable segments' by the mean of round medians (runs
/// 353-355). Over 100 replayed passes the 21 recorded traces went from 1.0215x
/// to 1.0227x of live on the mean, the worst from 1.047x to 1.046x (the GPT-2
/// beam search 1.013x to 1.034x); keeping the cache at every such miss
/// loosened the held-out traces (16 of 42 above 1.05x against 7). Off with
/// stream pools off and in an arena that has served several streams, where
/// blocks coalesce across streams: FSDP2 of GPT-2 in one shared arena went
/// from 1.052x to 1.055x over 100 passes (`docs/benchmarks.md`, sixtieth
/// session).
pub const DEFAULT_THREAD_CACHE_KEEP: usize = crate::SMALL_MAX;

/// Created streams that get a pool of their own by default
/// ([`PoolConfig::stream_pools`]). FSDP2 of a 1.1 B Llama on four GPUs, five
/// rotated rounds of 100 steps (runs 236-238): peak reserved 1.043-1.044x of
/// PyTorch's allocated peak of the job with them against 1.067-1.073x without
/// (expandable segments: 1.069x), 28.04-28.07 against 28.65-28.71 GiB at the
/// device, and the steps' totals 1.104x of expandable segments' (median of
/// rounds) against 1.143x without (by the mean of round medians 1.074x against
/// 1.058x). Where streams share memory by turns instead (`random_traces.py`'s
/// three-stream traces) they hold 1.11-1.25x of live where one shared arena
/// holds 1.06-1.13x; PyTorch's allocator, which keeps each stream's blocks
/// apart as they do, 1.24-1.60x. Eight covers FSDP2's and DDP's streams with
/// room; streams past it share the pool's own arena.
pub const DEFAULT_STREAM_POOLS: usize = 8;

pub use crate::settings::MAX_STREAM_POOLS;

/// Streams a thread keeps cached blocks for, per pool. A thread that frees on more
/// streams gives the oldest stream's blocks back to the arena: lookups stay a short
/// scan, and a program that cycles through thousands of streams does not strand a
/// cache on each.
pub const MAX_STREAM_CACHES: usize = 16;

/// The most a thread caches per stream in a pool without the expandable segment
/// (see `Core::cache_bytes`).
pub const NO_VMM_CACHE_BYTES: usize = 64 << 20;
