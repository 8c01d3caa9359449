//! The pool's settings, declared here, where they are read ([`SETTINGS`] is what
//! its factory declares to the router; see `emm_core::setting`). Adding one is one
//! `static` here and one entry in [`SETTINGS`]; `configure`, `emm_configure`,
//! Python's `emm.configure` and `emm.settings()` know it from that.

use emm_core::setting::{parse, AnySetting, Key, Setting, ValueKind};

/// The most stream pools a pool may be configured for
/// ([`PoolConfig::stream_pools`](crate::PoolConfig::stream_pools)): each has a
/// slot made with the pool, and a count near `usize::MAX` could not be
/// allocated at all. As many as tags ([`MAX_TAGS`](emm_core::tags::MAX_TAGS)).
pub const MAX_STREAM_POOLS: usize = 4096;

/// The largest segment size or growth step: past half of `isize::MAX` no
/// device holds it, and the pool's sums of segment sizes could overflow.
pub(crate) const MAX_SEGMENT_BYTES: usize = isize::MAX as usize / 2;

/// A growth step ([`parse::bytes`]), positive and at most
/// [`MAX_SEGMENT_BYTES`]: refused by `configure`, not at the first allocation.
fn step_bytes(v: &str) -> Result<usize, String> {
    match parse::bytes(v)? {
        0 => Err("a positive size (the least the pool grows by)".to_owned()),
        n if n > MAX_SEGMENT_BYTES => Err(format!("a size of at most {MAX_SEGMENT_BYTES} bytes")),
        n => Ok(n),
    }
}

/// A stream pool count ([`parse::count`]), at most [`MAX_STREAM_POOLS`].
fn stream_pool_count(v: &str) -> Result<usize, String> {
    match parse::count(v)? {
        n if n > MAX_STREAM_POOLS => Err(format!("at most {MAX_STREAM_POOLS} stream pools")),
        n => Ok(n),
    }
}

/// `pool_limit` (`EMM_POOL_LIMIT`): the most bytes the pool (with its tag pools)
/// reserves per device. A run-time setting: lowering it below what is reserved
/// gives cached memory back at once, then refuses what would pass it.
pub static LIMIT: Setting<Option<usize>> = Setting::new(
    Key::new(
        "pool_limit",
        "EMM_POOL_LIMIT",
        ValueKind::BytesOrMax,
        "max",
        "largest number of bytes the pool reserves per device (`max`: the device's memory); may change while the pool serves",
    )
    .at_run_time(),
    parse::bound,
);

/// `pool_release_threshold` (`EMM_POOL_RELEASE_THRESHOLD`): reserved bytes above
/// which the pool gives back free memory once the streams that freed it are idle
/// (see `PoolConfig::release_threshold`). A run-time setting.
pub static RELEASE_THRESHOLD: Setting<usize> = Setting::new(
    Key::new(
        "pool_release_threshold",
        "EMM_POOL_RELEASE_THRESHOLD",
        ValueKind::BytesOrMax,
        "max",
        "reserved bytes above which the pool gives free memory back to the device once the streams that freed it are idle (`max`: never; as CUDA's mempool release threshold); may change while the pool serves",
    )
    .at_run_time(),
    parse::bytes_or_max,
);

/// `pool_expandable` (`EMM_POOL_EXPANDABLE`).
pub static EXPANDABLE: Setting<bool> = Setting::new(
    Key::new(
        "pool_expandable",
        "EMM_POOL_EXPANDABLE",
        ValueKind::Bool,
        "1",
        "large pool blocks in one expandable segment over CUDA virtual memory (0: legacy IPC for every block)",
    ),
    parse::flag,
);

/// `pool_exportable` (`EMM_POOL_EXPORTABLE`).
pub static EXPORTABLE: Setting<bool> = Setting::new(
    Key::new(
        "pool_exportable",
        "EMM_POOL_EXPORTABLE",
        ValueKind::Bool,
        "0",
        "pieces of the pool's expandable segment are created exportable, so its blocks export to other processes by file descriptor (`emm.numba_plugin` turns it on)",
    ),
    parse::flag,
);

