//! The line formats: emm's CSV and RMM's replay log, read as a stream with bounded
//! memory (one line at a time, each at most [`MAX_LINE`] bytes).

use std::collections::HashMap;
use std::io::{BufRead, Read};

use crate::diagnostics::Diagnostics;
use crate::error::{excerpt, LineError, TraceError};
use crate::op::{Format, Op};

/// The longest line accepted; no valid line of either format comes near it.
pub const MAX_LINE: usize = 4096;

/// Reading gives up when this many lines in a row were malformed before any good one.
pub const GIVE_UP_AFTER_BAD: u64 = 1000;

const EXCERPT: usize = 60;

/// What the first bytes of an input look like.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sniff {
    Pickle,
    Text,
    Binary(String),
}

/// Tells a pickle, text and other binary data apart from the first bytes.
///
/// Protocols 2 to 5 begin with `PROTO`. Protocols 0 and 1 have no such mark, so a
/// pickle of theirs is known by how a dict (a snapshot's top) begins: `}` then a
/// memo `PUT`, a `MARK` or `STOP` at protocol 1; `(d` then `p` (`PUT`), a key
/// (`S`, `V`) or `STOP` at protocol 0. Neither begins a line of a text trace.
pub(crate) fn sniff(head: &[u8]) -> Sniff {
    match head {
        [0x80, 2..=5, ..] | [b'}', b'q' | b'r' | b'(' | b'.', ..] => return Sniff::Pickle,
        [b'(', b'd', b'p' | b'S' | b'V' | b'.', ..] => return Sniff::Pickle,
        _ => {}
    }
    if let Some(at) = head.iter().position(|&b| b == 0) {
        return Sniff::Binary(format!("a NUL byte at offset {at}"));
    }
    if let Err(e) = std::str::from_utf8(head) {
        if e.error_len().is_some() {
            return Sniff::Binary(format!("invalid UTF-8 at offset {}", e.valid_up_to()));
        }
    }
    Sniff::Text
}

/// The error for text read as a snapshot (`--format pytorch`): what its first
/// non-blank line is, from the bytes `head` it begins with.
pub(crate) fn not_a_snapshot(trace: &str, head: &[u8]) -> TraceError {
    let text = String::from_utf8_lossy(head);
    let line = text
        .lines()
        .map(|l| l.trim_start_matches('\u{feff}').trim())
        .find(|l| !l.is_empty())
        .unwrap_or("");
    TraceError::NotASnapshot {
        trace: trace.to_owned(),
        first_line: line.chars().take(60).collect(),
        header: header_format(line),
    }
}

fn header_format(line: &str) -> Option<Format> {
    let h: String = line
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    if h == "op,id,size,stream" {
        Some(Format::EmmCsv)
    } else if h.starts_with("thread,time,action,pointer,size") {
        Some(Format::RmmLog)
    } else {
        None
    }
}

/// Events of a text trace, one line at a time.
pub(crate) struct TextEvents<R> {
    reader: R,
    trace: String,
    format: Format,
    line: u64,
    buf: Vec<u8>,
    pending: Option<String>,
    rmm_ids: HashMap<u64, u64>,
    next_id: u64,
}

impl<R: BufRead> TextEvents<R> {
    /// Reads up to and including the header. `forced` (`EmmCsv` or `RmmLog`)
    /// makes the header optional.
    pub(crate) fn new(reader: R, trace: &str, forced: Option<Format>) -> Result<Self, TraceError> {
        let mut t = TextEvents {
            reader,
            trace: trace.to_owned(),
            format: forced.unwrap_or(Format::EmmCsv),
            line: 0,
            buf: Vec::with_capacity(256),
            pending: None,
            rmm_ids: HashMap::new(),
            next_id: 0,
        };
        loop {
            let Some(line) = t.read_line()? else {
                return Err(TraceError::NoUsableEvent {
                    trace: t.trace,
                    why: "the file is empty (no header, no event)".into(),
                });
            };
            let line = line.trim_start_matches('\u{feff}').trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match (header_format(line), forced) {
                (Some(f), None) => t.format = f,
                (Some(f), Some(g)) if f == g => {}
                (Some(f), Some(g)) => {
                    return Err(TraceError::HeaderMismatch {
                        trace: t.trace,
                        line: t.line,
                        found: f,
                        expected: g,
                    })
                }
                (None, Some(_)) => t.pending = Some(line.to_owned()),
                (None, None) => {
                    return Err(TraceError::MissingHeader {
                        trace: t.trace,
                        line: t.line,
                        found: excerpt(line, EXCERPT),
                    })
                }
            }
            return Ok(t);
        }
    }

