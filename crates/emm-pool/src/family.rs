//! [`Family`]: what a pool and its tag pools share: their reserved bytes, and the
//! byte limit and release threshold those are held to. Both bounds may change
//! while the pool serves (`pool_limit` and `pool_release_threshold` are run-time
//! settings), so they are atomics read under each arena's own lock.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared bytes and bounds of a pool's family of arenas.
#[derive(Debug)]
pub(crate) struct Family {
    /// Bytes the family reserves.
    reserved: AtomicUsize,
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
        self.reserved.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` bytes fewer (never below zero: every byte subtracted was added).
    pub(crate) fn sub(&self, n: usize) {
        let _ = self
            .reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
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
