//! [`PoolConfig`]: what a pool is built with, and its environment variables.

use emm_core::{EmmError, Result};

use crate::arena::SegmentPolicy;

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
    /// Reserved bytes above which `release_cached` and a free's trim check give
    /// wholly free segments back (`usize::MAX`: only on `trim()` or out of memory).
    pub release_threshold: usize,
    /// The expandable segment's pieces are created exportable as POSIX file
    /// descriptors, so that `get_ipc_handle` of a block there gives an
    /// [`IpcHandle::Vmm`](emm_core::IpcHandle::Vmm) another process opens (legacy CUDA IPC cannot export
    /// virtual memory). Off by default (`EMM_POOL_EXPORTABLE`; `emm.numba_plugin`
    /// turns it on); see `export.rs` for the contract.
    pub exportable: bool,
}

impl PoolConfig {
    /// The defaults, with `EMM_POOL_EXPANDABLE` (`0`/`false` turns the expandable
    /// segment off, e.g. for legacy IPC of every block), `EMM_POOL_EXPORTABLE`
    /// (`1`/`true`: blocks of the expandable segment export by file descriptor),
    /// `EMM_POOL_LEGACY_MERGE`
    /// (without the expandable segment: merge wholly free large segments when live
    /// bytes fall to 1/n of reserved; 0 off, see `SegmentPolicy::merge_quiet`),
    /// `EMM_POOL_THREAD_CACHE`
    /// (bytes per thread and stream; 0 turns thread caches off) and `EMM_POOL_LIMIT`
    /// (bytes) applied. An invalid value is an error naming the variable.
    pub fn from_env() -> Result<PoolConfig> {
        let mut c = PoolConfig::default();
        if let Ok(v) = emm_core::config::var("EMM_POOL_EXPANDABLE") {
            c.segments.expandable = env_bool("EMM_POOL_EXPANDABLE", v, true)?;
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_EXPORTABLE") {
            c.exportable = env_bool("EMM_POOL_EXPORTABLE", v, false)?;
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_THREAD_CACHE") {
            if !v.trim().is_empty() {
                c.thread_cache_bytes = emm_core::parse_bytes(&v)
                    .and_then(|n| usize::try_from(n).map_err(|_| "too large".to_owned()))
                    .map_err(|reason| EmmError::InvalidConfig {
                        name: "EMM_POOL_THREAD_CACHE".into(),
                        value: v.clone(),
                        reason,
                    })?;
                if c.thread_cache_bytes == 0 {
                    c.thread_cache_blocks = 0;
                }
            }
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_LEGACY_MERGE") {
            if !v.trim().is_empty() {
                let n: usize = v.trim().parse().map_err(|_| EmmError::InvalidConfig {
                    name: "EMM_POOL_LEGACY_MERGE".into(),
                    value: v.clone(),
                    reason: "expected a count (0: off)".into(),
                })?;
                c.segments.merge_quiet = (n > 0).then_some(n);
            }
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_LIMIT") {
            if !v.trim().is_empty() {
                c.limit = Some(
                    emm_core::parse_bytes(&v)
                        .and_then(|n| usize::try_from(n).map_err(|_| "too large".to_owned()))
                        .map_err(|reason| EmmError::InvalidConfig {
                            name: "EMM_POOL_LIMIT".into(),
                            value: v.clone(),
                            reason,
                        })?,
                );
            }
        }
        Ok(c)
    }
}

/// A boolean variable's value (`empty`: what an empty value means).
fn env_bool(name: &str, v: String, empty: bool) -> Result<bool> {
    match v.trim() {
        "" => Ok(empty),
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(EmmError::InvalidConfig {
            name: name.into(),
            value: v,
            reason: "expected 0 or 1".into(),
        }),
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            segments: SegmentPolicy::default(),
            limit: None,
            thread_cache_blocks: 256,
            thread_cache_bytes: 512 << 20,
            release_threshold: usize::MAX,
            exportable: false,
        }
    }
}

/// Streams a thread keeps cached blocks for, per pool. A thread that frees on more
/// streams gives the oldest stream's blocks back to the arena: lookups stay a short
/// scan, and a program that cycles through thousands of streams does not strand a
/// cache on each.
pub const MAX_STREAM_CACHES: usize = 16;

/// The most a thread caches per stream in a pool without the expandable segment
/// (see `Core::cache_bytes`).
pub const NO_VMM_CACHE_BYTES: usize = 64 << 20;