/// `pool_legacy_merge` (`EMM_POOL_LEGACY_MERGE`).
pub static LEGACY_MERGE: Setting<usize> = Setting::new(
    Key::new(
        "pool_legacy_merge",
        "EMM_POOL_LEGACY_MERGE",
        ValueKind::Count,
        "6",
        "without the expandable segment: n merges wholly free large segments into one when live bytes fall to 1/n of reserved, or to within 1/n of the way from their low to reserved after a step, once a new segment was made (0: off)",
    ),
    parse::count,
);

/// `pool_initial_size` (`EMM_POOL_INITIAL_SIZE`): without the expandable segment,
/// one segment of this many bytes made at the pool's first allocation, which
/// every request tries first (see `SegmentPolicy::initial_size`).
pub static INITIAL_SIZE: Setting<usize> = Setting::new(
    Key::new(
        "pool_initial_size",
        "EMM_POOL_INITIAL_SIZE",
        ValueKind::Bytes,
        "0",
        "without the expandable segment (EMM_POOL_EXPANDABLE=0, or no virtual memory): one segment of this size made at the first allocation, which every request tries first by best fit, with no thread caches and no stream pools (as RMM's initial pool size; `emm replay TRACE -m pool --initial-size` names the smallest that holds a trace; 0: none)",
    ),
    parse::bytes,
);

/// `pool_thread_cache` (`EMM_POOL_THREAD_CACHE`).
pub static THREAD_CACHE: Setting<usize> = Setting::new(
    Key::new(
        "pool_thread_cache",
        "EMM_POOL_THREAD_CACHE",
        ValueKind::Bytes,
        "512M",
        "bytes each thread keeps per stream for immediate reuse (0: no thread caches)",
    ),
    parse::bytes,
);

/// `pool_thread_cache_largest` (`EMM_POOL_THREAD_CACHE_LARGEST`).
pub static THREAD_CACHE_LARGEST: Setting<usize> = Setting::new(
    Key::new(
        "pool_thread_cache_largest",
        "EMM_POOL_THREAD_CACHE_LARGEST",
        ValueKind::BytesOrMax,
        "1M",
        "largest block a thread files in its cache with the expandable segment; a larger one waits only as the block freed last, taken back if its size is asked for next, then goes back to the shared arena, where it joins its free neighbours (`max`: any block; without the expandable segment, any block within the cache)",
    ),
    parse::bytes_or_max,
);

/// `pool_expand_step` (`EMM_POOL_EXPAND_STEP`).
pub static EXPAND_STEP: Setting<usize> = Setting::new(
    Key::new(
        "pool_expand_step",
        "EMM_POOL_EXPAND_STEP",
        ValueKind::Bytes,
        "2M",
        "growth at the end of the expandable segment maps at least this much, or a 32nd of what the pool reserves where that is less (2M, a page: only what the request lacks)",
    ),
    step_bytes,
);

/// `pool_adopt_parked` (`EMM_POOL_ADOPT_PARKED`).
pub static ADOPT_PARKED: Setting<bool> = Setting::new(
    Key::new(
        "pool_adopt_parked",
        "EMM_POOL_ADOPT_PARKED",
        ValueKind::Bool,
        "0",
        "before growing past its peak while live bytes are well below theirs, a stream takes free blocks parked for other streams by waiting for their events on the device (1: cuStreamWaitEvent; less memory, slower FSDP2 steps in run 204), instead of growing (0)",
    ),
    parse::flag,
);

/// `pool_wait_parked` (`EMM_POOL_WAIT_PARKED`).
pub static WAIT_PARKED: Setting<bool> = Setting::new(
    Key::new(
        "pool_wait_parked",
        "EMM_POOL_WAIT_PARKED",
        ValueKind::Bool,
        "1",
        "before growing past its peak, a stream waits on the host for the events of free blocks of other streams parked for it and takes them (1), instead of growing (0)",
    ),
    parse::flag,
);

/// `pool_replace_pieces` (`EMM_POOL_REPLACE_PIECES`).
pub static REPLACE_PIECES: Setting<usize> = Setting::new(
    Key::new(
        "pool_replace_pieces",
        "EMM_POOL_REPLACE_PIECES",
        ValueKind::Count,
        "0",
        "n > 0: growth gives back the pieces under n pages lying in free holes that no queued work uses and maps new memory in pieces of up to n pages, instead of moving them (0: off)",
    ),
    parse::count,
);

