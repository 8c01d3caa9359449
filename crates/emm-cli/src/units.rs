//! Human units: bytes in B, KiB, MiB, GiB, … as fits; durations; ratios.

use std::time::Duration;

const UNITS: [&str; 7] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"];

/// `bytes` with three significant digits in the largest binary unit that keeps the
/// number at 1 or more: `512 B`, `1.50 KiB`, `20.0 MiB`, `3.31 GiB`.
pub fn bytes(bytes: u128) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    // Rounding may reach 1024 (e.g. 1023.99 KiB): show it in the next unit.
    if format!("{v:.0}") == "1024" && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let digits = if v < 9.995 {
        2
    } else if v < 99.95 {
        1
    } else {
        0
    };
    format!("{v:.digits$} {}", UNITS[unit])
}

/// `a / b` as `1.090x` (three decimals: a footprint's drift from pass to pass is
/// often under 1 %), or `-` when `b` is 0.
pub fn ratio(a: u128, b: u128) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.3}x", a as f64 / b as f64)
    }
}

/// A duration as `850 us`, `12.3 ms` or `1.52 s`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_take_the_unit_that_fits() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(20 << 20), "20.0 MiB");
        assert_eq!(bytes(3_548_811_368), "3.31 GiB");
        assert_eq!(bytes((1 << 20) - 1), "1.00 MiB");
        assert_eq!(bytes(u128::from(u64::MAX) * 2), "32.0 EiB");
        assert_eq!(bytes(u128::MAX).split(' ').nth(1), Some("ZiB"));
    }

    #[test]
    fn ratios_and_durations() {
        assert_eq!(ratio(109, 100), "1.090x");
        assert_eq!(ratio(1053, 1000), "1.053x");
        assert_eq!(ratio(1, 0), "-");
        assert_eq!(duration(Duration::from_micros(850)), "850 us");
        assert_eq!(duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(duration(Duration::from_millis(1520)), "1.52 s");
    }
}
