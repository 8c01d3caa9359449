//! What the page tests share: the `emm` command on the host stand-in, their data,
//! and a folder for what they write.

use std::path::PathBuf;
use std::process::{Command, Output};

/// `emm` as the tests run it: the host stand-in (also where a driver is
/// present), no setting from the environment.
pub fn emm() -> Command {
    // EMM_BIN: the GPU bundle's `emm` (set by its run.sh); else the one cargo built.
    let bin = std::env::var_os("EMM_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_emm").into());
    let mut c = Command::new(bin);
    // Every `EMM_*` setting (the pool's `EMM_POOL_STREAM_POOLS` among them)
    // and PyTorch's allocator settings, which the models read.
    for (k, _) in std::env::vars_os() {
        if k.to_str()
            .is_some_and(|k| k.starts_with("EMM_") || k.starts_with("PYTORCH_"))
        {
            c.env_remove(k);
        }
    }
    c.env("EMM_CUDA_DRIVER", "/nonexistent/libcuda.so.1");
    c
}

/// Runs `emm` with `args` and checks it did not panic.
pub fn run(c: &mut Command) -> Output {
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(o.status.code(), Some(101), "{err}");
    o
}

/// Test data under `crates/`, found at run time: `EMM_TEST_DATA` (the checkout's
/// `crates/` beside the GPU bundle, set by its `run.sh`), else cargo's `CARGO_MANIFEST_DIR` of the running test.
pub fn data(rel: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("EMM_TEST_DATA") {
        return PathBuf::from(d).join(rel);
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect(
        "run the tests through cargo, or set EMM_TEST_DATA to the checkout's crates/ folder",
    );
    PathBuf::from(manifest).join("..").join(rel)
}

/// A folder for what a test writes (pages, screenshots), kept after the run to
/// be looked at: `EMM_TEST_OUT`, else cargo's `target/tmp/emm-page`, else the
/// system's temporary folder.
pub fn out_dir() -> PathBuf {
    let base = std::env::var_os("EMM_TEST_OUT")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_TARGET_TMPDIR").map(|d| PathBuf::from(d).join("emm-page")))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("emm-page-{}", std::process::id())));
    std::fs::create_dir_all(&base).unwrap();
    base
}
