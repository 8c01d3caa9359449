//! The host stand-in's device, running behind the host: a replay without a GPU
//! can model how far.
//!
//! On a GPU the host queues work ahead of the device, often by most of a step, so
//! an event a manager records on a stream seldom completes when it is first
//! asked; a manager that reuses memory across streams only after such an event
//! holds more while it waits. Over the host stand-in there is no device, and its
//! events complete at once unless a [`HostClock`] says otherwise: the replay
//! advances the clock by one for each request it makes, and an event recorded at
//! time `t` completes at `t + lag` (or when the manager waits for it, or for the
//! whole device).

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests made so far, and how many more the stand-in's device takes to reach
/// an event (see the module's documentation).
#[derive(Debug)]
pub struct HostClock {
    now: AtomicU64,
    lag: u64,
}

impl HostClock {
    /// A clock at 0 whose events complete `lag` requests after they are recorded.
    pub fn new(lag: u64) -> Self {
        HostClock {
            now: AtomicU64::new(0),
            lag,
        }
    }

    /// Requests made so far.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// Requests the device runs behind the host.
    pub fn lag(&self) -> u64 {
        self.lag
    }

    /// One more request made.
    pub fn tick(&self) {
        self.now.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_count_requests() {
        let c = HostClock::new(5);
        assert_eq!((c.now(), c.lag()), (0, 5));
        c.tick();
        c.tick();
        assert_eq!(c.now(), 2);
    }
}
