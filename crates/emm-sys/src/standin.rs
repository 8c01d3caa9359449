//! [`StandIn`]: the control handle of `emm-standin`, the fault-injecting test
//! driver, when it is the loaded driver.

use core::ffi::c_char;
use std::ffi::CString;

use crate::table::Driver;
use crate::types::CUresult;

/// Why a stand-in control command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StandInError {
    /// The command contains a NUL byte.
    #[error("stand-in command {0:?} contains a NUL byte")]
    Nul(String),
    /// The stand-in rejected the command (unknown, or malformed arguments).
    #[error("stand-in command {command:?} failed: {code}")]
    Rejected {
        /// The command.
        command: String,
        /// What the stand-in returned.
        code: CUresult,
    },
}

/// Live resources of the stand-in, for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Live {
    /// Device allocations: `cuMemAlloc`, stream-ordered, VMM physical handles.
    pub allocs: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Events created and not destroyed.
    pub events: u64,
    /// Streams created and not destroyed.
    pub streams: u64,
    /// Memory pools created and not destroyed.
    pub pools: u64,
    /// VMM address reservations not freed.
    pub reservations: u64,
    /// Pinned or registered host ranges.
    pub host: u64,
    /// Legacy IPC handles opened and not closed.
    pub ipc_open: u64,
}

/// The stand-in driver's control function; see `emm-standin`'s `control` module
/// for the commands (`fail cuMemAlloc_v2 1 CUDA_ERROR_OUT_OF_MEMORY`,
/// `lose_context`, `reset`, `live_allocs`, `calls cuMemFree_v2`, …).
#[derive(Clone, Copy)]
pub struct StandIn<'a> {
    driver: &'a Driver,
    control: unsafe extern "C" fn(*const c_char, *mut u64) -> CUresult,
}

impl core::fmt::Debug for StandIn<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StandIn")
            .field("path", &self.driver.path())
            .finish()
    }
}

impl Driver {
    /// The stand-in's control handle when the loaded driver is `emm-standin`
    /// (it exports `emmStandinControl`), `None` for a real driver.
    pub fn stand_in(&self) -> Option<StandIn<'_>> {
        let control = self.standin_control?;
        Some(StandIn {
            driver: self,
            control,
        })
    }

    /// `true` when the loaded driver is the `emm-standin` test driver, not CUDA.
    pub fn is_stand_in(&self) -> bool {
        self.standin_control.is_some()
    }
}

impl StandIn<'_> {
    /// Runs one control command and returns its answer.
    pub fn control(&self, command: &str) -> Result<u64, StandInError> {
        let c = CString::new(command).map_err(|_| StandInError::Nul(command.to_owned()))?;
        let mut out = 0u64;
        // SAFETY: `c` is NUL-terminated and `out` a valid out-pointer; the symbol
        // has this signature in the stand-in.
        let r = unsafe { (self.control)(c.as_ptr(), &mut out) };
        if r.is_success() {
            Ok(out)
        } else {
            Err(StandInError::Rejected {
                command: command.to_owned(),
                code: r,
            })
        }
    }

    /// Live resources (allocations, events, streams, pools, …).
    pub fn live(&self) -> Result<Live, StandInError> {
        Ok(Live {
            allocs: self.control("live_allocs")?,
            bytes: self.control("live_bytes")?,
            events: self.control("live_events")?,
            streams: self.control("live_streams")?,
            pools: self.control("live_pools")?,
            reservations: self.control("live_reservations")?,
            host: self.control("live_host")?,
            ipc_open: self.control("ipc_open")?,
        })
    }

    /// Calls made to `function` so far (failed ones included).
    pub fn calls(&self, function: &str) -> Result<u64, StandInError> {
        self.control(&format!("calls {function}"))
    }

    /// Plans the `nth` next call (1: the next) of `function` to fail with `code`.
    pub fn fail_nth(&self, function: &str, nth: u64, code: CUresult) -> Result<(), StandInError> {
        self.control(&format!("fail {function} {nth} {}", code.0))
            .map(drop)
    }

    /// Plans the `nth` next call (1: the next) of the class of calls `class`
    /// (`any`, `frees` or `events`), whatever its name, to fail with `code`.
    pub fn fail_at(&self, class: &str, nth: u64, code: CUresult) -> Result<(), StandInError> {
        self.control(&format!("fail_at {class} {nth} {}", code.0))
            .map(drop)
    }

    /// Plans the context to be lost from the `nth` next call (1: the next) of the
    /// class of calls `class` (`any`, `frees` or `events`) on, until [`reset`](Self::reset).
    pub fn lose_context_at(&self, class: &str, nth: u64) -> Result<(), StandInError> {
        self.control(&format!("lose_context_at {class} {nth}"))
            .map(drop)
    }

    /// Calls made so far of the class of calls `class` (`any`, `frees` or
    /// `events`; failed ones included).
    pub fn class_calls(&self, class: &str) -> Result<u64, StandInError> {
        self.control(&format!("class_calls {class}"))
    }

    /// Clears every planned fault, the lost context and the knobs (counters stay).
    pub fn reset(&self) -> Result<(), StandInError> {
        self.control("reset").map(drop)
    }
}
