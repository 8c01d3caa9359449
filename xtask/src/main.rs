//! Project automation for emm: `cargo xtask ci | gpu | tidy | python | wheel |
//! header | install | cpp`.
//!
//! - `ci`: formatting, the generated C header (`header::check`), clippy (`-D
//!   warnings`, all targets), tests (the page test in a headless browser,
//!   `browser.rs`; on CI a missing browser fails), doc tests, rustdoc (`-D warnings`), the C/C++
//!   packaging (`cpp`), the Python package (wheel built with pip, installed in a
//!   fresh venv, tested there with pytest), and `tidy`. Each failing step prints a
//!   hint.
//! - `gpu`: builds every test binary (release, stripped) and the `emm` binary into
//!   `gpu-bundle/` (git-ignored) with `run.sh`, which runs all of them with
//!   `--include-ignored` on a GPU machine and prints one summary line per binary;
//!   also the installed C/C++ tree (`gpu-bundle/prefix`) and `cpp.sh`.
//! - `python`: the Python step of `ci` alone (`python.rs`): the package built from
//!   source, then the binary wheel installed outside the checkout and tested there.
//! - `wheel`: the binary wheel (`wheel.rs`): `target/wheels/emm_cuda-<version>-py3-
//!   none-manylinux_2_28_x86_64.whl` with libemm_capi, the Python package and the
//!   `emm` program, built for glibc 2.28; installing it needs no Rust toolchain.
//! - `doc`: rustdoc (`-D warnings`) and the check that no link text was left
//!   literal in the rendered pages (`doc_links.rs`).
//! - `header`: writes `crates/emm-capi/include/emm.h` with cbindgen (`header.rs`);
//!   `header --check` only compares (as `ci` does).
//! - `install --prefix DIR`: header, library (with its SONAME links), pkg-config
//!   file and CMake package (`install.rs`).
//! - `cpp`: the C/C++ step of `ci` alone (`cpp.rs`).
//! - `tidy`: architecture invariants (layering, no import circle between the files
//!   of a crate or of `python/emm` (`circles.rs`), only emm-sys touches libloading,
//!   nothing links libcuda, every crate has a README and docs.rs metadata).

