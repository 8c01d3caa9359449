//! [`Diagnostics`]: what was wrong with a trace's lines, kept short.

use crate::error::LineError;

/// How many malformed lines are kept for the report; the rest are only counted.
pub const KEPT_LINE_ERRORS: usize = 5;

/// What reading a trace found besides its events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// Events read.
    pub events: u64,
    /// Malformed lines (or records), all of them.
    pub bad: u64,
    /// The first [`KEPT_LINE_ERRORS`] of them.
    pub first: Vec<LineError>,
}

impl Diagnostics {
    /// Counts a malformed line, keeping it when it is among the first few.
    pub fn push(&mut self, e: LineError) {
        self.bad += 1;
        if self.first.len() < KEPT_LINE_ERRORS {
            self.first.push(e);
        }
    }

    /// Like [`push`](Diagnostics::push), but builds the message only when it is
    /// kept: a file with millions of bad records formats only the first few.
    pub fn push_with(&mut self, line: u64, message: impl FnOnce() -> String) {
        self.bad += 1;
        if self.first.len() < KEPT_LINE_ERRORS {
            self.first.push(LineError {
                line,
                message: message(),
            });
        }
    }
}
