//! [`Trace`]: a named source of events that can be read more than once (once to
//! scan, once per manager), and [`Events`], one pass over it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::details::TraceDetails;
use crate::diagnostics::Diagnostics;
use crate::error::TraceError;
use crate::op::{Format, Op};
use crate::snapshot::{read_snapshot, TorchFigures, MAX_SNAPSHOT_BYTES};
use crate::text::{not_a_snapshot, sniff, Sniff, TextEvents};

const READ_BUFFER: usize = 64 << 10;

#[derive(Clone, Debug)]
enum Body {
    File(PathBuf),
    Text(Arc<str>),
    Ops(Arc<Vec<Op>>),
}

/// A trace: where its events come from, in which format.
///
/// Text traces are read from their file on every pass, one line at a time, so
/// memory stays bounded whatever the file's size. Snapshots and synthetic traces
/// hold their events in memory.
#[derive(Clone, Debug)]
pub struct Trace {
    name: String,
    format: Format,
    body: Body,
    torch: Option<TorchFigures>,
    preread: Option<Diagnostics>,
    details: Option<Arc<TraceDetails>>,
}

/// Which `--format` to read a file in; `None` detects it from the content.
pub type FormatChoice = Option<Format>;

impl Trace {
    /// Opens `path`, detecting its format from its first bytes (or taking
    /// `format`). A snapshot yields one trace per device with activity; a text
    /// file one trace. Text files are checked up to their header here and read in
    /// full by each pass; a text trace that is not a regular file (a FIFO, a
    /// pipe) is read once into memory, as [`Trace::from_reader`] reads it.
    pub fn open(path: &Path, format: FormatChoice) -> Result<Vec<Trace>, TraceError> {
        Self::open_limited(path, format, MAX_SNAPSHOT_BYTES)
    }

