//! What one allocator call made the pool do, for diagnostic builds: with the
//! `call-work` feature each thread notes, as bits, the paths its current call
//! took (the arena's lock, a claim of other threads' caches, a driver event
//! call, parked blocks, growth), and [`take`] hands them to the caller that
//! times the call (emm-capi's `call-timing` build), so a slow call can be put
//! down to the work behind it. The same builds time the phases of a growth
//! ([`Phase`]: planning, the unmapping helper's turn, each kind of driver call)
//! process-wide, read by [`phases`]. Without the feature, noting and timing are
//! nothing, [`take`] is always empty and [`phases`] reads zeros.

/// One kind of work a call may do (a bit of what [`take`] returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Work {
    /// Took the arena's lock (a thread-cache miss, a flush, a large block).
    Locked,
    /// Claimed other threads' caches (a process-wide barrier).
    Reclaim,
    /// Called the driver about an event (record, query, wait).
    Events,
    /// Took back or parked blocks for another stream.
    Parked,
    /// Grew the pool (new memory, or pieces of the expandable segment moved).
    Grew,
}

impl Work {
    /// Every kind, in the order of their bits.
    pub const ALL: [Work; 5] = [
        Work::Locked,
        Work::Reclaim,
        Work::Events,
        Work::Parked,
        Work::Grew,
    ];

    /// The kind's bit in what [`take`] returns.
    pub const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// A short name (`locked`, `reclaim`, `events`, `parked`, `grew`).
    pub const fn name(self) -> &'static str {
        match self {
            Work::Locked => "locked",
            Work::Reclaim => "reclaim",
            Work::Events => "events",
            Work::Parked => "parked",
            Work::Grew => "grew",
        }
    }
}

#[cfg(feature = "call-work")]
thread_local! {
    static WORK: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Notes that this thread's current call did `work` (nothing without the
/// `call-work` feature).
#[inline(always)]
pub(crate) fn note(work: Work) {
    #[cfg(feature = "call-work")]
    {
        let _ = WORK.try_with(|w| w.set(w.get() | work.bit()));
    }
    #[cfg(not(feature = "call-work"))]
    {
        let _ = work;
    }
}

/// The work this thread noted since the last call of `take`, as bits of
/// [`Work::bit`], and forgets it (always 0 without the `call-work` feature).
pub fn take() -> u8 {
    #[cfg(feature = "call-work")]
    {
        WORK.try_with(|w| w.replace(0)).unwrap_or(0)
    }
    #[cfg(not(feature = "call-work"))]
    {
        0
    }
}

/// A phase of growing the expandable segment, timed process-wide in
/// `call-work` builds (read by [`phases`]).
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
    /// `cuMemSetAccess`, one call a growth.
    Access,
    /// Retiring the old addresses of moved pieces (bookkeeping, events).
    Retire,
    /// `cuMemUnmap` of an old mapping, on whichever thread.
    Unmap,
    /// A host wait for the event of parked blocks (`Arena::wait_parked`).
    WaitParked,
}

impl Phase {
    /// Every phase, in the order [`phases`] reports them.
    pub const ALL: [Phase; 10] = [
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

#[cfg(feature = "call-work")]
mod phase_counters {
    use std::sync::atomic::AtomicU64;

    /// Calls and nanoseconds of each phase, in [`super::Phase::ALL`]'s order.
    pub(super) static CALLS: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
    pub(super) static NS: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
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
        phase_counters::CALLS[phase as usize].fetch_add(1, Relaxed);
        phase_counters::NS[phase as usize].fetch_add(ns, Relaxed);
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
pub fn phases() -> [(Phase, u64, u64); 10] {
    Phase::ALL.map(|p| {
        #[cfg(feature = "call-work")]
        {
            use std::sync::atomic::Ordering::Relaxed;
            (
                p,
                phase_counters::CALLS[p as usize].load(Relaxed),
                phase_counters::NS[p as usize].load(Relaxed),
            )
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
    fn bits_are_distinct_and_taking_forgets_them() {
        let all = Work::ALL.iter().fold(0u8, |m, w| {
            assert_eq!(m & w.bit(), 0, "{w:?} shares a bit");
            m | w.bit()
        });
        assert_eq!(all.count_ones() as usize, Work::ALL.len());
        let _ = take();
        note(Work::Locked);
        note(Work::Grew);
        if cfg!(feature = "call-work") {
            assert_eq!(take(), Work::Locked.bit() | Work::Grew.bit());
        } else {
            assert_eq!(take(), 0);
        }
        assert_eq!(take(), 0, "taking forgets");
    }

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
    }
}
