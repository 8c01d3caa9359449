//! The Python step of `ci` (`cargo xtask python` alone).
//!
//! 1. From source: `pip wheel .` (setuptools-rust compiles libemm_capi and the `emm`
//!    program with cargo, the `dev` profile, reusing the debug build), installed in
//!    a venv: the package imports, loads its library and runs its `emm`.
//! 2. The binary wheel of `cargo xtask wheel` ([`crate::wheel`]), installed in a
//!    fresh venv outside the checkout, run with no cargo on `PATH` and neither
//!    `PYTHONPATH` nor `EMM_LIBRARY` set: the whole of `python/tests`, the tests of
//!    the stand-in driver (`-m standin`), the NBEP 7 plugin under numba-cuda
//!    ([`crate::numba`]), and `emm replay` of a PyTorch snapshot from that venv.
//!
//! pytest's exit status 5 (no tests collected) fails like any other.

use std::path::Path;
use std::process::Command;

/// The snapshot `emm replay` reads from the installed wheel.
const SNAPSHOT: &str = "crates/emm-trace/tests/fixtures/h200_infer.pickle";

/// The Python step of `ci`.
pub fn ci(root: &Path) -> Result<(), String> {
    from_source(root)?;
    let wheel = crate::wheel::build(root)?;
    let installed = crate::venv::Installed::new(root, &wheel)?;
    crate::numba::step(root, &installed)?;
    eprintln!(
        "==> python: pytest of the installed wheel in {} (no cargo on PATH, no PYTHONPATH, no EMM_LIBRARY)",
        installed.dir.display()
    );
    pytest(
        "python: pytest",
        installed.pytest(&[]),
        "python/tests must hold test_*.py files pytest collects",
        "run `PYTHONPATH=python python3 -m pytest python/tests -x` after `cargo build -p emm-capi -p emm-cli`; the package must import without Numba, CuPy or PyTorch",
    )?;
    // The managers through the bindings, on the stand-in driver.
    let lib = crate::venv::standin(root)?;
    eprintln!(
        "==> python: pytest -m standin on the STAND-IN driver ({}), not on a GPU: host memory, no kernels",
        lib.display()
    );
    let mut standin_run = installed.pytest(&["-m", "standin", "-rs"]);
    standin_run.env("EMM_CUDA_DRIVER", &lib);
    pytest(
        "python: pytest -m standin",
        standin_run,
        "python/tests/test_standin.py holds them (pytest.mark.standin)",
        "run `EMM_CUDA_DRIVER=target/debug/libemm_standin.so EMM_LIBRARY=target/debug/libemm_capi.so PYTHONPATH=python python3 -m pytest -m standin python/tests -x` after `cargo build -p emm-capi -p emm-standin`",
    )?;
    replay_from_the_wheel(root, &installed)
}

fn pytest(name: &str, mut cmd: Command, none_hint: &str, hint: &str) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: could not start: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => Err(format!(
            "step `{name}` collected no tests (exit status 5).\n    hint: {none_hint}"
        )),
        _ => Err(format!(
            "step `{name}` failed ({status}).\n    hint: {hint}"
        )),
    }
}

/// `emm` and `python -m emm` from the venv: the version, and a replay of a PyTorch
/// snapshot (a copy outside the checkout) through every manager.
fn replay_from_the_wheel(root: &Path, installed: &crate::venv::Installed) -> Result<(), String> {
    let snapshot = installed.dir.join("snapshot.pickle");
    std::fs::copy(root.join(SNAPSHOT), &snapshot)
        .map_err(|e| format!("copying {SNAPSHOT}: {e}"))?;
    let emm = installed.venv.join("bin/emm");
    let mut version = installed.python();
    version.args(["-m", "emm", "--version"]);
    let printed = output("python: python -m emm --version", &mut version)?;
    let want = format!("emm {}", env!("CARGO_PKG_VERSION"));
    if printed.trim() != want {
        return Err(format!(
            "step `python: python -m emm --version` printed {printed:?}, not {want:?}"
        ));
    }
    let mut replay = installed.python();
    replay
        .env_remove("EMM_CUDA_DRIVER")
        .arg("-c")
        .arg("import os, sys; os.execv(sys.argv[1], sys.argv[1:])")
        .arg(&emm)
        .args(["replay", "snapshot.pickle", "--passes", "3"]);
    let table = output(
        "python: emm replay snapshot.pickle (the wheel's emm)",
        &mut replay,
    )?;
    print!("{table}");
    for manager in ["default", "pool", "pytorch"] {
        if !table
            .lines()
            .any(|l| l.contains("snapshot.pickle") && l.split_whitespace().nth(1) == Some(manager))
        {
            return Err(format!(
                "step `python: emm replay` printed no row for {manager}:\n{table}"
            ));
        }
    }
    eprintln!(
        "==> python: the wheel's `emm` replayed a PyTorch snapshot ({})",
        emm.display()
    );
    Ok(())
}

fn output(name: &str, cmd: &mut Command) -> Result<String, String> {
    eprintln!("==> {name}");
    let out = cmd
        .output()
        .map_err(|e| format!("{name}: could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "step `{name}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `pip wheel .` from the checkout (what `pip install <checkout>` does), installed in
/// `target/py/source-venv`: the package finds its library and its `emm`.
fn from_source(root: &Path) -> Result<(), String> {
    let target = crate::target_dir(root);
    let build = crate::venv::build_venv(root)?;
    let dist = target.join("py/dist");
    let _ = std::fs::remove_dir_all(&dist);
    // setuptools' in-tree build directory: stale copies must not reach the wheel.
    let _ = std::fs::remove_dir_all(root.join("build"));
    crate::run(
        root,
        "python: wheel from source",
        "`pip wheel .` builds libemm_capi and emm with cargo through setuptools-rust (pyproject.toml, setup.py); it needs the package index for setuptools-rust",
        Command::new(build.join("bin/python"))
            .args(["-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir"])
            .arg(&dist)
            .arg(".")
            .env("CARGO_TARGET_DIR", &target)
            .env("SETUPTOOLS_RUST_CARGO_PROFILE", "dev"),
    )?;
    let _ = std::fs::remove_dir_all(root.join("build"));
    let wheel = std::fs::read_dir(&dist)
        .map_err(|e| format!("reading {}: {e}", dist.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("no wheel in {}", dist.display()))?;
    let venv = target.join("py/source-venv");
    let _ = std::fs::remove_dir_all(&venv);
    crate::run(
        root,
        "python: venv for the source wheel",
        crate::venv::VENV_HINT,
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
    )?;
    crate::run(
        root,
        "python: install the source wheel",
        "the wheel must install with pip alone",
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(&wheel),
    )?;
    let check = "import emm, pathlib; p = emm.library_path(); \
        assert p == pathlib.Path(emm.__file__).resolve().parent / '_native' / 'libemm_capi.so', p; \
        emm.load(); print('emm', emm.__version__, p)";
    crate::run(
        std::env::temp_dir().as_path(),
        "python: the source wheel imports, loads its library and runs its emm",
        "setup.py installs the library as emm/_native/libemm_capi.so and the `emm` program as a script",
        Command::new(venv.join("bin/python"))
            .args(["-c", check])
            .env_remove("PYTHONPATH")
            .env_remove("EMM_LIBRARY"),
    )?;
    crate::run(
        std::env::temp_dir().as_path(),
        "python: the source wheel's emm --version",
        "setuptools-rust installs the `emm` program (pyproject.toml, [[tool.setuptools-rust.bins]])",
        Command::new(venv.join("bin/emm")).arg("--version"),
    )
}
