//! Configuration of the pending-deallocation queue, from a builder or the
//! environment.

use emm_core::setting::{parse, AnySetting, Key, Setting, ValueKind};
use emm_core::Result;

/// `EMM_MAX_PENDING_DEALLOCS_COUNT`: flush when more frees than this are pending.
pub const COUNT_ENV: &str = "EMM_MAX_PENDING_DEALLOCS_COUNT";
/// `EMM_MAX_PENDING_DEALLOCS_RATIO`: flush when pending bytes exceed this fraction
/// of device memory.
pub const RATIO_ENV: &str = "EMM_MAX_PENDING_DEALLOCS_RATIO";

/// `max_pending_deallocs_count` ([`COUNT_ENV`]).
pub static MAX_COUNT: Setting<usize> = Setting::new(
    Key::new(
        "max_pending_deallocs_count",
        COUNT_ENV,
        ValueKind::Count,
        "10",
        "queued frees (of the `default` manager and of pinned host memory) flushed past this count",
    ),
    parse::count,
);

/// `max_pending_deallocs_ratio` ([`RATIO_ENV`]).
pub static MAX_RATIO: Setting<f64> = Setting::new(
    Key::new(
        "max_pending_deallocs_ratio",
        RATIO_ENV,
        ValueKind::Ratio,
        "0.2",
        "queued frees flushed past this fraction of device memory",
    ),
    parse::ratio,
);

/// The settings of the pending-deallocation queue: every manager that composes
/// [`HostOnly`](crate::HostOnly) or queues frees declares them.
pub static SETTINGS: &[&dyn AnySetting] = &[&MAX_COUNT, &MAX_RATIO];

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
    /// The defaults, overridden by [`MAX_COUNT`] and [`MAX_RATIO`] (the
    /// environment's values when set, else the ones configured in code). An
    /// unparsable or out-of-range value is an error naming the variable.
    pub fn from_env() -> Result<PendingConfig> {
        let d = PendingConfig::default();
        Ok(PendingConfig {
            max_count: MAX_COUNT.get(d.max_count)?,
            max_ratio: MAX_RATIO.get(d.max_ratio)?,
        })
    }

    /// The byte threshold for a device of `capacity` bytes.
    pub fn max_bytes(&self, capacity: usize) -> usize {
        (capacity as f64 * self.max_ratio) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the variables, so no other sees them half set.
    #[test]
    fn defaults_overrides_and_invalid_values() {
        std::env::remove_var(COUNT_ENV);
        std::env::remove_var(RATIO_ENV);
        assert_eq!(PendingConfig::from_env().unwrap(), PendingConfig::default());
        std::env::set_var(COUNT_ENV, "3");
        std::env::set_var(RATIO_ENV, "0.5");
        let c = PendingConfig::from_env().unwrap();
        assert_eq!(
            c,
            PendingConfig {
                max_count: 3,
                max_ratio: 0.5
            }
        );
        assert_eq!(c.max_bytes(1000), 500);
        std::env::set_var(COUNT_ENV, "ten");
        let e = PendingConfig::from_env().unwrap_err();
        assert_eq!(e.to_string(), "invalid value \"ten\" for EMM_MAX_PENDING_DEALLOCS_COUNT: expected a non-negative integer");
        std::env::set_var(COUNT_ENV, "-1");
        assert!(PendingConfig::from_env().is_err());
        std::env::remove_var(COUNT_ENV);
        for bad in ["1.5", "NaN"] {
            std::env::set_var(RATIO_ENV, bad);
            let e = PendingConfig::from_env().unwrap_err();
            assert!(
                e.to_string().contains("EMM_MAX_PENDING_DEALLOCS_RATIO"),
                "{e}"
            );
            assert!(e.to_string().contains("between 0 and 1"), "{e}");
        }
        std::env::remove_var(RATIO_ENV);
    }
}
