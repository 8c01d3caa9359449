//! Sizes as people write them, for every setting that takes bytes
//! (`EMM_POOL_LIMIT=8G`, `emm_configure("pool_limit", "512MiB")`, `emm replay
//! --device-memory 24G`, `emm.configure(pool_limit="8G")`): one parser, so
//! the same text means the same everywhere.

/// Parses a size: a number of bytes, or a number (decimals allowed) with a binary
/// unit `K`, `M`, `G` or `T`, with or without `iB`/`B`, in any case and with or
/// without a space: `4096`, `24G`, `24GiB`, `512 MiB`, `1.5g`. A decimal with
/// a unit that comes to a fraction of a byte (`1.1K`, 1126.4 bytes) is rounded
/// down to the whole byte; a plain number of bytes must be whole. `Err` says
/// why.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "expected a number of bytes, or a number with K, M, G or T (binary: 24G is 24 GiB), found {text:?}"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!("expected a number before the unit, found {text:?}"));
    }
    if shift == 0 {
        // Bytes are whole: `1.5` is a mistake, not one byte.
        return num.parse::<u64>().map_err(|_| {
            format!("{text:?} is not a whole number of bytes this machine can count")
        });
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("expected a number before the unit, found {text:?}"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("{text:?} is larger than this machine can count"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_bytes("24G"), Ok(24 << 30));
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("24gb"), Ok(24 << 30));
        assert_eq!(parse_bytes(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        for bad in [
            "",
            "G",
            "12X",
            "-1G",
            "1e400",
            "abc",
            "1..5G",
            "18446744073709551616",
            "1.5",
            "12ib",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
