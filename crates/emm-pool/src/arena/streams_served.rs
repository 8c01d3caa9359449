//! Which streams an arena has served since its last reset: none yet, one, or
//! several (for good, until a reset). A thread keeps its cache at a small
//! request's miss only in an arena that has served one stream
//! (`Arena::serves_only`): where streams share an arena, their free blocks
//! coalesce across streams, and keeping caches there loosened the recorded
//! FSDP2 traces.

use crate::stream_key::StreamKey;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum StreamsServed {
    #[default]
    None,
    One(StreamKey),
    Several,
}

impl StreamsServed {
    /// Counts a request of `stream`.
    pub fn note(&mut self, stream: StreamKey) {
        *self = match *self {
            StreamsServed::None => StreamsServed::One(stream),
            StreamsServed::One(s) if s == stream => return,
            _ => StreamsServed::Several,
        };
    }

    /// Whether every request so far was `stream`'s.
    pub fn only(&self, stream: StreamKey) -> bool {
        *self == StreamsServed::One(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_until_another_comes() {
        let mut s = StreamsServed::default();
        assert!(!s.only(7), "none served yet");
        s.note(7);
        s.note(7);
        assert!(s.only(7));
        assert!(!s.only(8));
        s.note(8);
        assert!(!s.only(7) && !s.only(8), "several, for good");
        s.note(7);
        assert!(!s.only(7));
    }
}
