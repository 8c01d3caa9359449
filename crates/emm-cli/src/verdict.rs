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

/// The verdict, or `None` when emm's pool did not run (or failed), in neither
/// of its forms (`pool`, and `pool-shared`: one pool for every stream).
pub fn headline(f: &Facts<'_>) -> Option<String> {
    let ran = |name: &str| f.ran.iter().find(|m| m.manager == name && !m.failed);
    let shared = ran(crate::names::POOL_SHARED);
    // The pool as configured leads; where it failed (or was not asked for) and
    // one shared pool ran, that leads, named with the setting that gives it.
    let (pool, lead) = match (ran("pool"), shared) {
        (Some(p), _) => (p, "emm pool".to_owned()),
        (None, Some(s)) => (
            s,
            format!(
                "emm pool with one shared pool for every stream (EMM_POOL_STREAM_POOLS=0){}",
                if f.ran.iter().any(|m| m.manager == "pool") {
                    ", as the pool with stream pools does not run,"
                } else {
                    ""
                }
            ),
        ),
        (None, None) => return None,
    };
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
        "{lead} {} at peak",
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
    if let Some(shared) = shared.filter(|s| !std::ptr::eq(*s, pool)) {
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
    let fits = [
        ("the pool", needs("pool")),
        ("one shared pool", needs(crate::names::POOL_SHARED)),
    ];
    let mut said = fits.iter().filter_map(|&(who, n)| Some((who, n?)));
    if let Some((who, n)) = said.next() {
        s += &format!("; {who} fits on {}", units::bytes(u128::from(n)));
        for (who, n) in said {
            s += &format!(", {who} on {}", units::bytes(u128::from(n)));
        }
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
                format!(
                    "{} {} not run",
                    not.join(", "),
                    if not.len() == 1 { "does" } else { "do" }
                )
            }
        );
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn ran(manager: &str, gib: u64, failed: bool) -> Ran<'_> {
        Ran {
            manager,
            peak_reserved_bytes: gib * GIB,
            failed,
        }
    }

    fn facts<'a>(ran: Vec<Ran<'a>>, fit: Vec<(&'a str, Option<u64>)>) -> Facts<'a> {
        Facts {
            ran,
            recorded: None,
            fit,
            device_memory: None,
        }
    }

    #[test]
    fn the_pool_leads_and_one_shared_pool_is_set_beside_it() {
        let f = facts(
            vec![
                ran("pool", 10, false),
                ran("pool-shared", 8, false),
                ran("pytorch-expandable", 12, false),
            ],
            vec![],
        );
        let s = headline(&f).unwrap();
        assert!(s.starts_with("emm pool 10.0 GiB at peak; pytorch-expandable 12.0 GiB: the pool saves 2.00 GiB (17 %)"), "{s}");
        assert!(
            s.contains("with one shared pool for every stream 8.00 GiB, 2.00 GiB less: set EMM_POOL_STREAM_POOLS=0 for this job"),
            "{s}"
        );
    }

    #[test]
    fn where_the_pool_fails_one_shared_pool_leads_named_with_its_setting() {
        let f = facts(
            vec![
                ran("pool", 10, true),
                ran("pool-shared", 8, false),
                ran("pytorch-expandable", 12, false),
            ],
            vec![],
        );
        let s = headline(&f).unwrap();
        assert!(
            s.starts_with("emm pool with one shared pool for every stream (EMM_POOL_STREAM_POOLS=0), as the pool with stream pools does not run, 8.00 GiB at peak; pytorch-expandable 12.0 GiB: the pool saves 4.00 GiB"),
            "{s}"
        );
        assert!(!s.contains("less: set"), "not set beside itself: {s}");
        // Asked for alone, it leads without the clause on the pool.
        let f = facts(vec![ran("pool-shared", 8, false)], vec![]);
        assert_eq!(
            headline(&f).unwrap(),
            "emm pool with one shared pool for every stream (EMM_POOL_STREAM_POOLS=0) 8.00 GiB at peak"
        );
        // Neither ran: no verdict.
        let f = facts(
            vec![ran("pool", 10, true), ran("pool-shared", 8, true)],
            vec![],
        );
        assert_eq!(headline(&f), None);
    }

    #[test]
    fn the_fit_names_each_form_of_the_pool_that_has_an_answer() {
        let f = facts(
            vec![ran("pool", 10, false), ran("pool-shared", 8, false)],
            vec![
                ("pool", Some(11 * GIB)),
                ("pool-shared", Some(9 * GIB)),
                ("pytorch-native", Some(14 * GIB)),
            ],
        );
        let s = headline(&f).unwrap();
        assert!(
            s.ends_with("; the pool fits on 11.0 GiB, one shared pool on 9.00 GiB, pytorch-native needs 14.0 GiB"),
            "{s}"
        );
        let f = facts(
            vec![ran("pool", 10, true), ran("pool-shared", 8, false)],
            vec![("pool", None), ("pool-shared", Some(9 * GIB))],
        );
        assert!(headline(&f)
            .unwrap()
            .ends_with("; one shared pool fits on 9.00 GiB"));
    }
}
