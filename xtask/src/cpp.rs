//! The C/C++ packaging, used as a C++ program uses it.
//!
//! [`ci`] (`cargo xtask cpp`, and a step of `ci`): installs emm (the debug build)
//! for the prefix `/opt/emm` staged under `target/cpp/stage` (so the tree is used
//! where it was staged, not where it was meant to go: relocation and `DESTDIR`
//! both matter), then `examples/cpp/check.sh --strict` builds the examples with
//! pkg-config (Makefile) and CMake (`find_package(emm)`) and runs `emm_hello` with
//! no driver (exit status 3, emm's typed error) and on the stand-in driver. Last,
//! the programs must need the library by its SONAME.
//!
//! CMake comes from `PATH`; where there is none (this project's CI image has
//! none), from PyPI's `cmake` package in a venv under `target/py/`, and the step
//! says so. Any other missing tool fails the step.
//!
//! [`bundle`] (`cargo xtask gpu`): the installed tree in `gpu-bundle/prefix` and
//! `gpu-bundle/cpp.sh`, which runs the same script on the GPU machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::elf::SharedLibrary;
use crate::install::{self, Installed, Options};
use crate::{cargo, run, target_dir};

/// The script that builds and runs the examples (shared with the GPU bundle).
const CHECK_SCRIPT: &str = "examples/cpp/check.sh";

/// `cargo xtask cpp`: see the module docs.
pub fn ci(root: &Path) -> Result<(), String> {
    let work = target_dir(root).join("cpp");
    let _ = std::fs::remove_dir_all(&work);
    let stage = work.join("stage");
    let options = Options {
        prefix: PathBuf::from("/opt/emm"),
        libdir: PathBuf::from("/opt/emm/lib"),
        destdir: Some(stage.clone()),
        profile: "dev".to_owned(),
    };
    let installed = install::install(root, &options)?;
    let prefix = options.staged(&options.prefix);
    eprintln!(
        "==> cpp: installed emm {} for {} staged in {} ({} files and links)",
        installed.version.text,
        options.prefix.display(),
        prefix.display(),
        installed.written.len()
    );
    run(
        root,
        "build stand-in driver",
        "crates/emm-standin must build: emm_hello runs on libemm_standin.so",
        cargo().args(["build", "-p", "emm-standin"]),
    )?;
    let standin = target_dir(root).join("debug/libemm_standin.so");
    let cmake = cmake(root)?;
    let build = work.join("build");
    run(
        root,
        "cpp: examples/cpp built with pkg-config and CMake, run on the stand-in and with no driver",
        "the last lines above say which build or run failed; rerun with `cargo xtask cpp`; the tools are make, pkg-config, c++ and cmake (apt-get install make pkgconf g++ cmake)",
        Command::new("bash")
            .arg(root.join(CHECK_SCRIPT))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--build")
            .arg(&build)
            .arg("--standin")
            .arg(&standin)
            .arg("--strict")
            .env("CMAKE", &cmake),
    )?;
    for bin in ["make/emm_hello", "cmake/emm_hello"] {
        needs_soname(&build.join(bin), &installed)?;
    }
    Ok(())
}

/// `bin` needs libemm_capi by its SONAME (not by the link-time name).
fn needs_soname(bin: &Path, installed: &Installed) -> Result<(), String> {
    let exe = SharedLibrary::read(bin)?;
    if exe.needed.contains(&installed.soname) {
        eprintln!(
            "    {}: needs {} (the SONAME)",
            bin.display(),
            installed.soname
        );
        Ok(())
    } else {
        Err(format!(
            "step `cpp` failed: {} needs {:?}, not {}.\n    hint: the SONAME comes from crates/emm-capi/build.rs",
            bin.display(),
            exe.needed,
            installed.soname
        ))
    }
}

