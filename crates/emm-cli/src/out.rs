//! Writing to stdout and stderr without panicking: a closed pipe ends the program
//! quietly (exit 0), any other write error is reported once (exit 1).

use std::fmt::Display;
use std::io::{self, Write};
use std::process::ExitCode;

/// Standard output, with errors returned instead of panics.
pub struct Out {
    inner: io::StdoutLock<'static>,
}

impl Out {
    pub fn stdout() -> Out {
        Out {
            inner: io::stdout().lock(),
        }
    }

    /// Writes `s` and a newline.
    pub fn line(&mut self, s: impl Display) -> io::Result<()> {
        writeln!(self.inner, "{s}")
    }

    /// Writes raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.inner.write_all(b)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
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
