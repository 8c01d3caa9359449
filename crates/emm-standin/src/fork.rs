//! `fork` as the real driver sees it: a child forked after `cuInit` has no usable
//! CUDA, and every call there but the version and error-text queries (and
//! `cuGetProcAddress`) fails with `CUDA_ERROR_NOT_INITIALIZED`, `cuInit` included.
//! The check runs before the model's lock is taken, since a thread of the parent
//! may have held that lock at the fork.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);
static WATCH: Once = Once::new();

/// Registers the child handler, once per process (`cuInit` calls it).
pub(crate) fn watch() {
    WATCH.call_once(|| {
        // SAFETY: `on_child` is an `extern "C"` function without arguments that
        // only stores to an atomic, which is async-signal-safe as a handler run in
        // a freshly forked child must be. On failure (ENOMEM) fork goes unmodelled.
        let _ = unsafe { libc::pthread_atfork(None, None, Some(on_child)) };
    });
}

extern "C" fn on_child() {
    IN_FORKED_CHILD.store(true, Ordering::Relaxed);
}

/// Whether this process is a child forked after `cuInit` was called.
pub fn in_forked_child() -> bool {
    IN_FORKED_CHILD.load(Ordering::Relaxed)
}

/// The entry points that still answer in a forked child, as the real driver's do:
/// they need no context.
pub(crate) const WORK_AFTER_FORK: &[&str] = &[
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
];
