//! [`Family`]: what a pool and its tag and stream pools share: their reserved
//! bytes and the peaks of their sums, and the byte limit and release threshold
//! those are held to. Both bounds may change while the pool serves
//! (`pool_limit` and `pool_release_threshold` are run-time settings), so they
//! are atomics read under each arena's own lock.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared bytes and bounds of a pool's family of arenas.
#[derive(Debug)]
pub(crate) struct Family {
    /// Bytes the family reserves.
    reserved: AtomicUsize,
    /// The most `reserved` has been since the last reset of peaks: the peak of
    /// the sum, which the sum of each arena's peak only bounds.
    peak_reserved: AtomicUsize,
    /// Bytes of the family's arenas in blocks handed out (threads' cached
    /// blocks included: the arenas' `live`).
    active: AtomicUsize,
    /// The most `active` has been since the last reset of peaks.
    peak_active: AtomicUsize,
    /// The byte limit (`usize::MAX`: none).
    limit: AtomicUsize,
    /// Reserved bytes above which free memory goes back once idle
    /// (`usize::MAX`: never).
    release_threshold: AtomicUsize,
}

impl Default for Family {
    fn default() -> Self {
        Family::new(None, usize::MAX)
    }
}

impl Family {
    /// A family held to `limit` (`None`: none) and `release_threshold`.
    pub(crate) fn new(limit: Option<usize>, release_threshold: usize) -> Family {
        Family {
            reserved: AtomicUsize::new(0),
            peak_reserved: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            peak_active: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit.unwrap_or(usize::MAX)),
            release_threshold: AtomicUsize::new(release_threshold),
        }
    }

    /// Bytes the family reserves.
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Counts `n` more bytes reserved.
    pub(crate) fn add(&self, n: usize) {
        grow(&self.reserved, &self.peak_reserved, n);
    }

    /// Counts `n` bytes fewer (never below zero: every byte subtracted was added).
    pub(crate) fn sub(&self, n: usize) {
        shrink(&self.reserved, n);
    }

    /// Bytes in blocks handed out, over the family's arenas.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Counts `n` more bytes in blocks handed out.
    pub(crate) fn add_active(&self, n: usize) {
        grow(&self.active, &self.peak_active, n);
    }

    /// Counts `n` bytes fewer in blocks handed out.
    pub(crate) fn sub_active(&self, n: usize) {
        shrink(&self.active, n);
    }

    /// The peaks of the sums over the family's arenas: `(reserved, active)`.
    pub(crate) fn peaks(&self) -> (usize, usize) {
        (
            self.peak_reserved.load(Ordering::Relaxed),
            self.peak_active.load(Ordering::Relaxed),
        )
    }

    /// Sets both peaks to the current sums.
    pub(crate) fn reset_peaks(&self) {
        self.peak_reserved
            .store(self.reserved.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_active
            .store(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The byte limit, if any.
    pub(crate) fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            l => Some(l),
        }
    }

    /// Sets the byte limit (`None`: none).
    pub(crate) fn set_limit(&self, limit: Option<usize>) {
        self.limit
            .store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// The release threshold (`usize::MAX`: never).
    pub(crate) fn release_threshold(&self) -> usize {
        self.release_threshold.load(Ordering::Relaxed)
    }

    /// Sets the release threshold.
    pub(crate) fn set_release_threshold(&self, bytes: usize) {
        self.release_threshold.store(bytes, Ordering::Relaxed);
    }

    /// Whether the family reserves more than its release threshold.
    pub(crate) fn above_threshold(&self) -> bool {
        self.reserved() > self.release_threshold()
    }
}

/// Adds `n` to `now` and raises `peak` to the sum.
fn grow(now: &AtomicUsize, peak: &AtomicUsize, n: usize) {
    let v = now.fetch_add(n, Ordering::Relaxed).saturating_add(n);
    peak.fetch_max(v, Ordering::Relaxed);
}

/// Takes `n` from `now`, never below zero (every byte taken was added).
fn shrink(now: &AtomicUsize, n: usize) {
    let _ = now.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}
