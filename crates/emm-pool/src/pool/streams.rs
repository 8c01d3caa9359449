//! Stream pools (`pool_stream_pools`): each created stream, up to a bound,
//! allocates its large blocks from a pool of its own in the parent's family.
//!
//! In one pool every stream's blocks share one expandable segment, and a
//! stream's free blocks serve another stream only once the device has passed
//! the free. A job whose streams allocate in different rhythms (FSDP2: the
//! compute stream's activations against the all-gather stream's parameter
//! buffers) then leaves holes of one stream beside blocks of another, and each
//! pass's best fits see the layout the last pass's moves left: over many
//! passes the pool keeps moving pieces. Pools kept apart by stream each hold
//! their own steady layout (replayed, the four-GPU FSDP2 Llama trace holds
//! 1.043x of live against 1.058-1.068x shared, with a quarter of the moves
//! once a small pool stops moving, `Arena::moves_worth_their_calls`; see
//! `docs/benchmarks.md`).
//!
//! Only large requests (over [`SMALL_MAX`](crate::SMALL_MAX)) go to a stream's
//! pool: small ones stay in the parent's small segments, which are kept per
//! stream there already and hold no holes that moves fill; a pool of its own
//! would cost a stream of a few small blocks a 2 MiB segment and change the
//! parent's layout for nothing (the midway snapshot's side stream, 63 KiB live,
//! replayed at 1.053x of live at a device lag of 300 with its own pool, 1.043x
//! without). The default streams (the null stream, `CU_STREAM_LEGACY` and
//! `CU_STREAM_PER_THREAD`) and the streams past the bound stay in the parent's
//! pool, so a program that cycles through many streams does not strand memory
//! in a pool per stream. A pool is made on its stream's first large allocation, with
//! the parent's configuration (its blocks in segments of their own, as the
//! parent's), and kept while the parent lives; a block is freed into the pool
//! that made it, whatever stream frees it. Reads take no lock: the slots are
//! filled once, in order, under `making`.
//!
//! What a stream's pool holds stays there until a trim, the release
//! threshold or another pool's out-of-memory takes it back (as PyTorch's
//! allocator keeps each stream's cached blocks for that stream): streams that
//! peak at different times reserve the sum of their peaks. The first streams
//! to allocate large blocks keep the slots for the pool's life. A stream
//! handle the driver reuses after a destroy names the same pool, as it names
//! the same stream's blocks in a shared pool.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use emm_sys::CUstream;

use super::config::PoolConfig;
use super::shared::Core;
use super::siblings::Siblings;
use crate::stream_key;

/// One stream's pool.
pub(super) struct StreamPool {
    /// The stream's handle.
    pub(super) stream: usize,
    pub(super) core: Arc<Core>,
}

/// A pool's stream pools.
pub(super) struct StreamPools {
    siblings: Arc<Siblings>,
    /// At most `pool_stream_pools` slots, filled in order.
    slots: Box<[OnceLock<StreamPool>]>,
    /// Held while a slot is filled.
    making: Mutex<()>,
    /// After a pool could not be made: how many more streams without one are
    /// served by the parent's before making one is tried again (a driver fault
    /// may clear; one that does not costs a try every [`RETRY_AFTER`] misses).
    skip: AtomicU32,
    /// Whether a failure was logged as a warning (later ones at debug level).
    warned: AtomicBool,
}

/// Lookups of streams without a pool served by the parent's after a pool
/// could not be made, before the next try.
const RETRY_AFTER: u32 = 1024;

/// What the slots say of a stream.
enum Lookup<'a> {
    /// Its pool.
    Found(&'a Arc<Core>),
    /// Not there, and every slot is taken.
    Full,
    /// Not there; a slot is free.
    Missing,
}