/// A `cmake` to run: the one on `PATH`, else PyPI's in `target/py/tools-venv`.
fn cmake(root: &Path) -> Result<PathBuf, String> {
    let works = |c: &Path| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(Path::new("cmake")) {
        return Ok(PathBuf::from("cmake"));
    }
    let venv = root.join("target/py/tools-venv");
    let bin = venv.join("bin/cmake");
    if works(&bin) {
        eprintln!(
            "==> cpp: cmake is not on PATH: the CMake build uses PyPI's cmake from {}",
            venv.display()
        );
        return Ok(bin);
    }
    eprintln!(
        "==> cpp: cmake is not on PATH: installing PyPI's `cmake` into {} for the CMake build",
        venv.display()
    );
    let hint = "cmake is not on PATH and could not be installed from PyPI: install it (apt-get install cmake) and rerun";
    run(
        root,
        "cpp: venv for cmake",
        hint,
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
    )?;
    run(
        root,
        "cpp: cmake from PyPI",
        hint,
        Command::new(venv.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "cmake>=3.16",
        ]),
    )?;
    if works(&bin) {
        Ok(bin)
    } else {
        Err(format!("{} does not run.\n    hint: {hint}", bin.display()))
    }
}

/// `cargo xtask gpu`: installs the release build into `bundle/prefix`, copies the
/// installed library to `bundle/lib/` as `libemm_capi.so` (what `EMM_LIBRARY` and
/// the GPU scripts use) and under its SONAME (what programs linked with
/// `-L gpu-bundle/lib -lemm_capi` load), and writes `bundle/cpp.sh`.
pub fn bundle(root: &Path, bundle: &Path) -> Result<(), String> {
    let prefix = install::normalize(&bundle.join("prefix"));
    let _ = std::fs::remove_dir_all(&prefix);
    let options = Options {
        libdir: prefix.join("lib"),
        prefix,
        destdir: None,
        profile: "release".to_owned(),
    };
    let installed = install::install(root, &options)?;
    let lib = bundle.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| format!("creating {}: {e}", lib.display()))?;
    // The same file under both names (links may not survive the trip to the GPU
    // machine), so the bundle holds one build of the library.
    let from = options.libdir.join(&installed.file_name);
    for name in [install::LINK_NAME, installed.soname.as_str()] {
        let to = lib.join(name);
        std::fs::copy(&from, &to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    let script = bundle.join("cpp.sh");
    std::fs::write(&script, cpp_sh(&installed))
        .map_err(|e| format!("writing {}: {e}", script.display()))?;
    let _ = Command::new("chmod").arg("+x").arg(&script).status();
    eprintln!(
        "==> gpu-bundle: emm {} installed in {} (cpp.sh builds examples/cpp against it)",
        installed.version.text,
        options.prefix.display()
    );
    Ok(())
}

/// `gpu-bundle/cpp.sh`.
fn cpp_sh(installed: &Installed) -> String {
    format!(
        r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu`. Usage: gpu-bundle/cpp.sh [build dir]
# Builds examples/cpp (of the checkout beside the bundle, or of $EMM_REPO_ROOT)
# against the installed tree gpu-bundle/prefix with pkg-config and with CMake, and
# runs the programs on the GPU, on the stand-in driver and with no driver
# (examples/cpp/check.sh --gpu). A missing tool is reported as SKIPPED.
set -u
cd "$(dirname "$0")"
B=$(pwd)
ROOT=${{EMM_REPO_ROOT:-$B/..}}
# Links may not survive the trip to this machine: make them again.
ln -sfn {file} prefix/lib/{soname}
ln -sfn {soname} prefix/lib/{link}
BUILD=${{1:-$(mktemp -d "${{TMPDIR:-/tmp}}/emm-cpp.XXXXXX")}}
exec bash "$ROOT/{CHECK_SCRIPT}" --prefix "$B/prefix" --build "$BUILD" --standin "$B/libemm_standin.so" --gpu
"#,
        file = installed.file_name,
        soname = installed.soname,
        link = install::LINK_NAME,
    )
}
