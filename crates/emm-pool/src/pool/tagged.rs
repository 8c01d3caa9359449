//! Tagged allocations: one pool of its own per tag (see `emm_core::tags`).
//!
//! A pool serves allocations made under a tag other than `"default"` from a pool
//! of that tag's own, made on the tag's first allocation, with the parent's
//! configuration and every block in its expandable segment (`one_range`): tags
//! share no physical page, so a pause of one gives back whole pages and touches
//! no other tag's blocks. Frees go to the pool that made the block.
//!
//! A tag's gate orders pauses against allocations: an allocation holds it shared
//! while it checks the tag's state and takes its block; a pause holds it
//! exclusively, so once the tag is marked paused no allocation under it is in
//! flight when its memory goes.

use std::sync::{Arc, RwLock};

use emm_core::{DeviceAllocation, PauseReport, Result, Tag, TagStats};
use emm_sys::CUstream;

use super::config::PoolConfig;
use super::shared::Core;
use super::siblings::Siblings;

/// One tag's pool.
pub(super) struct TagPool {
    pub(super) tag: Tag,
    pub(super) core: Arc<Core>,
    /// Whether the pool's memory is paused, guarded by `gate`: shared by
    /// allocations, exclusive for pause and resume (see the module's
    /// documentation). The pool refuses allocations while paused whatever the
    /// tag's process-wide state says (a caller of `pause_tag` who did not go
    /// through the router).
    gate: RwLock<bool>,
}

/// A pool's tag pools, indexed by [`Tag::index`].
pub(super) struct TagPools {
    /// How each tag's pool is made (shared with the stream pools).
    siblings: Arc<Siblings>,
    pools: RwLock<Vec<Option<Arc<TagPool>>>>,
}

impl TagPools {
    pub(super) fn new(siblings: Arc<Siblings>) -> TagPools {
        TagPools {
            siblings,
            pools: RwLock::new(Vec::new()),
        }
    }

    /// Whether tags are kept (the parent's upstream can be made again).
    pub(super) fn enabled(&self) -> bool {
        self.siblings.enabled()
    }

    /// The tag pools made so far.
    pub(super) fn all(&self) -> Vec<Arc<TagPool>> {
        self.pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// `tag`'s pool, if made.
    pub(super) fn get(&self, tag: Tag) -> Option<Arc<TagPool>> {
        self.pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tag.index())
            .cloned()
            .flatten()
    }