mod browser;
mod circles;
mod cpp;
mod doc_links;
mod elf;
mod fuzz;
mod header;
mod install;
mod numba;
mod python;
mod venv;
mod wheel;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("gpu") => gpu(&root),
        Some("tidy") => tidy(&root),
        Some("python") => python::ci(&root),
        Some("wheel") => wheel::build(&root).map(|_| ()),
        Some("doc") => docs(&root),
        Some("header") if args.get(1).is_some_and(|a| a == "--check") => header::check(&root),
        Some("header") => header::write(&root),
        Some("install") => install::command(&root, &args[1..]),
        Some("cpp") => cpp::ci(&root),
        _ => {
            eprintln!(
                "usage: cargo xtask <ci|gpu|tidy|python|wheel|doc|header [--check]|cpp>\n       {}",
                install::Options::USAGE
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(Path::to_path_buf).unwrap_or(here)
}

pub(crate) fn run(root: &Path, name: &str, hint: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("==> {name}: {cmd:?}");
    let status = cmd
        .current_dir(root)
        .status()
        .map_err(|e| format!("{name}: could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "step `{name}` failed ({status}).\n    hint: {hint}"
        ))
    }
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn ci(root: &Path) -> Result<(), String> {
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
fn docs(root: &Path) -> Result<(), String> {
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

/// The folder names under `crates/` (each a workspace crate).
fn workspace_crates(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("crates"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("Cargo.toml").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/` in the checkout).
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

/// Which workspace crates each crate may depend on (normal dependencies).
const LAYERS: &[(&str, &[&str])] = &[
    ("emm-sys", &[]),
    ("emm-standin", &["emm-sys"]),
    ("emm-driver", &["emm-sys"]),
    ("emm-core", &["emm-sys", "emm-driver"]),
    ("emm-default", &["emm-sys", "emm-driver", "emm-core"]),
    (
        "emm-pool",
        &["emm-sys", "emm-driver", "emm-core", "emm-default"],
    ),
    (
        "emm-hostonly",
        &["emm-sys", "emm-driver", "emm-core", "emm-default"],
    ),
    ("emm-trace", &["emm-sys", "emm-driver", "emm-core"]),
    (
        "emm",
        &[
            "emm-sys",
            "emm-driver",
            "emm-core",
            "emm-default",
            "emm-pool",
            "emm-hostonly",
            "emm-trace",
        ],
    ),
    ("emm-cli", &["emm"]),
];

fn manifest_deps(manifest: &str) -> Vec<String> {
    // The `[dependencies]` table only: dev-dependencies may reach further.
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = t == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some((name, _)) = t.split_once(['=', '.']) {
                let name = name.trim();
                if !name.is_empty() && !name.starts_with('#') {
                    deps.push(name.to_owned());
                }
            }
        }
    }
    deps
}

fn tidy(root: &Path) -> Result<(), String> {
    eprintln!("==> tidy");
    let mut problems = String::new();
    let crates = root.join("crates");
    let mut names: Vec<String> = std::fs::read_dir(&crates)
        .map_err(|e| format!("reading {}: {e}", crates.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in &names {
        let dir = crates.join(name);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        let deps = manifest_deps(&manifest);
        // Invariant: only emm-sys touches libloading.
        if name != "emm-sys" && deps.iter().any(|d| d == "libloading") {
            let _ = writeln!(
                problems,
                "- {name} depends on libloading: only emm-sys may load the driver"
            );
        }
        // Invariant: layers point one way.
        if let Some((_, allowed)) = LAYERS.iter().find(|(n, _)| n == name) {
            for d in deps.iter().filter(|d| d.starts_with("emm")) {
                if !allowed.contains(&d.as_str()) {
                    let _ = writeln!(problems, "- {name} depends on {d}, a layer above or beside it (allowed: {allowed:?})");
                }
            }
        }
        // Invariant: nothing links libcuda at build time.
        if let Ok(build) = std::fs::read_to_string(dir.join("build.rs")) {
            if build.contains("rustc-link-lib") && build.contains("cuda") {
                let _ = writeln!(problems, "- {name}/build.rs links libcuda");
            }
        }
        if manifest.contains("links = \"cuda\"") {
            let _ = writeln!(problems, "- {name} declares links = \"cuda\"");
        }
        // Every crate is ready for docs.rs and has a README.
        if !dir.join("README.md").is_file() {
            let _ = writeln!(problems, "- {name} has no README.md");
        }
        if !manifest.contains("[package.metadata.docs.rs]") {
            let _ = writeln!(problems, "- {name} lacks [package.metadata.docs.rs]");
        }
        if !manifest.contains("[lints]") {
            let _ = writeln!(problems, "- {name} does not opt into the workspace lints");
        }
        // No source file outside emm-sys mentions libloading.
        if name != "emm-sys" {
            for file in rust_files(&dir.join("src")) {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if text.contains("libloading::") {
                    let _ = writeln!(problems, "- {} uses libloading", file.display());
                }
            }
        }
    }
    // Invariant: no import circle between the files of a crate or of python/emm.
    for c in circles::check(root) {
        let _ = write!(problems, "- import circle in {c}");
    }
    // The libcuda override that keeps cuda-driver-sys from linking stays in place.
    let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap_or_default();
    if !config.contains("x86_64-unknown-linux-gnu.cuda]") {
        let _ = writeln!(
            problems,
            "- .cargo/config.toml lost the `links = \"cuda\"` override"
        );
    }
    // Built binaries do not need libcuda (checked when readelf and a build exist).
    for bin in [
        root.join("target/debug/emm"),
        target_dir(root).join("release/emm"),
    ] {
        if bin.is_file() {
            match Command::new("readelf").arg("-d").arg(&bin).output() {
                Ok(out) if out.status.success() => {
                    let text = String::from_utf8_lossy(&out.stdout);
                    if text
                        .lines()
                        .any(|l| l.contains("NEEDED") && l.contains("libcuda"))
                    {
                        let _ = writeln!(problems, "- {} needs libcuda at start-up", bin.display());
                    } else {
                        eprintln!("    {}: no libcuda among NEEDED", bin.display());
                    }
                }
                _ => eprintln!(
                    "    readelf unavailable; skipped the NEEDED check of {}",
                    bin.display()
                ),
            }
        }
    }
    if problems.is_empty() {
        eprintln!("    tidy: {} crates checked, no problems", names.len());
        Ok(())
    } else {
        Err(format!(
            "tidy found problems:\n{problems}    hint: see docs/ARCHITECTURE.md, \"Invariants\""
        ))
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

fn gpu(root: &Path) -> Result<(), String> {
    let bundle = root.join("gpu-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(bundle.join("bin")).map_err(|e| e.to_string())?;
    eprintln!("==> building release test binaries");
    let out = cargo()
        .current_dir(root)
        .args([
            "test",
            "--workspace",
            "--release",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "building tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut tests = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // A test harness: its *profile* says test (the target's own `"test":true`
        // only says the target is tested, and the CLI binary has it too).
        let profile_is_test = line
            .split_once("\"profile\":{")
            .and_then(|(_, rest)| rest.split_once('}'))
            .is_some_and(|(profile, _)| profile.contains("\"test\":true"));
        if !profile_is_test {
            continue;
        }
        if let Some(exe) = json_string(line, "\"executable\":\"") {
            let src = PathBuf::from(exe);
            // `name-hash` -> `crate__name`
            let target = json_string(line, "\"name\":\"").unwrap_or_default();
            let pkg = json_string(line, "\"package_id\":\"").unwrap_or_default();
            let pkg = pkg
                .rsplit('/')
                .next()
                .unwrap_or("")
                .split(['#', '@'])
                .next()
                .unwrap_or("")
                .to_owned();
            let name = if pkg.is_empty() || pkg.replace('-', "_") == target {
                target
            } else {
                format!("{pkg}__{target}")
            };
            tests.push((name, src));
        }
    }
    run(
        root,
        "build emm and libemm_capi",
        "",
        cargo().args([
            "build",
            "--release",
            "-p",
            "emm-cli",
            "-p",
            "emm-capi",
            "-p",
            "emm-standin",
        ]),
    )?;
    // The stand-in's own tests (bin/emm__standin) find it beside bin/, as in target/.
    std::fs::copy(
        target_dir(root).join("release/libemm_standin.so"),
        bundle.join("libemm_standin.so"),
    )
    .map_err(|e| format!("copying libemm_standin.so: {e}"))?;
    std::fs::create_dir_all(bundle.join("lib")).map_err(|e| e.to_string())?;
    std::fs::copy(
        target_dir(root).join("release/libemm_capi.so"),
        bundle.join("lib/libemm_capi.so"),
    )
    .map_err(|e| format!("copying libemm_capi.so: {e}"))?;
    cpp::bundle(root, &bundle)?;
    let mut script = String::from(
        "#!/usr/bin/env bash\n# Runs every emm test binary, GPU tests included. Generated by `cargo xtask gpu`.\n\
         set -u\ncd \"$(dirname \"$0\")\"\n[ -d bin ] || python3 -c 'import tarfile; tarfile.open(\"bin.tar.xz\").extractall(\".\")' || { echo \"could not unpack bin.tar.xz\"; exit 1; }\nexport EMM_REPO_ROOT=\"${EMM_REPO_ROOT:-$(pwd)/..}\" EMM_TEST_DATA=\"$(pwd)/data\" EMM_BIN=\"$(pwd)/emm\"\nfail=0\n: > summary.txt\n\
         gpus=$(nvidia-smi -L 2>/dev/null | wc -l)\nskip=\"\"\n\
         if [ \"$gpus\" -lt 2 ]; then skip=\"--skip two_gpus --skip staged_ipc_child\"; echo \"note: $gpus GPU(s): the two-GPU tests are not run (they need two)\" | tee -a summary.txt; fi\n",
    );
    for (name, src) in &tests {
        let dst = bundle.join("bin").join(name);
        std::fs::copy(src, &dst).map_err(|e| format!("copying {}: {e}", src.display()))?;
        let _ = writeln!(
            script,
            "out=$(./bin/{name} --include-ignored --test-threads=1 $skip 2>&1); rc=$?\necho \"$out\" > log-{name}.txt\n\
             line=$(echo \"$out\" | grep -E '^test result:' | tail -n1)\necho \"{name}: rc=$rc ${{line:-no result line}}\" | tee -a summary.txt\n\
             [ $rc -eq 0 ] || fail=1\n"
        );
    }
    std::fs::copy(target_dir(root).join("release/emm"), bundle.join("emm"))
        .map_err(|e| e.to_string())?;
    // Test data travels with the bundle; tests find it through EMM_TEST_DATA.
    for rel in ["emm-cli/traces", "emm-trace/tests/fixtures"] {
        copy_dir(
            &root.join("crates").join(rel),
            &bundle.join("data").join(rel),
        )?;
    }
    script.push_str("exit $fail\n");
    std::fs::write(bundle.join("sanitize.sh"), SANITIZE_SH).map_err(|e| e.to_string())?;
    let _ = Command::new("chmod")
        .arg("+x")
        .arg(bundle.join("sanitize.sh"))
        .status();
    std::fs::write(bundle.join("run.sh"), script).map_err(|e| e.to_string())?;
    let _ = Command::new("chmod")
        .arg("+x")
        .arg(bundle.join("run.sh"))
        .status();
    // The test binaries travel packed (xz: a sixth of their size); run.sh and
    // sanitize.sh unpack them with Python's tarfile on the GPU machine. The machine
    // takes 64 MiB in all, the checkout included.
    let _ = std::fs::remove_file(bundle.join("bin.tar.xz"));
    run(
        root,
        "pack the test binaries",
        "needs tar with xz support",
        Command::new("tar")
            .arg("-cJf")
            .arg(bundle.join("bin.tar.xz"))
            .arg("-C")
            .arg(&bundle)
            .arg("bin"),
    )?;
    std::fs::remove_dir_all(bundle.join("bin")).map_err(|e| e.to_string())?;
    let size = dir_size(&bundle);
    eprintln!("==> gpu-bundle: {} test binaries (packed in bin.tar.xz) + emm, {:.1} MiB; run `gpu-bundle/run.sh` on a GPU machine; the CLI is `gpu-bundle/emm`; `gpu-bundle/cpp.sh` builds and runs examples/cpp against `gpu-bundle/prefix`", tests.len(), size as f64 / 1048576.0);
    if size > 44 << 20 {
        return Err(format!(
            "gpu-bundle is {size} bytes; the GPU machine takes 64 MiB in all, the checkout included"
        ));
    }
    Ok(())
}

/// Bytes of the files under `dir`, recursively (links not followed).
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Copies `from` into `to`, its folders included.
fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for e in std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let path = e.path();
        if path.is_dir() {
            // Fixtures keep their folders (`fixtures/random/`).
            copy_dir(&path, &to.join(e.file_name()))?;
        } else if path.is_file() {
            std::fs::copy(&path, to.join(e.file_name()))
                .map_err(|err| format!("copying {}: {err}", path.display()))?;
        }
    }
    Ok(())
}

/// `gpu-bundle/sanitize.sh`: every GPU test, one at a time, under compute-sanitizer's
/// memcheck with leak checking. Tests that provoke driver API errors on purpose
/// (out of memory, foreign or garbled IPC handles; the GPU soak, whose ballast
/// exhausts the device: run 174 saw only `CUDA_ERROR_OUT_OF_MEMORY` from
/// `cuMemAlloc` there) are listed in EXPECTED_API_ERRORS
/// and run with API error reports off; every other reported error, and every leak,
/// fails. Tests memcheck cannot follow (NOT_UNDER_MEMCHECK: a kernel on
/// host-attached managed memory, which fails under memcheck in a plain CUDA
/// program too) are listed as not run, with the reason; `run.sh` runs them. Prints
/// one line per test and a summary.
const SANITIZE_SH: &str = r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu`. Usage: gpu-bundle/sanitize.sh [log dir]
set -u
cd "$(dirname "$0")"
[ -d bin ] || python3 -c 'import tarfile; tarfile.open("bin.tar.xz").extractall(".")' || { echo "could not unpack bin.tar.xz"; exit 1; }
export EMM_TEST_DATA="$(pwd)/data" EMM_BIN="$(pwd)/emm"
LOG=${1:-sanitize-logs}; mkdir -p "$LOG"
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
# Substrings of test names that provoke driver API errors on purpose.
EXPECTED_API_ERRORS=" out_of_memory oom pool_limit foreign garbled invalid_launch bad_handle wrong_device exhaust events_time_a_kernel soak_every_manager "
# Substrings of test names memcheck cannot follow: a kernel on host-attached
# managed memory faults under memcheck even in a plain CUDA program (cuMemAllocManaged
# with CU_MEM_ATTACH_HOST) that runs correctly without it. run.sh runs them.
NOT_UNDER_MEMCHECK=" host_attached_managed "
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
pass=0; fail=0; expected=0; notrun=0
for bin in bin/*; do
  name=$(basename "$bin")
  for t in $("$bin" --list --ignored 2>/dev/null | sed -n 's/: test$//p'); do
    case "$t" in *two_gpus*|*staged_ipc_child*) [ "$gpus" -lt 2 ] && continue ;; esac
    case "$t" in *_child*|*child_process*) continue ;; esac  # run by their parent test
    skip=""
    for k in $NOT_UNDER_MEMCHECK; do case "$t" in *"$k"*) skip=1;; esac; done
    if [ -n "$skip" ]; then
      notrun=$((notrun+1)); echo "not run  $name $t (memcheck cannot follow a kernel into host-attached managed memory; run.sh runs it)"
      continue
    fi
    api=explicit; tag=""
    for k in $EXPECTED_API_ERRORS; do case "$t" in *"$k"*) api=no; tag=" (API errors expected: not reported)";; esac; done
    log="$LOG/$name--${t//::/-}.txt"
    $CS --tool memcheck --leak-check full --report-api-errors $api --error-exitcode 86       "$bin" --exact "$t" --include-ignored --test-threads=1 > "$log" 2>&1
    rc=$?
    errs=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+$')
    leaks=$(grep -cE 'Leaked [0-9]+ bytes' "$log")
    if [ $rc -eq 0 ] && [ "${errs:-0}" = 0 ] && [ "$leaks" = 0 ]; then
      pass=$((pass+1)); echo "ok    $name $t$tag"
      [ -n "$tag" ] && expected=$((expected+1))
    else
      fail=$((fail+1)); echo "FAIL  $name $t: rc=$rc errors=${errs:-?} leaks=$leaks$tag (log: $log)"
    fi
  done
done
echo "sanitize: $pass passed, $fail failed, $notrun not run under memcheck ($expected ran with API error reports off)"
[ $fail -eq 0 ]
"#;

/// The JSON string value that follows `key` on `line` (no escapes expected in paths).
fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(key)? + key.len();
    let rest = &line[start..];
    let end = rest.find('"')?;
    Some(rest[..end].to_owned())
}
