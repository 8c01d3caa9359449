//! Registries of live handles: a handle the C side passes in is looked up here
//! before anything is read through it, so a foreign, freed or made-up pointer (say
//! `0x1`) is `EMM_ERR_INVALID_ARGUMENT`, never a dereference.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// The live handles of one type, by address. Each handle is an `Arc`, so a call in
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

    /// Registers `v`; returns its handle (the address of the shared object).
    pub(crate) fn insert(&self, v: T) -> *mut T {
        let a = Arc::new(v);
        let p = Arc::as_ptr(&a).cast_mut();
        self.map()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize, a);
        p
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
