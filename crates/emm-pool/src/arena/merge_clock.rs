//! When the pool without its expandable segment merges its free segments: the
//! merge's clock ([`MergeClock`]), which `merge.rs` consults and the arena's
//! allocation and free paths feed.

/// When a merge is due, whether the program is quiet, and what the last merge
/// sized the pool to: the state `Arena::merge_if_quiet` keeps between calls.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MergeClock {
    /// A large segment was made since the last merge.
    due: bool,
    /// What the last merge sized the pool's reserved bytes to; `None` before the
    /// first (or after a trim).
    target: Option<usize>,
    /// Bytes of large segments made since the last merge.
    grown: usize,
    /// The fewest live bytes since the last new large segment was made (at
    /// first, those live then).
    low: usize,
    /// Live bytes rose half the way from `low` to reserved after it: what needed
    /// the segment, or a step since, came and went once they are back.
    rose: bool,
}

impl MergeClock {
    /// Whether a merge is due (a large segment was made since the last).
    pub(super) fn due(&self) -> bool {
        self.due
    }

    /// The merge was made, or found nothing to do: none is due until the next
    /// new segment.
    pub(super) fn settle(&mut self) {
        self.due = false;
    }

    /// What a merge now sizes the pool's reserved bytes to: `floor` before the
    /// first, else the last merge's figure plus what grew since.
    pub(super) fn target(&self, floor: usize) -> usize {
        match self.target {
            None => floor,
            Some(t) => t.saturating_add(self.grown),
        }
    }

    /// What grew since the last merge is accounted for (in a merge's size).
    pub(super) fn forget_growth(&mut self) {
        self.grown = 0;
    }

    /// A merge brought the pool to `reserved` bytes: the next one starts from it.
    pub(super) fn sized(&mut self, reserved: usize) {
        self.target = Some(reserved);
        self.grown = 0;
    }

    /// A large segment of `bytes` was made while `live` bytes were live.
    pub(super) fn grew(&mut self, bytes: usize, live: usize) {
        self.due = true;
        self.low = live;
        self.rose = false;
        self.grown = self.grown.saturating_add(bytes);
    }

    /// Live bytes changed to `live` (of `reserved`); only followed while a merge
    /// is due.
    pub(super) fn saw_live(&mut self, live: usize, reserved: usize) {
        if !self.due {
            return;
        }
        if live < self.low {
            self.low = live;
            self.rose = false;
        } else if !self.rose && live - self.low >= reserved.saturating_sub(self.low) / 2 {
            self.rose = true;
        }
    }

    /// Whether the program is quiet with `live` of `reserved` bytes live: they
    /// are at most 1/`quiet` of reserved, or (a program whose weights and
    /// optimizer state stay live between steps) back within 1/`quiet` of the way
    /// from their low to reserved after a step rose half of it.
    pub(super) fn quiet(&self, live: usize, reserved: usize, quiet: usize) -> bool {
        if live.saturating_mul(quiet) <= reserved {
            return true;
        }
        self.rose
            && live.saturating_sub(self.low).saturating_mul(quiet)
                <= reserved.saturating_sub(self.low)
    }
}
