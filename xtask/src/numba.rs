//! The Python step's third-party part: the frameworks emm plugs into, from PyPI,
//! and emm's NBEP 7 plugin under numba-cuda's own driver layer on the stand-in.
//!
//! [`step`] runs once the wheel is in the test venv, before the pytest passes:
//!
//! 1. installs [`PACKAGES`] (CPU wheels) into the venv, so that no test of
//!    `python/tests` skips for a package PyPI has (CuPy and PyTorch stay out: their
//!    runtimes need a real driver, so their tests use fakes);
//! 2. makes `target/py/driver/libcuda.so.1`, a link to `libemm_standin.so`;
//! 3. runs `pytest -m numba_driver` (`python/tests/test_numba_driver.py`) with that
//!    directory on `LD_LIBRARY_PATH` and `EMM_CUDA_DRIVER` naming the same file:
//!    the NVIDIA bindings numba-cuda uses `dlopen("libcuda.so.1")` and find the
//!    stand-in, emm loads it by path, and the loader hands both the one copy (same
//!    file), so Numba's context, streams and copies and emm's allocations meet in
//!    one model. Every selected test must pass: a skip fails the step.
//!
//! The other passes of `python()` run without that directory on the search path
//! (the first pass is the no-driver one, where emm itself would otherwise find the
//! link as `libcuda.so.1`), so `test_numba_driver.py` carries its own marker
//! (`numba_driver`), which `-m standin` does not select.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the test venv gets from PyPI, pinned where the tests depend on details:
///
/// - `numba-cuda==0.30.4`: the version whose driver calls the stand-in was checked
///   against (`cuGetProcAddress_v2` for every entry point; context, streams,
///   copies, memset, IPC, pointer attributes, primary-context reset).
/// - `cuda-bindings==12.9.7`: the stand-in reports CUDA 12.8, so the 12.x bindings
///   (13.x warns that the driver is too old); and 12.9.7 is the last one whose
///   `CUipcMemHandle` still has `.reserved`, which numba-cuda 0.30.4 reads to
///   pickle an IPC handle (12.9.8 and 13.4 made the handle opaque).
/// - `cuda-toolkit[cudart]==12.9.*`: `libcudart.so.12`, which `import numba.cuda`
///   loads (it asks the runtime for its version). No NVVM: no kernel is compiled.
/// - `rmm-cu12==26.10.*`: RMM's Python package (its resource objects work over
///   the stand-in: the tests' callbacks allocate from emm).
/// - `distributed`: Dask's scheduler, for `emm.dask` (a local cluster of two
///   workers on the stand-in).
pub const PACKAGES: &[&str] = &[
    "numba-cuda==0.30.4",
    "cuda-bindings==12.9.7",
    "cuda-toolkit[cudart]==12.9.*",
    "rmm-cu12==26.10.*",
    "distributed",
];

/// Installs [`PACKAGES`] into `venv`, then runs the `numba_driver` tests on the
/// stand-in through a `libcuda.so.1` link (see the module docs).
pub fn step(root: &Path, installed: &crate::venv::Installed) -> Result<(), String> {
    let started = Instant::now();
    crate::run(
        root,
        "python: numpy, numba-cuda, cuda-bindings, cudart, rmm, distributed from PyPI",
        "pip must reach PyPI; the pins are explained in xtask/src/numba.rs",
        installed
            .python()
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PACKAGES),
    )?;
    let lib = crate::venv::standin(root)?;
    let dir = driver_dir(root, &lib)?;
    eprintln!(
        "==> python: pytest -m numba_driver: numba-cuda's driver layer and emm's plugin on the STAND-IN driver ({} as {}/libcuda.so.1), not on a GPU: host memory, no kernels",
        lib.display(),
        dir.display()
    );
    let out = installed
        .pytest(&["-m", "numba_driver", "-rs"])
        .env("EMM_CUDA_DRIVER", &lib)
        .env("LD_LIBRARY_PATH", search_path(&dir))
        .output()
        .map_err(|e| format!("python: pytest could not start: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let hint = "run `cargo xtask python`, or by hand: `mkdir -p /tmp/d && ln -sf $PWD/target/debug/libemm_standin.so /tmp/d/libcuda.so.1 && LD_LIBRARY_PATH=/tmp/d EMM_CUDA_DRIVER=$PWD/target/debug/libemm_standin.so EMM_LIBRARY=target/debug/libemm_capi.so PYTHONPATH=python python3 -m pytest -m numba_driver python/tests -x` in a venv with the packages of xtask/src/numba.rs";
    match out.status.code() {
        Some(0) => {}
        Some(5) => return Err(format!("step `python: pytest -m numba_driver` collected no tests (exit status 5).\n    hint: python/tests/test_numba_driver.py holds them (pytest.mark.numba_driver); {hint}")),
        _ => return Err(format!("step `python: pytest -m numba_driver` failed ({}).\n    hint: {hint}", out.status)),
    }
    let summary = text.lines().last().unwrap_or_default();
    if summary.contains("skipped") {
        return Err(format!(
            "step `python: pytest -m numba_driver` skipped tests ({summary}); they must run in CI.\n    hint: the skip reasons are listed above (-rs); {hint}"
        ));
    }
    eprintln!(
        "    numba step: {:.0} s (install and tests)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `target/py/driver/` holding `libcuda.so.1` → `lib` (made afresh).
fn driver_dir(root: &Path, lib: &Path) -> Result<PathBuf, String> {
    let dir = crate::target_dir(root).join("py/driver");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let link = dir.join("libcuda.so.1");
    std::os::unix::fs::symlink(lib, &link)
        .map_err(|e| format!("linking {} to {}: {e}", link.display(), lib.display()))?;
    Ok(dir)
}

/// `dir` first, then whatever `LD_LIBRARY_PATH` held.
fn search_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| dir.as_os_str().to_owned())
}
