//! The page's time axis: where an event falls, in seconds since the first event
//! of the recording (a snapshot's `time_us`) or, for a trace that records no
//! time, in events replayed; the passes of a replay laid end to end.

use emm::trace::TraceDetails;

/// The x axis of one trace's chart.
pub struct Axis<'a> {
    /// The trace's times, when it has them and they move.
    times: Option<&'a TraceDetails>,
    /// Events in one pass.
    events: u64,
    /// The first event's time (us).
    t0: u64,
    /// How far one pass reaches on the axis (seconds): the recording's length
    /// and one mean gap between events, so the next pass starts one gap later.
    span: f64,
}

impl<'a> Axis<'a> {
    /// The axis of a trace of `events` events a pass, with `details` when it is a
    /// snapshot.
    pub fn new(details: Option<&'a TraceDetails>, events: u64) -> Axis<'a> {
        let events = events.max(1);
        let first = details.and_then(|d| d.time_us(0));
        let last = details.and_then(|d| d.time_us(events - 1));
        match (details, first, last) {
            (Some(d), Some(t0), Some(t1)) if t1 > t0 => {
                let length = (t1 - t0) as f64 / 1e6;
                let gap = length / (events - 1).max(1) as f64;
                Axis {
                    times: Some(d),
                    events,
                    t0,
                    span: length + gap,
                }
            }
            _ => Axis {
                times: None,
                events,
                t0: 0,
                span: events as f64,
            },
        }
    }

    /// Whether the axis is time (else events).
    pub fn is_time(&self) -> bool {
        self.times.is_some()
    }

    /// What the axis shows, for its label.
    pub fn label(&self, passes: u64) -> String {
        let end_to_end = if passes > 1 {
            format!("; {passes} passes end to end")
        } else {
            String::new()
        };
        if self.is_time() {
            format!("time since the recording's first event, s (time_us){end_to_end}")
        } else {
            format!("events replayed (the trace records no time: event index){end_to_end}")
        }
    }

    /// Where the moment after `replayed` events (over every pass) falls.
    pub fn at(&self, replayed: u64) -> f64 {
        match replayed.checked_sub(1) {
            None => 0.0,
            Some(last) => self.of_event(last / self.events, last % self.events),
        }
    }

    /// Where event `k` (its index in the trace) of pass `pass` (from 0) falls:
    /// its end.
    pub fn of_event(&self, pass: u64, k: u64) -> f64 {
        match self.times.and_then(|d| d.time_us(k)) {
            Some(t) => pass as f64 * self.span + t.saturating_sub(self.t0) as f64 / 1e6,
            None => (pass * self.events + k + 1) as f64,
        }
    }

    /// How far one pass reaches.
    pub fn pass_span(&self) -> f64 {
        self.span
    }
}

/// A round step (1, 2 or 5 times a power of ten) giving about `n` ticks up to
/// `range`.
pub fn tick_step(range: f64, n: f64) -> f64 {
    let raw = (range / n).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// A tick's label with the digits its step needs.
pub fn tick_label(v: f64, step: f64) -> String {
    let digits = (-step.log10().floor()).clamp(0.0, 9.0) as usize;
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_labels_have_the_digits_they_need() {
        assert_eq!(tick_step(10.0, 5.0), 2.0);
        assert_eq!(tick_step(0.37, 5.0), 0.1);
        assert_eq!(tick_step(7000.0, 5.0), 2000.0);
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(4000.0, 2000.0), "4000");
    }

    #[test]
    fn without_times_the_axis_counts_events_over_every_pass() {
        let a = Axis::new(None, 10);
        assert!(!a.is_time());
        assert_eq!(a.at(0), 0.0);
        assert_eq!(a.at(25), 25.0);
        assert_eq!(a.of_event(2, 4), 25.0);
        assert!(a.label(3).contains("event index"));
    }
}
