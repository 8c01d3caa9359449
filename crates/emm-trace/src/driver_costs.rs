//! What a replay's driver calls would cost on a GPU: each kind of call at a
//! time measured on an idle NVIDIA H100 (driver 580.159.04), so that a replay
//! over the host stand-in, whose own times are bookkeeping only, can still say
//! what a warm manager's calls would take each pass.
//!
//! An estimate, and a low one: the figures are medians over a process that does
//! nothing else. In a training process (tens of thousands of mappings, NCCL
//! running) a moved piece took 82-245 us of host time (emm's `call-timing`
//! build, `docs/benchmarks.md`, run 199) against the 39 us counted here.

use std::time::Duration;

use crate::DriverCalls;

/// The time one driver call of each kind takes (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverCosts {
    /// Memory taken from the driver: a `cuMemAlloc` (a growth of an expandable
    /// segment counts one of these beside its pieces).
    pub alloc: Duration,
    /// Memory given back: a `cuMemFree`.
    pub free: Duration,
    /// A piece of an expandable segment mapped with new memory: `cuMemCreate`,
    /// `cuMemMap` and `cuMemSetAccess`.
    pub piece_mapped: Duration,
    /// A piece's memory mapped again elsewhere: `cuMemMap` and `cuMemSetAccess`.
    pub piece_moved: Duration,
    /// An old mapping unmapped: `cuMemUnmap` (a `cuMemRelease` follows when the
    /// piece's memory goes back, which the counters do not tell apart; not
    /// counted).
    pub piece_unmapped: Duration,
}

impl DriverCosts {
    /// An idle H100: `cuMemAlloc` + `cuMemFree` 73 us a pair at 256 B (half
    /// each; 154 us at 64 MiB; `../shared/peers/driver_bench.c`), `cuMemCreate` 13 us,
    /// `cuMemMap` 1 us, `cuMemSetAccess` 38 us a handle and `cuMemUnmap` 24 us
    /// (`../shared/peers/vmm_bench.c`).
    pub const IDLE_H100: DriverCosts = DriverCosts {
        alloc: Duration::from_nanos(36_500),
        free: Duration::from_nanos(36_500),
        piece_mapped: Duration::from_micros(52),
        piece_moved: Duration::from_micros(39),
        piece_unmapped: Duration::from_micros(24),
    };

    /// The time `calls` would take at these costs.
    pub fn time(&self, calls: &DriverCalls) -> Duration {
        let each =
            |cost: Duration, n: u64| cost.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        each(self.alloc, calls.allocs)
            .saturating_add(each(self.free, calls.frees))
            .saturating_add(each(self.piece_mapped, calls.pieces_mapped))
            .saturating_add(each(self.piece_moved, calls.pieces_moved))
            .saturating_add(each(self.piece_unmapped, calls.pieces_unmapped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_call_is_counted_at_its_cost() {
        let calls = DriverCalls {
            allocs: 2,
            frees: 1,
            pieces_mapped: 10,
            pieces_moved: 100,
            pieces_unmapped: 100,
        };
        let t = DriverCosts::IDLE_H100.time(&calls);
        assert_eq!(
            t,
            Duration::from_nanos(3 * 36_500 + (10 * 52 + 100 * 39 + 100 * 24) * 1000)
        );
        assert_eq!(
            DriverCosts::IDLE_H100.time(&DriverCalls::default()),
            Duration::ZERO
        );
    }

    #[test]
    fn counts_past_what_a_duration_holds_saturate() {
        let calls = DriverCalls {
            pieces_moved: u64::MAX,
            ..DriverCalls::default()
        };
        assert!(DriverCosts::IDLE_H100.time(&calls) >= Duration::from_secs(100_000));
    }
}
