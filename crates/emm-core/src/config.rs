//! Configuration in code beside the environment: [`configure`], over typed
//! settings declared by the crates that read them ([`crate::setting`]).
//!
//! Every setting has a key that a program may set with
//! `emm::configure("pool_limit", "8G")`, the C ABI's `emm_configure` or Python's
//! `emm.configure(pool_limit=...)`, and an `EMM_*` environment variable. A manager
//! reads a setting through [`Setting::value`](crate::setting::Setting::value),
//! which returns the environment's value when the variable is set and the
//! configured one otherwise:
//!
//! - **The environment wins** (as `EMM_MEMORY_MANAGER` wins over
//!   `set_memory_manager` in NBEP 7): a value configured in code that the
//!   environment overrides is reported by a `tracing` warning.
//! - **Before first use**: once the process-wide router has created a manager,
//!   [`configure`] fails with [`EmmError::ConfiguredTooLate`] (setting the value
//!   already in effect is accepted and does nothing), except for the settings
//!   declared [`Key::at_run_time`]: those change at once, and every manager is
//!   told ([`MemoryManager::setting_changed`]).
//! - **Validated and parsed at once**: a value that does not parse is an
//!   [`EmmError::InvalidConfig`] from [`configure`], not from the first
//!   allocation; the store keeps the parsed value.
//! - **Declared by their owners**: the store knows the keys of the managers
//!   registered in the router ([`ManagerFactory::settings`]); `emm::configure`
//!   registers the built-in ones first.
//!
//! [`EmmError::ConfiguredTooLate`]: crate::EmmError::ConfiguredTooLate
//! [`EmmError::InvalidConfig`]: crate::EmmError::InvalidConfig
//! [`MemoryManager::setting_changed`]: crate::MemoryManager::setting_changed
//! [`ManagerFactory::settings`]: crate::ManagerFactory::settings

use crate::error::{EmmError, Result};
use crate::router::Router;
use crate::setting::ValueKind;

// The store lives in `config_store.rs`, below the router, which closes it; this
// file adds `configure`, which hands `manager` to the router and tells managers
// of run-time changes.
pub use crate::config_store::{Applied, Config, MANAGER, MANAGER_ENV};
pub use crate::setting::{AnySetting, Key, Setting};

/// Sets configuration key `key_name` (a key of [`Config::keys`]; the variable's
/// name is accepted too) to `value`.
///
/// `manager` goes to [`Router::set_memory_manager`] of the process-wide router (so
/// the name must be registered: call `emm::register_builtin_managers` first, or use
/// `emm::configure`); the others are stored in [`Config::global`], where managers
/// read them when they are created. A run-time setting set while managers serve is
/// handed to each of them.
///
/// Errors: [`EmmError::InvalidConfig`] (unknown key, bad value),
/// [`EmmError::UnknownManager`], [`EmmError::AlreadyInUse`] (another manager has
/// served), [`EmmError::ConfiguredTooLate`] (a manager has been created and the
/// setting is not a run-time one), or a manager's error applying a run-time change.
pub fn configure(key_name: &str, value: &str) -> Result<()> {
    let config = Config::global();
    match config.key(key_name) {
        Some(k) if k.kind == ValueKind::Manager => {
            Router::global().set_memory_manager(&manager_name(&k, value)?)
        }
        _ => match config.set(key_name, value)? {
            Applied::AtRunTime => {
                let name = config.key(key_name).map_or(key_name, |k| k.name);
                Router::global().setting_changed(name)
            }
            _ => Ok(()),
        },
    }
}

/// Whether [`configure`] would take `value` for `key_name`: a known key, a value
/// that parses, and for `manager` a registered name ([`EmmError::InvalidConfig`],
/// [`EmmError::UnknownManager`]). Nothing is applied; whether a manager has been
/// created, which may refuse a change ([`EmmError::ConfiguredTooLate`],
/// [`EmmError::AlreadyInUse`]), is not asked. A caller with several settings
/// checks them all first, so that a bad one applies none.
pub fn check(key_name: &str, value: &str) -> Result<()> {
    let config = Config::global();
    match config.key(key_name) {
        Some(k) if k.kind == ValueKind::Manager => {
            Router::global().check_known(&manager_name(&k, value)?)
        }
        _ => config.check(key_name, value),
    }
}

/// The manager's name `value` gives for key `k` (of kind `Manager`), as
/// [`configure`] and [`check`] read it.
fn manager_name(k: &Key, value: &str) -> Result<String> {
    k.kind
        .canonical(value)
        .map_err(|reason| EmmError::InvalidConfig {
            name: k.name.to_owned(),
            value: value.to_owned(),
            reason,
        })
}