    /// [`Trace::open`] accepting at most `limit` bytes of a snapshot or of a
    /// trace that is not a regular file (the tests' smaller limit).
    fn open_limited(
        path: &Path,
        format: FormatChoice,
        limit: u64,
    ) -> Result<Vec<Trace>, TraceError> {
        let name = path.display().to_string();
        let io = |source| TraceError::Io {
            trace: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory",
            )));
        }
        let mut reader = BufReader::with_capacity(READ_BUFFER, file);
        let head = reader.fill_buf().map_err(io)?.to_vec();
        let sniffed = sniff(&head);
        let pickle = match (format, &sniffed) {
            (Some(Format::TorchSnapshot), Sniff::Text) => return Err(not_a_snapshot(&name, &head)),
            (Some(Format::TorchSnapshot), _) | (None, Sniff::Pickle) => true,
            (_, Sniff::Binary(found)) => {
                return Err(TraceError::Binary {
                    trace: name,
                    found: found.clone(),
                })
            }
            (Some(Format::Memory), _) => {
                return Err(TraceError::NoUsableEvent {
                    trace: name,
                    why: "the `memory` format cannot be read from a file".into(),
                })
            }
            _ => false,
        };
        if !meta.is_file() {
            // A FIFO, `/dev/stdin` or a process substitution cannot be opened
            // again for each pass (and the bytes read above to find the format
            // would be gone): it is read once, into memory, as standard input is,
            // and one longer than the limit is too large, not cut short.
            return Self::from_reader_limited(&name, reader, format, limit);
        }
        if pickle {
            if meta.len() > limit {
                return Err(TraceError::TooLarge {
                    trace: name,
                    size: meta.len(),
                    limit,
                    what: "a PyTorch snapshot",
                });
            }
            let limited = reader.take(limit);
            let devices = read_snapshot(limited, &name)?;
            return Ok(snapshot_traces(&name, devices));
        }
        let events = TextEvents::new(reader, &name, format)?;
        Ok(vec![Trace {
            format: events.format(),
            name,
            body: Body::File(path.to_owned()),
            torch: None,
            preread: None,
            details: None,
        }])
    }

    /// Reads a whole trace from `reader` (standard input, a pipe) into memory,
    /// detecting its format as [`Trace::open`] does (or taking `format`); `name`
    /// names it in reports. At most [`MAX_SNAPSHOT_BYTES`](crate::snapshot::MAX_SNAPSHOT_BYTES)
    /// are read: more is [`TraceError::TooLarge`].
    pub fn from_reader(
        name: &str,
        reader: impl std::io::Read,
        format: FormatChoice,
    ) -> Result<Vec<Trace>, TraceError> {
        Self::from_reader_limited(name, reader, format, MAX_SNAPSHOT_BYTES)
    }

    /// [`Trace::from_reader`] accepting at most `limit` bytes.
    fn from_reader_limited(
        name: &str,
        reader: impl std::io::Read,
        format: FormatChoice,
        limit: u64,
    ) -> Result<Vec<Trace>, TraceError> {
        let mut data = Vec::new();
        reader
            .take(limit + 1)
            .read_to_end(&mut data)
            .map_err(|source| TraceError::Io {
                trace: name.to_owned(),
                source,
            })?;
        if data.len() as u64 > limit {
            return Err(TraceError::TooLarge {
                trace: name.to_owned(),
                size: data.len() as u64,
                limit,
                what: "a trace read from a stream",
            });
        }
        let head = &data[..data.len().min(READ_BUFFER)];
        match (format, sniff(head)) {
            (Some(Format::TorchSnapshot), Sniff::Text) => Err(not_a_snapshot(name, head)),
            (Some(Format::TorchSnapshot), _) | (None, Sniff::Pickle) => {
                let devices = read_snapshot(&data[..], name)?;
                Ok(snapshot_traces(name, devices))
            }
            (_, Sniff::Binary(found)) => Err(TraceError::Binary {
                trace: name.to_owned(),
                found,
            }),
            (Some(Format::Memory), _) => Err(TraceError::NoUsableEvent {
                trace: name.to_owned(),
                why: "the `memory` format cannot be read from a stream".into(),
            }),
            _ => {
                let text: Arc<str> = String::from_utf8_lossy(&data).into();
                let events = TextEvents::new(text.as_bytes(), name, format)?;
                Ok(vec![Trace {
                    name: name.to_owned(),
                    format: events.format(),
                    body: Body::Text(text),
                    torch: None,
                    preread: None,
                    details: None,
                }])
            }
        }
    }

    /// A text trace held in memory (e.g. one bundled into a program). Its header
    /// is checked here.
    pub fn from_text(name: &str, text: impl Into<Arc<str>>) -> Result<Trace, TraceError> {
        let text: Arc<str> = text.into();
        let events = TextEvents::new(text.as_bytes(), name, None)?;
        Ok(Trace {
            name: name.to_owned(),
            format: events.format(),
            body: Body::Text(text),
            torch: None,
            preread: None,
            details: None,
        })
    }

    /// A trace of events built in memory.
    pub fn from_ops(name: &str, ops: Vec<Op>) -> Trace {
        Trace {
            name: name.to_owned(),
            format: Format::Memory,
            body: Body::Ops(Arc::new(ops)),
            torch: None,
            preread: None,
            details: None,
        }
    }

    /// The name reports use (the path as given).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The format read.
    pub fn format(&self) -> Format {
        self.format
    }

    /// PyTorch's own figures, when the trace is a snapshot.
    pub fn torch_figures(&self) -> Option<&TorchFigures> {
        self.torch.as_ref()
    }

    /// What a snapshot tells besides its events: times, stacks, PyTorch's
    /// reserved bytes along the trace (`None` for other formats).
    pub fn details(&self) -> Option<&TraceDetails> {
        self.details.as_deref()
    }

    /// One pass over the events.
    pub fn events(&self) -> Result<Events<'_>, TraceError> {
        let inner = match &self.body {
            Body::File(p) => {
                let f = File::open(p).map_err(|source| TraceError::Io {
                    trace: self.name.clone(),
                    source,
                })?;
                let r: Box<dyn BufRead + '_> = Box::new(BufReader::with_capacity(READ_BUFFER, f));
                Inner::Text(TextEvents::new(r, &self.name, Some(self.format))?)
            }
            Body::Text(t) => {
                let r: Box<dyn BufRead + '_> = Box::new(t.as_bytes());
                Inner::Text(TextEvents::new(r, &self.name, Some(self.format))?)
            }
            Body::Ops(ops) => Inner::Ops(ops.iter()),
        };
        Ok(Events {
            inner,
            diag: self.preread.clone().unwrap_or_default(),
            fatal: None,
        })
    }
}

