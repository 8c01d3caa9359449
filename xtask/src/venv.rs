//! The Python environments of the automation: the build venv (pip and the wheel
//! tools), the fresh venv outside the checkout that the binary wheel is tested in
//! ([`Installed`]), and the stand-in driver those tests load. Shared by
//! `python.rs`, `wheel.rs` and `numba.rs`, so none of them imports another.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const VENV_HINT: &str =
    "python3 needs its venv module (Debian/Ubuntu: apt-get install python3-venv)";

/// `target/py/build-venv`: a venv holding pip and the wheel tools, kept between runs.
pub fn build_venv(root: &Path) -> Result<PathBuf, String> {
    let venv = crate::target_dir(root).join("py/build-venv");
    if !venv.join("bin/python").is_file() {
        crate::run(
            root,
            "python: build venv",
            VENV_HINT,
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        )?;
    }
    Ok(venv)
}

/// The binary wheel installed in a fresh venv in a temporary folder outside the
/// checkout; removed on drop.
pub struct Installed {
    /// The temporary folder: the venv, the working directory of every command.
    pub dir: PathBuf,
    /// The venv inside `dir`.
    pub venv: PathBuf,
    /// The checkout's `python/tests`.
    pub tests: PathBuf,
    /// `PATH` with the venv first and no folder that holds `cargo`.
    path: OsString,
}

impl Installed {
    pub fn new(root: &Path, wheel: &Path) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("emm-wheel-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let venv = dir.join("venv");
        let path = path_without_cargo(&venv.join("bin"))?;
        let me = Self {
            dir,
            venv,
            tests: root.join("python/tests"),
            path,
        };
        crate::run(
            &me.dir,
            "python: fresh venv outside the checkout",
            VENV_HINT,
            Command::new("python3").arg("-m").arg("venv").arg(&me.venv),
        )?;
        crate::run(
            &me.dir,
            "python: install the wheel and pytest",
            "the wheel must install with pip alone; pytest comes from the package index",
            me.python()
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg(wheel)
                .arg("pytest"),
        )?;
        Ok(me)
    }

    /// The venv's python, run in `dir` with the installed package alone: no
    /// `PYTHONPATH`, no `EMM_LIBRARY`, no cargo on `PATH`, `EMM_TEST_INSTALLED=1`.
    pub fn python(&self) -> Command {
        let mut cmd = Command::new(self.venv.join("bin/python"));
        cmd.current_dir(&self.dir)
            .env("PATH", &self.path)
            .env("EMM_TEST_INSTALLED", "1")
            .env_remove("PYTHONPATH")
            .env_remove("EMM_LIBRARY")
            .env_remove("EMM_MEMORY_MANAGER")
            .env_remove("NUMBA_CUDA_MEMORY_MANAGER");
        cmd
    }

    /// `python -m pytest -p no:cacheprovider ARGS python/tests`.
    pub fn pytest(&self, args: &[&str]) -> Command {
        let mut cmd = self.python();
        cmd.args(["-m", "pytest", "-p", "no:cacheprovider"])
            .args(args)
            .arg(&self.tests);
        cmd
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("    note: could not remove {}: {e}", self.dir.display());
        }
    }
}

/// `PATH` with `first` in front and without the folders that hold a `cargo`.
fn path_without_cargo(first: &Path) -> Result<OsString, String> {
    let mut paths = vec![first.to_path_buf()];
    if let Some(old) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&old).filter(|p| !p.join("cargo").exists()));
    }
    std::env::join_paths(paths).map_err(|e| format!("building PATH: {e}"))
}

/// The stand-in driver of the debug build.
pub fn standin(root: &Path) -> Result<PathBuf, String> {
    let lib = crate::target_dir(root).join("debug/libemm_standin.so");
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(format!(
            "{} is missing; run `cargo build -p emm-standin`",
            lib.display()
        ))
    }
}
