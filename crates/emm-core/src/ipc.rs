//! [`IpcHandle`]: sharing device memory with another process.
//!
//! Two kinds:
//!
//! - [`IpcHandle::Legacy`]: a `cuIpcMemHandle` of the upstream allocation plus the
//!   offset and size of the shared range inside it, so a view into a pooled block
//!   exports correctly (the driver only knows whole allocations).
//! - [`IpcHandle::MemPool`]: memory of the stream-ordered allocator, which legacy
//!   IPC cannot export. It carries the exporting process's id and the file
//!   descriptor of the exported pool in that process, plus the pointer's export
//!   data. The importer takes a duplicate of the descriptor with
//!   `pidfd_open` + `pidfd_getfd` (Linux 5.6+; needs the permission to ptrace the
//!   exporter, as a process of the same user normally has), imports the pool and
//!   then the pointer.
//!
//! - [`IpcHandle::Vmm`]: memory of a virtual-memory range (`cuMemCreate` pieces
//!   mapped one after another, as in the pool's expandable segment), which legacy
//!   IPC cannot export either. It carries the exporting process's id and, per
//!   piece behind the shared range, the file descriptor of the exported piece in
//!   that process and its size, plus the range's offset in the first piece. The
//!   importer takes each descriptor as for mempools, imports the pieces, maps them
//!   contiguously at a fresh address range and grants access (see
//!   [`emm_driver::vmm::ImportedRange`]).
//!
//! Handles serialise to bytes ([`IpcHandle::to_bytes`]) and back; foreign or garbled
//! bytes give [`EmmError::InvalidIpcHandle`] saying what was wrong.
//!
//! Opening on another device than the one the memory lives on is NBEP 7's "staged
//! IPC": the memory is opened on its own device, copied into a staging buffer that
//! the *target's manager* allocates (so it is owned once, by that manager), and the
//! mapping is closed. Opening ([`IpcHandle::open`], which gives an
//! [`IpcMemory`](crate::IpcMemory)) is in `ipc_open.rs`, above the
//! [`MemoryManager`](crate::MemoryManager) trait that names the handle.

use emm_driver::memory;
use emm_driver::Context;
use emm_sys::CUdeviceptr;

use crate::error::{EmmError, Result};

const MAGIC: &[u8; 6] = b"EMMIPC";
/// Version 2 added the exported allocation's size to mempool handles.
const FORMAT_VERSION: u8 = 2;
const KIND_LEGACY: u8 = 1;
const KIND_MEMPOOL: u8 = 2;
const KIND_VMM: u8 = 3;
/// The fixed part of a virtual-memory handle's body; each piece adds
/// [`VMM_PIECE`] bytes.
const VMM_FIXED: usize = 4 + 8 + 8 + 16 + 4;
const VMM_PIECE: usize = 4 + 8;
/// The most pieces a virtual-memory handle may list (a garbled count cannot
/// make a reader allocate much).
pub const MAX_VMM_PIECES: usize = 1 << 16;
const LEGACY_BODY: usize = 64 + 8 + 8 + 8 + 16 + 4;
const MEMPOOL_BODY: usize = 64 + 4 + 4 + 8 + 8 + 8 + 16;
const HEADER: usize = 8;
const TRAILER: usize = 8;

/// A handle through which another process opens device memory.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpcHandle {
    /// Legacy CUDA IPC of a `cuMemAlloc`-style allocation.
    Legacy {
        /// The driver's `CUipcMemHandle` of the upstream allocation.
        handle: [u8; 64],
        /// Size of the upstream allocation.
        base_size: usize,
        /// Offset of the shared range in it.
        offset: usize,
        /// Length of the shared range.
        size: usize,
        /// UUID of the device that holds the memory.
        device_uuid: [u8; 16],
        /// The exporting process.
        pid: u32,
    },
    /// Memory of an exported stream-ordered memory pool.
    MemPool {
        /// `CUmemPoolPtrExportData` of the pointer.
        export: [u8; 64],
        /// The pool's exported file descriptor, valid in the exporting process.
        pool_fd: i32,
        /// The exporting process.
        pid: u32,
        /// Size of the exported allocation (the range `offset..offset+size` lies in
        /// it).
        base_size: usize,
        /// Offset of the shared range from the exported pointer.
        offset: usize,
        /// Length of the shared range.
        size: usize,
        /// UUID of the device that holds the memory.
        device_uuid: [u8; 16],
    },
    /// Virtual memory: `cuMemCreate` pieces exported as POSIX file descriptors.
    Vmm {
        /// The exporting process.
        pid: u32,
        /// The pieces behind the shared range, in address order: each piece's
        /// exported file descriptor (valid in the exporting process) and size.
        pieces: Vec<(i32, usize)>,
        /// Offset of the shared range in the first piece.
        offset: usize,
        /// Length of the shared range.
        size: usize,
        /// UUID of the device that holds the memory.
        device_uuid: [u8; 16],
    },
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(crate) fn invalid(reason: impl Into<String>) -> EmmError {
    EmmError::InvalidIpcHandle {
        reason: reason.into(),
    }
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.0[..N]);
        self.0 = &self.0[N..];
        out
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    /// A `u64` field that must fit a `usize`.
    fn usize(&mut self, what: &str) -> Result<usize> {
        let v = self.u64();
        usize::try_from(v)
            .map_err(|_| invalid(format!("{what} {v} does not fit this machine's usize")))
    }
}

