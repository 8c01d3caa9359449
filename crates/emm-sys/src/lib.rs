//! Raw CUDA driver ABI for emm, loaded at run time.
//!
//! | item | what it is |
//! |---|---|
//! | [`CUresult`] | open `#[must_use]` status newtype: unknown codes stay valid values |
//! | [`CUcontext`], [`CUstream`], … | handle newtypes |
//! | [`Driver`] | the function table: required symbols as fn pointers, optional ones (managed memory, stream-ordered allocator, mempools, VMM) as `Option`s |
//! | [`Driver::load`], [`Driver::load_from`] | fallible, panic-free loading |
//! | [`driver`] | the process-wide table, loaded and `cuInit`ed once |
//! | [`Driver::stand_in`] | the control handle of `emm-standin`, the fault-injecting test driver, when it is loaded |
//! | [`check_not_forked`], [`Forked`] | whether this is a child forked after the driver was initialised (CUDA does not survive fork) |
//!
//! Architecture invariant: this is the only crate of the workspace that touches
//! `libloading`, and nothing here links libcuda at build time (`xtask tidy` checks
//! both).
//!
//! ```no_run
//! let drv = emm_sys::driver().expect("a CUDA driver");
//! println!("driver {:?}, lacks {:?}", drv.version(), drv.missing_optional());
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)
#![allow(non_camel_case_types)] // reason: the C names of the driver API are kept

mod fork;
mod standin;
mod table;
mod types;

use std::sync::OnceLock;

pub use fork::{check_not_forked, forked, Forked};
pub use standin::{Live, StandIn, StandInError};
pub use table::Driver;
pub use types::*;

/// The environment variable that names the driver library to load instead of the
/// platform default.
pub const DRIVER_PATH_ENV: &str = "EMM_CUDA_DRIVER";

