//! Every file of `corpus/<target>/` through its target, as a plain test: the
//! seeds, the fuzzer's finds kept in the repository and each crash found and fixed
//! (a regression test). A failure names the file.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(name: &str) {
    emm_fuzz::init();
    let (_, target) = emm_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a target of that name");
    let files = corpus(name);
    assert!(!files.is_empty(), "corpus/{name} is empty");
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if catch_unwind(AssertUnwindSafe(|| target(&data))).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{name}: {} of {} corpus files failed:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    println!("{name}: {} corpus files replayed", files.len());
}

#[test]
fn pickle_snapshot() {
    replay("pickle_snapshot");
}

#[test]
fn csv_trace() {
    replay("csv_trace");
}

#[test]
fn rmm_log() {
    replay("rmm_log");
}

#[test]
fn ipc_handle() {
    replay("ipc_handle");
}

#[test]
fn capi_args() {
    replay("capi_args");
}

#[test]
fn pool_ops() {
    replay("pool_ops");
}

#[test]
fn torch_hooks() {
    replay("torch_hooks");
}

#[test]
fn cupy_hooks() {
    replay("cupy_hooks");
}

#[test]
fn every_target_has_a_test_and_a_binary() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in emm_fuzz::TARGETS {
        assert!(
            root.join("src/bin").join(format!("{name}.rs")).is_file(),
            "{name} has no src/bin/{name}.rs"
        );
        assert!(
            root.join("corpus").join(name).is_dir(),
            "{name} has no corpus"
        );
    }
}
