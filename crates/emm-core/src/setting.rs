//! Typed settings: a [`Setting<T>`] is declared once, in the crate whose code
//! reads it (the pool's limit in `emm-pool`), with its key, its environment
//! variable, its documentation and its parser. The crate lists its settings in
//! one slice that its manager's factory hands to the router
//! ([`ManagerFactory::settings`](crate::ManagerFactory::settings)), which declares
//! them in the process-wide store ([`Config`](crate::config::Config)); C and Python
//! read the list of keys through `emm_setting_info`.
//!
//! This file holds the declaration and the parsers; the store (`config_store.rs`,
//! which also reads a setting's value: [`Setting::value`]) and
//! [`configure`](crate::config::configure) hold the rest (the environment wins;
//! before the first manager only, unless the setting is declared
//! [`Key::at_run_time`]).

use std::any::Any;
use std::sync::Arc;

use crate::units::parse_bytes;

/// What a setting's value is (how C and Python convert their values to its text).
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

impl ValueKind {
    /// The kind's name as C and Python read it: `manager`, `bytes`,
    /// `bytes_or_max`, `bool`, `count` or `ratio`.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Manager => "manager",
            ValueKind::Bytes => "bytes",
            ValueKind::BytesOrMax => "bytes_or_max",
            ValueKind::Bool => "bool",
            ValueKind::Count => "count",
            ValueKind::Ratio => "ratio",
        }
    }

    /// Validates `value` and returns its canonical text (what the store keeps and
    /// compares): bytes as a decimal count, booleans as `0`/`1`, ratios as the
    /// shortest text of their number (`0.20` and `2e-1` are `0.2`).
    pub fn canonical(self, value: &str) -> core::result::Result<String, String> {
        let v = value.trim();
        match self {
            ValueKind::Manager => parse::name(v),
            ValueKind::Bytes => parse::bytes(v).map(|n| n.to_string()),
            ValueKind::BytesOrMax => parse::bytes_or_max(v).map(|n| match n {
                usize::MAX => "max".to_owned(),
                n => n.to_string(),
            }),
            ValueKind::Bool => parse::flag(v).map(|b| if b { "1" } else { "0" }.to_owned()),
            ValueKind::Count => parse::count(v).map(|n| n.to_string()),
            ValueKind::Ratio => parse::ratio(v).map(|r| r.to_string()),
        }
    }
}

/// What a setting is, without its type: the key of
/// [`configure`](crate::config::configure) (and `emm_configure`), the environment
/// variable that overrides it, its kind, its default as shown to users, whether
/// it may change while managers serve, and its documentation.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Key {
    /// The key of `configure`.
    pub name: &'static str,
    /// The environment variable that overrides it.
    pub env: &'static str,
    /// What the value is.
    pub kind: ValueKind,
    /// The default, as users write it (`""`: none, e.g. "the device's memory").
    pub default: &'static str,
    /// Whether `configure` may change it after the first manager was created
    /// (the managers are told: [`MemoryManager::setting_changed`]).
    ///
    /// [`MemoryManager::setting_changed`]: crate::MemoryManager::setting_changed
    pub runtime: bool,
    /// What it does.
    pub doc: &'static str,
}

impl Key {
    /// A key read when managers are created.
    pub const fn new(
        name: &'static str,
        env: &'static str,
        kind: ValueKind,
        default: &'static str,
        doc: &'static str,
    ) -> Key {
        Key {
            name,
            env,
            kind,
            default,
            runtime: false,
            doc,
        }
    }

    /// The same key, which `configure` may also change while managers serve.
    pub const fn at_run_time(self) -> Key {
        Key {
            runtime: true,
            ..self
        }
    }
}

/// A setting of type `T`, declared as a `static` by the crate that reads it:
///
/// ```
/// use emm_core::setting::{Key, Setting, ValueKind};
///
/// /// Bytes the example keeps.
/// pub static KEEP: Setting<usize> = Setting::new(
///     Key::new("example_keep", "EMM_EXAMPLE_KEEP", ValueKind::Bytes, "0", "bytes the example keeps"),
///     emm_core::setting::parse::bytes,
/// );
/// // The environment's value, else the one configured in code, else the default.
/// assert_eq!(KEEP.get(0).unwrap(), 0);
/// ```
pub struct Setting<T: 'static> {
    key: Key,
    pub(crate) parse: fn(&str) -> core::result::Result<T, String>,
}

impl<T: 'static> core::fmt::Debug for Setting<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Setting").field(&self.key).finish()
    }
}

impl<T: Clone + Send + Sync + 'static> Setting<T> {
    /// The setting `key`, whose text `parse` turns into a value (an `Err` says
    /// what was expected).
    pub const fn new(key: Key, parse: fn(&str) -> core::result::Result<T, String>) -> Setting<T> {
        Setting { key, parse }
    }

    /// Its key.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