/// `pool_piece_share` (`EMM_POOL_PIECE_SHARE`).
pub static PIECE_SHARE: Setting<usize> = Setting::new(
    Key::new(
        "pool_piece_share",
        "EMM_POOL_PIECE_SHARE",
        ValueKind::Count,
        "4096",
        "n > 0: new memory of the expandable segment comes in pieces of at least an nth of what the pool reserves (at most 8 pages), so a large pool maps and moves fewer pieces (0: off, pieces by the request alone)",
    ),
    parse::count,
);

/// `pool_thread_cache_keep` (`EMM_POOL_THREAD_CACHE_KEEP`).
pub static THREAD_CACHE_KEEP: Setting<usize> = Setting::new(
    Key::new(
        "pool_thread_cache_keep",
        "EMM_POOL_THREAD_CACHE_KEEP",
        ValueKind::Bytes,
        "1M",
        "with the expandable segment: a thread's cache of a stream holding blocks, less than this, is kept when a small request finds no free small block, and a free block of the expandable segment serves the request, where no other thread caches blocks of the stream, the pool's arena has served only that stream and stream pools are on; otherwise the cache goes back to the arena to coalesce first (0: it always does, as before the sixtieth session)",
    ),
    parse::bytes,
);

/// `pool_piece_pages` (`EMM_POOL_PIECE_PAGES`).
pub static PIECE_PAGES: Setting<usize> = Setting::new(
    Key::new(
        "pool_piece_pages",
        "EMM_POOL_PIECE_PAGES",
        ValueKind::Count,
        "4",
        "the most 2 MiB pages in one piece of new memory of the expandable segment: a piece moves only when wholly free, so smaller pieces let more free memory move, larger ones take fewer driver calls (0 counts as 1)",
    ),
    parse::count,
);

/// `pool_background_unmap` (`EMM_POOL_BACKGROUND_UNMAP`).
pub static BACKGROUND_UNMAP: Setting<bool> = Setting::new(
    Key::new(
        "pool_background_unmap",
        "EMM_POOL_BACKGROUND_UNMAP",
        ValueKind::Bool,
        "1",
        "a helper thread unmaps the old mappings of the expandable segment's moved pieces once their work is done (1), instead of the next growth on the allocating thread (0)",
    ),
    parse::flag,
);

/// `pool_stream_pools` (`EMM_POOL_STREAM_POOLS`).
pub static STREAM_POOLS: Setting<usize> = Setting::new(
    Key::new(
        "pool_stream_pools",
        "EMM_POOL_STREAM_POOLS",
        ValueKind::Count,
        "8",
        "each created stream, up to n (at most 4096), allocates its large blocks from a pool of its own in the pool's family; small blocks, the default streams and streams past n share the pool (0: off)",
    ),
    stream_pool_count,
);

/// Every setting of the pool, in the order the documentation lists them.
pub static SETTINGS: &[&dyn AnySetting] = &[
    &LIMIT,
    &RELEASE_THRESHOLD,
    &EXPANDABLE,
    &EXPORTABLE,
    &LEGACY_MERGE,
    &INITIAL_SIZE,
    &THREAD_CACHE,
    &THREAD_CACHE_LARGEST,
    &THREAD_CACHE_KEEP,
    &EXPAND_STEP,
    &ADOPT_PARKED,
    &WAIT_PARKED,
    &REPLACE_PIECES,
    &PIECE_SHARE,
    &PIECE_PAGES,
    &BACKGROUND_UNMAP,
    &STREAM_POOLS,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Values the pool refuses at its creation are refused by `configure` and
    /// `emm_configure_check` already (they were refused only at the first
    /// allocation, under an internal name).
    #[test]
    fn the_pools_bounds_are_the_parsers_bounds() {
        for v in ["0", "0M", "9000000T"] {
            let e = EXPAND_STEP.parse_any(v).err().unwrap_or_default();
            assert!(e.contains("size"), "{v}: {e}");
        }
        assert!(EXPAND_STEP.parse_any("2M").is_ok());
        let e = STREAM_POOLS.parse_any("4097").err().unwrap_or_default();
        assert!(e.contains("at most 4096"), "{e}");
        assert!(STREAM_POOLS.parse_any("4096").is_ok());
        assert!(STREAM_POOLS.parse_any("0").is_ok());
    }
}
