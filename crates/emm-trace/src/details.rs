//! What a PyTorch snapshot tells beside its events ([`TraceDetails`]): when each
//! event happened (`time_us`), the stack of frames that made each allocation,
//! and PyTorch's own reserved bytes along the trace (its segment events).
//!
//! Stacks are kept once each and frames once each, so a snapshot of 100,000
//! events whose allocations come from a few hundred places holds a few hundred
//! stacks.

use std::collections::HashMap;
use std::sync::Arc;

/// The most frames kept of one stack (the innermost; PyTorch's are 15-40 deep).
pub const MAX_FRAMES: usize = 64;

/// One frame of a stack, as PyTorch records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function.
    pub name: Arc<str>,
    /// Its file (`??` where PyTorch did not know it).
    pub filename: Arc<str>,
    /// The line (0 where not known).
    pub line: i64,
}

/// PyTorch's reserved bytes from one of its segment events on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservedPoint {
    /// Events of the trace before it: where it falls among the events replayed.
    pub event: u64,
    /// PyTorch's reserved bytes from there on.
    pub bytes: u128,
}

/// A stack's number in a [`TraceDetails`].
pub type StackId = u32;

const NO_STACK: u32 = u32::MAX;

/// What a snapshot tells of its events besides the events (see the module).
#[derive(Clone, Debug, Default)]
pub struct TraceDetails {
    /// Each event's time, by its index; empty when none was recorded.
    times: Vec<u64>,
    /// Each event's stack, by its index ([`NO_STACK`]: none); empty when no event
    /// has one.
    stack_of: Vec<u32>,
    /// Stacks: frame numbers, innermost first.
    stacks: Vec<Vec<u32>>,
    frames: Vec<Frame>,
    /// PyTorch's reserved bytes, from the start of the trace, by event.
    reserved: Vec<ReservedPoint>,
}

impl TraceDetails {
    /// Whether the events have times.
    pub fn has_times(&self) -> bool {
        !self.times.is_empty()
    }

    /// When event `event` (its index in the trace) happened, in microseconds
    /// (PyTorch's `time_us`; never earlier than the event before). Events
    /// reconstructed at the start of the trace (made before the recording) have
    /// the first time recorded.
    pub fn time_us(&self, event: u64) -> Option<u64> {
        usize::try_from(event)
            .ok()
            .and_then(|i| self.times.get(i))
            .copied()
    }

    /// The stack of the allocation made by event `event`, if recorded.
    pub fn stack_of(&self, event: u64) -> Option<StackId> {
        usize::try_from(event)
            .ok()
            .and_then(|i| self.stack_of.get(i))
            .copied()
            .filter(|&s| s != NO_STACK)
    }

    /// The frames of stack `id`, innermost first (at most [`MAX_FRAMES`]).
    pub fn stack(&self, id: StackId) -> impl Iterator<Item = &Frame> + Clone {
        self.stacks
            .get(id as usize)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(|&f| self.frames.get(f as usize))
    }

    /// How many distinct stacks there are.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// PyTorch's reserved bytes along the trace: the bytes at its start, then
    /// after each segment event (empty when the snapshot tells none).
    pub fn torch_reserved(&self) -> &[ReservedPoint] {
        &self.reserved
    }
}

/// Builds [`TraceDetails`] while a snapshot is read: one call per event pushed,
/// in order.
#[derive(Default)]
pub(crate) struct DetailsBuilder {
    times: Vec<Option<u64>>,
    stack_of: Vec<u32>,
    any_stack: bool,
    stacks: Vec<Vec<u32>>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    stack_ids: HashMap<Vec<u32>, u32>,
    /// PyTorch's reserved bytes relative to the start, after each segment event:
    /// (events before it, bytes).
    deltas: Vec<(u64, i128)>,
}

impl DetailsBuilder {
    /// An event was pushed, at `time`, made by `stack` (frames, innermost first).
    pub(crate) fn event(&mut self, time: Option<u64>, stack: Option<u32>) {
        self.times.push(time);
        self.stack_of.push(stack.unwrap_or(NO_STACK));
    }

