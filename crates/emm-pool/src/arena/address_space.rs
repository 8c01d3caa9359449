//! The expandable segment's address space: reserved, to be reserved by the next
//! growth, refused by the driver, or not to be had (no virtual memory), and the
//! asking for it. What is mapped in it is the arena's (`growth.rs`,
//! `retire.rs`).

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use super::policy::SegmentPolicy;
use super::SegmentSource;

/// Divisors of [`SegmentPolicy::expandable_reserve`] tried, in order, when the
/// driver refuses a reservation (`AddressSpace::reserve_range`): 1 TiB by
/// default, then 256, 64 and 16 GiB.
const RESERVE_TRIES: [usize; 4] = [1, 4, 16, 64];

/// Where the expandable segment's address space stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Reservation {
    /// Not asked for yet (or asked again after a refusal): the next growth
    /// reserves it.
    #[default]
    NotYet,
    /// None to be had (no virtual memory): not asked for again.
    Unavailable,
    /// The driver refused every size asked for (`AddressSpace::reserve_range`):
    /// growth takes segments of their own, as without virtual memory, until a
    /// trim, a reset or the out-of-memory path makes it [`Reservation::NotYet`]
    /// again.
    Refused,
    /// Reserved at this base, this many bytes.
    At(CUdeviceptr, usize),
}

/// What `AddressSpace::reserve_range` got.
enum Reserved {
    /// Address space at this base, of this many bytes.
    At(CUdeviceptr, usize),
    /// The upstream has no virtual memory: never ask again.
    NoVirtualMemory,
    /// The driver refused every size tried.
    Refused,
    /// The request is larger than the reservation: nothing was asked.
    TooSmall,
}

/// What a growth gets from [`AddressSpace::obtain`].
pub(super) enum Obtained {
    /// The address space reserved before, at this base.
    Have(CUdeviceptr),
    /// Address space reserved now, at this base (the arena makes its segment).
    New(CUdeviceptr),
    /// None: no virtual memory, refused, or the request is larger than any
    /// reservation; the request takes a segment of its own.
    None,
}

/// The expandable segment's address space; see the module documentation.
#[derive(Default)]
pub(super) struct AddressSpace {
    state: Reservation,
    /// A refusal was logged (see `AddressSpace::reserve_range`); cleared when a
    /// reservation succeeds.
    refusal_logged: bool,
}

impl AddressSpace {
    /// An address space never to be had: the upstream has no virtual memory
    /// (known before any growth asks).
    pub fn unavailable() -> Self {
        AddressSpace {
            state: Reservation::Unavailable,
            ..AddressSpace::default()
        }
    }

    /// The base, when reserved.
    pub fn base(&self) -> Option<CUdeviceptr> {
        match self.state {
            Reservation::At(b, _) => Some(b),
            Reservation::NotYet | Reservation::Unavailable | Reservation::Refused => None,
        }
    }

    /// Bytes of address space reserved (0 when none is).
    pub fn reserved_bytes(&self) -> usize {
        match self.state {
            Reservation::At(_, size) => size,
            Reservation::NotYet | Reservation::Unavailable | Reservation::Refused => 0,
        }
    }

    /// Whether large blocks may come from the expandable segment: reserved, or
    /// to be reserved by the next growth.
    pub fn usable(&self) -> bool {
        matches!(self.state, Reservation::NotYet | Reservation::At(..))
    }

    /// Whether there is none to be had now: no virtual memory, or refused.
    pub fn none_to_be_had(&self) -> bool {
        matches!(self.state, Reservation::Unavailable | Reservation::Refused)
    }

