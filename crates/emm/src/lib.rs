//! emm: choose and share the CUDA memory manager of a program.
//!
//! This crate wires the built-in managers into the process-wide router of
//! `emm-core`: `default` ([`emm_default::DefaultManager`]), `pool`
//! ([`emm_pool::PoolManager`]) and `hostonly` ([`emm_hostonly::HostOnlyManager`]).
//! Without a choice the manager is `pool` (the same default in Rust, C, Python and
//! PyTorch). `EMM_MEMORY_MANAGER=default|pool|hostonly` picks one;
//! [`set_memory_manager`] picks one in code (the variable wins, with a warning).
//! [`configure`] sets any `EMM_*` setting in code before the first allocation
//! (keys in [`emm_core::config::KEYS`]; the environment wins here too).
//!
//! ```no_run
//! emm::configure("pool_limit", "8589934592")?; // or EMM_POOL_LIMIT
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

/// Sets configuration key `key` to `value` before the first allocation (see
/// [`emm_core::config`]): registers the built-in managers first, so
/// `configure("manager", "hostonly")` works without another call.
///
/// Errors: [`EmmError::InvalidConfig`], [`EmmError::UnknownManager`],
/// [`EmmError::AlreadyInUse`], [`EmmError::ConfiguredTooLate`].
pub fn configure(key: &str, value: &str) -> Result<()> {
    register_builtin_managers();
    emm_core::config::configure(key, value)
}

/// The pool's configuration: [`emm_pool::PoolConfig`]'s defaults with
/// `EMM_POOL_EXPANDABLE` and `EMM_POOL_LIMIT` read through
/// [`emm_core::config::var`] (the environment, else [`configure`]).
pub fn pool_config() -> Result<emm_pool::PoolConfig> {
    use emm_core::config::var;
    let mut c = emm_pool::PoolConfig::default();
    if let Ok(v) = var("EMM_POOL_EXPANDABLE") {
        c.segments.expandable = match v.trim().to_ascii_lowercase().as_str() {
            "" | "1" | "true" | "yes" => true,
            "0" | "false" | "no" => false,
            _ => {
                return Err(EmmError::InvalidConfig {
                    name: "EMM_POOL_EXPANDABLE".into(),
                    value: v,
                    reason: "expected 0 or 1".into(),
                })
            }
        };
    }
    if let Ok(v) = var("EMM_POOL_LIMIT") {
        if !v.trim().is_empty() {
            c.limit = Some(v.trim().parse().map_err(|_| EmmError::InvalidConfig {
                name: "EMM_POOL_LIMIT".into(),
                value: v.clone(),
                reason: "expected a number of bytes".into(),
            })?);
        }
    }
    Ok(c)
}

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
        Ok(Arc::new(emm_pool::PoolManager::with_config(
            emm_pool::PoolUpstream::Driver(ctx.clone()),
            pool_config()?,
        )?))
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
        // Without a choice (and without EMM_MEMORY_MANAGER): the pool.
        let r = Router::new();
        register_builtins_in(&r);
        if std::env::var_os(emm_core::MANAGER_ENV).is_none() {
            assert_eq!(r.selected().unwrap(), "pool");
        }
    }

    #[test]
    fn configured_pool_settings_reach_the_pool_config() {
        // This is the only test of this binary that touches the global config.
        if std::env::var_os("EMM_POOL_LIMIT").is_some()
            || std::env::var_os("EMM_POOL_EXPANDABLE").is_some()
        {
            return;
        }
        assert_eq!(pool_config().unwrap().limit, None);
        configure("pool_limit", "1048576").unwrap();
        configure("pool_expandable", "false").unwrap();
        let c = pool_config().unwrap();
        assert_eq!(c.limit, Some(1 << 20));
        assert!(!c.segments.expandable);
        let e = configure("pool_limit", "a lot").unwrap_err();
        assert!(matches!(e, EmmError::InvalidConfig { .. }), "{e}");
        let e = configure("manager", "rmm").unwrap_err();
        assert!(matches!(e, EmmError::UnknownManager { .. }), "{e}");
    }
}

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
