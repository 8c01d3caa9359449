//! How the pool keys streams: a stream's handle, one key per thread for the
//! per-thread default stream, and the key of blocks no stream's work touches.

/// A stream as the pool keys it.
pub type StreamKey = usize;

/// The key of free blocks whose last stream's work is known to be complete: any
/// stream may take them.
pub const SETTLED: StreamKey = usize::MAX;

/// A stream key as snapshots show it (the stream handle as an integer; 0 for
/// blocks settled on no stream; 2^48 + n for thread n's per-thread stream).
pub(crate) fn stream_id(s: StreamKey) -> usize {
    match per_thread_number(s) {
        // A thread's per-thread stream: 2^48 plus the thread's number, above every
        // user-space handle and exact as a JavaScript number (PyTorch's viewer).
        Some(n) => (1 << 48) + n,
        None if s == SETTLED => 0,
        None => s,
    }
}

/// The legacy default stream (and null): never destroyed, and the same stream on
/// every thread, so an event can be recorded on it at any time. (The per-thread
/// default stream's keys are [`per_thread_key`]s: the stream of one thread, with
/// events recorded by that thread at its frees, like a created stream.)
pub(crate) fn is_default_stream(s: StreamKey) -> bool {
    s <= 1
}

/// The tag of keys that stand for one thread's per-thread default stream
/// (`CU_STREAM_PER_THREAD`): no stream handle (a user-space address) has it.
const PER_THREAD_TAG: StreamKey = 1 << (usize::BITS - 1);

/// The key of `stream` in the pool: its handle, except for the per-thread default
/// stream, which names a different stream on every thread: the calling thread's
/// own key then (`PER_THREAD_TAG` and an index of the thread).
pub(crate) fn stream_key(stream: emm_sys::CUstream) -> StreamKey {
    if is_per_thread(stream) {
        per_thread_key()
    } else {
        stream.0 as StreamKey
    }
}

fn per_thread_key() -> StreamKey {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// Threads numbered in the order they first use the per-thread stream, below
    /// 2^31 (a number fits in an allocation's token beside its generation).
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static KEY: StreamKey = PER_THREAD_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) % PER_THREAD_THREADS);
    }
    KEY.with(|k| *k)
}

/// How many per-thread keys there are (numbers wrap past it).
pub(crate) const PER_THREAD_THREADS: usize = 1 << 31;

/// Whether `stream` can name a stream: the per-thread default stream's
/// handle, or a handle without the top bit, which no user-space address has
/// (`usize::MAX`, for one, would otherwise be taken for [`SETTLED`], blocks
/// any stream may take at once, and other such handles for a thread's
/// per-thread stream).
pub(crate) fn is_stream_handle(stream: emm_sys::CUstream) -> bool {
    is_per_thread(stream) || (stream.0 as StreamKey) & PER_THREAD_TAG == 0
}

/// Whether `stream` is the per-thread default stream handle.
pub(crate) fn is_per_thread(stream: emm_sys::CUstream) -> bool {
    std::ptr::eq(stream.0, emm_sys::CU_STREAM_PER_THREAD.0)
}

/// The thread number behind a per-thread key, `None` for any other key.
pub(crate) fn per_thread_number(key: StreamKey) -> Option<usize> {
    (key != SETTLED && key & PER_THREAD_TAG != 0).then_some(key & !PER_THREAD_TAG)
}

/// The per-thread key of thread number `n`.
pub(crate) fn per_thread_key_of(n: usize) -> StreamKey {
    PER_THREAD_TAG | n
}

/// The stream handle behind `key`: the per-thread default stream for a thread's
/// key (only the thread it stands for records events with it).
pub(crate) fn stream_of_key(key: StreamKey) -> emm_sys::CUstream {
    if key != SETTLED && key & PER_THREAD_TAG != 0 {
        emm_sys::CU_STREAM_PER_THREAD
    } else {
        emm_sys::CUstream(key as *mut core::ffi::c_void)
    }
}
