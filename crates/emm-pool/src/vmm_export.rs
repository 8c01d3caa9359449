//! The driver's side of exporting blocks of the expandable segment (see
//! `export.rs` for the design and the contract): pieces created exportable, and
//! the pieces mapped behind a range found and exported.

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use crate::export::ExportedRange;
use crate::vmm::DriverVmm;

impl DriverVmm {
    /// Requests exportable pieces (POSIX file descriptors) from now on, where the
    /// device supports them; returns whether it does.
    pub fn set_exportable(&mut self) -> bool {
        self.exportable = emm_driver::vmm::supports_fd_export(self.ctx.device());
        if !self.exportable {
            tracing::warn!(
                "the device or driver cannot export virtual memory as file descriptors: the pool's expandable segment stays unexportable"
            );
        }
        self.exportable
    }

    /// Descriptors this pool exported and holds now (one per exported piece).
    pub fn exported_descriptors(&self) -> usize {
        self.exports.len()
    }

    /// Exports the pieces mapped behind `[addr, addr+len)` (see the module docs).
    pub(crate) fn export_pieces(&self, addr: CUdeviceptr, len: usize) -> Result<ExportedRange> {
        if !self.exportable {
            return Err(EmmError::Unsupported {
                manager: "pool (its pieces are not exportable: build it with exportable: true, EMM_POOL_EXPORTABLE=1, on a device that supports POSIX file descriptors)".into(),
                operation: "export of virtual memory",
            });
        }
        let end = addr.saturating_add(len.max(1) as u64);
        let mut maps: Vec<(CUdeviceptr, u64, usize)> = {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.mapped
                .iter()
                .filter(|(&at, &(_, l))| at < end && at + l as u64 > addr)
                .map(|(&at, &(h, l))| (at, h, l))
                .collect()
        };
        maps.sort_unstable_by_key(|m| m.0);
        let covered = maps.first().is_some_and(|m| m.0 <= addr)
            && maps.windows(2).all(|w| w[0].0 + w[0].2 as u64 == w[1].0)
            && maps.last().is_some_and(|m| m.0 + m.2 as u64 >= end);
        if !covered {
            return Err(EmmError::InvalidArgument {
                what: "range to export",
                found: format!("{addr:#x} ({len} bytes), over {} mapped pieces", maps.len()),
                expected: "a range the pool's expandable segment has mapped".into(),
            });
        }
        let fds = self.exports.get_or_export(maps.iter().map(|m| m.1), |h| {
            emm_driver::vmm::export_fd(&self.ctx, h).map_err(EmmError::from)
        })?;
        Ok(ExportedRange {
            pieces: fds.into_iter().zip(maps.iter().map(|m| m.2)).collect(),
            offset: (addr - maps[0].0) as usize,
        })
    }
}
