//! The out-of-memory ladder.

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use emm_core::TraceAction;

use super::*;
use crate::events::EventSource;

impl Arena {
    #[allow(clippy::too_many_arguments)] // reason: the ladder needs the whole request
    pub(super) fn oom_ladder(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
        first: EmmError,
    ) -> Result<(CUdeviceptr, CUdeviceptr, usize)> {
        self.stats.oom_ladders += 1;
        // 1. Wait for the work of every stream holding free blocks; those blocks
        //    become usable by any stream, and coalesce.
        self.consolidate(events)?;
        if let Some(a) = self.take_fit_home_first(size, kind, SETTLED) {
            return Ok(self.finish(a, size));
        }
        // 2. Give back every wholly free segment (the home segment too: it
        //    could not hold this request, and the next allocation asks for it
        //    again).
        let home = self.home_size();
        self.release_free_segments(source, events);
        // 3. Retry the upstream, unless the device cannot hold even an exact
        //    segment: then say no at once (a failing driver allocation costs more
        //    than the question, and callers that fall back want the answer fast).
        //    Asked now (a few microseconds): the steps above, or another
        //    allocator of the process, may have given memory back since the first
        //    error.
        let (free, total) = source.device_info();
        let exact = size.div_ceil(2 << 20) * (2 << 20);
        let hopeless = total > 0 && free < exact;
        let retry = if hopeless {
            Err(())
        } else {
            let seg = self.policy.segment_for(size, kind);
            self.grow(seg, kind, stream, source)
                .or_else(|_| {
                    // A smaller, exact segment may still fit.
                    self.grow(exact, kind, stream, source)
                })
                .map_err(|_| ())
        };
        match retry {
            Ok(base) => {
                self.stats.counts.misses += 1;
                if let Some(home) = home {
                    self.count_home_overflow(size, home);
                }
                let a = self
                    .take_grown(size, kind, stream, base)
                    .ok_or_else(|| first.clone())?;
                Ok(self.finish(a, size))
            }
            Err(()) => {
                let (free, total) = if hopeless {
                    (free, total)
                } else {
                    source.device_info()
                };
                self.stats.ooms += 1;
                self.history
                    .push_oom_aware(TraceAction::Oom, 0, size, stream_id(stream), free);
                Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: size,
                    free,
                    total,
                    detail: format!(
                        "live {}, reserved {}, largest free block {}, after releasing cached segments{}",
                        emm_core::fmt_bytes(self.stats.live),
                        emm_core::fmt_bytes(self.stats.reserved),
                        emm_core::fmt_bytes(self.largest_free()),
                        // The limit, where one is set: the device's free and total
                        // bytes do not say why a pool under its limit refused.
                        self.limit().map_or(String::new(), |l| format!(
                            "; the pool's byte limit (EMM_POOL_LIMIT) is {}",
                            emm_core::fmt_bytes(l)
                        )),
                    ),
                })
            }
        }
    }
}
