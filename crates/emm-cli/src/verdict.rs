//! The one sentence a user came for, per trace: how much emm's pool reserves at
//! peak beside PyTorch's allocator (the models, and the snapshot's record), and,
//! with `--fit` or `--device-memory`, on what device each runs. The table and the
//! page both lead with it (`report::verdict_of` gathers the facts).

use crate::units;

/// One manager's replay of a trace, as the verdict needs it.
pub struct Ran<'a> {
    pub manager: &'a str,
    pub peak_reserved_bytes: u64,
    pub failed: bool,
}

/// What the verdict is drawn from: the replays, PyTorch's recorded peak, `--fit`'s
/// answers (manager, device needed with the overhead) and `--device-memory`.
pub struct Facts<'a> {
    pub ran: Vec<Ran<'a>>,
    pub recorded: Option<u64>,
    pub fit: Vec<(&'a str, Option<u64>)>,
    pub device_memory: Option<u64>,
}

/// The verdict, or `None` when emm's pool did not run (or failed).
pub fn headline(f: &Facts<'_>) -> Option<String> {
    let pool = f.ran.iter().find(|m| m.manager == "pool" && !m.failed)?;
    let peer = |name: &str| {
        f.ran
            .iter()
            .find(|m| m.manager == name && !m.failed)
            .map(|m| (name.to_owned(), m.peak_reserved_bytes))
    };
    let recorded = f.recorded.map(|b| ("PyTorch as recorded".to_owned(), b));
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
        let diff = i128::from(*bytes) - i128::from(pool.peak_reserved_bytes);
        let verb = if diff >= 0 { "saves" } else { "costs" };
        s += &format!(
            "; {name} {}: the pool {verb} {} ({:.0} %)",
            units::bytes(u128::from(*bytes)),
            units::bytes(diff.unsigned_abs()),
            diff.unsigned_abs() as f64 * 100.0 / (*bytes).max(1) as f64
        );
    }
    // A trace of several streams: the pool with one shared arena beside it,
    // and the setting that gives it.
    if let Some(shared) = f
        .ran
        .iter()
        .find(|m| m.manager == crate::names::POOL_SHARED && !m.failed)
    {
        let (a, b) = (pool.peak_reserved_bytes, shared.peak_reserved_bytes);
        s += &format!(
            "; with one shared pool for every stream {}{}",
            units::bytes(u128::from(b)),
            // (Less by a hundredth or more: a smaller difference is the
            // placement's noise, not a reason to change the setting.)
            if (b as f64) < a as f64 * 0.99 {
                format!(
                    ", {} less: set EMM_POOL_STREAM_POOLS=0 for this job",
                    units::bytes(u128::from(a - b))
                )
            } else if (b as f64) > a as f64 * 1.01 {
                " (stream pools suit this job)".to_owned()
            } else {
                " (the same within 1 %)".to_owned()
            }
        );
    }
    let needs = |name: &str| f.fit.iter().find(|x| x.0 == name).and_then(|x| x.1);
    if let Some(n) = needs("pool") {
        s += &format!("; the pool fits on {}", units::bytes(u128::from(n)));
        for name in ["pytorch-expandable", "pytorch-native"] {
            if let Some(n) = needs(name) {
                s += &format!(", {name} needs {}", units::bytes(u128::from(n)));
            }
        }
    }
    if let Some(cap) = f.device_memory {
        let not: Vec<&str> = f
            .ran
            .iter()
            .filter(|m| m.failed)
            .map(|m| m.manager)
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
