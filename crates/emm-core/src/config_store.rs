//! The store of settings ([`Config`]): the settings declared by the registered
//! managers' crates (see [`crate::setting`]), the values configured in code, and
//! the freeze at the first manager. Its public face is [`crate::config`], which
//! re-exports it beside [`configure`](crate::config::configure).
//!
//! This file is apart from `config.rs` so that the router, which closes the store
//! when it creates its first manager, depends on the store alone, and `configure`,
//! which hands the `manager` key to the router and tells managers of run-time
//! changes, sits above both.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{EmmError, Result};
use crate::setting::{parse, AnySetting, Key, Setting, ValueKind};

/// The environment variable that selects a manager by name.
pub const MANAGER_ENV: &str = "EMM_MEMORY_MANAGER";

/// `manager`: the router's own setting, declared in every store.
pub static MANAGER: Setting<String> = Setting::new(
    Key::new(
        "manager",
        MANAGER_ENV,
        ValueKind::Manager,
        "pool",
        "the manager of every device: `pool` (the default), `default` or `hostonly`",
    ),
    parse::name,
);

/// A store of declared settings and of the values configured in code; most
/// programs use the process-wide one ([`Config::global`]) through
/// [`configure`](crate::config::configure) and [`Setting::value`].
#[derive(Default)]
pub struct Config {
    state: Mutex<State>,
}

impl core::fmt::Debug for Config {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = self.lock();
        f.debug_struct("Config")
            .field(
                "keys",
                &s.declared.iter().map(|d| d.key().name).collect::<Vec<_>>(),
            )
            .field(
                "values",
                &s.values
                    .iter()
                    .map(|(k, v)| (*k, &v.text))
                    .collect::<Vec<_>>(),
            )
            .field("frozen_by", &s.frozen_by)
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// Every declared setting, in declaration order (`manager` first).
    declared: Vec<&'static dyn AnySetting>,
    values: BTreeMap<&'static str, Stored>,
    /// The manager whose creation closed configuration, if any.
    frozen_by: Option<String>,
}

/// A value configured in code: its canonical text and its parsed value.
struct Stored {
    text: String,
    value: Arc<dyn Any + Send + Sync>,
}

/// What [`Config::set`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// Stored before any manager: managers read it when they are created.
    BeforeUse,
    /// The value already in effect: nothing changed.
    Unchanged,
    /// A run-time setting changed while managers serve: they must be told.
    AtRunTime,
}

