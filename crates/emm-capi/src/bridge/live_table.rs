//! The live allocations of one device by address: what `emm_torch_free` and
//! `emm_cupy_free` look up on every call.
//!
//! An open-addressing table with linear probing, each slot holding its address and
//! its allocation side by side. A lookup reads the slot the address hashes to and,
//! rarely, the next few; a general-purpose hash map reads a separate control array
//! first, and in a training step, where the work between two allocator calls
//! leaves the table cold in the cache, each region read is a cache miss. Removal
//! shifts the following entries of the probe run back, so no tombstone ever
//! lengthens a probe. At most half the slots are used.

/// A value the table holds, keyed by a nonzero address.
pub(crate) struct LiveTable<V> {
    /// `None`: empty. Length a power of two (or zero before the first insert).
    slots: Vec<Option<(u64, V)>>,
    len: usize,
}

impl<V> Default for LiveTable<V> {
    fn default() -> Self {
        LiveTable {
            slots: Vec::new(),
            len: 0,
        }
    }
}

/// The slots a table starts with.
const MIN_SLOTS: usize = 64;

/// Device addresses are at least 256-byte aligned and spread out: a multiply-shift
/// of the address without its low bits spreads them over the slots.
fn home(key: u64, mask: usize) -> usize {
    let h = (key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 32) as usize & mask
}

impl<V> LiveTable<V> {
    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `key`, if any.
    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = home(key, mask);
        loop {
            match &self.slots[i] {
                None => return None,
                Some((k, _)) if *k == key => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.find(key)
            .and_then(|i| self.slots[i].as_ref())
            .map(|(_, v)| v)
    }

    /// Stores `value` under `key`; returns the value it replaces. Runs out of
    /// host memory as any collection does (the process's allocator decides).
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if let Some(i) = self.find(key) {
            return self.slots[i].replace((key, value)).map(|(_, v)| v);
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = home(key, mask);
        while self.slots[i].is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = Some((key, value));
        self.len += 1;
        None
    }

    /// Takes the value of `key` out.
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let mut hole = self.find(key)?;
        let (_, value) = self.slots[hole].take()?;
        self.len -= 1;
        // Backward shift: an entry further along the run moves into the hole when
        // its home is not between the hole and itself (cyclically), so that every
        // entry stays reachable from its home without crossing an empty slot.
        let mask = self.mask();
        let mut j = (hole + 1) & mask;
        while let Some((k, _)) = &self.slots[j] {
            let h = home(*k, mask);
            let dist_home = j.wrapping_sub(h) & mask;
            let dist_hole = j.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
            j = (j + 1) & mask;
        }
        Some(value)
    }

    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, Vec::with_capacity(n));
        self.slots.resize_with(n, || None);
        let mask = self.mask();
        for (k, v) in old.into_iter().flatten() {
            let mut i = home(k, mask);
            while self.slots[i].is_some() {
                i = (i + 1) & mask;
            }
            self.slots[i] = Some((k, v));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn holds_inserts_and_removes_by_address() {
        let mut t = LiveTable::default();
        assert_eq!(t.get(0x100), None);
        assert_eq!(t.remove(0x100), None, "an empty table holds nothing");
        assert_eq!(t.insert(0x7f00_0000_0000, "a"), None);
        assert_eq!(t.insert(0x7f00_0000_0200, "b"), None);
        assert_eq!(t.insert(0x7f00_0000_0000, "c"), Some("a"), "replaced");
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(0x7f00_0000_0000), Some(&"c"));
        assert_eq!(t.remove(0x7f00_0000_0200), Some("b"));
        assert_eq!(t.remove(0x7f00_0000_0200), None, "removed once");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn grows_and_keeps_every_entry_reachable() {
        let mut t = LiveTable::default();
        for i in 0..10_000u64 {
            assert_eq!(t.insert(0x7f00_0000_0000 + i * 512, i), None);
        }
        assert_eq!(t.len(), 10_000);
        assert!(t.slots.len() >= 20_000, "at most half full");
        for i in (0..10_000u64).step_by(2) {
            assert_eq!(t.remove(0x7f00_0000_0000 + i * 512), Some(i));
        }
        for i in 0..10_000u64 {
            let want = (i % 2 == 1).then_some(i);
            assert_eq!(t.get(0x7f00_0000_0000 + i * 512).copied(), want);
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Get(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct addresses, many colliding runs: keys 256 bytes apart in a
        // small range, so probe runs wrap and removals shift entries back.
        let key = (1u64..400).prop_map(|k| k * 256);
        prop_oneof![
            (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            key.clone().prop_map(Op::Remove),
            key.prop_map(Op::Get),
        ]
    }

    proptest! {
        /// The table answers every operation as a `HashMap` does.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 1..600)) {
            let mut t = LiveTable::default();
            let mut model = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(t.remove(k), model.remove(&k)),
                    Op::Get(k) => prop_assert_eq!(t.get(k), model.get(&k)),
                }
                prop_assert_eq!(t.len(), model.len());
            }
            for (k, v) in &model {
                prop_assert_eq!(t.get(*k), Some(v));
            }
        }
    }
}
