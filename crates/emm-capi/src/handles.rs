//! Registries of live handles: a handle the C side passes in is looked up here
//! before anything is read through it, so a foreign, freed or made-up pointer (say
//! `0x1`) is `EMM_ERR_INVALID_ARGUMENT`, never a dereference.
//!
//! A handle is a number, not the object's address, and no number is given out
//! twice in a process: the address of a destroyed object is soon reused by the
//! next one, so a handle kept past its destruction (a call racing another
//! thread's destroy, a caller's stale copy) would reach a newer object of
//! someone else's instead of being refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// The next handle's number, shared by every registry (so a manager's handle is
/// never an array's either). Handles are multiples of 16, like the addresses
/// they stand in for, and start past the first page so that no small made-up
/// value is ever live.
static NEXT: AtomicUsize = AtomicUsize::new(0x1000);

/// The live handles of one type, by number. Each handle is an `Arc`, so a call in
/// flight keeps its object alive even when another thread destroys the handle.
pub(crate) struct Handles<T> {
    live: OnceLock<RwLock<HashMap<usize, Arc<T>>>>,
}

impl<T> Handles<T> {
    /// An empty registry (for a `static`).
    pub(crate) const fn new() -> Self {
        Handles {
            live: OnceLock::new(),
        }
    }

    fn map(&self) -> &RwLock<HashMap<usize, Arc<T>>> {
        self.live.get_or_init(|| RwLock::new(HashMap::new()))
    }

    /// Registers `v`; returns its handle, a number no other handle of this
    /// process had or will have. The C side never reads through it.
    pub(crate) fn insert(&self, v: T) -> *mut T {
        let n = NEXT.fetch_add(16, Ordering::Relaxed);
        self.map()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, Arc::new(v));
        // A handle is an opaque number to the C side; it carries no provenance.
        core::ptr::without_provenance_mut(n)
    }

    /// The object behind a live handle; `None` for any other pointer.
    pub(crate) fn get(&self, p: *const T) -> Option<Arc<T>> {
        self.map()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(p as usize))
            .cloned()
    }

    /// Unregisters a live handle (the object goes when the last call using it ends).
    pub(crate) fn remove(&self, p: *const T) -> Option<Arc<T>> {
        self.map()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(p as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destroyed_handle_is_never_given_out_again() {
        let reg: Handles<[u64; 4]> = Handles::new();
        let first = reg.insert([1; 4]);
        assert!(reg.remove(first).is_some());
        let mut seen = std::collections::HashSet::from([first as usize]);
        // The objects have one size, so the allocator hands the freed address
        // to the next one: a handle that is the address repeats at once.
        for i in 0..1000 {
            let h = reg.insert([i; 4]);
            assert!(seen.insert(h as usize), "handle {h:p} given out twice");
            assert!(
                reg.get(first).is_none(),
                "the destroyed handle reached a new object"
            );
            assert_eq!(reg.get(h).map(|a| a[0]), Some(i));
            assert!(reg.remove(h).is_some());
        }
    }

    #[test]
    fn made_up_values_are_not_live() {
        let reg: Handles<u8> = Handles::new();
        let h = reg.insert(7);
        for p in [0usize, 1, 0x10, h as usize + 1, h as usize + 16] {
            assert!(
                reg.get(core::ptr::without_provenance(p)).is_none(),
                "{p:#x}"
            );
        }
        assert_eq!(reg.get(h).as_deref(), Some(&7));
    }
}
