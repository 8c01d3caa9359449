//! `--initial-size`: for the pool without virtual memory (`EMM_POOL_EXPANDABLE=0`,
//! the path of legacy IPC), the smallest initial size (`EMM_POOL_INITIAL_SIZE`)
//! whose home segment holds a trace over the replay's passes with no segment
//! beside it: what to set from a previous run's trace. A bisection over the
//! host stand-in (`fit::smallest`), each size judged by a replay of the same
//! passes; the pool's other settings come from the environment.

use emm::emm_pool::{PoolConfig, PoolManager, SegmentPolicy};
use emm::trace::{replay, ReplayOptions, Trace};

use crate::backend::Streams;
use crate::fit;

/// The search's step: whole 2 MiB pages, or a thousandth of the peak of live
/// bytes when that is more.
fn step(live: u64) -> u64 {
    (2 << 20).max(live / 1000)
}

/// The smallest initial size from `live` up to twice it (higher, up to
/// [`fit::DOUBLINGS`] doublings of that, where twice does not hold) whose home holds `t`
/// over `passes` passes (`events` requests a pass) with no request beside it
/// (`emm.home_overflows` 0) and no failed request. `Err` names what could not
/// be run at all. The pool's warnings (a home too small, which most sizes
/// tried are) are not logged during the search.
pub fn smallest_home(
    t: &Trace,
    live: u64,
    events: u64,
    passes: u32,
    streams: &mut Streams<'_>,
) -> Result<fit::Fit, String> {
    let base = PoolConfig::from_env().map_err(|e| e.to_string())?;
    let high = live.saturating_mul(2).max(step(live));
    let quiet = tracing::subscriber::NoSubscriber::default();
    let _quiet = tracing::subscriber::set_default(quiet);
    fit::smallest(live, high, step(live), fit::SEARCH_TIME, |size| {
        let initial_size = usize::try_from(size).map_err(|e| e.to_string())?;
        let config = PoolConfig {
            segments: SegmentPolicy {
                expandable: false,
                initial_size,
                ..base.segments
            },
            ..base
        };
        let pool =
            PoolManager::host(crate::backend::HOST_CAPACITY, config).map_err(|e| e.to_string())?;
        let opts = ReplayOptions {
            total_events: events,
            samples: 0,
            passes,
            until_steady: None,
            peak_map: false,
            clock: None,
        };
        let r = replay(t, &pool, &mut |n| streams.get(n), &opts, &mut |_| {})
            .map_err(|e| e.to_string())?;
        Ok(r.failures == 0 && pool.stats().counts.home_overflows == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_a_page_or_a_thousandth_of_live() {
        assert_eq!(step(1 << 20), 2 << 20);
        assert_eq!(step(10 << 30), (10 << 30) / 1000);
    }
}