/// Checks that `offset..offset+size` lies inside an exported allocation of
/// `base_size` bytes (without overflow).
fn check_range(base_size: usize, offset: usize, size: usize) -> Result<()> {
    if offset.checked_add(size).is_none_or(|end| end > base_size) {
        return Err(invalid(format!(
            "range {offset}+{size} lies outside its allocation of {base_size} bytes"
        )));
    }
    Ok(())
}

impl IpcHandle {
    /// Checks that the shared range lies inside the exported allocation:
    /// [`EmmError::InvalidIpcHandle`] otherwise. [`IpcHandle::from_bytes`] and
    /// [`IpcHandle::open`] check it.
    pub fn validate(&self) -> Result<()> {
        match self {
            IpcHandle::Legacy {
                base_size,
                offset,
                size,
                ..
            }
            | IpcHandle::MemPool {
                base_size,
                offset,
                size,
                ..
            } => check_range(*base_size, *offset, *size),
            IpcHandle::Vmm {
                pieces,
                offset,
                size,
                ..
            } => check_vmm(pieces, *offset, *size),
        }
    }

    /// Length of the shared range.
    pub fn size(&self) -> usize {
        match self {
            IpcHandle::Legacy { size, .. }
            | IpcHandle::MemPool { size, .. }
            | IpcHandle::Vmm { size, .. } => *size,
        }
    }

    /// Offset of the shared range in its upstream allocation (for
    /// [`IpcHandle::Vmm`]: in its first piece).
    pub fn offset(&self) -> usize {
        match self {
            IpcHandle::Legacy { offset, .. }
            | IpcHandle::MemPool { offset, .. }
            | IpcHandle::Vmm { offset, .. } => *offset,
        }
    }

    /// UUID of the device holding the memory.
    pub fn device_uuid(&self) -> [u8; 16] {
        match self {
            IpcHandle::Legacy { device_uuid, .. }
            | IpcHandle::MemPool { device_uuid, .. }
            | IpcHandle::Vmm { device_uuid, .. } => *device_uuid,
        }
    }