    /// The address space for a growth of `request` bytes, reserved now when not
    /// asked for yet (a refusal or no virtual memory is remembered; a request
    /// larger than any reservation is not, and the next growth asks).
    pub fn obtain(
        &mut self,
        request: usize,
        policy: &SegmentPolicy,
        source: &dyn SegmentSource,
    ) -> Result<Obtained> {
        match self.state {
            Reservation::Unavailable | Reservation::Refused => Ok(Obtained::None),
            Reservation::At(b, _) => Ok(Obtained::Have(b)),
            Reservation::NotYet => Ok(match self.reserve_range(request, policy, source)? {
                // Refused: this request takes a segment of its own, and so do
                // later ones until a trim, a reset or the out-of-memory path
                // (which gives free segments back) asks again.
                Reserved::Refused => {
                    self.state = Reservation::Refused;
                    Obtained::None
                }
                // Larger than the reservation: a segment of its own; the next
                // growth asks.
                Reserved::TooSmall => Obtained::None,
                Reserved::At(b, reserve) => {
                    self.state = Reservation::At(b, reserve);
                    Obtained::New(b)
                }
                Reserved::NoVirtualMemory => {
                    self.state = Reservation::Unavailable;
                    Obtained::None
                }
            }),
        }
    }

    /// After a trim, a reset or the out-of-memory path's release of free
    /// segments, a refused reservation is asked for again by the next growth
    /// (address space may have come free).
    pub fn ask_again(&mut self) {
        if self.state == Reservation::Refused {
            self.state = Reservation::NotYet;
        }
    }

    /// Leaves the address space reserved now (a mapping in it the driver kept:
    /// growth there would fail); the next growth reserves anew. Its base.
    pub fn give_up(&mut self) -> Option<CUdeviceptr> {
        match std::mem::take(&mut self.state) {
            Reservation::At(b, _) => Some(b),
            _ => None,
        }
    }

    /// Reserves the expandable segment's address space for a first growth of
    /// `request` bytes: [`SegmentPolicy::expandable_reserve`], or where the
    /// driver refuses that, a quarter of it, and so on while it holds the
    /// request ([`RESERVE_TRIES`]). A process's address space is finite and
    /// every pool of every device reserves its own (a stream's and a tag's
    /// pools too), and drivers refuse a reservation too large for them with
    /// out of memory, invalid value or not supported alike, so no refusal fails
    /// the request: when every size is refused (logged once until a
    /// reservation succeeds) the request is served from a segment of its own,
    /// and so are later ones until a trim, a reset or the out-of-memory path
    /// asks again (a lost context then fails that segment's `cuMemAlloc` with
    /// its own error). A driver without the virtual memory entry points is
    /// [`Reserved::NoVirtualMemory`]; a request larger than the reservation,
    /// [`Reserved::TooSmall`] (nothing asked).
    fn reserve_range(
        &mut self,
        request: usize,
        policy: &SegmentPolicy,
        source: &dyn SegmentSource,
    ) -> Result<Reserved> {
        let page = policy.large_round.max(1);
        let mut refused = None;
        for div in RESERVE_TRIES {
            let size = policy.expandable_reserve / div / page * page;
            if size < request || size == 0 {
                if refused.is_none() {
                    return Ok(Reserved::TooSmall);
                }
                break;
            }
            match source.reserve(size) {
                Ok(Some(b)) => {
                    if size < policy.expandable_reserve {
                        tracing::info!(
                            asked = policy.expandable_reserve,
                            reserved = size,
                            "the driver refused the expandable segment's address space; a smaller reservation took its place"
                        );
                    }
                    self.refusal_logged = false;
                    return Ok(Reserved::At(b, size));
                }
                Ok(None) => return Ok(Reserved::NoVirtualMemory),
                Err(EmmError::Unsupported { .. })
                | Err(EmmError::Driver(emm_driver::DriverError::Unsupported { .. })) => {
                    return Ok(Reserved::NoVirtualMemory)
                }
                Err(e) => refused = Some((size, e)),
            }
        }
        match refused {
            Some((size, e)) if !self.refusal_logged => {
                self.refusal_logged = true;
                tracing::warn!(
                    error = %e,
                    smallest = size,
                    "the driver refused the expandable segment's address space; large blocks take segments of their own until a trim, a reset or an out-of-memory asks again"
                );
            }
            // Logged already, or no size held the request.
            _ => {}
        }
        Ok(Reserved::Refused)
    }
}
