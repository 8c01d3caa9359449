//! What a replay's driver calls would cost on a GPU: each kind of call at a
//! time measured on an idle NVIDIA H100 (driver 580.159.04), so that a replay
//! over the host stand-in, whose own times are bookkeeping only, can still say
//! what a warm manager's calls would take each pass.
//!
//! An estimate. The calls on an expandable segment's pieces are timed low: the
//! figures are medians over a process that does nothing else, and in a training
//! process (tens of thousands of mappings, NCCL running) a moved piece took
//! 82-245 us of host time (emm's `call-timing` build, `docs/benchmarks.md`, run
//! 199) against the 39 us counted here. Part of that is other processes: the
//! driver runs the VMM calls of a host's processes one at a time, so ranks of a
//! job that grow in the same step (FSDP2 and DDP do) each wait for the others'
//! calls ([`DriverCosts::sharing_host_with`]). Allocations and frees are rougher: a
//! `cuMemAlloc` + `cuMemFree` pair took 6.5 us (64 small ones in a row) to 169 us
//! (64 MiB ones) on that H100, and is counted at 73 us; and a growth of an
//! expandable segment counts one allocation beside its pieces, though it makes
//! no `cuMemAlloc`.

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
    /// An idle H100: `cuMemAlloc` + `cuMemFree` 73 us a pair, one pair at a
    /// time at 256 B (half each; 6.5-169 us by size and pattern;
    /// `../shared/peers/driver_bench.c`), `cuMemCreate` 13 us,
    /// `cuMemMap` 1 us, `cuMemSetAccess` 38 us a handle and `cuMemUnmap` 24 us
    /// (`../shared/peers/vmm_bench.c`).
    pub const IDLE_H100: DriverCosts = DriverCosts {
        alloc: Duration::from_nanos(36_500),
        free: Duration::from_nanos(36_500),
        piece_mapped: Duration::from_micros(52),
        piece_moved: Duration::from_micros(39),
        piece_unmapped: Duration::from_micros(24),
    };

    /// These costs on a host where `ranks` processes (the ranks of one job, one
    /// per GPU) make their calls on expandable segments' pieces at the same
    /// time: those calls cost `ranks` times as much, since the driver runs the
    /// VMM calls of a host's processes one at a time; allocations and frees are
    /// left as they are (not measured). Measured: two `vmm_moves.cu` processes at
    /// once on two H200s paid 1.1-2.2x a lone process's `cuMemSetAccess` (run
    /// 230); inside FSDP2 of a 1.1 B Llama on two H200s a piece's access cost
    /// 1.3-1.7x what one rank paid (its `cuMemUnmap` 1.0-1.4x; run 231), and on
    /// four H100s 167 us against 37-46 us alone, `cuMemCreate` 59-91 us against
    /// 13 and `cuMemUnmap` 68-113 us against 24-27 (run 227). About right at
    /// four ranks; high at two on those H200s.
    /// `ranks` 0 counts as 1.
    pub fn sharing_host_with(self, ranks: u32) -> DriverCosts {
        let n = ranks.max(1);
        let times = |d: Duration| d.checked_mul(n).unwrap_or(Duration::MAX);
        DriverCosts {
            piece_mapped: times(self.piece_mapped),
            piece_moved: times(self.piece_moved),
            piece_unmapped: times(self.piece_unmapped),
            ..self
        }
    }

    /// The time `calls` would take at these costs ([`Duration::MAX`] past what a
    /// `Duration` holds).
    pub fn time(&self, calls: &DriverCalls) -> Duration {
        const NANOS: u128 = 1_000_000_000;
        let nanos = [
            (self.alloc, calls.allocs),
            (self.free, calls.frees),
            (self.piece_mapped, calls.pieces_mapped),
            (self.piece_moved, calls.pieces_moved),
            (self.piece_unmapped, calls.pieces_unmapped),
        ]
        .iter()
        .map(|&(cost, n)| cost.as_nanos().saturating_mul(u128::from(n)))
        .fold(0u128, u128::saturating_add);
        match u64::try_from(nanos / NANOS) {
            // The remainder is below a second's nanoseconds: it fits a u32.
            Ok(secs) => Duration::new(secs, (nanos % NANOS) as u32),
            Err(_) => Duration::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls of every kind: 3 allocations and frees, 210 pieces' calls.
    fn some_calls() -> DriverCalls {
        DriverCalls {
            allocs: 2,
            frees: 1,
            pieces_mapped: 10,
            pieces_moved: 100,
            pieces_unmapped: 100,
        }
    }

    #[test]
    fn each_kind_of_call_is_counted_at_its_cost() {
        let calls = some_calls();
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
    fn ranks_sharing_a_host_multiply_only_the_pieces_calls() {
        let calls = some_calls();
        let four = DriverCosts::IDLE_H100.sharing_host_with(4);
        assert_eq!(
            four.time(&calls),
            Duration::from_nanos(3 * 36_500 + 4 * (10 * 52 + 100 * 39 + 100 * 24) * 1000)
        );
        assert_eq!(
            DriverCosts::IDLE_H100.sharing_host_with(1),
            DriverCosts::IDLE_H100
        );
        assert_eq!(
            DriverCosts::IDLE_H100.sharing_host_with(0),
            DriverCosts::IDLE_H100
        );
        let huge = DriverCosts {
            piece_moved: Duration::MAX / 2,
            ..DriverCosts::IDLE_H100
        }
        .sharing_host_with(u32::MAX);
        assert_eq!(huge.piece_moved, Duration::MAX, "saturates");
    }

    #[test]
    fn large_counts_are_exact_and_past_a_duration_saturate() {
        let calls = DriverCalls {
            pieces_moved: u64::from(u32::MAX) * 4,
            ..DriverCalls::default()
        };
        let nanos = u128::from(u32::MAX) * 4 * 39_000;
        assert_eq!(DriverCosts::IDLE_H100.time(&calls).as_nanos(), nanos);
        let costs = DriverCosts {
            piece_moved: Duration::MAX,
            ..DriverCosts::IDLE_H100
        };
        let two = DriverCalls {
            pieces_moved: 2,
            ..DriverCalls::default()
        };
        assert_eq!(costs.time(&two), Duration::MAX);
    }
}
