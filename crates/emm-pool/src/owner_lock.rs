//! The lock around a thread's caches: taken on every allocation and free by the
//! thread that owns the caches (never contended but for a rare reclaim), and only
//! tried by other threads. A spin lock whose release is a plain store costs one
//! atomic read-modify-write per hook call, where `std::sync::Mutex` costs two (its
//! release swaps, to find waiters), which showed in the same-stream pair.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A value behind a spin lock (see the module's documentation).
#[derive(Default)]
pub(crate) struct OwnerLock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and a guard exists only while
// `held` was set by a successful compare-exchange (Acquire) and is cleared by that
// guard's drop (Release): one thread at a time, its accesses ordered with the next
// holder's. `T: Send` because the value moves between the threads that hold it.
unsafe impl<T: Send> Sync for OwnerLock<T> {}

impl<T> std::fmt::Debug for OwnerLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerLock")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Access to the value while the lock is held; dropping it releases the lock.
pub(crate) struct Guard<'a, T> {
    lock: &'a OwnerLock<T>,
}

impl<T> OwnerLock<T> {
    /// Takes the lock, spinning (then yielding) while another thread holds it.
    pub fn lock(&self) -> Guard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard { lock: self })
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `Sync` above).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only
        // reference through it.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn one_holder_at_a_time_and_try_lock_fails_while_held() {
        let l = OwnerLock::<Vec<u32>>::default();
        let mut g = l.lock();
        g.push(1);
        assert!(l.try_lock().is_none());
        drop(g);
        assert_eq!(*l.try_lock().unwrap(), [1]);
    }

    #[test]
    fn threads_counting_under_the_lock_lose_no_update() {
        let l = Arc::new(OwnerLock::<u64>::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 40_000);
    }
}
