//! The configuration keys ([`KEYS`]) and the store of values configured in code
//! ([`Config`]), read through [`var`]. Its public face is [`crate::config`], which
//! re-exports all of it beside [`configure`](crate::config::configure).
//!
//! This file is apart from `config.rs` so that the router, which closes the store
//! when it creates its first manager, depends on the store alone, and `configure`,
//! which hands the `manager` key to the router, sits above both.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::error::{EmmError, Result};
use crate::units::parse_bytes;

/// The environment variable that selects a manager by name.
pub const MANAGER_ENV: &str = "EMM_MEMORY_MANAGER";

/// What a key's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueKind {
    /// The name of a registered manager.
    Manager,
    /// A number of bytes.
    Bytes,
    /// A number of bytes, or `max`.
    BytesOrMax,
    /// `1`/`true`/`yes` or `0`/`false`/`no`.
    Bool,
    /// A non-negative integer.
    Count,
    /// A number between 0 and 1.
    Ratio,
}

/// One configuration key and the environment variable it mirrors.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// The key of [`configure`](crate::config::configure) (and `emm_configure`).
    pub name: &'static str,
    /// The environment variable that overrides it.
    pub env: &'static str,
    /// What the value is.
    pub kind: ValueKind,
    /// What it does.
    pub doc: &'static str,
}

/// Every key, in the order the documentation lists them.
pub const KEYS: &[Key] = &[
    Key {
        name: "manager",
        env: MANAGER_ENV,
        kind: ValueKind::Manager,
        doc: "the manager of every device: `pool` (the default), `default` or `hostonly`",
    },
    Key {
        name: "pool_limit",
        env: "EMM_POOL_LIMIT",
        kind: ValueKind::Bytes,
        doc: "largest number of bytes the pool reserves per device",
    },
    Key {
        name: "pool_expandable",
        env: "EMM_POOL_EXPANDABLE",
        kind: ValueKind::Bool,
        doc: "large pool blocks in one expandable segment over CUDA virtual memory (0: legacy IPC for every block)",
    },
    Key {
        name: "pool_exportable",
        env: "EMM_POOL_EXPORTABLE",
        kind: ValueKind::Bool,
        doc: "pieces of the pool's expandable segment are created exportable, so its blocks export to other processes by file descriptor (`emm.numba_plugin` turns it on)",
    },
    Key {
        name: "pool_legacy_merge",
        env: "EMM_POOL_LEGACY_MERGE",
        kind: ValueKind::Count,
        doc: "without the expandable segment: n merges wholly free large segments into one when live bytes fall to 1/n of reserved after a new segment (0: off)",
    },
    Key {
        name: "pool_thread_cache",
        env: "EMM_POOL_THREAD_CACHE",
        kind: ValueKind::Bytes,
        doc: "bytes each thread keeps per stream for immediate reuse (0: no thread caches)",
    },
    Key {
        name: "hostonly_release_threshold",
        env: "EMM_HOSTONLY_RELEASE_THRESHOLD",
        kind: ValueKind::BytesOrMax,
        doc: "bytes the `hostonly` manager's pool keeps reserved at synchronization points (`max`: all)",
    },
    Key {
        name: "max_pending_deallocs_count",
        env: "EMM_MAX_PENDING_DEALLOCS_COUNT",
        kind: ValueKind::Count,
        doc: "queued frees (of the `default` manager and of pinned host memory) flushed past this count",
    },
    Key {
        name: "max_pending_deallocs_ratio",
        env: "EMM_MAX_PENDING_DEALLOCS_RATIO",
        kind: ValueKind::Ratio,
        doc: "queued frees flushed past this fraction of device memory",
    },
];

/// The key named `name` (its key or its environment variable).
pub fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name || k.env == name)
}

/// A store of configured values; most programs use the process-wide one
/// ([`Config::global`]) through [`configure`](crate::config::configure) and [`var`].
#[derive(Debug, Default)]
pub struct Config {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    values: BTreeMap<&'static str, String>,
    /// The manager whose creation closed configuration, if any.
    frozen_by: Option<String>,
}

impl Config {
    /// An empty store.
    pub fn new() -> Config {
        Config::default()
    }

    /// The process-wide store, read by the built-in managers and closed by the
    /// process-wide router's first manager.
    pub fn global() -> &'static Config {
        static GLOBAL: OnceLock<Config> = OnceLock::new();
        GLOBAL.get_or_init(Config::new)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `key` (a key name or its variable) to `value` after validating it.
    /// `manager` is not stored here: [`configure`](crate::config::configure) hands
    /// it to the router.
    ///
    /// Errors: [`EmmError::InvalidConfig`] for an unknown key or a bad value;
    /// [`EmmError::ConfiguredTooLate`] after [`Config::freeze`], unless the value is
    /// the one already in effect.
    pub fn set(&self, key_name: &str, value: &str) -> Result<()> {
        self.set_with_env(key_name, value, |k| std::env::var(k).ok())
    }

