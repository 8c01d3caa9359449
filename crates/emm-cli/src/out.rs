//! Writing to stdout and stderr without panicking. A closed pipe ends `bench`
//! and `info` quietly (exit 0); `replay` goes on without its standard output
//! (`Out::stdout_past_close`), so that what failed still reaches stderr and the
//! exit status, and the page of `--html` is still written. Any other write
//! error is reported once (exit 1).

use std::fmt::Display;
use std::io::{self, Write};
use std::process::ExitCode;

/// Standard output, with errors returned instead of panics.
pub struct Out {
    inner: io::StdoutLock<'static>,
    /// Whether a closed pipe lets the command go on (its writes then do nothing).
    past_close: bool,
    /// The reader went away (only with `past_close`).
    closed: bool,
}

impl Out {
    /// Standard output whose closed pipe is an error (`finish` ends quietly).
    pub fn stdout() -> Out {
        Out {
            inner: io::stdout().lock(),
            past_close: false,
            closed: false,
        }
    }

    /// Standard output whose closed pipe only stops the output: later writes
    /// do nothing and succeed, so the command finishes its work and its exit
    /// status says whether that work failed.
    pub fn stdout_past_close() -> Out {
        Out {
            past_close: true,
            ..Out::stdout()
        }
    }

    fn check(&mut self, r: io::Result<()>) -> io::Result<()> {
        match r {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe && self.past_close => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }

    /// Writes `s` and a newline.
    pub fn line(&mut self, s: impl Display) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let r = writeln!(self.inner, "{s}");
        self.check(r)
    }

    /// Writes raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let r = self.inner.write_all(b);
        self.check(r)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let r = self.inner.flush();
        self.check(r)
    }
}

/// A line on stderr; a failure to write it is ignored (there is nowhere left to say it).
pub fn note(s: impl Display) {
    let _ = writeln!(io::stderr(), "{s}");
}

/// The exit status of a command whose output may have failed.
pub fn finish(r: io::Result<ExitCode>) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            note(format_args!("emm: cannot write the output: {e}"));
            ExitCode::from(1)
        }
    }
}
