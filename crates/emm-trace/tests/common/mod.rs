//! What the integration tests of `emm-trace` share.

use std::path::PathBuf;

use emm_trace::Trace;

/// Test data under `crates/`, found at run time: `EMM_TEST_DATA` (the checkout's
/// `crates/` beside the GPU bundle, set by its `run.sh`), else cargo's `CARGO_MANIFEST_DIR` of the running
/// test. Never a path compiled in, so a moved bundle still finds its data.
pub fn data(rel: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("EMM_TEST_DATA") {
        return PathBuf::from(d).join(rel);
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .expect("run the tests through cargo, or set EMM_TEST_DATA to the checkout's crates/ folder");
    PathBuf::from(manifest).join("..").join(rel)
}

/// The recorded trace `name` bundled with `emm-cli` (`crates/emm-cli/traces`).
#[allow(dead_code)] // not every test file replays a bundled trace
pub fn bundled(name: &str) -> Trace {
    Trace::open(&data("emm-cli/traces").join(name), None)
        .unwrap()
        .remove(0)
}
