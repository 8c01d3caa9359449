//! The fuzzing step of `ci` (see `docs/fuzzing.md`): the crate `fuzz/` (its own
//! workspace) holds coverage-guided targets for AFL++ through afl.rs.
//!
//! 1. `cargo fmt --check` and clippy (`-D warnings`) of `fuzz/`, which the root's
//!    steps do not cover, and its corpus replay test, a plain `cargo test` (every
//!    file of `fuzz/corpus/<target>/` through its target, on the stand-in driver).
//! 2. What the fuzzer needs: `make` and a C compiler from Debian's packages
//!    (`apt-get install -y`, only when missing), and `cargo-afl` ([`CARGO_AFL`],
//!    `cargo install --locked`, which builds AFL++ from the sources it ships), only
//!    when `cargo afl` is missing. A failed install fails the step: nothing is
//!    skipped.
//! 3. The targets built with AFL++'s instrumentation (`cargo afl build`).
//! 4. A smoke test: each target fuzzed for [`SMOKE_SECS`] seconds (at most
//!    [`SMOKE_LIMIT_SECS`] with the start), so at most 3.2 minutes in all; a crash
//!    fails the step and names the input.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The fuzz targets (binaries of `fuzz/`, folders of `fuzz/corpus/`).
const TARGETS: &[&str] = &[
    "pickle_snapshot",
    "csv_trace",
    "rmm_log",
    "ipc_handle",
    "capi_args",
    "pool_ops",
    "torch_hooks",
    "cupy_hooks",
];

/// The cargo-afl release installed (its `afl` crate is `fuzz/`'s dependency).
const CARGO_AFL: &str = "cargo-afl@0.18.2";

/// Seconds of fuzzing per target in the smoke test (`afl-fuzz -V`).
const SMOKE_SECS: u32 = 18;

/// The hard limit per target, start-up included: 8 targets x 24 s = 3.2 minutes.
const SMOKE_LIMIT_SECS: u32 = 24;

/// emm-sys's `DRIVER_PATH_ENV` (xtask does not depend on emm-sys).
const DRIVER_ENV: &str = "EMM_CUDA_DRIVER";

/// Environment of every `afl-fuzz` run: no CPU-governor or core-pattern checks
/// (CI machines are not tuned for fuzzing), no core pinning, no curses UI, and no
/// calibration of the whole corpus at the start (thousands of files would eat the
/// smoke test's seconds; the replay test has run every file already).
const AFL_ENV: &[(&str, &str)] = &[
    ("AFL_FAST_CAL", "1"),
    ("AFL_NO_STARTUP_CALIBRATION", "1"),
    ("AFL_SKIP_CPUFREQ", "1"),
    ("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1"),
    ("AFL_NO_AFFINITY", "1"),
    ("AFL_NO_UI", "1"),
];

