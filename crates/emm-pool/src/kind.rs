//! Block sizes: the rounding of every request, and which requests are small.

/// Alignment and rounding of every block.
pub const ROUND: usize = 512;
/// Requests up to this size come from small segments.
pub const SMALL_MAX: usize = 1 << 20;

/// Rounds a request to the pool's granularity.
pub fn round_size(size: usize) -> usize {
    size.max(1).div_ceil(ROUND) * ROUND
}

/// Small and large blocks live in different segments (as in PyTorch's allocator):
/// mixing them scatters long-lived small blocks across large free runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Requests ≤ [`SMALL_MAX`].
    Small,
    /// Larger requests.
    Large,
}

impl Kind {
    /// The kind of a rounded request.
    pub fn of(size: usize) -> Kind {
        if size <= SMALL_MAX {
            Kind::Small
        } else {
            Kind::Large
        }
    }
}
