//! The curves of a replay ([`Sample`]): live and reserved bytes per bucket of
//! events, both taken by the same rule (the most in the bucket), so that a
//! manager's reserved bytes are never drawn below the live bytes it holds.

use emm_core::ManagerStats;

/// One point of the curves drawn: the bucket of events after the previous sample,
/// up to and including event `event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Events replayed so far: the end of the bucket.
    pub event: u64,
    /// The most live bytes in the bucket.
    pub live_bytes: u128,
    /// The most reserved bytes in the bucket, as far as they were read: at its
    /// start and end, at the moment live bytes reached the bucket's most, and the
    /// manager's peak where that rose in the bucket. A manager reserves the bytes
    /// it holds, so while every request succeeds this is never below
    /// [`live_bytes`](Sample::live_bytes).
    pub reserved_bytes: u64,
}

/// Takes the samples of one replay.
pub(crate) struct Sampler {
    samples: Vec<Sample>,
    /// About how many samples to keep (0: none).
    want: u64,
    /// Events per bucket (`u64::MAX`: no periodic sample).
    step: u64,
    /// The most live bytes in the bucket so far.
    live: u128,
    /// The most reserved bytes read in the bucket so far.
    reserved: u64,
    /// Live bytes reached a new most of the bucket since reserved bytes were read.
    unread: bool,
    /// The manager's peak of reserved bytes at the previous sample.
    peak: u64,
}

impl Sampler {
    /// A sampler keeping about `want` samples (0: none), a bucket every `step`
    /// events; `now` is the manager's state at the start.
    pub(crate) fn new(want: u64, step: u64, now: &ManagerStats) -> Sampler {
        let reserved = now.reserved_bytes as u64;
        let mut samples = Vec::new();
        if want > 0 {
            samples.push(Sample {
                event: 0,
                live_bytes: 0,
                reserved_bytes: reserved,
            });
        }
        Sampler {
            samples,
            want,
            step,
            live: 0,
            reserved,
            unread: false,
            peak: now.reserved_bytes_peak as u64,
        }
    }

    /// Live bytes are now `live` (after an event).
    pub(crate) fn live(&mut self, live: u128) {
        if self.want > 0 && live > self.live {
            self.live = live;
            self.unread = true;
        }
    }

    /// Whether reserved bytes must be read before the next event frees memory:
    /// live bytes reached the bucket's most since they were last read.
    pub(crate) fn wants_reserved(&self) -> bool {
        self.unread
    }

    /// Reserved bytes read now.
    pub(crate) fn reserved(&mut self, reserved: u64) {
        self.reserved = self.reserved.max(reserved);
        self.unread = false;
    }

    /// Whether a bucket ends after `event` events.
    pub(crate) fn due(&self, event: u64) -> bool {
        self.want > 0 && event % self.step == 0
    }

    /// Ends the bucket at `event` events, with the manager's state `now` and
    /// `live` bytes live; halves the samples (the step doubled) when they reach
    /// twice as many as wanted.
    pub(crate) fn push(&mut self, event: u64, now: &ManagerStats, live: u128) {
        let mut reserved = self.reserved.max(now.reserved_bytes as u64);
        let peak = now.reserved_bytes_peak as u64;
        if peak > self.peak {
            // The manager reached a new peak inside this bucket.
            reserved = reserved.max(peak);
            self.peak = peak;
        }
        self.samples.push(Sample {
            event,
            live_bytes: self.live,
            reserved_bytes: reserved,
        });
        self.live = live;
        self.reserved = now.reserved_bytes as u64;
        self.unread = false;
        if self.samples.len() as u64 > self.want.saturating_mul(2) {
            thin(&mut self.samples);
            self.step = self.step.saturating_mul(2);
        }
    }

    /// The samples, the last bucket ended at `event` events unless it just was.
    pub(crate) fn finish(mut self, event: u64, now: &ManagerStats, live: u128) -> Vec<Sample> {
        if self.want > 0 && self.samples.last().is_some_and(|s| s.event != event) {
            self.push_last(event, now, live);
        }
        self.samples
    }

    /// `push` without thinning: the last sample always stays.
    fn push_last(&mut self, event: u64, now: &ManagerStats, live: u128) {
        let want = self.want;
        self.want = u64::MAX;
        self.push(event, now, live);
        self.want = want;
    }
}

/// Halves `samples` (all but the first, the start) by merging each pair into one
/// at the later's event, with the most live and the most reserved bytes of both.
fn thin(samples: &mut Vec<Sample>) {
    if samples.len() < 3 {
        return;
    }
    let rest: Vec<Sample> = samples.split_off(1);
    for pair in rest.chunks(2) {
        if let Some(&last) = pair.last() {
            samples.push(Sample {
                event: last.event,
                live_bytes: pair.iter().map(|s| s.live_bytes).max().unwrap_or(0),
                reserved_bytes: pair.iter().map(|s| s.reserved_bytes).max().unwrap_or(0),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(reserved: usize, peak: usize) -> ManagerStats {
        ManagerStats {
            reserved_bytes: reserved,
            reserved_bytes_peak: peak,
            ..ManagerStats::default()
        }
    }

    /// Live peaks mid-bucket and reserved falls before the bucket ends (a
    /// manager that gives memory back): the bucket keeps the reserved bytes
    /// read when live was at its most, not the lower figure at its end.
    #[test]
    fn reserved_is_taken_where_live_peaks_not_only_at_the_end() {
        let mut s = Sampler::new(10, 4, &stats(0, 0));
        s.live(100);
        s.live(300);
        assert!(s.wants_reserved());
        s.reserved(320);
        assert!(!s.wants_reserved());
        s.live(50);
        s.push(4, &stats(60, 320), 50);
        let v = s.finish(4, &stats(60, 320), 50);
        assert_eq!(v.len(), 2);
        assert_eq!((v[1].live_bytes, v[1].reserved_bytes), (300, 320));
    }

    /// A peak the manager reached inside the bucket counts even when nothing
    /// read it there.
    #[test]
    fn a_new_peak_of_the_manager_is_the_buckets_reserved() {
        let mut s = Sampler::new(10, 2, &stats(0, 0));
        s.live(10);
        s.reserved(10);
        s.push(2, &stats(10, 500), 10);
        s.push(4, &stats(10, 500), 10);
        let v = s.finish(4, &stats(10, 500), 10);
        assert_eq!(v[1].reserved_bytes, 500);
        assert_eq!(
            v[2].reserved_bytes, 10,
            "the peak counts once, where it rose"
        );
    }

    /// Thinning keeps the most of both figures of each pair.
    #[test]
    fn thinning_keeps_the_most_of_each_pair() {
        let mut v = vec![
            Sample {
                event: 0,
                live_bytes: 0,
                reserved_bytes: 0,
            },
            Sample {
                event: 1,
                live_bytes: 5,
                reserved_bytes: 90,
            },
            Sample {
                event: 2,
                live_bytes: 7,
                reserved_bytes: 8,
            },
        ];
        thin(&mut v);
        assert_eq!(
            v[1],
            Sample {
                event: 2,
                live_bytes: 7,
                reserved_bytes: 90
            }
        );
    }
}
