//! Export of blocks of the expandable segment to other processes by file
//! descriptor (legacy CUDA IPC cannot export virtual memory).
//!
//! With [`PoolConfig::exportable`](crate::PoolConfig::exportable)
//! (`EMM_POOL_EXPORTABLE=1`; `emm.numba_plugin` turns it on) every piece of the
//! expandable segment is created with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`
//! requested. `get_ipc_handle` of a block there finds the pieces mapped behind
//! the block's byte range, exports each once (`cuMemExportToShareableHandle`, one
//! descriptor per piece, kept by the pool) and describes them in an
//! [`IpcHandle::Vmm`](emm_core::IpcHandle::Vmm): this process's id, each piece's
//! descriptor and size, the block's offset in the first piece and its length. The
//! importer takes the descriptors with `pidfd_getfd`, imports the pieces and maps
//! them contiguously at addresses of its own (`emm_core`'s `IpcHandle::open`).
//!
//! The contract is legacy CUDA IPC's: the exporter keeps the block alive while
//! importers open and use it. While the block lives, the pool never moves,
//! unmaps or releases the pieces behind it (growth moves only whole pieces of
//! free blocks, `trim` releases only idle pieces), so their descriptors stay
//! valid. A descriptor is closed when its piece's memory is released (its last
//! mapping unmapped, after the blocks on it were freed), or with the pool. An
//! importer's mapping holds its own reference to the memory, so a piece released
//! by the exporter stays valid memory in the importer until it closes the handle;
//! what it then reads is whatever the exporter put in the memory afterwards, as
//! with legacy IPC of a freed block. A handle opened after its block was freed
//! may name descriptors that are closed (a typed error) or reused.
//!
//! Cost: exportable pieces only differ at `cuMemCreate` (the handle type
//! requested); nothing is exported before `get_ipc_handle`. It is opt-in because
//! the cost of exportable creation on every GPU and driver is not measured here
//! (`exportable_pieces_cost` in `tests/gpu.rs` measures it on a GPU).
//!
//! This file holds the types; the driver's side (finding and exporting the
//! pieces of a range) is `vmm_export.rs`.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use emm_core::Result;

/// The pieces behind a range, exported: each piece's descriptor (valid in this
/// process while the piece's memory lives) and size, in address order, and the
/// range's offset in the first piece.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedRange {
    /// `(file descriptor, piece size)` per piece.
    pub pieces: Vec<(i32, usize)>,
    /// Offset of the range's start in the first piece.
    pub offset: usize,
}

/// The descriptors exported so far, per physical handle; each closed when its
/// handle is released ([`ExportedFds::forget`]) or on drop.
#[derive(Debug, Default)]
pub(crate) struct ExportedFds(Mutex<HashMap<u64, OwnedFd>>);

impl ExportedFds {
    /// Closes the descriptor of `handle`, if it was exported (its memory was
    /// just released).
    pub(crate) fn forget(&self, handle: u64) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !map.is_empty() {
            map.remove(&handle);
        }
    }

    /// Descriptors held now.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The descriptor of each of `handles`, exported by `export` the first time
    /// and kept.
    pub(crate) fn get_or_export(
        &self,
        handles: impl IntoIterator<Item = u64>,
        export: impl Fn(u64) -> Result<OwnedFd>,
    ) -> Result<Vec<i32>> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        handles
            .into_iter()
            .map(|h| {
                if let Some(fd) = map.get(&h) {
                    return Ok(fd.as_raw_fd());
                }
                let fd = export(h)?;
                let raw = fd.as_raw_fd();
                map.insert(h, fd);
                Ok(raw)
            })
            .collect()
    }
}
