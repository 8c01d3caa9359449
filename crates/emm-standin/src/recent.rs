//! A bounded memory of the handles released last, so a second release can be
//! told (a double free) from a release of a handle never made (an invalid one)
//! without keeping every handle a long run ever released.

use std::collections::{HashSet, VecDeque};

/// How many released handles are remembered: a release of one released longer
/// ago than that is counted as invalid rather than double (both are counted as
/// faults).
pub(crate) const KEPT: usize = 1 << 16;

/// The last [`KEPT`] handles released, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Recent {
    /// Remembers `handle`, forgetting the oldest past [`KEPT`].
    pub(crate) fn insert(&mut self, handle: u64) {
        if !self.set.insert(handle) {
            return;
        }
        self.order.push_back(handle);
        if self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `handle` is among those remembered.
    pub(crate) fn contains(&self, handle: u64) -> bool {
        self.set.contains(&handle)
    }

    /// How many are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_kept_and_forgets_older_ones() {
        let mut r = Recent::default();
        let n = KEPT as u64 + 10;
        for h in 0..n {
            r.insert(h);
            r.insert(h); // again: no second entry
        }
        assert_eq!(r.len(), KEPT);
        assert!((0..10).all(|h| !r.contains(h)), "the oldest ten forgotten");
        assert!((10..n).all(|h| r.contains(h)), "the last KEPT remembered");
    }
}
