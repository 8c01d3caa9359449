//! Project automation for emm: `cargo xtask ci | gpu | tidy | python | wheel |
//! header | install | cpp`, one file per command (`ci.rs`, `gpu.rs`, `tidy.rs`,
//! `python.rs`, `wheel.rs`, `header.rs`, `install.rs`, `cpp.rs`); `cmd.rs` runs
//! steps and finds the workspace. This file only dispatches.
//!
//! - `ci`: formatting, the generated C header (`header::check`), clippy (`-D
//!   warnings`, all targets), tests (the page test in a headless browser,
//!   `browser.rs`; on CI a missing browser fails), doc tests, rustdoc (`-D warnings`), the C/C++
//!   packaging (`cpp`), the Python package (wheel built with pip, installed in a
//!   fresh venv, tested there with pytest), and `tidy`. Each failing step prints a
//!   hint.
//! - `gpu`: builds every test binary (release, stripped) and the `emm` binary into
//!   `gpu-bundle/` (git-ignored) with `run.sh`, which runs all of them with
//!   `--include-ignored` on a GPU machine and prints one summary line per binary,
//!   `sanitize.sh` (every GPU test under memcheck) and `suite.sh` (both, then
//!   the Python tests: the whole GPU suite in one call); also the installed C/C++
//!   tree (`gpu-bundle/prefix`) and `cpp.sh`.
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
//! - `tidy`: architecture invariants (layering: each package's floor from
//!   `cargo metadata`, `layers.rs`; no import circle between the files
//!   of a crate or of `python/emm` (`circles.rs`), only emm-sys touches libloading,
//!   nothing links libcuda, every crate has a README and docs.rs metadata).

mod browser;
mod ci;
mod circles;
mod cmd;
mod cpp;
mod doc_links;
mod elf;
mod fuzz;
mod gpu;
mod header;
mod install;
mod layers;
mod numba;
mod python;
mod tidy;
mod venv;
mod wheel;

use std::process::ExitCode;

pub(crate) use cmd::{cargo, run, rust_files, target_dir, workspace_crates};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = cmd::workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::ci(&root),
        Some("gpu") => gpu::gpu(&root),
        Some("tidy") => tidy::tidy(&root),
        Some("python") => python::ci(&root),
        Some("wheel") => wheel::build(&root).map(|_| ()),
        Some("doc") => ci::docs(&root),
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
