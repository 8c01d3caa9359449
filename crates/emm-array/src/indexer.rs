//! [`Indexer`]: shape and row-major strides, linear ↔ multi-index.

/// Shape and row-major strides (in elements) of an `N`-dimensional array. Small and
/// `Copy`, so it passes to a kernel by value (see [`KernelIndexer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Indexer<const N: usize> {
    shape: [usize; N],
    strides: [usize; N],
}

impl<const N: usize> Indexer<N> {
    /// The row-major (C order) indexer of `shape`; `None` when the element count
    /// overflows.
    pub fn new(shape: [usize; N]) -> Option<Self> {
        let mut strides = [0usize; N];
        let mut acc = 1usize;
        for d in (0..N).rev() {
            strides[d] = acc;
            acc = acc.checked_mul(shape[d].max(1))?;
        }
        shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s))?;
        Some(Indexer { shape, strides })
    }

    /// The shape.
    pub fn shape(&self) -> [usize; N] {
        self.shape
    }

    /// The strides in elements (numpy's strides divided by the item size).
    pub fn strides(&self) -> [usize; N] {
        self.strides
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// `true` when some dimension is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The linear offset of `idx`, or `None` when out of bounds.
    #[allow(clippy::needless_range_loop)] // reason: walks idx, shape and strides in step
    pub fn linear(&self, idx: [usize; N]) -> Option<usize> {
        let mut off = 0;
        for d in 0..N {
            if idx[d] >= self.shape[d] {
                return None;
            }
            off += idx[d] * self.strides[d];
        }
        Some(off)
    }

    /// The multi-index of linear offset `i`, or `None` when out of bounds.
    #[allow(clippy::needless_range_loop)] // reason: walks idx and strides in step
    pub fn multi(&self, mut i: usize) -> Option<[usize; N]> {
        if i >= self.len() {
            return None;
        }
        let mut idx = [0usize; N];
        for d in 0..N {
            idx[d] = i / self.strides[d];
            i %= self.strides[d];
        }
        Some(idx)
    }

    /// The layout a kernel receives by value; `None` past rank 4 (the kernel's
    /// struct holds four extents) or for an extent or stride past `i64::MAX`
    /// (it would read as negative there).
    pub fn to_kernel(&self) -> Option<KernelIndexer> {
        if N > 4 {
            return None;
        }
        let mut k = KernelIndexer {
            shape: [1; 4],
            strides: [0; 4],
            rank: N as i32,
            _pad: 0,
        };
        for d in 0..N {
            k.shape[d] = i64::try_from(self.shape[d]).ok()?;
            k.strides[d] = i64::try_from(self.strides[d]).ok()?;
        }
        Some(k)
    }
}

/// The `Indexer` of `kernels/memarray.cu`: passed to kernels by value (72 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelIndexer {
    /// Extent per dimension (1 past the rank).
    pub shape: [i64; 4],
    /// Row-major strides in elements (0 past the rank).
    pub strides: [i64; 4],
    /// Number of dimensions.
    pub rank: i32,
    _pad: i32,
}
