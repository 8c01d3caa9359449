//! [`DriverError`] and the helpers that build it.

use emm_sys::{CUresult, Driver, LoadError};

/// A failed driver operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The driver could not be loaded or initialised.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A driver call returned an error code.
    #[error("{call} failed: {name} ({}): {text}", .code.0)]
    Call {
        /// The driver function that failed, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The code it returned.
        code: CUresult,
        /// The code's name as the driver gives it.
        name: String,
        /// The driver's description of the code.
        text: String,
    },
    /// The loaded driver lacks an optional entry point.
    #[error("{symbol} is not available: the loaded CUDA driver (version {version}) lacks it")]
    Unsupported {
        /// The missing symbol.
        symbol: &'static str,
        /// `cuDriverGetVersion` of the loaded driver.
        version: i32,
    },
    /// An argument was rejected before reaching the driver.
    #[error("invalid {what}: asked for {asked}, found {found}")]
    InvalidArgument {
        /// What was checked.
        what: &'static str,
        /// The value asked for.
        asked: String,
        /// What was found instead.
        found: String,
    },
    /// A release run from `Drop` failed earlier; reported on the next fallible call.
    #[error("an earlier release during drop failed: {0}")]
    Deferred(Box<DriverError>),
}

impl DriverError {
    /// The driver's code, when the error came from a driver call.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            DriverError::Call { code, .. } => Some(*code),
            DriverError::Deferred(inner) => inner.code(),
            _ => None,
        }
    }

    /// `true` when the driver reported `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        self.code() == Some(CUresult::ERROR_OUT_OF_MEMORY)
    }

    /// `true` when the driver reported `CUDA_ERROR_DEINITIALIZED`: it is shutting
    /// down (the process is exiting and the driver's own teardown has run), and
    /// it frees every allocation, mapping and event itself.
    pub fn is_shutting_down(&self) -> bool {
        self.code() == Some(CUresult::ERROR_DEINITIALIZED)
    }

    pub(crate) fn invalid(what: &'static str, asked: impl ToString, found: impl ToString) -> Self {
        DriverError::InvalidArgument {
            what,
            asked: asked.to_string(),
            found: found.to_string(),
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = DriverError> = core::result::Result<T, E>;

/// The process-wide driver table (see [`emm_sys::driver`]), as a [`Result`] of this crate.
pub fn driver() -> Result<&'static Driver> {
    Ok(emm_sys::driver()?)
}

/// Turns `code` from the driver call `call` into a [`Result`]. In a child forked
/// after the driver was initialised, where every call fails, the error is
/// [`LoadError::Forked`], which says why and what to do.
pub fn check(drv: &Driver, call: &'static str, code: CUresult) -> Result<()> {
    if code.is_success() {
        Ok(())
    } else if let Err(forked) = emm_sys::check_not_forked() {
        Err(DriverError::Load(LoadError::Forked(forked)))
    } else {
        Err(DriverError::Call {
            call,
            code,
            name: drv.error_name(code),
            text: drv.error_string(code),
        })
    }
}

/// Returns the optional entry point `f`, or [`DriverError::Unsupported`] naming `symbol`.
pub fn optional<F: Copy>(drv: &Driver, f: Option<F>, symbol: &'static str) -> Result<F> {
    f.ok_or_else(|| DriverError::Unsupported {
        symbol,
        version: drv.version().unwrap_or(0),
    })
}