    /// The number of frame `f` (kept once).
    pub(crate) fn frame(&mut self, f: Frame) -> Option<u32> {
        let next = u32::try_from(self.frames.len()).ok()?;
        Some(*self.frame_ids.entry(f).or_insert_with_key(|f| {
            self.frames.push(f.clone());
            next
        }))
    }

    /// The number of the stack of frames numbered `ids` by [`Self::frame`],
    /// innermost first, at most [`MAX_FRAMES`] of them (kept once).
    pub(crate) fn stack_of_frames(&mut self, mut ids: Vec<u32>) -> Option<u32> {
        ids.truncate(MAX_FRAMES);
        if ids.is_empty() {
            return None;
        }
        let next = u32::try_from(self.stacks.len()).ok()?;
        let id = *self.stack_ids.entry(ids).or_insert_with_key(|ids| {
            self.stacks.push(ids.clone());
            next
        });
        self.any_stack = true;
        Some(id)
    }

    /// A segment event after the events pushed so far moved PyTorch's reserved
    /// bytes to `delta` from the start.
    pub(crate) fn reserved(&mut self, delta: i128) {
        self.deltas.push((self.times.len() as u64, delta));
    }

    /// The details, with `pre` events (reconstructed allocations) put before the
    /// events pushed, and PyTorch's reserved bytes `start` at the start.
    pub(crate) fn finish(self, pre: usize, start: i128) -> TraceDetails {
        let first = self.times.iter().flatten().next().copied();
        let times = match first {
            None => Vec::new(),
            Some(first) => {
                let mut at = first;
                std::iter::repeat_n(Some(first), pre)
                    .chain(self.times)
                    .map(|t| {
                        at = at.max(t.unwrap_or(at));
                        at
                    })
                    .collect()
            }
        };
        let stack_of = if self.any_stack {
            std::iter::repeat_n(NO_STACK, pre)
                .chain(self.stack_of)
                .collect()
        } else {
            Vec::new()
        };
        let reserved = if self.deltas.is_empty() && start == 0 {
            Vec::new()
        } else {
            let at = |delta: i128| (start + delta).max(0) as u128;
            std::iter::once(ReservedPoint {
                event: 0,
                bytes: at(0),
            })
            .chain(self.deltas.iter().map(|&(e, d)| ReservedPoint {
                event: e + pre as u64,
                bytes: at(d),
            }))
            .collect()
        };
        TraceDetails {
            times,
            stack_of,
            stacks: self.stacks,
            frames: self.frames,
            reserved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number of `frames` as a stack, each frame numbered first.
    fn stack(b: &mut DetailsBuilder, frames: &[Frame]) -> Option<u32> {
        let ids = frames
            .iter()
            .map(|f| b.frame(f.clone()))
            .collect::<Option<_>>()?;
        b.stack_of_frames(ids)
    }

    fn frame(name: &str) -> Frame {
        Frame {
            name: name.into(),
            filename: "train.py".into(),
            line: 1,
        }
    }

    #[test]
    fn stacks_and_frames_are_kept_once_and_times_never_go_back() {
        let mut b = DetailsBuilder::default();
        let s1 = stack(&mut b, &[frame("f"), frame("g")]);
        let s2 = stack(&mut b, &[frame("f"), frame("g")]);
        let s3 = stack(&mut b, &[frame("g")]);
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
        b.event(Some(10), s1);
        b.event(None, None);
        b.event(Some(5), s3);
        b.reserved(4096);
        b.event(Some(20), None);
        let d = b.finish(2, 1000);
        assert_eq!(d.stack_count(), 2);
        assert_eq!(d.frames.len(), 2);
        let times: Vec<_> = (0..6).map(|e| d.time_us(e)).collect();
        assert_eq!(
            times,
            [Some(10), Some(10), Some(10), Some(10), Some(10), Some(20)]
        );
        assert_eq!(d.stack_of(0), None);
        assert_eq!(d.stack_of(2), s1);
        let names: Vec<&str> = d.stack(s1.unwrap()).map(|f| &*f.name).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(
            d.torch_reserved(),
            [
                ReservedPoint {
                    event: 0,
                    bytes: 1000
                },
                ReservedPoint {
                    event: 5,
                    bytes: 5096
                }
            ]
        );
    }
}