/// A setting whatever its type: what the store and the router hold.
pub trait AnySetting: Sync {
    /// Its key.
    fn key(&self) -> &Key;
    /// `value` parsed (trimmed first), as the store keeps it.
    fn parse_any(&self, value: &str) -> core::result::Result<Arc<dyn Any + Send + Sync>, String>;
}

impl<T: Clone + Send + Sync + 'static> AnySetting for Setting<T> {
    fn key(&self) -> &Key {
        &self.key
    }

    fn parse_any(&self, value: &str) -> core::result::Result<Arc<dyn Any + Send + Sync>, String> {
        (self.parse)(value.trim()).map(|v| Arc::new(v) as Arc<dyn Any + Send + Sync>)
    }
}

/// The parsers of the usual kinds (each takes trimmed text; the error says what
/// was expected).
pub mod parse {
    use super::parse_bytes;

    /// A number of bytes, with binary units (`8G`, `512MiB`, `1.5g`).
    pub fn bytes(v: &str) -> Result<usize, String> {
        parse_bytes(v).and_then(|n| {
            usize::try_from(n).map_err(|_| "larger than this machine can address".to_owned())
        })
    }

    /// [`bytes`], or `max` (`usize::MAX`).
    pub fn bytes_or_max(v: &str) -> Result<usize, String> {
        if v.eq_ignore_ascii_case("max") {
            return Ok(usize::MAX);
        }
        bytes(v).map_err(|e| format!("{e}, or `max`"))
    }

    /// [`bytes`] as `Some`, or `max` (`None`: no bound).
    pub fn bound(v: &str) -> Result<Option<usize>, String> {
        bytes_or_max(v).map(|n| (n != usize::MAX).then_some(n))
    }

    /// `1`/`true`/`yes` or `0`/`false`/`no` (any case).
    pub fn flag(v: &str) -> Result<bool, String> {
        match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" => Ok(true),
            "0" | "false" | "no" => Ok(false),
            _ => Err("expected 0 or 1".to_owned()),
        }
    }

    /// A non-negative integer.
    pub fn count(v: &str) -> Result<usize, String> {
        v.parse::<usize>()
            .map_err(|_| "expected a non-negative integer".to_owned())
    }

    /// A number between 0 and 1.
    pub fn ratio(v: &str) -> Result<f64, String> {
        match v.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err("expected a number between 0 and 1".to_owned()),
        }
    }

    /// A name that is not empty.
    pub fn name(v: &str) -> Result<String, String> {
        if v.is_empty() {
            Err("expected a manager name".to_owned())
        } else {
            Ok(v.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_canonicalize_and_explain() {
        assert_eq!(ValueKind::Bytes.canonical(" 1.5G ").unwrap(), "1610612736");
        assert_eq!(ValueKind::BytesOrMax.canonical("MAX").unwrap(), "max");
        assert_eq!(ValueKind::Bool.canonical("Yes").unwrap(), "1");
        assert_eq!(ValueKind::Count.canonical("7").unwrap(), "7");
        // One number, one text: a value in effect written another way is the
        // same value (it was refused after first use as a change).
        for v in ["0.2", "0.20", " 2e-1", "0.200000"] {
            assert_eq!(ValueKind::Ratio.canonical(v).unwrap(), "0.2", "{v}");
        }
        assert_eq!(ValueKind::Ratio.canonical("1").unwrap(), "1");
        assert!(ValueKind::Ratio
            .canonical("1.5")
            .unwrap_err()
            .contains("between 0 and 1"));
        assert!(ValueKind::Bytes.canonical("-1").is_err());
        assert!(ValueKind::Manager.canonical(" ").is_err());
        assert!(parse::bound("none").is_err(), "as configure refuses it");
        assert_eq!(parse::bound("max").unwrap(), None);
        assert_eq!(parse::bound("2M").unwrap(), Some(2 << 20));
        assert!(parse::bytes_or_max("lots")
            .unwrap_err()
            .ends_with("or `max`"));
    }

    static SAMPLE: Setting<usize> = Setting::new(
        Key::new(
            "sample_setting_test",
            "EMM_SAMPLE_SETTING_TEST",
            ValueKind::Bytes,
            "0",
            "a test's",
        ),
        parse::bytes,
    );

    #[test]
    fn a_setting_reads_the_environment_first() {
        assert_eq!(SAMPLE.get(5).unwrap(), 5);
        std::env::set_var("EMM_SAMPLE_SETTING_TEST", "2K");
        assert_eq!(SAMPLE.value().unwrap(), Some(2048));
        std::env::set_var("EMM_SAMPLE_SETTING_TEST", "two");
        let e = SAMPLE.value().unwrap_err();
        assert!(
            e.to_string().starts_with(
                "invalid value \"two\" for EMM_SAMPLE_SETTING_TEST: expected a number"
            ),
            "{e}"
        );
        std::env::set_var("EMM_SAMPLE_SETTING_TEST", "");
        assert_eq!(SAMPLE.value().unwrap(), None);
        std::env::remove_var("EMM_SAMPLE_SETTING_TEST");
    }
}
