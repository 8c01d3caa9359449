//! `cargo xtask ci` (every step CI runs, in order) and `cargo xtask doc`.

use std::path::Path;

use crate::tidy::tidy;
use crate::{browser, cpp, doc_links, fuzz, header, python, venv};
use crate::{cargo, run, target_dir, workspace_crates};

/// `cargo xtask ci`: every check CI runs (see `main.rs`).
pub(crate) fn ci(root: &Path) -> Result<(), String> {
    run(
        root,
        "fmt",
        "run `cargo fmt --all` and commit the result",
        cargo().args(["fmt", "--all", "--check"]),
    )?;
    header::check(root)?;
    run(
        root,
        "clippy",
        "fix the lints above; an `allow` needs a `reason`",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run(
        root,
        "build stand-in driver",
        "crates/emm-standin must build: the stand-in tests load libemm_standin.so",
        cargo().args(["build", "-p", "emm-standin"]),
    )?;
    let mut test = cargo();
    test.args(["test", "--workspace", "--all-targets"]);
    if let Some(b) = browser::find()? {
        test.env("EMM_BROWSER", b);
    }
    run(
        root,
        "test",
        "run the failing test alone with `cargo test -p <crate> <name>`; GPU tests are #[ignore]d and need a GPU",
        &mut test,
    )?;
    run(
        root,
        "test call-timing",
        "the diagnostic build of the C ABI (feature call-timing) must build and count",
        cargo().args([
            "test",
            "-p",
            "emm-capi",
            "--features",
            "call-timing",
            "--lib",
        ]),
    )?;
    standin_gpu_tests(root)?;
    run(
        root,
        "quickstart example on the stand-in",
        "crates/emm/examples/quickstart.rs must run: EMM_CUDA_DRIVER=target/debug/libemm_standin.so cargo run -p emm --example quickstart",
        cargo()
            .args(["run", "--quiet", "-p", "emm", "--example", "quickstart"])
            .env("EMM_CUDA_DRIVER", venv::standin(root)?),
    )?;
    run(
        root,
        "doctest",
        "doc examples must compile; mark GPU ones `no_run`",
        cargo().args(["test", "--workspace", "--doc"]),
    )?;
    docs(root)?;
    run(
        root,
        "package every crate",
        "`cargo publish --dry-run --workspace` packages the crates in dependency order; a crate that does not package is missing a file or metadata",
        cargo().args([
            "publish",
            "--dry-run",
            "--workspace",
            "--no-verify",
            "--allow-dirty",
            "--quiet",
        ]),
    )?;
    cpp::ci(root)?;
    fuzz::ci(root)?;
    if root.join("python/tests").is_dir() {
        python::ci(root)?;
    }
    tidy(root)?;
    eprintln!("==> ci: all steps passed");
    Ok(())
}

/// GPU-marked tests the stand-in driver cannot run, each with the reason.
const STANDIN_SKIPS: &[(&str, &str)] = &[
    (
        "kernel_adds_index_sums_for_every_type_and_rank",
        "launches a kernel; the stand-in has no device to run code on",
    ),
    (
        "an_invalid_launch_is_a_typed_error_and_the_context_keeps_working",
        "launches a kernel",
    ),
    ("events_time_a_kernel", "launches a kernel"),
    ("saxpy_on_a_stream_matches_the_host", "launches a kernel"),
    ("two_streams_run_independently", "launches kernels"),
    (
        "a_stream_waits_for_a_busy_streams_parked_block_instead_of_growing",
        "launches a kernel",
    ),
    (
        "kernels_on_several_streams_write_and_read_their_allocations",
        "launches kernels",
    ),
    (
        "a_kernel_writes_global_managed_memory_that_the_host_reads",
        "launches a kernel",
    ),
    (
        "a_kernel_writes_host_attached_managed_memory_that_the_host_reads",
        "launches a kernel",
    ),
    (
        "two_gpus",
        "needs two GPUs (the two-GPU tests assert on real peer copies across processes)",
    ),
    ("staged_ipc_child", "a child process of a two-GPU test"),
    (
        "ipc_round_trip_of_a_view_across_processes",
        "cross-process IPC: the stand-in's memory is private to its process",
    ),
    ("ipc_child_process", "the child half of cross-process IPC"),
    (
        "mempool_ipc_round_trip_across_processes",
        "cross-process mempool IPC: the stand-in's memory is private to its process",
    ),
    (
        "mempool_ipc_child_process",
        "the child half of cross-process mempool IPC",
    ),
    (
        "processes_share_blocks_through_ipc",
        "cross-process IPC under churn: the stand-in's memory is private to its process",
    ),
    ("ipc_churn_child", "the child half of the IPC churn test"),
];

/// Long tests that load the stand-in themselves, so the plain `test` step already
/// ran them on it: the stand-in step does not run them a second time.
const STANDIN_ALREADY_RUN: &[&str] = &[
    "faults_in_the_",                           // the fault sweeps
    "soak_",                                    // the soak tests
    "every_recorded_trace_holds_its_footprint", // steady_state.rs
    "legacy_path_holds_its_footprint",          // legacy_steady.rs
    "without_merging_the_legacy_path_keeps_allocating",
];

/// Runs every test, the GPU-marked ones included, against `libemm_standin.so`.
fn standin_gpu_tests(root: &Path) -> Result<(), String> {
    let lib = target_dir(root).join("debug/libemm_standin.so");
    if !lib.is_file() {
        return Err(format!(
            "{} is missing; run `cargo build -p emm-standin`",
            lib.display()
        ));
    }
    eprintln!("==> GPU-marked tests on the STAND-IN driver ({}), not on a GPU: host memory, no kernels; `cargo xtask gpu` is the GPU run", lib.display());
    for (name, why) in STANDIN_SKIPS {
        eprintln!("    skipped: {name}: {why}");
    }
    let mut cmd = cargo();
    // One test at a time, as on the GPU (`run.sh`): device-wide figures such as free
    // memory are shared by every test of a binary.
    cmd.args([
        "test",
        "--workspace",
        "--",
        "--include-ignored",
        "--test-threads=1",
    ]);
    for (name, _) in STANDIN_SKIPS {
        cmd.args(["--skip", name]);
    }
    for name in STANDIN_ALREADY_RUN {
        eprintln!("    not again: {name}*: loads the stand-in itself; the `test` step ran it");
        cmd.args(["--skip", name]);
    }
    cmd.env("EMM_CUDA_DRIVER", &lib)
        // The pool's GPU tests reserve 8 GiB and then ask for more than the device.
        .env("EMM_STANDIN_CAPACITY", "32G");
    run(
        root,
        "GPU tests on the stand-in",
        "a GPU-marked test fails on emm-standin: rerun it with EMM_CUDA_DRIVER=target/debug/libemm_standin.so cargo test -p <crate> <name> -- --include-ignored; if the stand-in cannot model it, add it to STANDIN_SKIPS with a reason",
        &mut cmd,
    )
}

/// rustdoc with `-D warnings`, then no link text left literal in what it rendered.
/// `cargo xtask doc`.
pub(crate) fn docs(root: &Path) -> Result<(), String> {
    run(
        root,
        "rustdoc",
        "fix broken intra-doc links and missing docs",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    doc_links::check(root, &workspace_crates(root))
}