    /// The format read.
    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// The next line, without its end; `None` at the end of the input.
    fn read_line(&mut self) -> Result<Option<String>, TraceError> {
        self.buf.clear();
        let limit = MAX_LINE as u64 + 1;
        let n = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
            .map_err(|source| TraceError::Io {
                trace: self.trace.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if self.buf.len() > MAX_LINE && self.buf.last() != Some(&b'\n') {
            return Err(TraceError::LineTooLong {
                trace: self.trace.clone(),
                line: self.line,
                limit: MAX_LINE,
            });
        }
        if let Some(at) = self.buf.iter().position(|&b| b == 0) {
            return Err(TraceError::Binary {
                trace: self.trace.clone(),
                found: format!("a NUL byte in line {}, column {}", self.line, at + 1),
            });
        }
        let text = String::from_utf8_lossy(&self.buf);
        Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()))
    }

    /// The next event; malformed lines go to `diag`. `Ok(None)` at the end.
    pub(crate) fn next_op(&mut self, diag: &mut Diagnostics) -> Result<Option<Op>, TraceError> {
        loop {
            let line = match self.pending.take() {
                Some(l) => l,
                None => match self.read_line()? {
                    Some(l) => l,
                    None => return Ok(None),
                },
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let parsed = match self.format {
                Format::RmmLog => parse_rmm(&f, &mut self.rmm_ids, &mut self.next_id),
                _ => parse_emm(&f),
            };
            match parsed {
                Ok(Some(op)) => {
                    diag.events += 1;
                    return Ok(Some(op));
                }
                Ok(None) => {}
                Err(message) => {
                    diag.push(LineError {
                        line: self.line,
                        message: format!("{message} (in {:?})", excerpt(line, EXCERPT)),
                    });
                    if diag.events == 0 && diag.bad >= GIVE_UP_AFTER_BAD {
                        return Err(TraceError::NoUsableEvent {
                            trace: self.trace.clone(),
                            why: format!(
                                "the first {} lines after the header are all malformed; the first: {}",
                                diag.bad,
                                diag.first.first().map_or_else(String::new, ToString::to_string)
                            ),
                        });
                    }
                }
            }
        }
    }
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{what} {:?} is not a number", excerpt(s, 24)))
}

fn parse_emm(f: &[&str]) -> Result<Option<Op>, String> {
    if f.len() != 4 {
        return Err(format!(
            "expected 4 fields (op,id,size,stream), found {}",
            f.len()
        ));
    }
    let id = num(f[1], "id")?;
    match f[0] {
        "a" => Ok(Some(Op::Alloc {
            id,
            size: num(f[2], "size")?,
            stream: num(f[3], "stream")?,
        })),
        "f" => Ok(Some(Op::Free { id })),
        other => Err(format!(
            "op {:?} is neither \"a\" nor \"f\"",
            excerpt(other, 24)
        )),
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x").trim_start_matches("0X"), 16).ok()
}

/// Why `s`, named `what`, is not a 64-bit hex value: not hex at all, or too
/// large for 64 bits.
fn not_hex(what: &str, s: &str) -> String {
    let digits = s.trim_start_matches("0x").trim_start_matches("0X");
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{what} {:?} is larger than 64 bits", excerpt(s, 24))
    } else {
        format!("{what} {:?} is not hex", excerpt(s, 24))
    }
}

fn parse_rmm(
    f: &[&str],
    ids: &mut HashMap<u64, u64>,
    next: &mut u64,
) -> Result<Option<Op>, String> {
    if f.len() < 6 {
        return Err(format!(
            "expected 6 fields (Thread,Time,Action,Pointer,Size,Stream), found {}",
            f.len()
        ));
    }
    if f[2] == "allocate failure" {
        // No block came of it; its pointer may be written as "(nil)".
        return Ok(None);
    }
    let ptr = hex(f[3]).ok_or_else(|| not_hex("pointer", f[3]))?;
    match f[2] {
        "allocate" => {
            // RMM writes the stream as a pointer (`0x0`); an empty field is the
            // default stream, anything else that is not hex is said, not read as 0.
            let field = f[5].trim();
            let stream = if field.is_empty() {
                0
            } else {
                hex(field).ok_or_else(|| not_hex("stream", field))?
            };
            let size = num(f[4], "size")?;
            // A pointer allocated again while live keeps its id: the replay then
            // takes the earlier allocation as freed there and counts it, as it
            // does an emm CSV's reused id (a fresh id left the earlier one live
            // for ever).
            let id = match ids.get(&ptr) {
                Some(&live) => live,
                None => {
                    *next += 1;
                    ids.insert(ptr, *next);
                    *next
                }
            };
            Ok(Some(Op::Alloc { id, size, stream }))
        }
        "free" => match ids.remove(&ptr) {
            Some(id) => Ok(Some(Op::Free { id })),
            None => Err(format!("free of pointer {ptr:#x} that was never allocated")),
        },
        "allocate failure" => Ok(None),
        other => Err(format!(
            "action {:?} is not allocate/free",
            excerpt(other, 24)
        )),
    }
}