    /// Serialises the handle: magic, format version, kind, fields, checksum.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + LEGACY_BODY + TRAILER);
        out.extend_from_slice(MAGIC);
        out.push(FORMAT_VERSION);
        match self {
            IpcHandle::Legacy {
                handle,
                base_size,
                offset,
                size,
                device_uuid,
                pid,
            } => {
                out.push(KIND_LEGACY);
                out.extend_from_slice(handle);
                out.extend_from_slice(&(*base_size as u64).to_le_bytes());
                out.extend_from_slice(&(*offset as u64).to_le_bytes());
                out.extend_from_slice(&(*size as u64).to_le_bytes());
                out.extend_from_slice(device_uuid);
                out.extend_from_slice(&pid.to_le_bytes());
            }
            IpcHandle::MemPool {
                export,
                pool_fd,
                pid,
                base_size,
                offset,
                size,
                device_uuid,
            } => {
                out.push(KIND_MEMPOOL);
                out.extend_from_slice(export);
                out.extend_from_slice(&pool_fd.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&(*base_size as u64).to_le_bytes());
                out.extend_from_slice(&(*offset as u64).to_le_bytes());
                out.extend_from_slice(&(*size as u64).to_le_bytes());
                out.extend_from_slice(device_uuid);
            }
            IpcHandle::Vmm {
                pid,
                pieces,
                offset,
                size,
                device_uuid,
            } => {
                out.push(KIND_VMM);
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&(*offset as u64).to_le_bytes());
                out.extend_from_slice(&(*size as u64).to_le_bytes());
                out.extend_from_slice(device_uuid);
                out.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
                for (fd, len) in pieces {
                    out.extend_from_slice(&fd.to_le_bytes());
                    out.extend_from_slice(&(*len as u64).to_le_bytes());
                }
            }
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parses bytes made by [`IpcHandle::to_bytes`]; anything else is
    /// [`EmmError::InvalidIpcHandle`].
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcHandle> {
        if bytes.len() < HEADER + TRAILER {
            return Err(invalid(format!(
                "{} bytes is too short for an emm IPC handle (at least {})",
                bytes.len(),
                HEADER + TRAILER
            )));
        }
        if &bytes[..6] != MAGIC {
            return Err(invalid(format!(
                "not an emm IPC handle: it starts with {:02x?}, expected \"EMMIPC\"",
                &bytes[..6]
            )));
        }
        if bytes[6] != FORMAT_VERSION {
            return Err(invalid(format!(
                "format version {} is not supported (this emm reads version {FORMAT_VERSION})",
                bytes[6]
            )));
        }
        let body_len = match bytes[7] {
            KIND_LEGACY => LEGACY_BODY,
            KIND_MEMPOOL => MEMPOOL_BODY,
            KIND_VMM => vmm_body_len(bytes)?,
            k => {
                return Err(invalid(format!(
                    "unknown handle kind {k} (known: 1 legacy, 2 mempool, 3 virtual memory)"
                )))
            }
        };
        let want = HEADER + body_len + TRAILER;
        if bytes.len() != want {
            return Err(invalid(format!(
                "a kind-{} handle is {want} bytes, found {}",
                bytes[7],
                bytes.len()
            )));
        }
        let (payload, sum) = bytes.split_at(want - TRAILER);
        let stored = u64::from_le_bytes(sum.try_into().unwrap_or([0; 8]));
        if fnv1a(payload) != stored {
            return Err(invalid(
                "checksum mismatch: the handle was corrupted in transit",
            ));
        }
        let mut r = Reader(&payload[HEADER..]);
        let handle = match bytes[7] {
            KIND_LEGACY => {
                let handle = r.take::<64>();
                let base_size = r.usize("allocation size")?;
                let offset = r.usize("offset")?;
                let size = r.usize("size")?;
                let device_uuid = r.take::<16>();
                let pid = r.u32();
                check_range(base_size, offset, size)?;
                IpcHandle::Legacy {
                    handle,
                    base_size,
                    offset,
                    size,
                    device_uuid,
                    pid,
                }
            }
            KIND_VMM => {
                let pid = r.u32();
                let offset = r.usize("offset")?;
                let size = r.usize("size")?;
                let device_uuid = r.take::<16>();
                let n = r.u32() as usize;
                let mut pieces = Vec::with_capacity(n);
                for _ in 0..n {
                    let fd = r.u32() as i32;
                    pieces.push((fd, r.usize("piece size")?));
                }
                check_vmm(&pieces, offset, size)?;
                IpcHandle::Vmm {
                    pid,
                    pieces,
                    offset,
                    size,
                    device_uuid,
                }
            }
            _ => {
                let export = r.take::<64>();
                let pool_fd = r.u32() as i32;
                let pid = r.u32();
                let base_size = r.usize("allocation size")?;
                let offset = r.usize("offset")?;
                let size = r.usize("size")?;
                let device_uuid = r.take::<16>();
                check_range(base_size, offset, size)?;
                IpcHandle::MemPool {
                    export,
                    pool_fd,
                    pid,
                    base_size,
                    offset,
                    size,
                    device_uuid,
                }
            }
        };
        Ok(handle)
    }