    fn set_with_env(
        &self,
        key_name: &str,
        value: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<()> {
        let k = key(key_name).ok_or_else(|| EmmError::InvalidConfig {
            name: key_name.to_owned(),
            value: value.to_owned(),
            reason: format!(
                "unknown configuration key; known keys: {}",
                KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
            ),
        })?;
        let value = normalize(k, value)?;
        let mut s = self.lock();
        if let Some(manager) = &s.frozen_by {
            let current = env(k.env).or_else(|| s.values.get(k.name).cloned());
            let same = current.is_some_and(|c| normalize(k, &c).is_ok_and(|c| c == value));
            if same {
                return Ok(());
            }
            return Err(EmmError::ConfiguredTooLate {
                key: k.name.to_owned(),
                manager: manager.clone(),
            });
        }
        if let Some(e) = env(k.env) {
            if normalize(k, &e).ok().as_deref() != Some(value.as_str()) {
                tracing::warn!(
                    key = k.name,
                    configured = %value,
                    environment = %e,
                    "{}={e} overrides configure({}={value})",
                    k.env,
                    k.name
                );
            }
        }
        s.values.insert(k.name, value);
        Ok(())
    }

    /// The configured value of the key whose variable is `env` (no environment).
    pub fn get(&self, env: &str) -> Option<String> {
        let k = key(env)?;
        self.lock().values.get(k.name).cloned()
    }

    /// Closes configuration: `manager` now serves. Returns `true` when this call
    /// closed it (`false`: it was closed already).
    pub fn freeze(&self, manager: &str) -> bool {
        let mut s = self.lock();
        if s.frozen_by.is_some() {
            return false;
        }
        s.frozen_by = Some(manager.to_owned());
        true
    }

    /// Reopens configuration (the manager whose creation closed it failed to start).
    pub fn thaw(&self) {
        self.lock().frozen_by = None;
    }

    /// The manager that closed configuration, if any.
    pub fn frozen_by(&self) -> Option<String> {
        self.lock().frozen_by.clone()
    }
}

/// Validates `value` for `k` and returns its canonical form.
pub(crate) fn normalize(k: &Key, value: &str) -> Result<String> {
    let v = value.trim();
    let bad = |reason: &str| EmmError::InvalidConfig {
        name: k.name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    match k.kind {
        ValueKind::Manager => {
            if v.is_empty() {
                Err(bad("expected a manager name"))
            } else {
                Ok(v.to_owned())
            }
        }
        ValueKind::Bytes => parse_bytes(v)
            .and_then(|n| {
                usize::try_from(n).map_err(|_| "larger than this machine can address".to_owned())
            })
            .map(|n| n.to_string())
            .map_err(|e| bad(&e)),
        ValueKind::BytesOrMax => match v {
            "max" => Ok("max".to_owned()),
            _ => parse_bytes(v)
                .map(|n| n.to_string())
                .map_err(|e| bad(&format!("{e}, or `max`"))),
        },
        ValueKind::Bool => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" => Ok("1".to_owned()),
            "0" | "false" | "no" => Ok("0".to_owned()),
            _ => Err(bad("expected 0 or 1")),
        },
        ValueKind::Count => v
            .parse::<usize>()
            .map(|n| n.to_string())
            .map_err(|_| bad("expected a non-negative integer")),
        ValueKind::Ratio => match v.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(v.to_owned()),
            _ => Err(bad("expected a number between 0 and 1")),
        },
    }
}

/// The value of configuration variable `env` (e.g. `EMM_POOL_LIMIT`): the
/// environment's when set, else the one configured in code (on
/// [`Config::global`]). A drop-in for `std::env::var` in a manager's `from_env`.
pub fn var(env: &str) -> core::result::Result<String, std::env::VarError> {
    match std::env::var(env) {
        Err(std::env::VarError::NotPresent) => Config::global()
            .get(env)
            .ok_or(std::env::VarError::NotPresent),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn values_are_validated_and_canonical() {
        let c = Config::new();
        c.set_with_env("pool_limit", " 1024 ", no_env).unwrap();
        assert_eq!(c.get("EMM_POOL_LIMIT").as_deref(), Some("1024"));
        c.set_with_env("EMM_POOL_EXPANDABLE", "False", no_env)
            .unwrap();
        assert_eq!(c.get("EMM_POOL_EXPANDABLE").as_deref(), Some("0"));
        c.set_with_env("hostonly_release_threshold", "max", no_env)
            .unwrap();
        c.set_with_env("max_pending_deallocs_ratio", "0.5", no_env)
            .unwrap();
        let e = c.set_with_env("pool_limit", "-1", no_env).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid value \"-1\" for pool_limit: expected a number of bytes"),
            "{e}"
        );
        // Sizes take binary units, stored as bytes.
        c.set_with_env("pool_limit", "1.5G", no_env).unwrap();
        assert_eq!(c.get("EMM_POOL_LIMIT").as_deref(), Some("1610612736"));
        let e = c
            .set_with_env("max_pending_deallocs_ratio", "1.5", no_env)
            .unwrap_err();
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        let e = c.set_with_env("pool_limti", "1", no_env).unwrap_err();
        assert!(
            e.to_string().contains("known keys: manager, pool_limit"),
            "{e}"
        );
        assert!(matches!(e, EmmError::InvalidConfig { .. }));
    }

    #[test]
    fn configuration_closes_at_first_use_except_for_the_value_in_effect() {
        let c = Config::new();
        c.set_with_env("pool_limit", "4096", no_env).unwrap();
        assert!(c.freeze("pool"));
        assert!(!c.freeze("pool"));
        let e = c.set_with_env("pool_limit", "8192", no_env).unwrap_err();
        assert!(matches!(e, EmmError::ConfiguredTooLate { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "cannot configure `pool_limit`: manager `pool` has already been created in this process; configure before the first allocation"
        );
        // The value in effect (in code or from the environment) is accepted.
        c.set_with_env("pool_limit", "4096", no_env).unwrap();
        c.set_with_env("pool_expandable", "1", |_| Some("yes".into()))
            .unwrap();
        c.thaw();
        c.set_with_env("pool_limit", "8192", no_env).unwrap();
        assert_eq!(c.frozen_by(), None);
    }

    #[test]
    fn every_key_names_an_emm_variable() {
        for k in KEYS {
            assert!(k.env.starts_with("EMM_"), "{k:?}");
            assert_eq!(key(k.env).map(|f| f.name), Some(k.name));
        }
    }
}
