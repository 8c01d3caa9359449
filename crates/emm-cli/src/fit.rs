//! `--fit`: the search for the smallest device on which a manager runs a trace
//! (sizes with units come from `emm_core::parse_bytes`).

/// The answer of [`smallest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fit {
    /// The smallest device size found on which the run succeeded, confirmed by a
    /// run at it; `None` when even the largest tried failed.
    pub needs: Option<u64>,
    /// A larger size that failed (caching allocators are not monotone in the
    /// size of the device: another order of frees and splits can strand more).
    pub larger_failed: Option<u64>,
    /// Runs made.
    pub runs: u32,
}

/// How many sizes between the answer and `high` are tried afterwards, to find a
/// larger size that fails.
const PROBES_ABOVE: u64 = 4;

/// How many times [`smallest`] doubles `high` when the run fails there: the
/// largest size tried is `high` times 2 to this power.
pub const DOUBLINGS: u32 = 3;

/// The smallest size in `[low, high]`, to within `step`, on which `runs_at`
/// succeeds: a bisection (`high` is expected to succeed; every size it settles on
/// has run), then [`PROBES_ABOVE`] sizes evenly between the answer and `high`,
/// any failure among them reported. `runs_at` returns `Err` for a run that could
/// not be made at all, which ends the search.
pub fn smallest(
    low: u64,
    high: u64,
    step: u64,
    mut runs_at: impl FnMut(u64) -> Result<bool, String>,
) -> Result<Fit, String> {
    let step = step.max(1);
    let mut runs = 0;
    let mut failed_at: Vec<u64> = Vec::new();
    let mut try_at = |cap: u64, runs: &mut u32, failed_at: &mut Vec<u64>| -> Result<bool, String> {
        *runs += 1;
        let ok = runs_at(cap)?;
        if !ok {
            failed_at.push(cap);
        }
        Ok(ok)
    };
    // `high` is what the run reserved without a cap, measured on another target
    // (the GPU, or a device of another size): should it fail here, look higher.
    let mut top = high;
    let mut ok = try_at(top, &mut runs, &mut failed_at)?;
    for _ in 0..DOUBLINGS {
        if ok {
            break;
        }
        top = top.saturating_mul(2);
        ok = try_at(top, &mut runs, &mut failed_at)?;
    }
    if !ok {
        return Ok(Fit {
            needs: None,
            larger_failed: None,
            runs,
        });
    }
    let high = top;
    let (mut lo, mut hi) = (low.min(high), high);
    while hi - lo > step {
        let mid = lo + (hi - lo) / 2;
        if try_at(mid, &mut runs, &mut failed_at)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let gap = (high - hi) / (PROBES_ABOVE + 1);
    if gap >= step {
        for k in 1..=PROBES_ABOVE {
            try_at(hi + k * gap, &mut runs, &mut failed_at)?;
        }
    }
    Ok(Fit {
        needs: Some(hi),
        larger_failed: failed_at.into_iter().filter(|&c| c > hi).max(),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_finds_the_threshold_and_remembers_larger_failures() {
        let f = smallest(0, 1000, 1, |c| Ok(c >= 700)).unwrap();
        assert_eq!((f.needs, f.larger_failed), (Some(700), None));
        assert!(f.runs <= 16, "{f:?}");
        // Fits from 700 up, except around 820 (not monotone): said.
        let fits = |c: u64| Ok(c >= 700 && !(810..=830).contains(&c));
        let f = smallest(0, 1000, 1, fits).unwrap();
        assert_eq!(f.needs, Some(700));
        assert_eq!(f.larger_failed, Some(820), "{f:?}");
        // Never fits.
        assert_eq!(smallest(0, 1000, 1, |_| Ok(false)).unwrap().needs, None);
        // Fits only above the given top: found by looking higher.
        let f = smallest(0, 1000, 1, |c| Ok(c >= 1500)).unwrap();
        assert_eq!(f.needs, Some(1500));
        // Up to `DOUBLINGS` doublings of the top, and no further.
        let most = 1000 << DOUBLINGS;
        assert_eq!(
            smallest(0, 1000, 1, |c| Ok(c >= most)).unwrap().needs,
            Some(most)
        );
        assert_eq!(smallest(0, 1000, 1, |c| Ok(c > most)).unwrap().needs, None);
        assert!(smallest(0, 10, 1, |_| Err("no".into())).is_err());
    }
}
