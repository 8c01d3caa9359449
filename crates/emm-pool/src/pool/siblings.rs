//! [`Siblings`]: how a pool makes the further pools of its family (a tag's in
//! `tagged.rs`, a stream's in `streams.rs`): the parent's upstream again, in
//! the parent's [`Family`] (reserved bytes, byte limit, release threshold),
//! recording history as the parent does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use emm_core::{HostClock, Result};
use emm_default::HostUpstream;
use emm_driver::Context;

use super::config::PoolConfig;
use super::shared::Core;
use super::upstream::{host_parts, make_core, PoolUpstream};
use crate::events::HostEvents;
use crate::family::Family;

/// How to make a sibling pool: the parent's upstream, again.
#[derive(Clone)]
pub(super) enum Recipe {
    /// `cuMemAlloc` and virtual memory in this context.
    Driver(Context),
    /// The host stand-in: the parent's, so that the family counts against one
    /// device's capacity (`--device-memory`).
    Host {
        host: Arc<HostUpstream>,
        touch: bool,
    },
    /// The host stand-in whose device runs behind the host by `clock`
    /// ([`PoolManager::host_lagged`](super::PoolManager::host_lagged)), the
    /// parent's as above.
    Lagged {
        host: Arc<HostUpstream>,
        clock: Arc<HostClock>,
    },
    /// A custom upstream cannot be made again: no siblings are made
    /// (allocations under a tag, or on any stream, come from the parent).
    None,
}

/// What a pool's siblings are made from.
pub(super) struct Siblings {
    recipe: Recipe,
    /// The parent's family.
    family: Arc<Family>,
    /// History entries each sibling records (the parent's `record_history`).
    history: AtomicUsize,
}

impl Siblings {
    pub(super) fn new(recipe: Recipe, family: Arc<Family>) -> Siblings {
        Siblings {
            recipe,
            family,
            history: AtomicUsize::new(0),
        }
    }

    /// Whether siblings can be made (the parent's upstream can be made again).
    pub(super) fn enabled(&self) -> bool {
        !matches!(self.recipe, Recipe::None)
    }

    /// Siblings made from now on record `max_entries` history entries.
    pub(super) fn set_history(&self, max_entries: usize) {
        self.history.store(max_entries, Ordering::Relaxed);
    }

    /// A new pool over the parent's upstream with `config`, in the family, for
    /// `what` (named in the error when no sibling can be made). A sibling
    /// keeps no home segment (`SegmentPolicy::initial_size`): the initial size
    /// is the family's, and the parent's home holds it.
    pub(super) fn make(&self, mut config: PoolConfig, what: &'static str) -> Result<Arc<Core>> {
        config.segments.initial_size = 0;
        let upstream = match &self.recipe {
            Recipe::Driver(ctx) => PoolUpstream::Driver(ctx.clone()),
            Recipe::Host { host, touch } => {
                let (up, vmm) = host_parts(host, *touch, &config.segments);
                PoolUpstream::Custom(up, Box::new(HostEvents::immediate()), vmm, None)
            }
            Recipe::Lagged { host, clock } => {
                let (up, vmm) = host_parts(host, false, &config.segments);
                PoolUpstream::Custom(
                    up,
                    Box::new(crate::LaggedEvents::new(clock.clone())),
                    vmm,
                    None,
                )
            }
            Recipe::None => {
                return Err(emm_core::EmmError::Internal {
                    operation: what,
                    detail: "a pool of its own asked of a pool whose upstream cannot be made again"
                        .into(),
                })
            }
        };
        let core = make_core(upstream, config, self.family.clone())?;
        let history = self.history.load(Ordering::Relaxed);
        if history > 0 {
            core.lock().history.set_capacity(history);
            core.recording.store(true, Ordering::Relaxed);
        }
        Ok(core)
    }
}
