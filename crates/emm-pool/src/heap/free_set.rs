//! One stream's free blocks of one kind, ordered by size, then address: what best
//! fit searches.
//!
//! The keys lie in short sorted runs (chunks) with the last key of each run beside
//! them in one array, so an insertion or removal is two binary searches and a
//! shift inside one run, and the runs' storage is reused: a run split in two takes
//! an emptied run's storage. A `BTreeSet` (before) allocated a node whenever one
//! split and freed one whenever two merged, which a free set hovering around a
//! node's size did on about one in seventeen of the pool's allocations (DeepLabV3's
//! recorded trace, `call_costs`): with the host's caches cold, as in a training
//! job, each such call cost 2.5-2.9 us more than one without.

use emm_sys::CUdeviceptr;

/// A free block: `(size, address)`.
pub(crate) type Key = (usize, CUdeviceptr);

/// The most keys a run holds; one more and it splits in two halves.
const RUN: usize = 32;

/// Emptied runs kept for later splits.
const SPARE_RUNS: usize = 4;

/// A run's storage: room for a full run and the key that splits it, so a run
/// never reallocates.
fn new_run() -> Vec<Key> {
    Vec::with_capacity(RUN + 1)
}

/// Free blocks as `(size, address)`, in order; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct FreeSet {
    /// Sorted runs, none empty; every key of a run is below every key of the next.
    runs: Vec<Vec<Key>>,
    /// The last (largest) key of each run, in the runs' order.
    lasts: Vec<Key>,
    /// Keys held: the runs' lengths summed, kept so that `len` need not walk them.
    len: usize,
    /// Emptied runs' storage (each with room for a run), at most [`SPARE_RUNS`].
    spare: Vec<Vec<Key>>,
}

impl FreeSet {
    /// Keys held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run where `key` is or would be: the first whose last key is not below
    /// it; `runs.len()` when every key is below it.
    fn run_of(&self, key: &Key) -> usize {
        self.lasts.partition_point(|last| last < key)
    }

    /// Adds `key`; false when it was there already.
    pub fn insert(&mut self, key: Key) -> bool {
        if self.runs.is_empty() {
            let mut run = self.spare.pop().unwrap_or_else(new_run);
            run.push(key);
            self.runs.push(run);
            self.lasts.push(key);
            self.len = 1;
            return true;
        }
        // Past every key: the last run takes it.
        let i = self.run_of(&key).min(self.runs.len() - 1);
        let run = &mut self.runs[i];
        let Err(at) = run.binary_search(&key) else {
            return false;
        };
        run.insert(at, key);
        self.len += 1;
        if run.len() > RUN {
            let mut upper = self.spare.pop().unwrap_or_else(new_run);
            upper.extend(run.drain(RUN / 2..));
            let (lower_last, upper_last) = (run[run.len() - 1], upper[upper.len() - 1]);
            self.lasts[i] = lower_last;
            self.runs.insert(i + 1, upper);
            self.lasts.insert(i + 1, upper_last);
        } else {
            self.lasts[i] = run[run.len() - 1];
        }
        true
    }

    /// Takes `key` out; false when it was not there.
    pub fn remove(&mut self, key: &Key) -> bool {
        let i = self.run_of(key);
        let Some(run) = self.runs.get_mut(i) else {
            return false;
        };
        let Ok(at) = run.binary_search(key) else {
            return false;
        };
        run.remove(at);
        self.len -= 1;
        match run.last() {
            Some(&last) => self.lasts[i] = last,
            None => {
                let run = self.runs.remove(i);
                self.lasts.remove(i);
                if self.spare.len() < SPARE_RUNS {
                    self.spare.push(run);
                }
            }
        }
        true
    }

    /// The keys of blocks of at least `size` bytes, smallest first (then lowest
    /// address).
    pub fn at_least(&self, size: usize) -> impl Iterator<Item = Key> + '_ {
        let from = (size, 0);
        let i = self.run_of(&from);
        let runs = self.runs.get(i..).unwrap_or_default();
        let skip = runs
            .first()
            .map_or(0, |run| run.partition_point(|k| *k < from));
        runs.iter()
            .enumerate()
            .flat_map(move |(j, run)| run[if j == 0 { skip } else { 0 }..].iter().copied())
    }

    /// The largest key.
    pub fn last(&self) -> Option<Key> {
        self.lasts.last().copied()
    }

    /// Every key, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Key> + '_ {
        self.runs.iter().flatten()
    }
}

impl IntoIterator for FreeSet {
    type Item = Key;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<Key>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.runs.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(Key),
        Remove(Key),
        AtLeast(usize),
    }

    /// Few distinct sizes and addresses, so that inserts meet keys already there
    /// and removes find them.
    fn key() -> impl Strategy<Value = Key> {
        (0usize..48, 0u64..16).prop_map(|(s, a)| (s * 512, a * 0x1000))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => key().prop_map(Op::Insert),
            3 => key().prop_map(Op::Remove),
            1 => (0usize..50).prop_map(|s| Op::AtLeast(s * 512 - (s > 0) as usize)),
        ]
    }

    proptest! {
        /// Every operation answers as a `BTreeSet` of the same keys does, and the
        /// runs stay sorted, non-empty, at most [`RUN`] long, with their lasts and
        /// room for a split.
        #[test]
        fn behaves_as_an_ordered_set(ops in prop::collection::vec(op(), 1..600)) {
            let mut set = FreeSet::default();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(k) => prop_assert_eq!(set.insert(k), model.insert(k)),
                    Op::Remove(k) => prop_assert_eq!(set.remove(&k), model.remove(&k)),
                    Op::AtLeast(s) => {
                        let got: Vec<Key> = set.at_least(s).collect();
                        let want: Vec<Key> = model.range((s, 0)..).copied().collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                prop_assert_eq!(set.is_empty(), model.is_empty());
                prop_assert_eq!(set.last(), model.last().copied());
                prop_assert!(set.iter().copied().eq(model.iter().copied()));
                prop_assert_eq!(set.runs.len(), set.lasts.len());
                for (run, last) in set.runs.iter().zip(&set.lasts) {
                    prop_assert!(!run.is_empty() && run.len() <= RUN);
                    prop_assert!(run.capacity() > RUN, "a run was made short");
                    prop_assert_eq!(run.last(), Some(last));
                }
                prop_assert!(set.spare.len() <= SPARE_RUNS);
            }
            prop_assert!(set.into_iter().eq(model.into_iter()));
        }
    }

    #[test]
    fn a_run_splits_and_empties_without_losing_order() {
        let mut set = FreeSet::default();
        for a in (0..(3 * RUN as u64)).rev() {
            assert!(set.insert((4096, a)));
        }
        let runs = set.runs.len();
        assert!(runs >= 3, "{runs} runs");
        assert_eq!(set.at_least(4096).next(), Some((4096, 0)));
        assert_eq!(set.at_least(4097).next(), None);
        for a in 0..(3 * RUN as u64) {
            assert!(set.remove(&(4096, a)));
        }
        assert!(set.is_empty() && set.runs.is_empty() && set.lasts.is_empty());
        // Each emptied run became a spare until there were enough.
        assert_eq!(set.spare.len(), runs.min(SPARE_RUNS));
        assert!(!set.remove(&(4096, 0)));
        assert!(set.insert((512, 7)));
        assert_eq!(set.last(), Some((512, 7)));
    }
}