    /// The handle as lowercase hex text (for environment variables, command lines,
    /// logs).
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`IpcHandle::to_hex`] text; bad text is [`EmmError::InvalidIpcHandle`].
    pub fn from_hex(text: &str) -> Result<IpcHandle> {
        let t = text.trim();
        if t.len() % 2 != 0 {
            return Err(invalid(format!("hex text of odd length {}", t.len())));
        }
        let bytes = (0..t.len() / 2)
            .map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2).unwrap_or("zz"), 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| invalid("the text is not hex"))?;
        IpcHandle::from_bytes(&bytes)
    }

    /// Builds a legacy handle for `[ptr, ptr+size)`, which lies in the `cuMemAlloc`
    /// allocation that starts at `base`.
    pub fn export_legacy(
        ctx: &Context,
        base: CUdeviceptr,
        ptr: CUdeviceptr,
        size: usize,
    ) -> Result<IpcHandle> {
        let (real_base, base_size) = memory::address_range(ctx, ptr)?;
        if real_base != base {
            tracing::debug!(
                base,
                real_base,
                "manager's base differs from the driver's; using the driver's"
            );
        }
        let offset = (ptr - real_base) as usize;
        Ok(IpcHandle::Legacy {
            handle: memory::ipc_get_handle(ctx, real_base)?,
            base_size,
            offset,
            size,
            device_uuid: ctx.device().uuid()?,
            pid: std::process::id(),
        })
    }
}

/// The body length of a virtual-memory handle, from its piece count (which must
/// be at most [`MAX_VMM_PIECES`]; the bytes must hold the fixed part).
fn vmm_body_len(bytes: &[u8]) -> Result<usize> {
    let at = HEADER + VMM_FIXED - 4;
    let Some(count) = bytes.get(at..at + 4) else {
        return Err(invalid(format!(
            "a virtual-memory handle is at least {} bytes, found {}",
            HEADER + VMM_FIXED + TRAILER,
            bytes.len()
        )));
    };
    let n = u32::from_le_bytes([count[0], count[1], count[2], count[3]]) as usize;
    if n == 0 || n > MAX_VMM_PIECES {
        return Err(invalid(format!(
            "a virtual-memory handle lists {n} pieces (1 to {MAX_VMM_PIECES} allowed)"
        )));
    }
    Ok(VMM_FIXED + n * VMM_PIECE)
}

/// Checks a virtual-memory handle's pieces and range: 1 to [`MAX_VMM_PIECES`]
/// pieces of non-zero size whose total fits a `usize`, descriptors that are not
/// negative, the range inside the pieces and starting in the first.
fn check_vmm(pieces: &[(i32, usize)], offset: usize, size: usize) -> Result<()> {
    if pieces.is_empty() || pieces.len() > MAX_VMM_PIECES {
        return Err(invalid(format!(
            "a virtual-memory handle lists {} pieces (1 to {MAX_VMM_PIECES} allowed)",
            pieces.len()
        )));
    }
    let mut total = 0usize;
    for (i, &(fd, len)) in pieces.iter().enumerate() {
        if fd < 0 || len == 0 {
            return Err(invalid(format!(
                "piece {i} has file descriptor {fd} and {len} bytes (a descriptor and a size are needed)"
            )));
        }
        total = total
            .checked_add(len)
            .ok_or_else(|| invalid("the pieces' sizes add up to more than the address space"))?;
    }
    if offset >= pieces[0].1 {
        return Err(invalid(format!(
            "offset {offset} lies past the first piece of {} bytes",
            pieces[0].1
        )));
    }
    check_range(total, offset, size)
}

