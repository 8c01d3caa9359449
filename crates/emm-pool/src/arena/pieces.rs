//! The pieces mapped in the expandable segment: each one physical allocation
//! mapped at an offset of the segment's address space. Growth maps and moves
//! them whole (see `growth.rs` and `retire.rs`), trim and shrinking unmap them
//! whole (`shrink.rs`), a pause unmaps them and a resume maps fresh memory under
//! the same offsets (`pause.rs`).

/// `len` bytes of one physical allocation mapped `offset` bytes into the
/// expandable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Piece {
    pub offset: usize,
    pub len: usize,
}

impl Piece {
    pub(crate) fn new(offset: usize, len: usize) -> Self {
        Piece { offset, len }
    }

    /// The offset just past the piece.
    pub(crate) fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// The bytes of `pieces`.
pub(crate) fn bytes(pieces: &[Piece]) -> usize {
    pieces.iter().map(|p| p.len).sum()
}

/// The pieces mapped in one expandable segment, in address order; no two
/// overlap. Every change keeps the order, so lookups by offset are binary
/// searches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pieces(Vec<Piece>);

impl Pieces {
    /// The pieces, in address order.
    pub(crate) fn as_slice(&self) -> &[Piece] {
        &self.0
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The piece at the highest address.
    pub(crate) fn last(&self) -> Option<Piece> {
        self.0.last().copied()
    }

    /// Removes the piece at the highest address.
    pub(crate) fn pop(&mut self) -> Option<Piece> {
        self.0.pop()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// The pieces that start at or after `offset`, in address order.
    pub(crate) fn starting_at(&self, offset: usize) -> &[Piece] {
        &self.0[self.0.partition_point(|p| p.offset < offset)..]
    }

    /// Puts `run` (pieces in address order that lie between two pieces held, or
    /// past the last) in its place.
    pub(crate) fn insert_run(&mut self, run: &[Piece]) {
        let Some(first) = run.first() else {
            return;
        };
        let at = self.0.partition_point(|p| p.offset < first.offset);
        self.0.splice(at..at, run.iter().copied());
    }

    /// Removes the piece that starts at `offset`; `None` when none does.
    pub(crate) fn remove_at(&mut self, offset: usize) -> Option<Piece> {
        let i = self.0.binary_search_by_key(&offset, |p| p.offset).ok()?;
        Some(self.0.remove(i))
    }

    /// Removes every piece of `gone` (in address order) that it holds.
    pub(crate) fn remove_all(&mut self, gone: &[Piece]) {
        self.0.retain(|p| gone.binary_search(p).is_err());
    }

    /// Adds the pieces of `more` it does not hold yet; returns their bytes.
    pub(crate) fn add_missing(&mut self, more: &[Piece]) -> usize {
        // (Looked up among the pieces held before any is added: the search
        // needs them in order.)
        let missing: Vec<Piece> = more
            .iter()
            .filter(|p| self.0.binary_search(p).is_err())
            .copied()
            .collect();
        self.0.extend_from_slice(&missing);
        self.0.sort_unstable();
        bytes(&missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(list: &[(usize, usize)]) -> Pieces {
        let mut p = Pieces::default();
        p.add_missing(
            &list
                .iter()
                .map(|&(o, l)| Piece::new(o, l))
                .collect::<Vec<_>>(),
        );
        p
    }

    fn offsets(p: &Pieces) -> Vec<usize> {
        p.as_slice().iter().map(|p| p.offset).collect()
    }

    #[test]
    fn runs_go_in_their_place_and_come_out_by_offset() {
        let mut p = pieces(&[(0, 4), (20, 4)]);
        p.insert_run(&[Piece::new(4, 8), Piece::new(12, 8)]);
        assert_eq!(offsets(&p), [0, 4, 12, 20]);
        p.insert_run(&[Piece::new(24, 2)]);
        p.insert_run(&[]);
        assert_eq!(offsets(&p), [0, 4, 12, 20, 24]);
        assert_eq!(bytes(p.as_slice()), 26);
        assert_eq!(
            p.starting_at(5),
            &[Piece::new(12, 8), Piece::new(20, 4), Piece::new(24, 2)]
        );
        assert_eq!(p.starting_at(30), &[]);
        assert_eq!(p.remove_at(12), Some(Piece::new(12, 8)));
        assert_eq!(p.remove_at(13), None);
        assert_eq!(offsets(&p), [0, 4, 20, 24]);
        assert_eq!(p.last().map(|p| p.end()), Some(26));
        assert_eq!(p.pop(), Some(Piece::new(24, 2)));
    }

    #[test]
    fn sets_of_pieces_leave_and_join_once() {
        let mut p = pieces(&[(0, 4), (4, 4), (8, 4)]);
        p.remove_all(&[Piece::new(0, 4), Piece::new(8, 4), Piece::new(40, 4)]);
        assert_eq!(offsets(&p), [4]);
        // Pieces already held are not added twice, nor counted.
        assert_eq!(p.add_missing(&[Piece::new(4, 4), Piece::new(0, 4)]), 4);
        assert_eq!(offsets(&p), [0, 4]);
        p.clear();
        assert!(p.is_empty() && p.last().is_none());
    }
}
