//! The arena's expandable segment: one address space over CUDA virtual memory
//! management where large blocks live, its memory mapped in pieces as it grows
//! (PyTorch's `expandable_segments`). What it owns: the address space
//! (`address_space.rs`), the pieces mapped in it (`pieces.rs`), the old
//! mappings of moved pieces waiting for their work (`retire.rs`) and what a
//! pause holds away (`pause.rs`). Its blocks, like every segment's, are the
//! arena's heap's, and its size and retired bytes are its entry in the
//! arena's [`Segments`](super::segments::Segments): what the arena changes
//! together with the blocks.

use emm_core::Result;
use emm_sys::CUdeviceptr;

use super::address_space::{AddressSpace, Obtained};
use super::pause::PauseState;
use super::pieces::Pieces;
use super::policy::SegmentPolicy;
use super::retire::Retirements;
use super::SegmentSource;
use crate::events::EventSource;

/// The expandable segment; see the module documentation.
#[derive(Default)]
pub(super) struct ExpandableSegment {
    /// Its address space: reserved, to be reserved, refused or not to be had.
    space: AddressSpace,
    /// The pieces of memory mapped, in address order; each is one physical
    /// allocation, which growth may move whole (see `retire.rs`).
    pub(super) pieces: Pieces,
    /// Old mappings of moved pieces, waiting for the work queued on them.
    pub(super) retiring: Retirements,
    /// What a pause took away, and the pinned buffers kept for the next.
    pub(super) pause: PauseState,
}

impl ExpandableSegment {
    /// One never to be had: the upstream has no virtual memory.
    pub(super) fn without_virtual_memory() -> Self {
        ExpandableSegment {
            space: AddressSpace::unavailable(),
            ..ExpandableSegment::default()
        }
    }

    /// Its base, once its address space is reserved.
    pub(super) fn base(&self) -> Option<CUdeviceptr> {
        self.space.base()
    }

    /// Bytes of address space reserved (0 before any is).
    pub(super) fn reserve(&self) -> usize {
        self.space.reserved_bytes()
    }

    /// Whether large blocks may come from it: its address space is reserved, or
    /// to be reserved by the next growth.
    pub(super) fn usable(&self) -> bool {
        self.space.usable()
    }

    /// Whether none is to be had: no virtual memory, or the driver refused its
    /// address space.
    pub(super) fn none_to_be_had(&self) -> bool {
        self.space.none_to_be_had()
    }

    /// Its address space for a growth of `request` bytes, reserved now if not
    /// yet (see `AddressSpace::obtain`).
    pub(super) fn obtain(
        &mut self,
        request: usize,
        policy: &SegmentPolicy,
        source: &dyn SegmentSource,
    ) -> Result<Obtained> {
        self.space.obtain(request, policy, source)
    }

    /// Asks for its address space again at the next growth, after a refusal
    /// (address space may have come free).
    pub(super) fn ask_again(&mut self) {
        self.space.ask_again();
    }

    /// Leaves its address space (a mapping in it the driver kept: growth there
    /// would fail) with the pieces in it, which the virtual memory keeps and
    /// unmaps on drop; the next growth reserves anew. The base given up.
    pub(super) fn give_up(&mut self) -> Option<CUdeviceptr> {
        self.pieces.clear();
        self.space.give_up()
    }

    /// Drops the piece mapped at `addr` (unmapped now) from its pieces; with no
    /// address space (given up) it holds no pieces and there is nothing to drop.
    pub(super) fn forget_piece(&mut self, addr: CUdeviceptr) {
        if let Some(base) = self.base() {
            self.pieces.remove_at((addr - base) as usize);
        }
    }

    /// Before a reset unmaps its pieces (the old mappings of moved pieces among
    /// them): every job handed to the helper thread is settled (a queued one
    /// taken back, a started one waited for), and the mappings the helper
    /// unmapped leave its pieces, so the reset unmaps each mapping once and none
    /// the helper is unmapping at the same time. Returns how many left.
    pub(super) fn settle_jobs(&mut self) -> usize {
        let Some(base) = self.base() else {
            return 0;
        };
        let (pieces, mut gone) = (&mut self.pieces, 0);
        self.retiring.settle_jobs(|addr| {
            pieces.remove_at((addr - base) as usize);
            gone += 1;
        });
        gone
    }

    /// A reset: its pieces are unmapped (by the caller), the old mappings
    /// waiting are forgotten with them (their events go back to `events`), and
    /// a pause's pieces and kept bytes go with the blocks they held. Its address
    /// space stays.
    pub(super) fn clear(&mut self, events: &dyn EventSource) {
        self.pieces.clear();
        self.retiring.forget(events);
        self.pause.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::pieces::Piece;

    /// A source with (or without) virtual memory; nothing else is asked of it.
    struct Source {
        vmm: bool,
    }

    impl SegmentSource for Source {
        fn alloc_segment(&self, size: usize) -> Result<CUdeviceptr> {
            panic!("no segment of {size} bytes is asked for here")
        }
        fn free_segment(&self, base: CUdeviceptr, _size: usize) -> Result<()> {
            panic!("no segment at {base:#x} is given back here")
        }
        fn device_info(&self) -> (usize, usize) {
            (0, 0)
        }
        fn reserve(&self, _size: usize) -> Result<Option<CUdeviceptr>> {
            Ok(self.vmm.then_some(0x7000_0000_0000))
        }
        fn map_pieces(
            &self,
            _dst: CUdeviceptr,
            _pieces: &[(Option<CUdeviceptr>, usize)],
        ) -> (usize, Result<()>) {
            (0, Ok(()))
        }
    }

    #[test]
    fn reserved_it_knows_its_base_and_size_and_given_up_it_holds_nothing() {
        let policy = SegmentPolicy::default();
        let mut e = ExpandableSegment::default();
        assert_eq!((e.base(), e.reserve(), e.usable()), (None, 0, true));
        assert_eq!(e.settle_jobs(), 0);
        let base = match e.obtain(64 << 20, &policy, &Source { vmm: true }) {
            Ok(Obtained::New(b)) => b,
            _ => panic!("the address space is reserved at the first growth"),
        };
        assert_eq!(e.base(), Some(base));
        assert_eq!(e.reserve(), policy.expandable_reserve);
        assert!(matches!(
            e.obtain(64 << 20, &policy, &Source { vmm: true }),
            Ok(Obtained::Have(b)) if b == base
        ));
        e.pieces
            .insert_run(&[Piece::new(0, 2 << 20), Piece::new(2 << 20, 4 << 20)]);
        e.forget_piece(base + (2 << 20));
        assert_eq!(e.pieces.as_slice(), &[Piece::new(0, 2 << 20)]);
        // Given up, its pieces are the virtual memory's to unmap, not its own.
        assert_eq!(e.give_up(), Some(base));
        assert!(e.pieces.is_empty());
        assert_eq!((e.base(), e.reserve()), (None, 0));
    }

    #[test]
    fn without_virtual_memory_none_is_to_be_had() {
        let mut e = ExpandableSegment::default();
        let got = e.obtain(64 << 20, &SegmentPolicy::default(), &Source { vmm: false });
        assert!(matches!(got, Ok(Obtained::None)));
        assert!(e.none_to_be_had() && !e.usable());
        assert_eq!(e.base(), None);
    }
}
