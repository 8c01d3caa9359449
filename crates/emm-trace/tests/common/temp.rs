//! A file written for one test, in a folder of its own that goes when the
//! [`Temp`] does (`tempfile`). Shared by `emm-trace`'s and `emm-cli`'s tests
//! (the second includes this file by its path).

use std::io::Write;
use std::path::{Path, PathBuf};

/// A file of a test's, removed with its folder when this is dropped: it must
/// outlive whatever reads it (a text trace is read from its file again on every
/// pass; a command reads the path it is given).
pub struct Temp {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Temp {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Temp {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for Temp {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// `bytes` written to a file `name` in a new folder whose name starts with
/// `prefix`.
pub fn temp_in(prefix: &str, name: &str, bytes: &[u8]) -> Temp {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    Temp { path, _dir: dir }
}