/// The step (see the module docs).
pub fn ci(root: &Path) -> Result<(), String> {
    let started = Instant::now();
    let fuzz = root.join("fuzz");
    let standin = crate::target_dir(root).join("debug/libemm_standin.so");
    if !standin.is_file() {
        return Err(format!(
            "{} is missing; run `cargo build -p emm-standin`",
            standin.display()
        ));
    }
    crate::run(
        root,
        "fuzz: fmt",
        "run `cargo fmt` in fuzz/ (its own workspace) and commit the result",
        crate::cargo()
            .args(["fmt", "--check", "--manifest-path"])
            .arg(fuzz.join("Cargo.toml")),
    )?;
    crate::run(
        root,
        "fuzz: clippy",
        "fix the lints above in fuzz/; an `allow` needs a `reason`",
        crate::cargo()
            .args(["clippy", "--all-targets", "--manifest-path"])
            .arg(fuzz.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(fuzz.join("target"))
            .args(["--", "-D", "warnings"]),
    )?;
    crate::run(
        root,
        "fuzz: corpus replay",
        "a corpus file fails its target: run `cargo test --manifest-path fuzz/Cargo.toml`; see docs/fuzzing.md",
        crate::cargo()
            .args(["test", "--manifest-path"])
            .arg(fuzz.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(fuzz.join("target"))
            .env(DRIVER_ENV, &standin),
    )?;
    let replayed = started.elapsed();
    install(root)?;
    let installed = started.elapsed();
    crate::run(
        root,
        "fuzz: build the targets with AFL++ instrumentation",
        "`cargo afl build` must build fuzz/ (see docs/fuzzing.md)",
        crate::cargo()
            .args(["afl", "build", "--release", "--features", "afl"])
            .arg("--manifest-path")
            .arg(fuzz.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(fuzz.join("target/afl")),
    )?;
    let built = started.elapsed();
    for t in TARGETS {
        smoke(root, &fuzz, &standin, t)?;
    }
    eprintln!(
        "==> fuzz: done in {:.0} s (replay {:.0} s, install {:.0} s, AFL build {:.0} s, smoke {:.0} s)",
        started.elapsed().as_secs_f64(),
        replayed.as_secs_f64(),
        (installed - replayed).as_secs_f64(),
        (built - installed).as_secs_f64(),
        (started.elapsed() - built).as_secs_f64(),
    );
    Ok(())
}

fn found(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs `make`, a C compiler and cargo-afl where missing.
fn install(root: &Path) -> Result<(), String> {
    let missing: Vec<&str> = [("make", "make"), ("cc", "gcc")]
        .iter()
        .filter(|(cmd, _)| !found(cmd, &["--version"]))
        .map(|&(_, pkg)| pkg)
        .collect();
    if !missing.is_empty() {
        crate::run(
            root,
            "fuzz: apt-get update",
            "Debian's package lists must be reachable to install the fuzzer's build tools",
            Command::new("apt-get").args(["update", "-q"]),
        )?;
        crate::run(
            root,
            "fuzz: apt-get install make/gcc",
            "AFL++ is built from source with make and a C compiler; install them",
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if found(
        &std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
        &["afl", "--version"],
    ) {
        eprintln!("==> fuzz: cargo-afl already installed");
        return Ok(());
    }
    crate::run(
        root,
        "fuzz: cargo install cargo-afl",
        "crates.io must be reachable; cargo-afl builds AFL++ from the sources it ships (make, cc)",
        crate::cargo().args(["install", "--locked", CARGO_AFL]),
    )
}

/// Fuzzes `target` for [`SMOKE_SECS`] seconds from its corpus; a crash fails.
fn smoke(root: &Path, fuzz: &Path, standin: &Path, target: &str) -> Result<(), String> {
    let out = fuzz.join("target/smoke").join(target);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.parent().unwrap_or(&out))
        .map_err(|e| format!("creating {}: {e}", out.display()))?;
    let binary = fuzz.join("target/afl/release").join(target);
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "2", &SMOKE_LIMIT_SECS.to_string()])
        .arg(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["afl", "fuzz", "-V", &SMOKE_SECS.to_string(), "-i"])
        .arg(fuzz.join("corpus").join(target))
        .arg("-o")
        .arg(&out)
        .arg(&binary)
        .env(DRIVER_ENV, standin)
        .envs(AFL_ENV.iter().copied())
        .stdout(std::process::Stdio::null());
    eprintln!("==> fuzz: smoke {target} ({SMOKE_SECS} s)");
    let status = cmd
        .current_dir(root)
        .status()
        .map_err(|e| format!("fuzz: could not start afl-fuzz: {e}"))?;
    let stats_file = out.join("default/fuzzer_stats");
    let stats = std::fs::read_to_string(&stats_file).map_err(|e| {
        format!(
            "fuzz: afl-fuzz on {target} left no {} ({e}; it exited {status}): it did not start fuzzing",
            stats_file.display()
        )
    })?;
    let stat = |key: &str| {
        stats
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| "?".into())
    };
    eprintln!(
        "    {target}: {} execs ({} /s), corpus {}, edges {} of {}, crashes {}, hangs {}",
        stat("execs_done"),
        stat("execs_per_sec"),
        stat("corpus_count"),
        stat("edges_found"),
        stat("total_edges"),
        stat("saved_crashes"),
        stat("saved_hangs"),
    );
    let crashes = crashes(&out.join("default/crashes"));
    if !crashes.is_empty() {
        let list: Vec<String> = crashes.iter().map(|p| format!("{}", p.display())).collect();
        return Err(format!(
            "fuzz: {target} crashed on {} input(s):\n    {}\n    hint: reproduce with `{} < INPUT` (EMM_CUDA_DRIVER={}); fix the library and add the input to fuzz/corpus/{target}/",
            crashes.len(),
            list.join("\n    "),
            binary.display(),
            standin.display()
        ));
    }
    if !status.success() && status.code() != Some(124) {
        return Err(format!("fuzz: afl-fuzz on {target} failed ({status})"));
    }
    Ok(())
}

/// The crashing inputs afl-fuzz saved (its README aside).
fn crashes(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.txt"))
        .collect();
    found.sort();
    found
}