/// Why the driver could not be loaded or initialised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate library could be opened.
    #[error("no CUDA driver could be loaded; tried {}", format_attempts(.attempts))]
    NotFound {
        /// Each path tried and why opening it failed.
        attempts: Vec<(String, String)>,
    },
    /// A library was opened but lacks a required symbol (not a CUDA driver, or too old).
    #[error("{path} is not a usable CUDA driver: required symbol {symbol} is missing ({reason})")]
    MissingSymbol {
        /// The library's path.
        path: String,
        /// The symbol that was looked up.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// `cuInit` failed, e.g. with `CUDA_ERROR_NO_DEVICE` on a machine without a GPU.
    #[error("cuInit on {path} failed: {name} ({code}): {text}")]
    InitFailed {
        /// The library's path.
        path: String,
        /// The raw code.
        code: i32,
        /// The code's name.
        name: String,
        /// The driver's description.
        text: String,
    },
    /// This process was forked after its parent initialised the driver.
    #[error(transparent)]
    Forked(#[from] Forked),
}

/// The loader's message with its cause (libloading puts the `dlerror` text there).
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

fn format_attempts(attempts: &[(String, String)]) -> String {
    attempts
        .iter()
        .map(|(p, why)| format!("{p} ({why})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The libraries [`Driver::load`] tries, in order: the value of [`DRIVER_PATH_ENV`]
/// when set and non-empty (alone), else the platform's default names.
pub fn candidate_paths() -> Vec<String> {
    match std::env::var(DRIVER_PATH_ENV) {
        Ok(p) if !p.is_empty() => vec![p],
        _ if cfg!(windows) => vec!["nvcuda.dll".to_owned()],
        _ => vec!["libcuda.so.1".to_owned(), "libcuda.so".to_owned()],
    }
}

impl Driver {
    /// Loads the driver from the first of [`candidate_paths`] that opens.
    ///
    /// Does not call `cuInit`; [`driver`] does.
    ///
    /// # Safety
    /// Loading a shared library runs its initialisers: the library found must be a
    /// CUDA driver (or a faithful stand-in).
    pub unsafe fn load() -> Result<Driver, LoadError> {
        let mut attempts = Vec::new();
        for path in candidate_paths() {
            // SAFETY: forwarded to the caller.
            match unsafe { Driver::load_from(&path) } {
                Ok(d) => return Ok(d),
                Err(LoadError::NotFound { attempts: mut a }) => attempts.append(&mut a),
                Err(e) => return Err(e),
            }
        }
        Err(LoadError::NotFound { attempts })
    }

    /// Loads the driver from `path`.
    ///
    /// # Safety
    /// As for [`Driver::load`].
    pub unsafe fn load_from(path: &str) -> Result<Driver, LoadError> {
        // SAFETY: forwarded to the caller.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::NotFound {
                attempts: vec![(path.to_owned(), describe(&e))],
            })?;
        // SAFETY: forwarded to the caller.
        unsafe { Driver::from_library(library, path.to_owned()) }
    }
}

static DRIVER: OnceLock<Result<Driver, LoadError>> = OnceLock::new();

/// The process-wide driver: loaded from [`candidate_paths`] and initialised with
/// `cuInit(0)` on first call, then the same table (or the same error) every time.
///
/// Never panics; a machine without a driver or without a device gets a
/// [`LoadError`] naming what was tried, and a child forked after the driver was
/// initialised gets [`LoadError::Forked`].
pub fn driver() -> Result<&'static Driver, LoadError> {
    check_not_forked()?;
    DRIVER
        .get_or_init(|| {
            fork::watch();
            // SAFETY: the default candidates are the CUDA driver's well-known names,
            // or a path the user named explicitly for that purpose.
            let drv = unsafe { Driver::load() }?;
            // SAFETY: cuInit takes flags that must be 0.
            let r = unsafe { (drv.init)(0) };
            if !r.is_success() {
                return Err(LoadError::InitFailed {
                    path: drv.path().to_owned(),
                    code: r.0,
                    name: drv.error_name(r),
                    text: drv.error_string(r),
                });
            }
            fork::initialised();
            Ok(drv)
        })
        .as_ref()
        .map_err(Clone::clone)
}

// The README's examples are compiled and run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_result_codes_are_valid_values() {
        let r = CUresult(123_456);
        assert_eq!(r.name(), None);
        assert_eq!(r.to_string(), "unknown CUresult 123456");
        assert_eq!(format!("{r:?}"), "CUresult(123456)");
        assert_eq!(
            CUresult::ERROR_OUT_OF_MEMORY.name(),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
        assert!(CUresult::SUCCESS.is_success());
        assert!(!CUresult::ERROR_NOT_READY.is_success());
    }

    #[test]
    fn missing_library_is_a_typed_error_naming_the_path() {
        // SAFETY: the path does not exist, so nothing is loaded.
        let err = unsafe { Driver::load_from("/nonexistent/libcuda.so.1") }.unwrap_err();
        match &err {
            LoadError::NotFound { attempts } => {
                assert_eq!(attempts.len(), 1);
                assert_eq!(attempts[0].0, "/nonexistent/libcuda.so.1");
                assert!(!attempts[0].1.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            err.to_string().contains("/nonexistent/libcuda.so.1"),
            "{err}"
        );
    }

    #[test]
    fn a_library_that_is_not_a_driver_names_the_missing_symbol() {
        // libc is on every Linux machine and has none of the driver's symbols.
        if !cfg!(target_os = "linux") {
            return;
        }
        // SAFETY: libc's initialisers have already run in this process.
        let err = unsafe { Driver::load_from("libc.so.6") }.unwrap_err();
        match err {
            LoadError::MissingSymbol { symbol, path, .. } => {
                assert_eq!(symbol, "cuInit");
                assert_eq!(path, "libc.so.6");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn layouts_match_cuda_h() {
        use core::mem::size_of;
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemPoolPtrExportData>(), 64);
        assert_eq!(size_of::<CUipcMemHandle>(), 64);
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<CUresult>(), 4);
        assert_eq!(size_of::<CUstream>(), size_of::<*mut ()>());
    }
}
