//! The pool's allocation history: a bounded ring of [`TraceEntry`]s for
//! snapshots (PyTorch's `record_memory_history`). Off by default; the pool checks
//! one relaxed flag on its lock-free path and records there only while on.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use emm_core::{TraceAction, TraceEntry};

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A ring of the latest `cap` entries (`cap` 0: off, empty).
#[derive(Debug, Default)]
pub(crate) struct History {
    cap: usize,
    entries: VecDeque<TraceEntry>,
}

impl History {
    /// Keeps the latest `cap` entries from now on (0: off, the history dropped).
    pub fn set_capacity(&mut self, cap: usize) {
        self.cap = cap;
        while self.entries.len() > cap {
            self.entries.pop_front();
        }
        if cap == 0 {
            self.entries = VecDeque::new();
        }
    }

    /// Appends an entry (dropping the oldest when full); nothing when off.
    pub fn push(&mut self, action: TraceAction, addr: u64, size: usize, stream: usize) {
        self.push_oom_aware(action, addr, size, stream, 0);
    }

    /// As [`History::push`], with the device's free bytes (for `Oom`).
    pub fn push_oom_aware(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: usize,
        stream: usize,
        device_free: usize,
    ) {
        if self.cap == 0 {
            return;
        }
        if self.entries.len() >= self.cap {
            self.entries.pop_front();
        }
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: now_us(),
            device_free,
        });
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.entries.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_entries() {
        let mut h = History::default();
        h.push(TraceAction::Alloc, 1, 512, 0);
        assert!(h.entries().is_empty(), "off by default");
        h.set_capacity(2);
        for a in 1..=3 {
            h.push(TraceAction::Alloc, a, 512, 0);
        }
        let addrs: Vec<u64> = h.entries().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, [2, 3]);
        h.set_capacity(1);
        assert_eq!(h.entries().len(), 1);
        h.set_capacity(0);
        assert!(h.entries().is_empty());
        h.push(TraceAction::Alloc, 9, 512, 0);
        assert!(h.entries().is_empty(), "off again");
    }
}
