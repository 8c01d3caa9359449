//! Fault injection: planned failures of named calls, failures of the k-th call of
//! a class of calls ([`CallClass`]: any call, frees, event calls) counted from the
//! moment they are planned, failing frees, a lost context, and the call counters
//! that tests read back.

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

/// A class of driver calls, counted together for failures planned by position
/// ([`Faults::fail_at`], [`Faults::lose_context_at`]): a fault sweep counts a
/// scenario's calls of a class, then fails the k-th of them for every k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallClass {
    /// Every call, whatever its name.
    Any,
    /// The calls that give memory back ([`FREE_CALLS`]: frees, unmaps, releases).
    Frees,
    /// Event calls: `cuEvent*` and `cuStreamWaitEvent`.
    Events,
}

impl CallClass {
    /// Every class, in the order of `CallClass::index`.
    pub const ALL: [CallClass; 3] = [CallClass::Any, CallClass::Frees, CallClass::Events];

    /// The class named `any`, `frees` or `events`.
    pub fn parse(s: &str) -> Option<CallClass> {
        match s {
            "any" => Some(CallClass::Any),
            "frees" => Some(CallClass::Frees),
            "events" => Some(CallClass::Events),
            _ => None,
        }
    }

    /// Whether a call of `name` belongs to the class.
    pub fn contains(self, name: &str) -> bool {
        match self {
            CallClass::Any => true,
            CallClass::Frees => FREE_CALLS.contains(&name),
            CallClass::Events => name.starts_with("cuEvent") || name == "cuStreamWaitEvent",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a failure planned by position does when its call comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// That call fails with the code.
    Fail(CUresult),
    /// The context is lost from that call on (until [`Faults::reset`]).
    LoseContext,
}

/// A failure planned by position: `left` more calls of `class`, the last of which
/// triggers `action`.
#[derive(Debug, Clone, Copy)]
struct AtPosition {
    class: CallClass,
    left: u64,
    action: Action,
}

/// The fault plan and the call counters.
#[derive(Debug, Default)]
pub struct Faults {
    /// Failures planned by position within a class of calls.
    positioned: Vec<AtPosition>,
    /// Calls made per [`CallClass`] (by [`CallClass::index`]).
    class_calls: [u64; 3],
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
        let positioned = self.positioned(name);
        let code = positioned.or_else(|| self.decide(name));
        if code.is_some() {
            self.injected += 1;
        }
        code
    }

    /// Counts the call in its classes and runs the failures planned by position
    /// that it triggers: the code of the first failure, if one is due (a lost
    /// context starts here and is then reported by [`Faults::decide`]).
    fn positioned(&mut self, name: &'static str) -> Option<CUresult> {
        for class in CallClass::ALL {
            if class.contains(name) {
                self.class_calls[class.index()] += 1;
            }
        }
        let mut hit = None;
        for p in &mut self.positioned {
            if p.left == 0 || !p.class.contains(name) {
                continue;
            }
            p.left -= 1;
            if p.left == 0 {
                match p.action {
                    Action::Fail(code) => hit = hit.or(Some(code)),
                    Action::LoseContext => self.context_lost = true,
                }
            }
        }
        self.positioned.retain(|p| p.left > 0);
        hit
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

    /// Plans the `nth` next call of `class` (1: the next one), whatever its name, to
    /// fail with `code`.
    pub fn fail_at(&mut self, class: CallClass, nth: u64, code: CUresult) {
        self.positioned.push(AtPosition {
            class,
            left: nth.max(1),
            action: Action::Fail(code),
        });
    }

    /// Plans the context to be lost at the `nth` next call of `class` (1: the next
    /// one): that call and every one after it fail with
    /// `CUDA_ERROR_CONTEXT_IS_DESTROYED` until [`Faults::reset`].
    pub fn lose_context_at(&mut self, class: CallClass, nth: u64) {
        self.positioned.push(AtPosition {
            class,
            left: nth.max(1),
            action: Action::LoseContext,
        });
    }

    /// Calls of `class` made so far (failed ones included).
    pub fn class_calls(&self, class: CallClass) -> u64 {
        self.class_calls[class.index()]
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
        self.positioned.clear();
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
        self.planned.values().map(|v| v.len() as u64).sum::<u64>() + self.positioned.len() as u64
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
    fn the_kth_call_of_a_class_fails_whatever_its_name() {
        let mut f = Faults::default();
        f.fail_at(CallClass::Any, 3, CUresult::ERROR_OUT_OF_MEMORY);
        f.fail_at(CallClass::Frees, 2, CUresult::ERROR_UNKNOWN);
        assert_eq!(f.pending(), 2);
        assert_eq!(f.on_call("cuMemFree_v2"), None);
        assert_eq!(f.on_call("cuCtxSynchronize"), None);
        assert_eq!(
            f.on_call("cuStreamQuery"),
            Some(CUresult::ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(f.on_call("cuStreamQuery"), None);
        assert_eq!(f.on_call("cuMemUnmap"), Some(CUresult::ERROR_UNKNOWN));
        assert_eq!(f.pending(), 0);
        assert_eq!(f.class_calls(CallClass::Any), 5);
        assert_eq!(f.class_calls(CallClass::Frees), 2);
        assert_eq!(f.class_calls(CallClass::Events), 0);
        assert_eq!(f.injected, 2);
    }

    #[test]
    fn the_context_is_lost_from_the_kth_event_call_on() {
        let mut f = Faults::default();
        f.lose_context_at(CallClass::Events, 2);
        assert_eq!(f.on_call("cuEventCreate"), None);
        assert_eq!(f.on_call("cuMemAlloc_v2"), None);
        let lost = Some(CUresult::ERROR_CONTEXT_IS_DESTROYED);
        assert_eq!(f.on_call("cuStreamWaitEvent"), lost);
        assert_eq!(f.on_call("cuMemAlloc_v2"), lost);
        assert_eq!(f.on_call("cuGetErrorName"), None);
        f.reset();
        assert_eq!(f.on_call("cuMemAlloc_v2"), None);
        assert_eq!(f.class_calls(CallClass::Events), 2);
        assert_eq!(CallClass::parse("frees"), Some(CallClass::Frees));
        assert_eq!(CallClass::parse("x"), None);
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
