//! Configuration of the pending-deallocation queue, from a builder or the
//! environment.

use emm_core::{EmmError, Result};

/// `EMM_MAX_PENDING_DEALLOCS_COUNT`: flush when more frees than this are pending.
pub const COUNT_ENV: &str = "EMM_MAX_PENDING_DEALLOCS_COUNT";
/// `EMM_MAX_PENDING_DEALLOCS_RATIO`: flush when pending bytes exceed this fraction
/// of device memory.
pub const RATIO_ENV: &str = "EMM_MAX_PENDING_DEALLOCS_RATIO";

/// When queued frees are flushed (NBEP 7 / Numba's `_PendingDeallocs` rules): when
/// the count *exceeds* `max_count`, or the bytes *exceed* `max_ratio` × capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PendingConfig {
    /// Largest number of frees left pending (default 10).
    pub max_count: usize,
    /// Largest fraction of device memory left pending (default 0.2).
    pub max_ratio: f64,
}

impl Default for PendingConfig {
    fn default() -> Self {
        PendingConfig {
            max_count: 10,
            max_ratio: 0.2,
        }
    }
}

impl PendingConfig {
    /// The defaults, overridden by [`COUNT_ENV`] and [`RATIO_ENV`] when set, or by
    /// the values configured in code (`max_pending_deallocs_count` / `_ratio`, see
    /// [`emm_core::config`]) when not. An unparsable or out-of-range value is an
    /// error naming the variable.
    pub fn from_env() -> Result<PendingConfig> {
        Self::from_lookup(|k| emm_core::config::var(k).ok())
    }

    /// As [`PendingConfig::from_env`], with an explicit variable lookup.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<PendingConfig> {
        let mut c = PendingConfig::default();
        if let Some(v) = get(COUNT_ENV).filter(|v| !v.trim().is_empty()) {
            c.max_count = v.trim().parse().map_err(|_| EmmError::InvalidConfig {
                name: COUNT_ENV.into(),
                value: v.clone(),
                reason: "expected a non-negative integer".into(),
            })?;
        }
        if let Some(v) = get(RATIO_ENV).filter(|v| !v.trim().is_empty()) {
            let r: f64 = v.trim().parse().map_err(|_| EmmError::InvalidConfig {
                name: RATIO_ENV.into(),
                value: v.clone(),
                reason: "expected a number between 0 and 1".into(),
            })?;
            if !(0.0..=1.0).contains(&r) {
                return Err(EmmError::InvalidConfig {
                    name: RATIO_ENV.into(),
                    value: v,
                    reason: "expected a number between 0 and 1".into(),
                });
            }
            c.max_ratio = r;
        }
        Ok(c)
    }

    /// The byte threshold for a device of `capacity` bytes.
    pub fn max_bytes(&self, capacity: usize) -> usize {
        (capacity as f64 * self.max_ratio) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(
            PendingConfig::from_lookup(env(&[])).unwrap(),
            PendingConfig::default()
        );
        let c = PendingConfig::from_lookup(env(&[(COUNT_ENV, "3"), (RATIO_ENV, "0.5")])).unwrap();
        assert_eq!(
            c,
            PendingConfig {
                max_count: 3,
                max_ratio: 0.5
            }
        );
        assert_eq!(c.max_bytes(1000), 500);
    }

    #[test]
    fn invalid_values_name_the_variable() {
        let e = PendingConfig::from_lookup(env(&[(COUNT_ENV, "ten")])).unwrap_err();
        assert_eq!(e.to_string(), "invalid value \"ten\" for EMM_MAX_PENDING_DEALLOCS_COUNT: expected a non-negative integer");
        let e = PendingConfig::from_lookup(env(&[(RATIO_ENV, "1.5")])).unwrap_err();
        assert!(
            e.to_string().contains("EMM_MAX_PENDING_DEALLOCS_RATIO"),
            "{e}"
        );
        let e = PendingConfig::from_lookup(env(&[(RATIO_ENV, "NaN")])).unwrap_err();
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        assert!(PendingConfig::from_lookup(env(&[(COUNT_ENV, "-1")])).is_err());
    }
}
