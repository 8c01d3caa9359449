//! Fork detection: CUDA does not survive `fork`.
//!
//! A child forked after its parent initialised the driver inherits the parent's
//! address space — emm's pools, their locks and cached blocks, the driver's own
//! state — but not a usable CUDA context: the real driver answers every call there
//! with `CUDA_ERROR_NOT_INITIALIZED`. [`driver`](crate::driver) registers a
//! `pthread_atfork` child handler before it first loads the driver, and records
//! the process once `cuInit` has succeeded; a child forked after that sees
//! [`forked`] return `true` and [`check_not_forked`] the [`Forked`] error, and
//! emm's layers above refuse to serve (or free into) the parent's pools there. A
//! child forked before emm initialised the driver (or after `cuInit` failed) is an
//! ordinary process as far as emm knows; if another library initialised CUDA in
//! the parent, the driver itself still refuses it (`CUDA_ERROR_NOT_INITIALIZED`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Once;

/// The process that initialised the driver (0 before).
static INITIALISED_BY: AtomicU32 = AtomicU32::new(0);
/// Set in a child forked after the driver was initialised.
static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);
static WATCH: Once = Once::new();

/// This process was forked after its parent initialised the CUDA driver, so
/// CUDA (and the parent's memory managers) cannot be used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "CUDA cannot be used in process {child}: it was forked from process {parent} after \
     CUDA was initialised there, and a CUDA context does not survive fork (the driver \
     answers CUDA_ERROR_NOT_INITIALIZED); start workers with spawn \
     (Python: multiprocessing.get_context(\"spawn\")) or fork before CUDA is first used"
)]
#[non_exhaustive]
pub struct Forked {
    /// The process that initialised CUDA (this one's parent, or an earlier ancestor).
    pub parent: u32,
    /// This process.
    pub child: u32,
}

/// `Err` in a child forked after this process (or an ancestor) initialised the
/// driver through [`driver`](crate::driver); `Ok` everywhere else. One relaxed
/// atomic load: cheap enough for every allocation.
#[inline]
pub fn check_not_forked() -> Result<(), Forked> {
    if IN_FORKED_CHILD.load(Ordering::Relaxed) {
        Err(forked_here())
    } else {
        Ok(())
    }
}

#[cold]
fn forked_here() -> Forked {
    Forked {
        parent: INITIALISED_BY.load(Ordering::Relaxed),
        child: std::process::id(),
    }
}

/// Whether this process is a child forked after the driver was initialised.
#[inline]
pub fn forked() -> bool {
    IN_FORKED_CHILD.load(Ordering::Relaxed)
}

/// Registers the child handler, once per process. Called by
/// [`driver`](crate::driver) before it loads the library, so that no fork can
/// fall between a successful `cuInit` and the handler.
pub(crate) fn watch() {
    WATCH.call_once(|| {
        #[cfg(unix)]
        {
            // SAFETY: `on_child` is an `extern "C"` function with no arguments that
            // only loads and stores atomics (async-signal-safe, as a handler run in
            // a freshly forked child must be). A non-zero return (ENOMEM) leaves
            // fork undetected: logged nowhere (this crate has no logger), and the
            // real driver still fails every call in such a child.
            let _ = unsafe { libc::pthread_atfork(None, None, Some(on_child)) };
        }
    });
}

/// Records this process as the one that initialised the driver (after a
/// successful `cuInit`): from now on a forked child is refused.
pub(crate) fn initialised() {
    INITIALISED_BY.store(std::process::id(), Ordering::Relaxed);
}

/// In the child: only two atomic operations (async-signal-safe, as a handler run
/// in a freshly forked child must be). Flags the child only when this process
/// (or an ancestor) had initialised the driver.
#[cfg(unix)]
extern "C" fn on_child() {
    if INITIALISED_BY.load(Ordering::Relaxed) != 0 {
        IN_FORKED_CHILD.store(true, Ordering::Relaxed);
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_never_forked_is_not_a_forked_child() {
        watch();
        initialised();
        assert_eq!(check_not_forked(), Ok(()));
        assert!(!forked());
    }

    #[test]
    fn the_error_names_both_processes_and_the_way_out() {
        let e = Forked {
            parent: 10,
            child: 11,
        };
        let text = e.to_string();
        assert!(
            text.contains("process 11") && text.contains("process 10"),
            "{text}"
        );
        assert!(text.contains("spawn"), "{text}");
    }
}
