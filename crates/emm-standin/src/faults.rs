//! Fault injection: planned failures of named calls, failing frees, a lost
//! context, and the call counters that tests read back.

use std::collections::HashMap;

use emm_sys::CUresult;

/// The calls that give memory back; `fail_frees` makes each of them fail.
pub const FREE_CALLS: &[&str] = &[
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemHostUnregister",
    "cuMemRelease",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemPoolDestroy",
    "cuIpcCloseMemHandle",
];

/// Calls that keep working after the context is lost (they describe, not act).
const ALWAYS_WORK: &[&str] = &["cuGetErrorName", "cuGetErrorString", "cuDriverGetVersion"];

/// The fault plan and the call counters.
#[derive(Debug, Default)]
pub struct Faults {
    /// Per function: `(calls still to let through, code)` for each planned failure.
    planned: HashMap<String, Vec<(u64, CUresult)>>,
    /// Per function: fail every call with this code.
    always: HashMap<String, CUresult>,
    /// Fail every call of [`FREE_CALLS`] with this code.
    frees: Option<CUresult>,
    /// Every call fails with `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
    pub(crate) context_lost: bool,
    /// Calls made, per function (including failed ones).
    calls: HashMap<&'static str, u64>,
    /// Failures injected so far.
    pub(crate) injected: u64,
}

impl Faults {
    /// Counts a call of `name` and says whether it must fail, and with what.
    pub fn on_call(&mut self, name: &'static str) -> Option<CUresult> {
        *self.calls.entry(name).or_insert(0) += 1;
        let code = self.decide(name);
        if code.is_some() {
            self.injected += 1;
        }
        code
    }

    fn decide(&mut self, name: &'static str) -> Option<CUresult> {
        if self.context_lost && !ALWAYS_WORK.contains(&name) {
            return Some(CUresult::ERROR_CONTEXT_IS_DESTROYED);
        }
        if let Some(code) = self.always.get(name) {
            return Some(*code);
        }
        if let Some(code) = self.frees.filter(|_| FREE_CALLS.contains(&name)) {
            return Some(code);
        }
        let plan = self.planned.get_mut(name)?;
        let mut hit = None;
        for (left, code) in plan.iter_mut() {
            if *left == 0 {
                continue;
            }
            *left -= 1;
            if *left == 0 && hit.is_none() {
                hit = Some(*code);
            }
        }
        plan.retain(|(left, _)| *left > 0);
        hit
    }

    /// Plans the `nth` next call of `name` (1: the next one) to fail with `code`.
    pub fn fail_nth(&mut self, name: &str, nth: u64, code: CUresult) {
        self.planned
            .entry(name.to_owned())
            .or_default()
            .push((nth.max(1), code));
    }

    /// Makes every call of `name` fail with `code` until [`Faults::reset`].
    pub fn fail_always(&mut self, name: &str, code: CUresult) {
        self.always.insert(name.to_owned(), code);
    }

    /// Makes every call of [`FREE_CALLS`] fail with `code` (`None`: stop).
    pub fn fail_frees(&mut self, code: Option<CUresult>) {
        self.frees = code;
    }

    /// Clears every planned failure and the lost context; counters stay.
    pub fn reset(&mut self) {
        self.planned.clear();
        self.always.clear();
        self.frees = None;
        self.context_lost = false;
    }

    /// Calls made to `name` so far.
    pub fn calls(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }

    /// Planned failures not yet triggered.
    pub fn pending(&self) -> u64 {
        self.planned.values().map(|v| v.len() as u64).sum()
    }
}

/// Parses a `CUresult` given as a number or a `CUDA_ERROR_*` name (with or without
/// the `CUDA_` prefix).
pub fn parse_code(s: &str) -> Option<CUresult> {
    if let Ok(n) = s.parse::<i32>() {
        return Some(CUresult(n));
    }
    let want = s.strip_prefix("CUDA_").unwrap_or(s);
    (0..1000)
        .map(CUresult)
        .find(|c| c.name().and_then(|n| n.strip_prefix("CUDA_")) == Some(want))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_call_fails_once() {
        let mut f = Faults::default();
        f.fail_nth("cuMemAlloc_v2", 2, CUresult::ERROR_OUT_OF_MEMORY);
        assert_eq!(f.on_call("cuMemAlloc_v2"), None);
        assert_eq!(
            f.on_call("cuMemAlloc_v2"),
            Some(CUresult::ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(f.on_call("cuMemAlloc_v2"), None);
        assert_eq!(f.calls("cuMemAlloc_v2"), 3);
        assert_eq!(f.pending(), 0);
    }

    #[test]
    fn frees_and_lost_context() {
        let mut f = Faults::default();
        f.fail_frees(Some(CUresult::ERROR_UNKNOWN));
        assert_eq!(f.on_call("cuMemFree_v2"), Some(CUresult::ERROR_UNKNOWN));
        assert_eq!(f.on_call("cuMemAlloc_v2"), None);
        f.context_lost = true;
        assert_eq!(
            f.on_call("cuMemAlloc_v2"),
            Some(CUresult::ERROR_CONTEXT_IS_DESTROYED)
        );
        assert_eq!(f.on_call("cuGetErrorName"), None);
        f.reset();
        assert_eq!(f.on_call("cuMemFree_v2"), None);
    }

    #[test]
    fn codes_parse_by_name_or_number() {
        assert_eq!(parse_code("2"), Some(CUresult::ERROR_OUT_OF_MEMORY));
        assert_eq!(
            parse_code("CUDA_ERROR_OUT_OF_MEMORY"),
            Some(CUresult::ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(
            parse_code("ERROR_NOT_READY"),
            Some(CUresult::ERROR_NOT_READY)
        );
        assert_eq!(parse_code("bogus"), None);
    }
}
