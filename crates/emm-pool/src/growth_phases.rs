//! The phases of the pool's growths, timed process-wide in diagnostic builds:
//! with the `call-work` feature (emm-capi's `call-timing` build turns it on),
//! `timed` counts the calls and nanoseconds of each [`Phase`] in atomics, and
//! [`phases`] reads them (emm-capi appends them to `emm_manager_report` as
//! `pool_<phase>_calls` and `pool_<phase>_ns`). They tell where a growth's time
//! goes inside a real job: a whole growth, unmapping old mappings before it,
//! planning, the unmapping helper's turn, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, retiring moved pieces, `cuMemUnmap`, and the host wait for
//! parked blocks. Phases nest ([`Phase::Expand`] holds the growth's others,
//! [`Phase::UnmapRetired`] its unmaps): do not add them up. Without the
//! feature, timing is a plain call and [`phases`] reads zeros.

/// A phase of growing the pool, timed process-wide in `call-work` builds (read
/// by [`phases`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// A whole growth of the expandable segment (`Arena::expand`).
    Expand,
    /// Unmapping old mappings on the allocating thread before a growth.
    UnmapRetired,
    /// Choosing where to map and which free pieces move.
    Plan,
    /// Waiting for the unmapping helper to finish its current unmap.
    Turn,
    /// `cuMemCreate`, one call a new piece.
    Create,
    /// `cuMemMap`, one call a piece.
    Map,
    /// `cuMemSetAccess`, one call over the pieces of each `map_pieces` (one a
    /// growth; two when a failed move falls back to new memory).
    Access,
    /// Retiring the old addresses of moved pieces (bookkeeping, events).
    Retire,
    /// `cuMemUnmap` of an old mapping, on whichever thread (the unmapping
    /// helper's, or the allocating one inside [`Phase::UnmapRetired`]).
    Unmap,
    /// A host wait for the event of parked blocks (`Arena::wait_parked`).
    WaitParked,
}

impl Phase {
    /// Every phase, in the order [`phases`] reports them (each at its
    /// discriminant).
    pub const ALL: [Phase; COUNT] = [
        Phase::Expand,
        Phase::UnmapRetired,
        Phase::Plan,
        Phase::Turn,
        Phase::Create,
        Phase::Map,
        Phase::Access,
        Phase::Retire,
        Phase::Unmap,
        Phase::WaitParked,
    ];

    /// A short name (`expand`, `unmap_retired`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Expand => "expand",
            Phase::UnmapRetired => "unmap_retired",
            Phase::Plan => "plan",
            Phase::Turn => "turn",
            Phase::Create => "create",
            Phase::Map => "map",
            Phase::Access => "access",
            Phase::Retire => "retire",
            Phase::Unmap => "unmap",
            Phase::WaitParked => "wait_parked",
        }
    }
}

/// How many phases there are.
const COUNT: usize = Phase::WaitParked as usize + 1;

#[cfg(feature = "call-work")]
mod phase_counters {
    use std::sync::atomic::AtomicU64;

    /// Calls and nanoseconds of each phase, in [`super::Phase::ALL`]'s order.
    pub(super) static CALLS: [AtomicU64; super::COUNT] =
        [const { AtomicU64::new(0) }; super::COUNT];
    pub(super) static NS: [AtomicU64; super::COUNT] = [const { AtomicU64::new(0) }; super::COUNT];
}

/// Runs `f`; in `call-work` builds, counts one call of `phase` and its time.
#[inline(always)]
pub(crate) fn timed<R>(phase: Phase, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "call-work")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        let start = std::time::Instant::now();
        let out = f();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // (Every phase has its counters: `COUNT` follows the last variant.)
        if let (Some(calls), Some(total)) = (
            phase_counters::CALLS.get(phase as usize),
            phase_counters::NS.get(phase as usize),
        ) {
            calls.fetch_add(1, Relaxed);
            total.fetch_add(ns, Relaxed);
        }
        out
    }
    #[cfg(not(feature = "call-work"))]
    {
        let _ = phase;
        f()
    }
}

/// Each phase with its calls and nanoseconds so far, process-wide (zeros
/// without the `call-work` feature).
pub fn phases() -> [(Phase, u64, u64); COUNT] {
    Phase::ALL.map(|p| {
        #[cfg(feature = "call-work")]
        {
            use std::sync::atomic::Ordering::Relaxed;
            let read = |a: &[std::sync::atomic::AtomicU64; COUNT]| {
                a.get(p as usize).map_or(0, |v| v.load(Relaxed))
            };
            (p, read(&phase_counters::CALLS), read(&phase_counters::NS))
        }
        #[cfg(not(feature = "call-work"))]
        {
            (p, 0, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_count_only_in_the_diagnostic_build() {
        let before = phases()[Phase::Plan as usize];
        assert_eq!(timed(Phase::Plan, || 5), 5);
        let after = phases()[Phase::Plan as usize];
        assert_eq!(after.0, Phase::Plan);
        if cfg!(feature = "call-work") {
            assert!(after.1 > before.1, "{before:?} {after:?}");
        } else {
            assert_eq!((after.1, after.2), (0, 0));
        }
        for (i, p) in Phase::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "{p:?} is reported in its place");
        }
        // The listed phases have distinct names (the report's keys).
        let names: std::collections::HashSet<_> = Phase::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), COUNT, "distinct names");
    }
}
