//! `cargo xtask wheel`: the binary wheel that installs with no Rust toolchain.
//!
//! `libemm_capi.so` and the `emm` program are built in release for glibc 2.28
//! (`x86_64-unknown-linux-gnu.2.28`) with cargo-zigbuild, which links through zig's
//! bundled glibc stubs: this machine's glibc is newer, and a wheel linked against it
//! would need that glibc everywhere. zig comes from the package index (`ziglang`),
//! cargo-zigbuild from crates.io (installed under `target/tools/`, not in the
//! user's cargo). setuptools (`setup.py`, `EMM_WHEEL_PREBUILT`) then packs them with
//! the Python package into `target/wheels/emm_cuda-<version>-py3-none-
//! manylinux_2_28_x86_64.whl`, and `auditwheel show` must agree with that tag.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The glibc the wheel is built for, and its platform tag.
const GLIBC: (u32, u32) = (2, 28);
const PLATFORM: &str = "manylinux_2_28_x86_64";
const RUST_TARGET: &str = "x86_64-unknown-linux-gnu";
/// Pinned build tools (from the package index and crates.io).
const PY_TOOLS: &[&str] = &["ziglang==0.15.2", "auditwheel==6.8.2"];
const ZIGBUILD: (&str, &str) = ("cargo-zigbuild", "0.24.1");

/// Builds the wheel and returns its path.
pub fn build(root: &Path) -> Result<PathBuf, String> {
    if std::env::consts::ARCH != "x86_64" || std::env::consts::OS != "linux" {
        return Err(format!(
            "`cargo xtask wheel` builds the x86_64 Linux wheel; this is {} {}",
            std::env::consts::OS,
            std::env::consts::ARCH
        ));
    }
    let target = crate::target_dir(root);
    let venv = crate::venv::build_venv(root)?;
    crate::run(
        root,
        "wheel: zig and auditwheel",
        "pip must reach the package index for ziglang and auditwheel",
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PY_TOOLS),
    )?;
    let zigbuild = zigbuild(root, &target)?;
    let triple = format!("{RUST_TARGET}.{}.{}", GLIBC.0, GLIBC.1);
    crate::run(
        root,
        "wheel: libemm_capi and emm for glibc 2.28",
        "cargo-zigbuild links with zig (`python3 -m ziglang` from the build venv); rerun with -v to see the link line",
        Command::new(&zigbuild)
            .args(["zigbuild", "--release", "--locked", "-p", "emm-capi", "-p", "emm-cli", "--target"])
            .arg(&triple)
            .env("PATH", prepend_path(&venv.join("bin")))
            .env("CARGO_TARGET_DIR", &target),
    )?;
    let built = target.join(RUST_TARGET).join("release");
    let stage = target.join("wheels/prebuilt");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(|e| format!("creating {}: {e}", stage.display()))?;
    for name in ["libemm_capi.so", "emm"] {
        let from = built.join(name);
        std::fs::copy(&from, stage.join(name))
            .map_err(|e| format!("copying {} into {}: {e}", from.display(), stage.display()))?;
    }
    let dist = target.join("wheels");
    for old in wheels_in(&dist) {
        let _ = std::fs::remove_file(old);
    }
    // setuptools' in-tree build directory: stale copies must not reach the wheel.
    let _ = std::fs::remove_dir_all(root.join("build"));
    crate::run(
        root,
        "wheel: pack",
        "setup.py takes the prebuilt files from EMM_WHEEL_PREBUILT; pip needs the package index for setuptools and setuptools-rust",
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir"])
            .arg(&dist)
            .arg(".")
            .env("EMM_WHEEL_PREBUILT", &stage)
            .env("EMM_WHEEL_PLAT", PLATFORM),
    )?;
    let _ = std::fs::remove_dir_all(root.join("build"));
    let wheel = wheels_in(&dist)
        .into_iter()
        .next()
        .ok_or_else(|| format!("no wheel in {}", dist.display()))?;
    check_tag(&venv, &wheel)?;
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "==> wheel: {} ({:.1} MiB; auditwheel: {PLATFORM}); install it with `pip install {}` (extras: [torch], [cupy], [numba], [rmm], [dask])",
        wheel.display(),
        size as f64 / (1u64 << 20) as f64,
        wheel.display()
    );
    Ok(wheel)
}

/// `target/tools/bin/cargo-zigbuild`, installed there at the pinned version if missing.
fn zigbuild(root: &Path, target: &Path) -> Result<PathBuf, String> {
    let tools = target.join("tools");
    let bin = tools.join("bin/cargo-zigbuild");
    let current = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if current.as_deref() != Some(&format!("{} {}", ZIGBUILD.0, ZIGBUILD.1)) {
        crate::run(
            root,
            "wheel: cargo-zigbuild",
            "cargo install needs crates.io",
            crate::cargo()
                .args(["install", "--locked", "--quiet", "--root"])
                .arg(&tools)
                .args([ZIGBUILD.0, "--version", ZIGBUILD.1]),
        )?;
    }
    Ok(bin)
}

/// `auditwheel show` must find the wheel consistent with glibc 2.28 or older.
fn check_tag(venv: &Path, wheel: &Path) -> Result<(), String> {
    let out = Command::new(venv.join("bin/auditwheel"))
        .arg("show")
        .arg(wheel)
        .output()
        .map_err(|e| format!("wheel: auditwheel could not start: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let glibc = text
        .split("consistent with the following platform tag: \"manylinux_")
        .nth(1)
        .and_then(|rest| {
            let mut parts = rest.split('_');
            Some((
                parts.next()?.parse::<u32>().ok()?,
                parts.next()?.parse::<u32>().ok()?,
            ))
        });
    match glibc {
        Some(v) if out.status.success() && v <= GLIBC => Ok(()),
        _ => Err(format!(
            "step `wheel: auditwheel show` did not find {} consistent with {PLATFORM}: {text} {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

fn wheels_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.retain(|p| p.extension().is_some_and(|x| x == "whl"));
    found.sort();
    found
}

fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| dir.as_os_str().to_owned())
}
