//! [`TraceError`]: why a trace cannot be read.

/// Why a trace could not be read (or read further). Every message names the trace
/// and, where there is one, the line or record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{trace}: cannot read: {source}")]
    Io {
        /// The trace.
        trace: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The input is binary and not a pickle.
    #[error("{trace}: binary data ({found}); expected emm's CSV, an RMM replay log or a PyTorch memory snapshot pickle")]
    Binary {
        /// The trace.
        trace: String,
        /// What was seen (e.g. "a NUL byte at offset 3").
        found: String,
    },
    /// `--format pytorch` on text: a snapshot is a pickle, and this does not
    /// begin as one.
    #[error("{trace}: was to be read as a PyTorch snapshot (--format pytorch), but it does not begin as a pickle: it begins with the text line {first_line:?}{}; drop --format to detect the format", .header.map(|f| format!(", {}'s header", f.name())).unwrap_or_default())]
    NotASnapshot {
        /// The trace.
        trace: String,
        /// An excerpt of its first non-blank line.
        first_line: String,
        /// The text format whose header that line is, if any.
        header: Option<crate::op::Format>,
    },
    /// The first non-blank line is no known header.
    #[error("{trace}:{line}: no usable header: found {found:?}; expected \"op,id,size,stream\" (emm) or \"Thread,Time,Action,Pointer,Size,Stream\" (RMM), or pass --format")]
    MissingHeader {
        /// The trace.
        trace: String,
        /// The line looked at (1-based).
        line: u64,
        /// An excerpt of it.
        found: String,
    },
    /// The header is another format's than the one asked for (`--format`).
    #[error("{trace}:{line}: the header is {}'s ({}), but the trace was to be read as {} (expected the header {}); drop --format to detect the format", .found.name(), header_of(*.found), .expected.name(), header_of(*.expected))]
    HeaderMismatch {
        /// The trace.
        trace: String,
        /// The header's line (1-based).
        line: u64,
        /// The format whose header was found.
        found: crate::op::Format,
        /// The format asked for.
        expected: crate::op::Format,
    },
    /// A line is longer than any valid line could be.
    #[error("{trace}:{line}: line longer than {limit} bytes; this is not a trace")]
    LineTooLong {
        /// The trace.
        trace: String,
        /// The line (1-based).
        line: u64,
        /// The limit.
        limit: usize,
    },
    /// No line (or record) could be used.
    #[error("{trace}: no usable event: {why}")]
    NoUsableEvent {
        /// The trace.
        trace: String,
        /// Why (e.g. "all 12 lines are malformed; the first: line 2: ...").
        why: String,
    },
    /// The pickle could not be decoded.
    #[error("{trace}: not a readable pickle: {reason}")]
    Pickle {
        /// The trace.
        trace: String,
        /// What the decoder said.
        reason: String,
    },
    /// The pickle decoded but is not a PyTorch memory snapshot.
    #[error("{trace}: {at}: not a PyTorch memory snapshot: expected {expected}, found {found}")]
    Snapshot {
        /// The trace.
        trace: String,
        /// Where in the snapshot (e.g. `device_traces[0][17]`).
        at: String,
        /// What was expected there.
        expected: &'static str,
        /// What was found (a short excerpt).
        found: String,
    },
    /// The input is larger than this reader accepts for its format.
    #[error("{trace}: {size} bytes is larger than the {limit} bytes accepted for {what}")]
    TooLarge {
        /// The trace.
        trace: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
        /// The format.
        what: &'static str,
    },
}

/// A format's header line, quoted, for messages.
fn header_of(f: crate::op::Format) -> &'static str {
    match f {
        crate::op::Format::EmmCsv => "\"op,id,size,stream\"",
        crate::op::Format::RmmLog => "\"Thread,Time,Action,Pointer,Size,Stream\"",
        _ => "none: not a text format",
    }
}

/// A malformed line or record: reported, then skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// Line number (1-based) or record index.
    pub line: u64,
    /// What was wrong, with a short excerpt.
    pub message: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// At most `max` characters of `s`, with "…" when cut.
pub fn excerpt(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}
