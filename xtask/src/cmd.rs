//! Running a command's steps, and finding the workspace and its crates.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root (the folder above `xtask/`).
pub(crate) fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(Path::to_path_buf).unwrap_or(here)
}

/// Runs one step of a command in `root`, printing it first; a failure names the
/// step and gives `hint`.
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

/// `cargo`, the one running this xtask where known.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// The folder names under `crates/` (each a workspace crate).
pub(crate) fn workspace_crates(root: &Path) -> Vec<String> {
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

/// Every `.rs` file under `dir`, folders included.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
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
