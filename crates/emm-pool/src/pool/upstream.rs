//! [`PoolUpstream`]: what a pool is built over, and how its shared state
//! ([`Core`]) is made from it (a pool's own, or a tag or stream pool's:
//! `siblings.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use emm_core::{DeferState, EmmError, Result};
use emm_default::{DriverUpstream, HostOnly, HostUpstream, Managed, PendingConfig, Upstream};
use emm_driver::Context;

use super::config::PoolConfig;
use super::shared::Core;
use super::threads::{ThreadCounters, NEXT_ID};
use crate::arena::{Arena, SegmentPolicy};
use crate::events::{DriverEvents, EventSource, HostEvents};
use crate::family::Family;
use crate::unmapper::Unmapper;
use crate::vmm::{DriverVmm, HostVmm, VirtualMemory};

/// Where a pool's segments come from.
pub enum PoolUpstream {
    /// `cuMemAlloc` in a context.
    Driver(Context),
    /// The host stand-in (no GPU): `capacity` bytes, `touch` to back blocks with
    /// real host memory.
    Host {
        /// Bytes of the stand-in device.
        capacity: usize,
        /// Back blocks with real memory.
        touch: bool,
    },
    /// Any other upstream, with its event source and optional virtual memory.
    Custom(
        Box<dyn Upstream>,
        Box<dyn EventSource>,
        Option<Box<dyn VirtualMemory>>,
        Option<Context>,
    ),
}

/// The upstream and virtual memory of a pool over the host stand-in `host`,
/// which a pool and its tag and stream pools share: one device, whose capacity
/// they all count against.
///
/// As over the driver, whose virtual memory a pool uses only when its
/// `large_round` is a multiple of the driver's granularity, the stand-in's
/// comes only with a `large_round` that is a multiple of
/// [`HOST_GRANULARITY`](crate::vmm::HOST_GRANULARITY): pieces of a few bytes
/// would make every growth and release walk millions of them.
pub(super) fn host_parts(
    host: &Arc<HostUpstream>,
    touch: bool,
    segments: &SegmentPolicy,
) -> (Box<dyn Upstream>, Option<Box<dyn VirtualMemory>>) {
    let expandable =
        segments.expandable && segments.large_round % crate::vmm::HOST_GRANULARITY == 0;
    let vmm: Option<Box<dyn VirtualMemory>> = if expandable && !touch {
        Some(Box::new(HostVmm::new(host.clone())))
    } else {
        None
    };
    (Box::new(host.clone()), vmm)
}

/// The shared state of a pool over `upstream` with `config` (a pool's own, or
/// a tag or stream pool's), in `family` (shared by a pool and its tag and
/// stream pools: reserved bytes, the byte limit and the release threshold).
pub(super) fn make_core(
    upstream: PoolUpstream,
    config: PoolConfig,
    family: Arc<Family>,
) -> Result<Arc<Core>> {
    let seg = &config.segments;
    for (name, value) in [
        ("segments.large_round", seg.large_round),
        ("segments.small_segment", seg.small_segment),
        ("segments.large_segment", seg.large_segment),
        ("segments.expand_step", seg.expand_step),
    ] {
        // (Past half of `isize::MAX` no device holds it, and the pool's sums of
        // segment sizes could overflow: a request that large is refused too.)
        if value == 0
            || value > crate::settings::MAX_SEGMENT_BYTES
            || (name == "segments.large_round" && !value.is_power_of_two())
        {
            return Err(EmmError::InvalidConfig {
                name: name.into(),
                value: value.to_string(),
                reason: format!(
                    "a positive size of at most {} bytes (the rounding a power of two)",
                    crate::settings::MAX_SEGMENT_BYTES
                ),
            });
        }
    }
    if seg.expandable && seg.expandable_reserve < seg.large_round {
        return Err(EmmError::InvalidConfig {
            name: "segments.expandable_reserve".into(),
            value: seg.expandable_reserve.to_string(),
            reason: format!(
                "at least segments.large_round ({}) bytes of address space for the expandable segment",
                seg.large_round
            ),
        });
    }
    if config.stream_pools > super::config::MAX_STREAM_POOLS {
        return Err(EmmError::InvalidConfig {
            name: "stream_pools".into(),
            value: config.stream_pools.to_string(),
            reason: format!(
                "at most {} stream pools (EMM_POOL_STREAM_POOLS, pool_stream_pools)",
                super::config::MAX_STREAM_POOLS
            ),
        });
    }
    if let Some(p) = seg.tight_percent.filter(|&p| p < 100) {
        return Err(EmmError::InvalidConfig {
            name: "segments.tight_percent".into(),
            value: p.to_string(),
            reason: "a percentage of live bytes of at least 100 (or None: never)".into(),
        });
    }
    let defer = DeferState::new();
    type Parts = (
        Box<dyn Upstream>,
        Box<dyn EventSource>,
        Option<Box<dyn VirtualMemory>>,
        Option<Context>,
    );
    // The host stand-in (what `emm replay` runs on) unmaps on the allocating
    // thread: its events complete when waited for, so a helper would unmap at
    // once, and the replay's figures would depend on the helper's timing.
    let helper_allowed = !matches!(upstream, PoolUpstream::Host { .. });
    let (up, events, vmm, ctx): Parts = match upstream {
        PoolUpstream::Driver(ctx) => {
            // A failed query of the device is the pool's error, not a pool
            // without its expandable segment for good.
            let vmm = if config.segments.expandable {
                DriverVmm::new(&ctx)?.map(|mut v| {
                    if config.exportable {
                        v.set_exportable();
                    }
                    v
                })
            } else {
                None
            };
            let vmm = match vmm {
                Some(v) if config.segments.large_round.checked_rem(v.granularity()?) == Some(0) => {
                    Some(v)
                }
                _ => None,
            };
            (
                Box::new(DriverUpstream::new(&ctx)),
                Box::new(DriverEvents::new(&ctx)),
                vmm.map(|v| Box::new(v) as Box<dyn VirtualMemory>),
                Some(ctx),
            )
        }
        PoolUpstream::Host { capacity, touch } => {
            let host = Arc::new(HostUpstream::new(capacity, touch));
            let (host, vmm) = host_parts(&host, touch, &config.segments);
            (host, Box::new(HostEvents::immediate()), vmm, None)
        }
        PoolUpstream::Custom(u, e, v, ctx) => (u, e, v, ctx),
    };
    let name = "pool";
    let host = match &ctx {
        Some(c) => {
            Some(HostOnly::new(c, PendingConfig::from_env()?, defer.clone())?.for_manager("pool"))
        }
        None => None,
    };
    let managed = ctx.as_ref().map(|c| Managed::new(c, "pool", defer.clone()));
    let vmm: Option<Arc<dyn VirtualMemory>> = vmm.map(Arc::from);
    let events: Arc<dyn EventSource> = Arc::from(events);
    let unmapper = vmm
        .as_ref()
        .filter(|_| config.background_unmap && helper_allowed)
        .map(|v| Unmapper::new(v.clone(), events.clone()));
    Ok(Arc::new(Core {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        name,
        arena: Mutex::new(Arena::in_family(config.segments, family, vmm.is_some())),
        upstream: up,
        vmm,
        events,
        unmapper,
        config,
        generation: AtomicUsize::new(0),
        threads: Mutex::new(Vec::new()),
        orphan: ThreadCounters::default(),
        host,
        managed,
        ctx,
        defer,
        recording: AtomicBool::new(false),
        refused: Default::default(),
    }))
}