/// One trace per device of a snapshot named `name`.
fn snapshot_traces(name: &str, devices: Vec<crate::snapshot::DeviceTrace>) -> Vec<Trace> {
    let many = devices.len() > 1;
    devices
        .into_iter()
        .map(|d| Trace {
            name: if many {
                format!("{name} (cuda:{})", d.device)
            } else {
                name.to_owned()
            },
            format: Format::TorchSnapshot,
            body: Body::Ops(Arc::new(d.ops)),
            torch: Some(d.figures),
            preread: Some(d.diagnostics),
            details: Some(Arc::new(d.details)),
        })
        .collect()
}

enum Inner<'a> {
    Text(TextEvents<Box<dyn BufRead + 'a>>),
    Ops(std::slice::Iter<'a, Op>),
}

/// One pass over a trace's events: an iterator of [`Op`]s. A fatal error ends the
/// iteration; [`Events::finish`] returns it, or the [`Diagnostics`].
pub struct Events<'a> {
    inner: Inner<'a>,
    diag: Diagnostics,
    fatal: Option<TraceError>,
}

impl Iterator for Events<'_> {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        if self.fatal.is_some() {
            return None;
        }
        match &mut self.inner {
            Inner::Ops(it) => it.next().copied(),
            Inner::Text(t) => match t.next_op(&mut self.diag) {
                Ok(op) => op,
                Err(e) => {
                    self.fatal = Some(e);
                    None
                }
            },
        }
    }
}

impl Events<'_> {
    /// What the pass found: the fatal error that ended it, or its diagnostics.
    pub fn finish(self) -> Result<Diagnostics, TraceError> {
        match self.fatal {
            Some(e) => Err(e),
            None => Ok(self.diag),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protocol-4 pickle of one bytes object of `n` bytes.
    fn big_pickle(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 4, 0x8e];
        p.extend((n as u64).to_le_bytes());
        p.extend(std::iter::repeat_n(0u8, n));
        p.push(b'.');
        p
    }

    /// A snapshot past the limit is too large whether it comes from a file or a
    /// FIFO (`<(...)`, `/dev/stdin`); from a FIFO it was once cut at the limit
    /// and called "truncated".
    #[test]
    fn a_snapshot_past_the_limit_is_too_large_from_a_file_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let data = big_pickle(4096);
        let file = dir.path().join("big.pickle");
        std::fs::write(&file, &data).unwrap();
        let fifo = dir.path().join("big.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let writer = {
            let (fifo, data) = (fifo.clone(), data.clone());
            std::thread::spawn(move || {
                use std::io::Write as _;
                // The reader stops at the limit and closes: a broken pipe then.
                let _ = File::options()
                    .write(true)
                    .open(fifo)
                    .and_then(|mut f| f.write_all(&data));
            })
        };
        for (path, what) in [
            (&file, "a PyTorch snapshot"),
            (&fifo, "a trace read from a stream"),
        ] {
            let e = Trace::open_limited(path, None, 1024).unwrap_err();
            assert!(
                matches!(&e, TraceError::TooLarge { limit: 1024, what: w, .. } if *w == what),
                "{}: {e}",
                path.display()
            );
        }
        writer.join().unwrap();
        // Within the limit, both read.
        assert!(matches!(
            Trace::open_limited(&file, None, 8192),
            Err(TraceError::Snapshot { .. } | TraceError::NoUsableEvent { .. })
        ));
    }
}
