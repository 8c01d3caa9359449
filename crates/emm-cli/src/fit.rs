//! `--fit`: the search for the smallest device on which a manager runs a trace
//! (sizes with units come from `emm_core::parse_bytes`).

use std::time::{Duration, Instant};

/// How long one search (one manager and trace of `--fit`, one trace of
/// `--initial-size`) may go on starting runs: twice the steady rule's bound on
/// one replay. A search past it stops where it is, with the smallest size that
/// has run so far and how far above the smallest it may be ([`Fit::within`]).
pub const SEARCH_TIME: Duration = Duration::from_secs(120);

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
    /// How far above the smallest size that runs `needs` may be: the step of
    /// a finished search, more where it stopped for time.
    pub within: u64,
    /// The search stopped at its time bound ([`SEARCH_TIME`]) before it
    /// finished: `needs` is the smallest size that ran by then (`None` when
    /// none had), and the sizes above it were not probed for failures.
    pub stopped_for_time: bool,
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
/// not be made at all, which ends the search. No run starts after `time` has
/// passed since the call (the first always runs): the search then answers with
/// what it has ([`Fit::stopped_for_time`]).
pub fn smallest(
    low: u64,
    high: u64,
    step: u64,
    time: Duration,
    mut runs_at: impl FnMut(u64) -> Result<bool, String>,
) -> Result<Fit, String> {
    let start = Instant::now();
    let out_of_time = || start.elapsed() >= time;
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
    let mut stopped_for_time = false;
    for _ in 0..DOUBLINGS {
        if ok {
            break;
        }
        if out_of_time() {
            stopped_for_time = true;
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
            within: 0,
            stopped_for_time,
        });
    }
    let high = top;
    let (mut lo, mut hi) = (low.min(high), high);
    while hi - lo > step {
        if out_of_time() {
            stopped_for_time = true;
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if try_at(mid, &mut runs, &mut failed_at)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let gap = (high - hi) / (PROBES_ABOVE + 1);
    if gap >= step && !stopped_for_time {
        for k in 1..=PROBES_ABOVE {
            if out_of_time() {
                stopped_for_time = true;
                break;
            }
            try_at(hi + k * gap, &mut runs, &mut failed_at)?;
        }
    }
    Ok(Fit {
        needs: Some(hi),
        larger_failed: failed_at.into_iter().filter(|&c| c > hi).max(),
        runs,
        within: hi - lo,
        stopped_for_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOREVER: Duration = Duration::from_secs(3600);

    #[test]
    fn the_search_finds_the_threshold_and_remembers_larger_failures() {
        let f = smallest(0, 1000, 1, FOREVER, |c| Ok(c >= 700)).unwrap();
        assert_eq!((f.needs, f.larger_failed), (Some(700), None));
        assert!(f.runs <= 16, "{f:?}");
        // Fits from 700 up, except around 820 (not monotone): said.
        let fits = |c: u64| Ok(c >= 700 && !(810..=830).contains(&c));
        let f = smallest(0, 1000, 1, FOREVER, fits).unwrap();
        assert_eq!(f.needs, Some(700));
        assert_eq!(f.larger_failed, Some(820), "{f:?}");
        // Never fits.
        assert_eq!(
            smallest(0, 1000, 1, FOREVER, |_| Ok(false)).unwrap().needs,
            None
        );
        // Fits only above the given top: found by looking higher.
        let f = smallest(0, 1000, 1, FOREVER, |c| Ok(c >= 1500)).unwrap();
        assert_eq!(f.needs, Some(1500));
        // Up to `DOUBLINGS` doublings of the top, and no further.
        let most = 1000 << DOUBLINGS;
        assert_eq!(
            smallest(0, 1000, 1, FOREVER, |c| Ok(c >= most))
                .unwrap()
                .needs,
            Some(most)
        );
        assert_eq!(
            smallest(0, 1000, 1, FOREVER, |c| Ok(c > most))
                .unwrap()
                .needs,
            None
        );
        assert!(smallest(0, 10, 1, FOREVER, |_| Err("no".into())).is_err());
    }

    #[test]
    fn a_search_past_its_time_answers_with_what_ran_and_says_how_close() {
        // Every run takes 10 ms; the search may start runs for 35 ms: the top
        // and three bisections run, then it stops.
        let slow = |c: u64| {
            std::thread::sleep(Duration::from_millis(10));
            Ok(c >= 700)
        };
        let f = smallest(0, 1000, 1, Duration::from_millis(35), slow).unwrap();
        assert!(f.stopped_for_time, "{f:?}");
        assert!((1..=6).contains(&f.runs), "{f:?}");
        let needs = f.needs.expect("the top ran");
        assert!(needs >= 700, "an answer that ran: {f:?}");
        assert!(
            needs - f.within <= 700,
            "the smallest lies within the bracket: {f:?}"
        );
        assert!(f.within > 1, "not searched down to the step: {f:?}");
        // A finished search says so, to within its step.
        let f = smallest(0, 1000, 1, FOREVER, |c| Ok(c >= 700)).unwrap();
        assert!(!f.stopped_for_time);
        assert!(f.within <= 1, "{f:?}");
        // Out of time before any size ran: no answer, and the reason.
        let never = |_| {
            std::thread::sleep(Duration::from_millis(10));
            Ok(false)
        };
        let f = smallest(0, 1000, 1, Duration::from_millis(5), never).unwrap();
        assert_eq!((f.needs, f.runs, f.stopped_for_time), (None, 1, true));
    }
}
