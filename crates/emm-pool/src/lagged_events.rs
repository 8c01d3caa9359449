//! Events of the host stand-in's device when it runs behind the host
//! ([`emm_core::HostClock`]): a replay without a GPU that models how long the
//! device takes to reach what the pool records.

use std::sync::{Arc, Mutex};

use emm_core::{HostClock, Result};
use emm_sys::CUstream;

use crate::events::{EventId, EventSource};

/// Markers that complete `clock.lag()` requests after they are recorded, when
/// waited for, or at a device-wide synchronization. Recycled markers are reused,
/// so a long replay keeps as many as were in use at once.
#[derive(Debug)]
pub struct LaggedEvents {
    clock: Arc<HostClock>,
    slots: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    /// The clock's value at which each marker completes.
    due: Vec<u64>,
    /// When each marker was recorded, in the order of records.
    order: Vec<u64>,
    /// Records so far.
    records: u64,
    /// Markers recycled, free for the next record.
    idle: Vec<usize>,
}

impl LaggedEvents {
    /// Markers on the device `clock` describes.
    pub fn new(clock: Arc<HostClock>) -> Self {
        LaggedEvents {
            clock,
            slots: Mutex::new(Slots::default()),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl EventSource for LaggedEvents {
    fn record(&self, _stream: CUstream) -> Result<EventId> {
        let due = self.clock.now().saturating_add(self.clock.lag());
        let mut s = self.slots();
        s.records += 1;
        let order = s.records;
        let id = match s.idle.pop() {
            Some(i) => {
                s.due[i] = due;
                s.order[i] = order;
                i
            }
            None => {
                s.due.push(due);
                s.order.push(order);
                s.due.len() - 1
            }
        };
        Ok(EventId(id))
    }

    fn is_complete(&self, id: EventId) -> Result<bool> {
        let now = self.clock.now();
        Ok(self.slots().due.get(id.0).is_none_or(|&d| now >= d))
    }

    fn wait(&self, id: EventId) -> Result<()> {
        // The host waits until the device gets there: from now on it has, and
        // past every marker recorded before it, on any stream (the model's
        // device is one queue, behind the host by the clock's lag; a GPU runs
        // streams side by side, so this settles somewhat more than one would).
        let mut s = self.slots();
        if let Some(&order) = s.order.get(id.0) {
            let Slots {
                due, order: orders, ..
            } = &mut *s;
            for (d, o) in due.iter_mut().zip(orders.iter()) {
                if *o <= order {
                    *d = 0;
                }
            }
        }
        Ok(())
    }

    fn stream_wait(&self, _stream: CUstream, _id: EventId) -> Result<()> {
        // The stand-in's device runs no work to order: the stream may go on.
        Ok(())
    }

    fn recycle(&self, id: EventId) {
        let mut s = self.slots();
        if id.0 < s.due.len() {
            s.idle.push(id.0);
        }
    }

    fn synchronize_all(&self) -> Result<()> {
        self.slots().due.iter_mut().for_each(|d| *d = 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_completes_lag_requests_after_it_was_recorded() {
        let clock = Arc::new(HostClock::new(3));
        let ev = LaggedEvents::new(clock.clone());
        let s = CUstream(core::ptr::null_mut());
        let a = ev.record(s).unwrap();
        for _ in 0..2 {
            clock.tick();
            assert!(!ev.is_complete(a).unwrap());
        }
        clock.tick();
        assert!(ev.is_complete(a).unwrap());
        // Waiting, or a device-wide synchronization, completes a marker at once;
        // a wait also completes the markers recorded before it, not after (even
        // in the same tick).
        let before = ev.record(s).unwrap();
        clock.tick();
        let b = ev.record(s).unwrap();
        let c = ev.record(s).unwrap();
        assert!(!ev.is_complete(b).unwrap());
        ev.wait(b).unwrap();
        assert!(ev.is_complete(b).unwrap());
        assert!(ev.is_complete(before).unwrap());
        assert!(!ev.is_complete(c).unwrap());
        ev.synchronize_all().unwrap();
        assert!(ev.is_complete(c).unwrap());
        // A recycled marker is reused, recorded afresh.
        ev.recycle(a);
        let d = ev.record(s).unwrap();
        assert_eq!(d, a);
        assert!(!ev.is_complete(d).unwrap());
    }
}