impl Config {
    /// A store that knows only `manager`.
    pub fn new() -> Config {
        let c = Config::default();
        c.declare(&[&MANAGER]);
        c
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

    /// Declares `settings` (a setting declared already, by key, is kept once).
    pub fn declare(&self, settings: &[&'static dyn AnySetting]) {
        let mut s = self.lock();
        for &d in settings {
            if !s.declared.iter().any(|k| k.key().name == d.key().name) {
                s.declared.push(d);
            }
        }
    }

    /// Every declared key, in declaration order.
    pub fn keys(&self) -> Vec<Key> {
        self.lock().declared.iter().map(|d| *d.key()).collect()
    }

    /// The declared key named `name` (its key or its environment variable).
    pub fn key(&self, name: &str) -> Option<Key> {
        Self::find(&self.lock(), name).map(|d| *d.key())
    }

    fn find(s: &State, name: &str) -> Option<&'static dyn AnySetting> {
        s.declared
            .iter()
            .copied()
            .find(|d| d.key().name == name || d.key().env == name)
    }

    /// Sets `key` (a key name or its variable) to `value` after validating it.
    /// `manager` is not stored here: [`configure`](crate::config::configure) hands
    /// it to the router.
    ///
    /// Errors: [`EmmError::InvalidConfig`] for an unknown key or a bad value;
    /// [`EmmError::ConfiguredTooLate`] after [`Config::freeze`], unless the value is
    /// the one already in effect or the key is a run-time one.
    pub fn set(&self, key_name: &str, value: &str) -> Result<Applied> {
        self.set_with_env(key_name, value, |k| std::env::var(k).ok())
    }

    /// Whether [`set`](Self::set) would take `value` for `key_name`: a known key
    /// and a value that parses. Nothing is stored, and whether a manager has
    /// been created (which may refuse the change) is not asked.
    pub fn check(&self, key_name: &str, value: &str) -> Result<()> {
        let s = self.lock();
        Self::validated(&s, key_name, value).map(|_| ())
    }

    /// The key of `key_name` with `value` validated: its canonical text and its
    /// parsed value; [`EmmError::InvalidConfig`] for an unknown key or a value
    /// that does not parse.
    fn validated(
        s: &State,
        key_name: &str,
        value: &str,
    ) -> Result<(Key, String, Arc<dyn Any + Send + Sync>)> {
        let d = Self::find(s, key_name).ok_or_else(|| EmmError::InvalidConfig {
            name: key_name.to_owned(),
            value: value.to_owned(),
            reason: format!(
                "unknown configuration key; known keys: {}",
                s.declared
                    .iter()
                    .map(|d| d.key().name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
        let k = *d.key();
        let bad = |reason: String| EmmError::InvalidConfig {
            name: k.name.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let text = k.kind.canonical(value).map_err(bad)?;
        let parsed = d.parse_any(value).map_err(bad)?;
        Ok((k, text, parsed))
    }

    fn set_with_env(
        &self,
        key_name: &str,
        value: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Applied> {
        let mut s = self.lock();
        let (k, text, parsed) = Self::validated(&s, key_name, value)?;
        let from_env = env(k.env).filter(|e| !e.trim().is_empty());
        let env_text = from_env.as_ref().map(|e| k.kind.canonical(e));
        if let Some(manager) = s.frozen_by.clone() {
            // In effect: the environment's, else the configured, else the default.
            let current = match &env_text {
                Some(e) => e.clone().ok(),
                None => s
                    .values
                    .get(k.name)
                    .map(|v| v.text.clone())
                    .or_else(|| k.kind.canonical(k.default).ok()),
            };
            if current.as_deref() == Some(text.as_str()) {
                return Ok(Applied::Unchanged);
            }
            if !k.runtime {
                return Err(EmmError::ConfiguredTooLate {
                    key: k.name.to_owned(),
                    manager,
                });
            }
        }
        if let (Some(e), Some(e_text)) = (&from_env, &env_text) {
            if e_text.as_deref().ok() != Some(text.as_str()) {
                tracing::warn!(
                    key = k.name,
                    configured = %text,
                    environment = %e,
                    "{}={e} overrides configure({}={text})",
                    k.env,
                    k.name
                );
            }
        }
        let applied = if s.frozen_by.is_some() {
            Applied::AtRunTime
        } else {
            Applied::BeforeUse
        };
        s.values.insert(
            k.name,
            Stored {
                text,
                value: parsed,
            },
        );
        Ok(applied)
    }

    /// The configured text of the key named `name` (its key or its variable; the
    /// environment is not read).
    pub fn get(&self, name: &str) -> Option<String> {
        let s = self.lock();
        let d = Self::find(&s, name)?;
        s.values.get(d.key().name).map(|v| v.text.clone())
    }

    /// The configured value of the key named `name`, as parsed when it was set.
    pub(crate) fn typed(&self, name: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.lock().values.get(name).map(|v| v.value.clone())
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

/// Reading a setting's value: here, beside the store it falls back to.
impl<T: Clone + Send + Sync + 'static> Setting<T> {
    /// The value in effect: the environment variable's when it is set and not
    /// empty (parsed here), else the one configured in code (parsed when it was
    /// configured), else `None`.
    ///
    /// Errors: [`EmmError::InvalidConfig`] naming the variable, when its value
    /// does not parse.
    pub fn value(&self) -> Result<Option<T>> {
        if let Some(os) = std::env::var_os(self.key().env) {
            // Not UTF-8 is not "unset": it is said, as a value that does not
            // parse is.
            let v = os.into_string().map_err(|os| EmmError::InvalidConfig {
                name: self.key().env.to_owned(),
                value: os.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".to_owned(),
            })?;
            if !v.trim().is_empty() {
                return (self.parse)(v.trim()).map(Some).map_err(|reason| {
                    EmmError::InvalidConfig {
                        name: self.key().env.to_owned(),
                        value: v,
                        reason,
                    }
                });
            }
        }
        Ok(Config::global()
            .typed(self.key().name)
            .and_then(|v| v.downcast_ref::<T>().cloned()))
    }

    /// [`Setting::value`], or `default` when the setting is not set.
    pub fn get(&self, default: T) -> Result<T> {
        Ok(self.value()?.unwrap_or(default))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// A variable whose value is not UTF-8 is an error naming it, not unset
    /// (the configured value or the default silently served before).
    #[test]
    fn a_variable_that_is_not_utf8_is_an_error_not_unset() {
        use std::os::unix::ffi::OsStrExt as _;
        static ODD: Setting<usize> = Setting::new(
            Key::new(
                "t_odd",
                "EMM_T_NOT_UTF8",
                ValueKind::Bytes,
                "",
                "a test size",
            ),
            parse::bytes,
        );
        std::env::set_var("EMM_T_NOT_UTF8", std::ffi::OsStr::from_bytes(b"1\xffG"));
        let e = ODD.value().unwrap_err();
        std::env::remove_var("EMM_T_NOT_UTF8");
        assert!(
            matches!(&e, EmmError::InvalidConfig { name, value, reason }
                if name == "EMM_T_NOT_UTF8" && value == "1\u{fffd}G" && reason.contains("UTF-8")),
            "{e}"
        );
        assert_eq!(ODD.value().unwrap(), None, "unset again");
    }

    static LIMIT: Setting<usize> = Setting::new(
        Key::new("t_limit", "EMM_T_LIMIT", ValueKind::Bytes, "", "a limit"),
        parse::bytes,
    );
    static FLAG: Setting<bool> = Setting::new(
        Key::new("t_flag", "EMM_T_FLAG", ValueKind::Bool, "1", "a flag"),
        parse::flag,
    );
    static LIVE: Setting<usize> = Setting::new(
        Key::new(
            "t_live",
            "EMM_T_LIVE",
            ValueKind::BytesOrMax,
            "max",
            "a run-time one",
        )
        .at_run_time(),
        parse::bytes_or_max,
    );

    fn store() -> Config {
        let c = Config::new();
        c.declare(&[&LIMIT, &FLAG, &LIVE, &LIMIT]);
        c
    }

    /// `check` says what `set` would say of a key and value, and stores nothing.
    #[test]
    fn a_check_validates_without_storing() {
        let c = store();
        c.check("t_limit", "2K").unwrap();
        c.check("EMM_T_FLAG", "true").unwrap();
        assert_eq!(c.get("t_limit"), None, "nothing stored");
        let e = c.check("t_limit", "banana").unwrap_err();
        assert!(matches!(e, EmmError::InvalidConfig { .. }), "{e}");
        assert!(e.to_string().contains("banana"), "{e}");
        let e = c.check("t_nothing", "1").unwrap_err();
        assert!(
            e.to_string().contains("known keys: manager, t_limit"),
            "{e}"
        );
    }

    #[test]
    fn values_are_validated_and_canonical() {
        let c = store();
        assert_eq!(
            c.keys().iter().map(|k| k.name).collect::<Vec<_>>(),
            ["manager", "t_limit", "t_flag", "t_live"],
            "declared once each, in order"
        );
        c.set_with_env("t_limit", " 1024 ", no_env).unwrap();
        assert_eq!(c.get("EMM_T_LIMIT").as_deref(), Some("1024"));
        let typed = c.typed("t_limit").unwrap();
        assert_eq!(typed.downcast_ref::<usize>(), Some(&1024));
        c.set_with_env("EMM_T_FLAG", "False", no_env).unwrap();
        assert_eq!(c.get("t_flag").as_deref(), Some("0"));
        assert_eq!(
            c.typed("t_flag").unwrap().downcast_ref::<bool>(),
            Some(&false)
        );
        c.set_with_env("t_live", "max", no_env).unwrap();
        assert_eq!(
            c.typed("t_live").unwrap().downcast_ref::<usize>(),
            Some(&usize::MAX)
        );
        let e = c.set_with_env("t_limit", "-1", no_env).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid value \"-1\" for t_limit: expected a number of bytes"),
            "{e}"
        );
        // Sizes take binary units, stored as bytes.
        c.set_with_env("t_limit", "1.5G", no_env).unwrap();
        assert_eq!(c.get("t_limit").as_deref(), Some("1610612736"));
        let e = c.set_with_env("t_limti", "1", no_env).unwrap_err();
        assert!(
            e.to_string()
                .contains("known keys: manager, t_limit, t_flag, t_live"),
            "{e}"
        );
        assert!(matches!(e, EmmError::InvalidConfig { .. }));
    }

    #[test]
    fn configuration_closes_at_first_use_except_for_the_value_in_effect() {
        let c = store();
        assert_eq!(
            c.set_with_env("t_limit", "4096", no_env).unwrap(),
            Applied::BeforeUse
        );
        assert!(c.freeze("pool"));
        assert!(!c.freeze("pool"));
        let e = c.set_with_env("t_limit", "8192", no_env).unwrap_err();
        assert!(matches!(e, EmmError::ConfiguredTooLate { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "cannot configure `t_limit`: manager `pool` has already been created in this process; configure before the first allocation"
        );
        // The value in effect (in code or from the environment) is accepted.
        assert_eq!(
            c.set_with_env("t_limit", "4K", no_env).unwrap(),
            Applied::Unchanged
        );
        assert_eq!(
            c.set_with_env("t_flag", "1", |_| Some("yes".into()))
                .unwrap(),
            Applied::Unchanged
        );
        // The default, when nothing else was set, is the value in effect too.
        assert_eq!(
            c.set_with_env("t_flag", "yes", no_env).unwrap(),
            Applied::Unchanged
        );
        let e = c.set_with_env("t_flag", "0", no_env).unwrap_err();
        assert!(matches!(e, EmmError::ConfiguredTooLate { .. }), "{e}");
        c.thaw();
        c.set_with_env("t_limit", "8192", no_env).unwrap();
        assert_eq!(c.frozen_by(), None);
    }

    #[test]
    fn a_run_time_setting_changes_after_the_freeze() {
        let c = store();
        c.freeze("pool");
        assert_eq!(
            c.set_with_env("t_live", "1M", no_env).unwrap(),
            Applied::AtRunTime
        );
        assert_eq!(
            c.typed("t_live").unwrap().downcast_ref::<usize>(),
            Some(&(1 << 20))
        );
        assert_eq!(
            c.set_with_env("t_live", "1024K", no_env).unwrap(),
            Applied::Unchanged
        );
        // The environment still wins: the value is stored, and the manager reads
        // the environment's.
        assert_eq!(
            c.set_with_env("t_live", "2M", |_| Some("3M".into()))
                .unwrap(),
            Applied::AtRunTime
        );
        let e = c.set_with_env("t_live", "lots", no_env).unwrap_err();
        assert!(matches!(e, EmmError::InvalidConfig { .. }), "{e}");
    }

    #[test]
    fn every_key_names_an_emm_variable() {
        let c = store();
        for k in c.keys() {
            assert!(k.env.starts_with("EMM_"), "{k:?}");
            assert_eq!(c.key(k.env).map(|f| f.name), Some(k.name));
        }
    }
}
