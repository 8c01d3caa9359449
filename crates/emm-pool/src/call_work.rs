//! What one allocator call made the pool do, for diagnostic builds: with the
//! `call-work` feature each thread notes, as bits, the paths its current call
//! took (the arena's lock, a claim of other threads' caches, a driver event
//! call, parked blocks, growth), and [`take`] hands them to the caller that
//! times the call (emm-capi's `call-timing` build), so a slow call can be put
//! down to the work behind it (the same builds also time the phases of the
//! pool's growths: [`crate::growth_phases`]). Without the feature, noting is
//! nothing and [`take`] is always empty.

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
}
