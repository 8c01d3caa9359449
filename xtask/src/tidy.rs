//! `cargo xtask tidy`: layering, libloading only in emm-sys, no libcuda link,
//! no import circle, every crate documented and linted.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use crate::{circles, rust_files, target_dir};

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

/// `cargo xtask tidy`: the architecture's invariants (`docs/ARCHITECTURE.md`).
pub(crate) fn tidy(root: &Path) -> Result<(), String> {
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
    // Invariant: layers point one way (each package's floor, from cargo metadata).
    for p in crate::layers::check(root)? {
        let _ = writeln!(problems, "- {p}");
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
