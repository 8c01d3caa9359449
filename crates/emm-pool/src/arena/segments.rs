//! The arena's segments by base address ([`Segments`]): what each one holds and
//! the order they were made in. Which one is the expandable segment is the
//! arena's `ExpandableSegment`'s to say (its base), not a mark here.

use std::collections::BTreeMap;

use emm_sys::CUdeviceptr;

use crate::kind::Kind;

/// One segment: a plain allocation from the upstream, or the expandable
/// segment's address space.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Bytes backed by memory (for an expandable segment: mapped so far).
    pub size: usize,
    pub kind: Kind,
    /// Bytes of `size` whose memory was moved elsewhere (retired ranges and
    /// gaps): the memory behind the segment is `size - retired`.
    pub retired: usize,
    /// Made by merging wholly free large segments (see `merge.rs`): it holds
    /// blocks of every size, so the exclusive rule does not apply to it.
    pub merged: bool,
    /// Its number in the order the table made segments (the first is 1, and
    /// no number is given twice): without the expandable segment, best fit breaks ties between equal
    /// free blocks of different segments by it rather than by address (see
    /// `Arena::fit_in`).
    pub made: u64,
}

/// The segments an arena holds, by base address, a count of those it has
/// made (each new one's [`Segment::made`]) and which one is the home segment
/// (`SegmentPolicy::initial_size`), when there is one.
#[derive(Debug, Default)]
pub(super) struct Segments {
    by_base: BTreeMap<CUdeviceptr, Segment>,
    made: u64,
    home: Option<CUdeviceptr>,
}

impl Segments {
    /// Notes a plain segment of `size` bytes of `kind` at `base`, made now.
    pub(super) fn add_plain(&mut self, base: CUdeviceptr, size: usize, kind: Kind) {
        self.add(base, size, kind);
    }

    /// Notes the plain segment of `size` bytes at `base`, made now, as the
    /// home segment (`home.rs`).
    pub(super) fn add_home(&mut self, base: CUdeviceptr, size: usize) {
        self.add(base, size, Kind::Large);
        self.home = Some(base);
    }

    /// The home segment's base, when there is one.
    pub(super) fn home(&self) -> Option<CUdeviceptr> {
        self.home
    }

    /// Whether the segment at `base` is the home segment.
    pub(super) fn is_home(&self, base: CUdeviceptr) -> bool {
        self.home == Some(base)
    }

    /// Notes the expandable segment's address space at `base`, with nothing
    /// mapped yet.
    pub(super) fn add_expandable(&mut self, base: CUdeviceptr) {
        self.add(base, 0, Kind::Large);
    }

    fn add(&mut self, base: CUdeviceptr, size: usize, kind: Kind) {
        self.made += 1;
        self.by_base.insert(
            base,
            Segment {
                size,
                kind,
                retired: 0,
                merged: false,
                made: self.made,
            },
        );
    }

    /// The segment at `base`.
    pub(super) fn get(&self, base: &CUdeviceptr) -> Option<&Segment> {
        self.by_base.get(base)
    }

    /// The segment at `base`, to change.
    pub(super) fn get_mut(&mut self, base: &CUdeviceptr) -> Option<&mut Segment> {
        self.by_base.get_mut(base)
    }

    /// Forgets the segment at `base` (given back, or its address space given up).
    pub(super) fn remove(&mut self, base: &CUdeviceptr) -> Option<Segment> {
        if self.home == Some(*base) {
            self.home = None;
        }
        self.by_base.remove(base)
    }

    /// Every segment, by base address.
    pub(super) fn iter(&self) -> std::collections::btree_map::Iter<'_, CUdeviceptr, Segment> {
        self.by_base.iter()
    }

    /// Every segment, in the order of their base addresses.
    pub(super) fn values(&self) -> impl Iterator<Item = &Segment> + '_ {
        self.by_base.values()
    }

    /// How many segments there are.
    pub(super) fn len(&self) -> usize {
        self.by_base.len()
    }

    /// Forgets every segment but the one at `keep` (the plain segments' memory
    /// went back in a reset; the expandable segment's address space, at `keep`
    /// when there is one, stays).
    pub(super) fn keep_only(&mut self, keep: Option<CUdeviceptr>) {
        self.by_base.retain(|&base, _| Some(base) == keep);
        if self.home != keep {
            self.home = None;
        }
    }
}

impl<'a> IntoIterator for &'a Segments {
    type Item = (&'a CUdeviceptr, &'a Segment);
    type IntoIter = std::collections::btree_map::Iter<'a, CUdeviceptr, Segment>;

    fn into_iter(self) -> Self::IntoIter {
        self.by_base.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large plain segment, the expandable one and a small one, made in
    /// that order at descending addresses.
    fn three() -> Segments {
        let mut s = Segments::default();
        s.add_plain(0x3000, 4096, Kind::Large);
        s.add_expandable(0x1000);
        s.add_plain(0x2000, 512, Kind::Small);
        s
    }

    #[test]
    fn segments_are_numbered_in_the_order_they_were_made() {
        let mut s = three();
        let made: Vec<(CUdeviceptr, u64)> = s.iter().map(|(&b, seg)| (b, seg.made)).collect();
        assert_eq!(made, vec![(0x1000, 2), (0x2000, 3), (0x3000, 1)]);
        // A number is never given twice, even after a segment goes.
        assert!(s.remove(&0x3000).is_some());
        s.add_plain(0x4000, 4096, Kind::Large);
        assert_eq!(s.get(&0x4000).map(|seg| seg.made), Some(4));
    }

    #[test]
    fn the_home_segment_is_forgotten_with_it() {
        let mut s = three();
        s.add_home(0x5000, 8192);
        assert_eq!(s.home(), Some(0x5000));
        assert!(s.is_home(0x5000) && !s.is_home(0x3000));
        assert_eq!(
            s.get(&0x5000).map(|seg| (seg.size, seg.kind)),
            Some((8192, Kind::Large))
        );
        // Another segment going leaves it the home.
        assert!(s.remove(&0x3000).is_some());
        assert_eq!(s.home(), Some(0x5000));
        assert!(s.remove(&0x5000).is_some());
        assert_eq!(s.home(), None);
        // A reset forgets it with the plain segments' memory.
        s.add_home(0x6000, 8192);
        s.keep_only(Some(0x1000));
        assert_eq!(s.home(), None);
        assert!(s.get(&0x6000).is_none());
    }

    #[test]
    fn a_reset_keeps_only_the_expandable_segment() {
        let mut s = three();
        s.keep_only(Some(0x1000));
        assert_eq!(s.len(), 1);
        let only = s.get(&0x1000).expect("the expandable segment stays");
        assert_eq!((only.size, only.kind, only.made), (0, Kind::Large, 2));
        // Without an expandable segment a reset forgets every segment.
        let mut s = three();
        s.keep_only(None);
        assert_eq!(s.len(), 0);
    }
}