    /// `tag`'s pool, made with `config` (the parent's) on first use.
    fn get_or_make(&self, tag: Tag, config: &PoolConfig) -> Result<Arc<TagPool>> {
        if let Some(p) = self.get(tag) {
            return Ok(p);
        }
        let mut pools = self.pools.write().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(p)) = pools.get(tag.index()) {
            return Ok(p.clone());
        }
        let mut config = *config;
        config.segments.one_range = true;
        let core = self.siblings.make(config, "tagged allocation")?;
        let pool = Arc::new(TagPool {
            tag,
            core,
            gate: RwLock::new(false),
        });
        if pools.len() <= tag.index() {
            pools.resize(tag.index() + 1, None);
        }
        pools[tag.index()] = Some(pool.clone());
        Ok(pool)
    }

    /// Allocates `size` bytes on `stream` under `tag` (not `"default"`).
    pub(super) fn alloc(
        &self,
        tag: Tag,
        config: &PoolConfig,
        size: usize,
        stream: CUstream,
    ) -> Result<DeviceAllocation> {
        let pool = self.get_or_make(tag, config)?;
        let paused = pool.gate.read().unwrap_or_else(|p| p.into_inner());
        if *paused {
            return Err(tag.state_error("allocate", "its memory is paused; resume it first"));
        }
        tag.check_active("allocate")?;
        pool.core.alloc(size, stream)
    }

    /// Pauses `tag`'s pool (made empty where the tag never allocated here, so
    /// that it refuses allocations until resumed all the same).
    pub(super) fn pause(&self, tag: Tag, config: &PoolConfig, keep: bool) -> Result<PauseReport> {
        if !self.enabled() {
            return Err(emm_core::EmmError::Unsupported {
                manager: "pool over a custom upstream (it keeps no tags)".into(),
                operation: "pause",
            });
        }
        let pool = self.get_or_make(tag, config)?;
        let mut paused = pool.gate.write().unwrap_or_else(|p| p.into_inner());
        if *paused {
            return Err(tag.state_error("pause", "its memory here is already paused"));
        }
        let r = pool.core.pause(tag, keep);
        // (A failure that could not put the memory back leaves it paused.)
        *paused = pool.core.lock().is_paused();
        r
    }

    /// Whether `tag`'s pool could be paused now (see `Arena::check_pausable`);
    /// a tag that never allocated here can.
    pub(super) fn check_pause(&self, tag: Tag) -> Result<()> {
        if !self.enabled() {
            return Err(emm_core::EmmError::Unsupported {
                manager: "pool over a custom upstream (it keeps no tags)".into(),
                operation: "pause",
            });
        }
        match self.get(tag) {
            Some(pool) => {
                let refuse = |found: &str| tag.state_error("pause", found);
                // Blocks parked in threads' caches are free: back first, as the
                // pause itself does.
                let mut arena = pool.core.lock();
                pool.core.flush_thread(&mut arena);
                let gen = pool
                    .core
                    .generation
                    .load(std::sync::atomic::Ordering::Acquire);
                pool.core.reclaim_cached(&mut arena, None, gen);
                arena.check_pausable(&refuse)
            }
            None => Ok(()),
        }
    }

    /// Resumes `tag`'s pool.
    pub(super) fn resume(&self, tag: Tag) -> Result<PauseReport> {
        if !self.enabled() {
            return Err(emm_core::EmmError::Unsupported {
                manager: "pool over a custom upstream (it keeps no tags)".into(),
                operation: "resume",
            });
        }
        let Some(pool) = self.get(tag) else {
            return Ok(PauseReport::default());
        };
        let mut paused = pool.gate.write().unwrap_or_else(|p| p.into_inner());
        if !*paused {
            return Ok(PauseReport::default());
        }
        let r = pool.core.resume();
        *paused = pool.core.lock().is_paused();
        r
    }

    /// Each tag pool's figures.
    pub(super) fn stats(&self) -> Vec<TagStats> {
        self.all()
            .iter()
            .map(|p| {
                let arena = p.core.lock();
                let cached = p.core.cached_bytes();
                let mut s = TagStats::default();
                s.tag = p.tag.name().to_string();
                s.allocated_bytes = arena.stats.live.saturating_sub(cached);
                s.reserved_bytes = arena.stats.reserved;
                s.paused_bytes = arena.paused_bytes();
                s.paused = arena.is_paused();
                s.host_copy_bytes = arena.host_copy_bytes();
                s
            })
            .collect()
    }
}

impl Core {
    /// Pauses the pool (a tag pool: every block in its expandable segment): the
    /// threads' cached blocks go back to the arena, which then unmaps its pieces
    /// (see `arena/pause.rs`).
    fn pause(self: &Arc<Self>, tag: Tag, keep: bool) -> Result<PauseReport> {
        emm_core::check_not_forked()?;
        let mut arena = self.lock();
        self.flush_thread(&mut arena);
        let gen = self.generation.load(std::sync::atomic::Ordering::Acquire);
        self.reclaim_cached(&mut arena, None, gen);
        let source = self.source();
        let refuse = |found: &str| tag.state_error("pause", found);
        arena.pause(keep, self.events.as_ref(), &source, &refuse)
    }

    /// Resumes the pool: fresh memory under its paused pieces, contents restored.
    fn resume(&self) -> Result<PauseReport> {
        emm_core::check_not_forked()?;
        let mut arena = self.lock();
        let source = self.source();
        arena.resume(&source)
    }
}
