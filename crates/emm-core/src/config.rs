//! Configuration in code beside the environment: [`configure`] and [`var`].
//!
//! Every `EMM_*` variable has a key that a program may set before the first
//! allocation ([`KEYS`]): `emm::configure("pool_limit", "8589934592")`, the C ABI's
//! `emm_configure`, Python's `emm.configure(limit=...)`. Managers read their
//! configuration through [`var`], which returns the environment variable when it is
//! set and the configured value otherwise:
//!
//! - **The environment wins** (as `EMM_MEMORY_MANAGER` wins over
//!   `set_memory_manager` in NBEP 7): a value configured in code that the
//!   environment overrides is reported by a `tracing` warning.
//! - **Before first use only**: once the process-wide router has created a manager,
//!   [`configure`] fails with [`EmmError::ConfiguredTooLate`] (setting the value
//!   already in effect is accepted and does nothing).
//! - **Validated at once**: a value that does not parse is an
//!   [`EmmError::InvalidConfig`] from [`configure`], not from the first allocation.
//!
//! [`EmmError::ConfiguredTooLate`]: crate::EmmError::ConfiguredTooLate
//! [`EmmError::InvalidConfig`]: crate::EmmError::InvalidConfig

use crate::config_store::normalize;
use crate::error::Result;
use crate::router::Router;

// The keys and the store live in `config_store.rs`, below the router, which closes
// the store; this file adds `configure`, which hands `manager` to the router.
pub use crate::config_store::{key, var, Config, Key, ValueKind, KEYS};

/// Sets configuration key `key` (see [`KEYS`]; the variable's name is accepted too)
/// to `value`, before the first allocation of the process.
///
/// `manager` goes to [`Router::set_memory_manager`] of the process-wide router (so
/// the name must be registered: call `emm::register_builtin_managers` first, or use
/// `emm::configure`); the others are stored in [`Config::global`] and read by
/// managers through [`var`] when they are created.
///
/// Errors: [`EmmError::InvalidConfig`] (unknown key, bad value),
/// [`EmmError::UnknownManager`], [`EmmError::AlreadyInUse`] (another manager has
/// served), [`EmmError::ConfiguredTooLate`] (a manager has been created).
///
/// [`EmmError::InvalidConfig`]: crate::EmmError::InvalidConfig
/// [`EmmError::UnknownManager`]: crate::EmmError::UnknownManager
/// [`EmmError::AlreadyInUse`]: crate::EmmError::AlreadyInUse
/// [`EmmError::ConfiguredTooLate`]: crate::EmmError::ConfiguredTooLate
pub fn configure(key_name: &str, value: &str) -> Result<()> {
    match key(key_name) {
        Some(k) if k.kind == ValueKind::Manager => {
            Router::global().set_memory_manager(normalize(k, value)?.as_str())
        }
        _ => Config::global().set(key_name, value),
    }
}
