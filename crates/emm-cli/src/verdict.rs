//! The one sentence a user came for, per trace: how much emm's pool reserves at
//! peak beside PyTorch's allocator (the models, else the snapshot's record), and,
//! with `--fit` or `--device-memory`, on what device each runs. The table, the
//! page and nothing else print it, so both say the same.

use crate::report::{Report, TraceReport};
use crate::units;

/// The verdict for `t`, or `None` when emm's pool did not run (or failed).
pub fn headline(r: &Report, t: &TraceReport) -> Option<String> {
    let pool = t
        .managers
        .iter()
        .find(|m| m.manager == "pool" && !m.failed)?;
    let peer = |name: &str| {
        t.managers
            .iter()
            .find(|m| m.manager == name && !m.failed)
            .map(|m| (name.to_owned(), m.peak_reserved_bytes))
    };
    let recorded = t
        .pytorch
        .as_ref()
        .and_then(|p| p.peak_reserved_bytes)
        .map(|b| {
            (
                "PyTorch as recorded".to_owned(),
                u64::try_from(b).unwrap_or(u64::MAX),
            )
        });
    let peers: Vec<(String, u64)> = [peer("pytorch-native"), peer("pytorch-expandable")]
        .into_iter()
        .flatten()
        .chain(recorded)
        .collect();
    let mut s = format!(
        "emm pool {} at peak",
        units::bytes(u128::from(pool.peak_reserved_bytes))
    );
    for (name, bytes) in &peers {
        let diff = *bytes as i128 - i128::from(pool.peak_reserved_bytes);
        let verb = if diff >= 0 { "saves" } else { "costs" };
        s += &format!(
            "; {name} {}: the pool {verb} {} ({:.0} %)",
            units::bytes(u128::from(*bytes)),
            units::bytes(diff.unsigned_abs()),
            diff.unsigned_abs() as f64 * 100.0 / (*bytes).max(1) as f64
        );
    }
    if let Some(f) = t
        .fit
        .iter()
        .find(|f| f.manager == "pool")
        .and_then(|f| f.with_overhead_bytes)
    {
        s += &format!("; the pool fits on {}", units::bytes(u128::from(f)));
        for name in ["pytorch-expandable", "pytorch-native"] {
            if let Some(n) = t
                .fit
                .iter()
                .find(|f| f.manager == name)
                .and_then(|f| f.with_overhead_bytes)
            {
                s += &format!(", {name} needs {}", units::bytes(u128::from(n)));
            }
        }
    }
    if let Some(cap) = r.device_memory_bytes {
        let not: Vec<&str> = t
            .managers
            .iter()
            .filter(|m| m.failed)
            .map(|m| m.manager.as_str())
            .collect();
        s += &format!(
            "; on {}: {}",
            units::bytes(u128::from(cap)),
            if not.is_empty() {
                "every manager runs".to_owned()
            } else {
                format!("{} do not run", not.join(", "))
            }
        );
    }
    Some(s)
}