impl StreamPools {
    /// Up to `bound` stream pools made by `siblings` (0: none).
    pub(super) fn new(siblings: Arc<Siblings>, bound: usize) -> StreamPools {
        let bound = if siblings.enabled() { bound } else { 0 };
        StreamPools {
            siblings,
            slots: (0..bound).map(|_| OnceLock::new()).collect(),
            making: Mutex::new(()),
            skip: AtomicU32::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// The pool of `stream`, made with `config` (the parent's) on its first
    /// large allocation; `None` for a default stream, a stream past the bound,
    /// with stream pools off, or for the next [`RETRY_AFTER`] streams without a
    /// pool after one could not be made (the parent serves those; then making
    /// one is tried again). A stream past the bound takes no lock.
    pub(super) fn pool_of(&self, stream: CUstream, config: &PoolConfig) -> Option<&Arc<Core>> {
        if self.slots.is_empty() || is_default_stream(stream) {
            return None;
        }
        let key = stream.0 as usize;
        match self.find(key) {
            Lookup::Found(p) => return Some(p),
            Lookup::Full => return None,
            Lookup::Missing if self.skipping() => return None,
            Lookup::Missing => {}
        }
        let _making = self.making.lock().unwrap_or_else(|p| p.into_inner());
        for slot in self.slots.iter() {
            match slot.get() {
                Some(p) if p.stream == key => return Some(&p.core),
                Some(_) => continue,
                None => {
                    let mut config = *config;
                    config.segments.one_range = false;
                    let core = match self.siblings.make(config, "a stream pool") {
                        Ok(c) => c,
                        Err(e) => {
                            self.skip.store(RETRY_AFTER, Ordering::Relaxed);
                            if !self.warned.swap(true, Ordering::Relaxed) {
                                tracing::warn!(error = %e, stream = key, "making a stream's pool failed; streams without one share the pool's own, and making one is tried again after {RETRY_AFTER} of them");
                            } else {
                                tracing::debug!(error = %e, stream = key, "making a stream's pool failed again");
                            }
                            return None;
                        }
                    };
                    let _ = slot.set(StreamPool { stream: key, core });
                    return slot.get().map(|p| &p.core);
                }
            }
        }
        None
    }

    /// Whether a failure to make a pool is still being waited out (one lookup
    /// of the wait counted).
    fn skipping(&self) -> bool {
        self.skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// What the slots say of the stream with handle `key`.
    fn find(&self, key: usize) -> Lookup<'_> {
        for slot in self.slots.iter() {
            match slot.get() {
                Some(p) if p.stream == key => return Lookup::Found(&p.core),
                Some(_) => continue,
                None => return Lookup::Missing,
            }
        }
        Lookup::Full
    }

    /// The stream pools made so far.
    pub(super) fn all(&self) -> impl Iterator<Item = &StreamPool> {
        self.slots.iter().map_while(OnceLock::get)
    }
}

/// Whether `stream` is a default stream (null, legacy or per-thread), as the
/// arena judges them.
fn is_default_stream(stream: CUstream) -> bool {
    stream_key::is_default_stream(stream.0 as usize) || stream_key::is_per_thread(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::Family;
    use crate::pool::siblings::Recipe;

    fn pools(bound: usize) -> StreamPools {
        let siblings = Siblings::new(
            Recipe::Host {
                host: Arc::new(emm_default::HostUpstream::new(1 << 30, false)),
                touch: false,
            },
            Arc::new(Family::default()),
        );
        StreamPools::new(Arc::new(siblings), bound)
    }

    #[test]
    fn default_streams_and_streams_past_the_bound_stay_with_the_parent() {
        let p = pools(2);
        let c = PoolConfig::default();
        for s in [0usize, 1, 2] {
            assert!(p.pool_of(CUstream(s as *mut _), &c).is_none());
        }
        let a = Arc::as_ptr(p.pool_of(CUstream(0x100 as *mut _), &c).unwrap());
        let b = Arc::as_ptr(p.pool_of(CUstream(0x200 as *mut _), &c).unwrap());
        assert_ne!(a, b, "two streams, two pools");
        assert_eq!(
            a,
            Arc::as_ptr(p.pool_of(CUstream(0x100 as *mut _), &c).unwrap()),
            "a stream keeps its pool"
        );
        assert!(
            p.pool_of(CUstream(0x300 as *mut _), &c).is_none(),
            "past the bound"
        );
        assert_eq!(p.all().count(), 2);
        assert!(
            pools(0).pool_of(CUstream(0x100 as *mut _), &c).is_none(),
            "off"
        );
    }
}
