//! emm: choose and share the CUDA memory manager of a program.
//!
//! This crate wires the built-in managers into the process-wide router of
//! `emm-core`: `default` ([`emm_default::DefaultManager`]), `pool`
//! ([`emm_pool::PoolManager`]) and `hostonly` ([`emm_hostonly::HostOnlyManager`]).
//! `EMM_MEMORY_MANAGER=default|pool|hostonly` picks one; [`set_memory_manager`]
//! picks one in code (the variable wins, with a warning).
//!
//! ```no_run
//! emm::register_builtin_managers();
//! emm::set_memory_manager("pool")?;
//! let ctx = emm::Context::on_device(0)?;
//! let manager = emm::memory_manager(&ctx)?;
//! let block = manager.memalloc(1 << 20)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Arc, Once};

pub use emm_core::{
    self as core, memory_manager, register_manager, set_memory_manager, DeviceAllocation, EmmError,
    MemoryManager, Result, Router,
};
pub use emm_driver::{self as driver, Context, Device, Stream};
pub use {emm_default, emm_hostonly, emm_pool};

/// The names of the built-in managers.
pub const BUILTIN_MANAGERS: &[&str] = &["default", "pool", "hostonly"];

/// Registers `default`, `pool` and `hostonly` in the process-wide router (once;
/// later calls do nothing). Never touches the driver.
pub fn register_builtin_managers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| register_builtins_in(Router::global()));
}

/// Registers the built-in managers in `router`.
pub fn register_builtins_in(router: &Router) {
    router.register(
        "default",
        |ctx: &Context| -> Result<Arc<dyn MemoryManager>> {
            Ok(Arc::new(emm_default::DefaultManager::new(ctx)?))
        },
    );
    router.register("pool", |ctx: &Context| -> Result<Arc<dyn MemoryManager>> {
        Ok(Arc::new(emm_pool::PoolManager::new(ctx)?))
    });
    router.register(
        "hostonly",
        |ctx: &Context| -> Result<Arc<dyn MemoryManager>> {
            Ok(Arc::new(emm_hostonly::HostOnlyManager::new(ctx)?))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_registered_without_touching_the_driver() {
        let r = Router::new();
        register_builtins_in(&r);
        assert_eq!(r.known(), vec!["default", "hostonly", "pool"]);
        r.set_memory_manager("pool").unwrap();
        let e = r.set_memory_manager("rmm").unwrap_err();
        assert!(
            e.to_string()
                .contains("known managers: default, hostonly, pool"),
            "{e}"
        );
    }
}

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