/// `base + offset`, or [`EmmError::InvalidIpcHandle`] where it would wrap.
pub(crate) fn at_offset(base: CUdeviceptr, offset: usize) -> Result<CUdeviceptr> {
    u64::try_from(offset)
        .ok()
        .and_then(|o| base.checked_add(o))
        .ok_or_else(|| {
            invalid(format!(
                "offset {offset} from {base:#x} wraps the address space"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy() -> IpcHandle {
        IpcHandle::Legacy {
            handle: [7; 64],
            base_size: 1 << 20,
            offset: 4096,
            size: 512,
            device_uuid: [1; 16],
            pid: 1234,
        }
    }

    #[test]
    fn handles_round_trip_through_bytes() {
        for h in [
            legacy(),
            IpcHandle::MemPool {
                export: [9; 64],
                pool_fd: 17,
                pid: 99,
                base_size: 1 << 30,
                offset: 0,
                size: 1 << 30,
                device_uuid: [3; 16],
            },
            vmm(),
        ] {
            let b = h.to_bytes();
            assert_eq!(IpcHandle::from_bytes(&b).unwrap(), h);
        }
    }

    fn vmm() -> IpcHandle {
        IpcHandle::Vmm {
            pid: 4321,
            pieces: vec![(12, 4 << 20), (13, 2 << 20), (40, 8 << 20)],
            offset: 3 << 20,
            size: 9 << 20,
            device_uuid: [4; 16],
        }
    }

    #[test]
    fn garbled_vmm_handles_are_typed_errors() {
        let err = |h: IpcHandle| match IpcHandle::from_bytes(&h.to_bytes()) {
            Err(EmmError::InvalidIpcHandle { reason }) => {
                assert_eq!(
                    h.validate().unwrap_err().to_string(),
                    format!("invalid IPC handle: {reason}")
                );
                reason
            }
            other => panic!("expected InvalidIpcHandle, got {other:?}"),
        };
        type Edit<'a> = &'a dyn Fn(&mut Vec<(i32, usize)>, &mut usize, &mut usize);
        let with = |f: Edit<'_>| {
            let IpcHandle::Vmm {
                pid,
                mut pieces,
                mut offset,
                mut size,
                device_uuid,
            } = vmm()
            else {
                unreachable!()
            };
            f(&mut pieces, &mut offset, &mut size);
            IpcHandle::Vmm {
                pid,
                pieces,
                offset,
                size,
                device_uuid,
            }
        };
        let r = err(with(&|p, _, _| p.clear()));
        assert!(r.contains("lists 0 pieces"), "{r}");
        let r = err(with(&|_, o, _| *o = 4 << 20));
        assert!(r.contains("past the first piece of 4194304 bytes"), "{r}");
        let r = err(with(&|_, _, s| *s = 12 << 20));
        assert!(
            r.contains("outside its allocation of 14680064 bytes"),
            "{r}"
        );
        let r = err(with(&|p, _, _| p[1].0 = -1));
        assert!(r.contains("piece 1 has file descriptor -1"), "{r}");
        let r = err(with(&|p, _, _| p[2].1 = 0));
        assert!(r.contains("piece 2"), "{r}");
        let r = err(with(&|p, _, _| p[2].1 = usize::MAX));
        assert!(r.contains("more than the address space"), "{r}");
        // A count that disagrees with the length, or is absurd.
        let mut b = vmm().to_bytes();
        let at = HEADER + VMM_FIXED - 4;
        b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        resign(&mut b);
        let r = match IpcHandle::from_bytes(&b) {
            Err(EmmError::InvalidIpcHandle { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(r.contains("4294967295 pieces"), "{r}");
        b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        resign(&mut b);
        let r = IpcHandle::from_bytes(&b).unwrap_err().to_string();
        assert!(r.contains("bytes, found"), "{r}");
        let r = IpcHandle::from_bytes(&b[..HEADER + 10])
            .unwrap_err()
            .to_string();
        assert!(r.contains("at least"), "{r}");
        assert_eq!(vmm().size(), 9 << 20);
        assert_eq!(vmm().offset(), 3 << 20);
    }

    #[test]
    fn foreign_and_garbled_bytes_are_typed_errors() {
        let good = legacy().to_bytes();
        let err = |b: &[u8]| match IpcHandle::from_bytes(b) {
            Err(EmmError::InvalidIpcHandle { reason }) => reason,
            other => panic!("expected InvalidIpcHandle, got {other:?}"),
        };
        assert!(err(&[]).contains("too short"));
        assert!(err(&[0u8; 64]).contains("not an emm IPC handle"));
        let mut v = good.clone();
        v[6] = 9;
        assert!(err(&v).contains("format version 9"));
        let mut k = good.clone();
        k[7] = 5;
        assert!(err(&k).contains("unknown handle kind 5"));
        assert!(err(&good[..good.len() - 1]).contains("bytes, found"));
        for i in HEADER..good.len() {
            let mut c = good.clone();
            c[i] ^= 0x40;
            let r = err(&c);
            assert!(
                r.contains("checksum") || r.contains("outside"),
                "byte {i}: {r}"
            );
        }
    }

    #[test]
    fn hex_text_round_trips_and_bad_text_is_an_error() {
        let h = legacy();
        assert_eq!(IpcHandle::from_hex(&h.to_hex()).unwrap(), h);
        assert!(IpcHandle::from_hex("abc").is_err());
        assert!(IpcHandle::from_hex("zz").is_err());
        assert!(IpcHandle::from_hex("ééé").is_err());
    }

    #[test]
    fn a_range_outside_its_allocation_is_rejected() {
        let h = IpcHandle::Legacy {
            handle: [0; 64],
            base_size: 100,
            offset: 90,
            size: 20,
            device_uuid: [0; 16],
            pid: 1,
        };
        let e = IpcHandle::from_bytes(&h.to_bytes()).unwrap_err();
        assert!(
            e.to_string()
                .contains("outside its allocation of 100 bytes"),
            "{e}"
        );
    }

    fn mempool(base_size: usize, offset: usize, size: usize) -> IpcHandle {
        IpcHandle::MemPool {
            export: [5; 64],
            pool_fd: 3,
            pid: 42,
            base_size,
            offset,
            size,
            device_uuid: [2; 16],
        }
    }

    #[test]
    fn a_mempool_range_outside_its_allocation_is_rejected() {
        for (base, off, len) in [
            (100, 90, 20),
            (100, 101, 0),
            (usize::MAX, usize::MAX, 1),
            (usize::MAX, 1, usize::MAX),
            (0, 0, 1),
        ] {
            let h = mempool(base, off, len);
            let e = IpcHandle::from_bytes(&h.to_bytes()).unwrap_err();
            assert!(
                matches!(&e, EmmError::InvalidIpcHandle { reason } if reason.contains("outside its allocation")),
                "{base} {off} {len}: {e}"
            );
            assert_eq!(h.validate().unwrap_err(), e);
        }
        let edge = mempool(100, 60, 40);
        assert_eq!(IpcHandle::from_bytes(&edge.to_bytes()).unwrap(), edge);
        assert!(at_offset(u64::MAX - 4, 5).is_err());
        assert_eq!(at_offset(16, 5).unwrap(), 21);
    }

    /// Re-signs `b` (a handle's bytes, possibly edited) so that only the fields
    /// decide whether it parses.
    fn resign(b: &mut [u8]) {
        if b.len() >= HEADER + TRAILER {
            let n = b.len() - TRAILER;
            let sum = fnv1a(&b[..n]);
            b[n..].copy_from_slice(&sum.to_le_bytes());
        }
    }

    /// Every decode ends in a typed error or in a handle whose range is inside its
    /// allocation and which writes back to the same bytes.
    fn decodes_cleanly(b: &[u8]) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        match IpcHandle::from_bytes(b) {
            Ok(h) => {
                proptest::prop_assert!(h.validate().is_ok());
                proptest::prop_assert!(h.offset().checked_add(h.size()).is_some());
                proptest::prop_assert_eq!(h.to_bytes(), b.to_vec());
            }
            Err(EmmError::InvalidIpcHandle { reason }) => {
                proptest::prop_assert!(!reason.is_empty())
            }
            Err(e) => proptest::prop_assert!(false, "untyped error {e:?}"),
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_are_typed_errors(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            decodes_cleanly(&b)?;
            let mut signed = b.clone();
            resign(&mut signed);
            decodes_cleanly(&signed)?;
        }

        #[test]
        fn garbled_and_truncated_handles_are_typed_errors(
            kind in 0u8..3,
            base in proptest::num::usize::ANY,
            off in proptest::num::usize::ANY,
            len in proptest::num::usize::ANY,
            edits in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 0..4),
            cut in proptest::num::usize::ANY,
            sign in proptest::bool::ANY,
        ) {
            let h = match kind {
                0 => IpcHandle::Legacy { handle: [1; 64], base_size: base, offset: off, size: len, device_uuid: [0; 16], pid: 7 },
                1 => mempool(base, off, len),
                // Two pieces: `base` split so the first holds at most half.
                _ => IpcHandle::Vmm { pid: 7, pieces: vec![(3, base / 2 + 1), (4, base - base / 2)], offset: off, size: len, device_uuid: [0; 16] },
            };
            let mut b = h.to_bytes();
            let valid = match kind {
                0 | 1 => off.checked_add(len).is_some_and(|e| e <= base),
                _ => base - base / 2 > 0 && off <= base / 2
                    && (base / 2 + 1).checked_add(base - base / 2).and_then(|t| off.checked_add(len).filter(|&e| e <= t)).is_some(),
            };
            // Extreme offsets and lengths: parsed exactly when inside the allocation.
            proptest::prop_assert_eq!(IpcHandle::from_bytes(&b).is_ok(), valid);
            if valid {
                proptest::prop_assert_eq!(IpcHandle::from_bytes(&b).unwrap(), h);
            }
            for (i, v) in edits {
                let n = b.len();
                b[i % n] = v;
            }
            if sign {
                resign(&mut b);
            }
            decodes_cleanly(&b)?;
            let keep = cut % (b.len() + 1);
            decodes_cleanly(&b[..keep])?;
        }
    }
}
