//! Fork after CUDA (issue 36, item 3): a child forked after emm initialised the
//! driver gets a typed error from every manager and from the driver layer, and
//! never hands out or frees the parent's blocks; a child forked before CUDA was
//! first used is an ordinary process with a working manager of its own; and the
//! parent's managers work on, their data intact. (That a child never takes a lock
//! a parent thread held at the fork is argued in the code, not shown here: these
//! helpers fork from their only thread of their own.)
//!
//! `fork` is only safe from a single-threaded process, and libtest runs tests on
//! threads of its own, so this binary has no harness: `main` runs each driver's
//! scenarios in a helper process of its own (the driver is process-wide), started
//! from this executable, whose only thread forks. The stand-in driver behaves as
//! the real one in a forked child (its calls fail with
//! `CUDA_ERROR_NOT_INITIALIZED`), so the stand-in run proves the checks; the GPU
//! run (`--ignored` or `--include-ignored`, as the GPU bundle passes) repeats
//! them over the driver the environment names (`EMM_CUDA_DRIVER`, else the real
//! one).
//!
//! Build the stand-in first: `cargo build -p emm-standin` (`cargo xtask ci` does).

mod common;

use std::process::{Command, ExitCode};

use emm::core::{alloc_from, SYNC_STREAM};
use emm::{Context, EmmError};
use emm_sys::CUresult;

/// Set in a helper process: which driver it runs on (`standin` or `gpu`).
const HELPER_ENV: &str = "EMM_FORK_TEST_HELPER";
const MIB: usize = 1 << 20;

fn main() -> ExitCode {
    if let Ok(driver) = std::env::var(HELPER_ENV) {
        return helper(&driver);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let names = ["standin", "gpu"];
    if has("--list") {
        for n in names {
            println!("fork::{n}: test");
        }
        return ExitCode::SUCCESS;
    }
    let gpu = has("--ignored") || has("--include-ignored");
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for driver in names {
        let wanted = match driver {
            "gpu" => gpu,
            _ => !has("--ignored"),
        };
        if !wanted {
            if driver == "gpu" {
                println!("test fork::gpu ... ignored, needs a CUDA GPU");
                ignored += 1;
            }
            continue;
        }
        let mut cmd = Command::new(std::env::current_exe().expect("this test's executable"));
        // Named for what it runs on: `gpu` on the real driver, `gpu-marked` when
        // EMM_CUDA_DRIVER names another (CI's stand-in pass), never counted as a GPU.
        let label = match driver {
            "gpu" if std::env::var_os(emm_sys::DRIVER_PATH_ENV).is_some() => "gpu-marked",
            d => d,
        };
        cmd.env(HELPER_ENV, label);
        // The GPU-marked run takes the driver the environment names, as every
        // GPU test does: the real one on a GPU machine, the stand-in in CI's pass
        // of the GPU-marked tests over it.
        if driver != "gpu" {
            cmd.env(emm_sys::DRIVER_PATH_ENV, common::standin_path());
        }
        let out = cmd.output().expect("the helper process starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        passed += stdout.lines().filter(|l| l.ends_with("... ok")).count();
        let failed_here = stdout.lines().filter(|l| l.ends_with("... FAILED")).count();
        failed += failed_here;
        if !out.status.success() && failed_here == 0 {
            println!("test fork::{driver} ... FAILED ({})", out.status);
            failed += 1;
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; 0 filtered out"
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The helper: its only thread runs every scenario, forking as it goes.
fn helper(driver: &str) -> ExitCode {
    let mut failed = false;
    let mut report = |name: &str, r: Result<(), String>| match r {
        Ok(()) => println!("test fork::{driver}::{name} ... ok"),
        Err(e) => {
            println!("test fork::{driver}::{name} ... FAILED");
            eprintln!("fork::{driver}::{name}: {e}");
            failed = true;
        }
    };
    // Before the driver is loaded: must come first.
    report(
        "a_child_forked_before_cuda_gets_a_working_manager",
        in_child(|| {
            let ctx = Context::on_device(0).map_err(|e| format!("the driver: {e}"))?;
            let m = common::managers::manager("pool", &ctx);
            let a = alloc_from(m.as_ref(), MIB, SYNC_STREAM)
                .map_err(|e| format!("allocating in the child: {e}"))?;
            a.free()
                .map_err(|e| format!("freeing in the child: {}", e.error))
        }),
    );
    let drv = match emm_sys::driver() {
        Ok(d) => d,
        Err(e) => {
            report("the_driver_loads", Err(e.to_string()));
            return ExitCode::FAILURE;
        }
    };
    println!("driver: {} ({driver})", drv.path());
    let ctx = Context::on_device(0).expect("device 0");
    for name in common::managers::MANAGERS {
        report(
            &format!("a_child_forked_after_cuda_is_refused_by_{name}"),
            after_cuda(name, &ctx),
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Forks, runs `f` in the child (which exits without running destructors: what it
/// holds is the parent's), and says how the child ended.
fn in_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: this process runs no thread of its own but this one (see the module
    // docs; the real driver's service threads hold none of emm's locks), so the
    // child inherits no lock of emm's held by another thread.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                eprintln!("in the forked child: {e}");
                1
            }
            Err(_) => 2,
        };
        let _ = std::io::stderr().flush();
        // SAFETY: ends the child at once, running no destructor of the parent's state.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, 2) => Err("the forked child panicked".into()),
        (true, c) => Err(format!(
            "the forked child failed (exit status {c}; its message is above)"
        )),
        _ => Err(format!(
            "the forked child did not exit (wait status {status:#x})"
        )),
    }
}

/// The error of an allocation that had to fail (the block, if one came, is
/// forgotten: it is the parent's).
fn refused(what: &str, r: emm::Result<emm::DeviceAllocation>) -> Result<EmmError, String> {
    match r {
        Err(e) => Ok(e),
        Ok(a) => {
            let ptr = a.ptr();
            let _ = a.into_raw();
            Err(format!("{what} handed out {ptr:#x} in the forked child"))
        }
    }
}

/// `Ok` when `e` says this is a forked child of `parent`.
fn is_forked(what: &str, e: &EmmError, parent: u32) -> Result<(), String> {
    match e.forked() {
        Some(f) if f.parent == parent && f.child == std::process::id() => {
            let text = e.to_string();
            if text.contains("forked") && text.contains("spawn") {
                Ok(())
            } else {
                Err(format!(
                    "{what}: the message does not say what happened and what to do: {text}"
                ))
            }
        }
        Some(f) => Err(format!(
            "{what}: wrong processes in {f:?} (parent {parent})"
        )),
        None => Err(format!("{what}: expected the forked-child error, got {e}")),
    }
}

fn after_cuda(name: &str, ctx: &Context) -> Result<(), String> {
    let m = common::managers::manager(name, ctx);
    let pattern: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 + 3) as u8).collect();
    let mut held = Some(alloc_from(m.as_ref(), 4 * MIB, SYNC_STREAM).map_err(|e| e.to_string())?);
    let ptr = held.as_ref().map_or(0, |h| h.ptr());
    // SAFETY: `held` is 4 MiB of device memory and `pattern` 4 MiB of host memory.
    unsafe { emm_driver::memory::copy_htod(ctx, ptr, &pattern) }.map_err(|e| e.to_string())?;
    // A block freed before the fork: the pool keeps it cached.
    drop(alloc_from(m.as_ref(), 2 * MIB, SYNC_STREAM).map_err(|e| e.to_string())?);
    let parent = std::process::id();
    let drv = emm_sys::driver().map_err(|e| e.to_string())?;
    let stats_before = m.report();

    in_child(|| {
        // Through the router (as the C ABI, Python and MemArray allocate).
        let e = refused(
            "emm::alloc_from",
            alloc_from(m.as_ref(), 2 * MIB, SYNC_STREAM),
        )?;
        is_forked("emm::alloc_from", &e, parent)?;
        // Straight to the manager: the pool's cached 2 MiB must not come out.
        let e = refused("memalloc", m.memalloc(2 * MIB))?;
        is_forked("memalloc", &e, parent)?;
        // Freeing the parent's block is refused, and the block comes back.
        let not_freed = match held.take().ok_or("no block")?.free() {
            Err(not_freed) => not_freed,
            Ok(()) => return Err("free: the parent's block was freed in the child".into()),
        };
        is_forked("free", &not_freed.error, parent)?;
        drop(not_freed); // dropping it releases nothing here
                         // The driver layer says the same, and the driver itself refuses CUDA.
        match emm_sys::driver() {
            Err(emm_sys::LoadError::Forked(f)) if f.parent == parent => {}
            other => return Err(format!("emm_sys::driver(): expected Forked, got {other:?}")),
        }
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer.
        let code = unsafe { (drv.device_get_count)(&mut n) };
        if code != CUresult::ERROR_NOT_INITIALIZED {
            return Err(format!(
                "cuDeviceGetCount in the forked child returned {code}, not CUDA_ERROR_NOT_INITIALIZED (the real driver's answer)"
            ));
        }
        if let Err(e) = Context::on_device(0) {
            is_forked("Context::on_device", &EmmError::from(e), parent)?;
        } else {
            return Err("Context::on_device succeeded in the forked child".into());
        }
        // Trimming releases nothing of the parent's: refused (the pool), or
        // nothing given back (the others, whose driver calls are refused).
        match m.release_cached() {
            Ok(0) => {}
            Ok(n) => {
                return Err(format!(
                    "release_cached released {n} bytes of the parent's pool"
                ))
            }
            Err(e) => is_forked("release_cached", &e, parent)?,
        }
        Ok(())
    })?;

    // The parent goes on as before: same counters, data intact, allocating.
    if m.report() != stats_before {
        return Err("the parent's statistics changed across the child's life".into());
    }
    let mut back = vec![0u8; 4 * MIB];
    // SAFETY: `back` holds 4 MiB; `held` is 4 MiB of device memory.
    unsafe { emm_driver::memory::copy_dtoh(ctx, &mut back, ptr) }.map_err(|e| e.to_string())?;
    if back != pattern {
        return Err("the parent's block changed".into());
    }
    let more = alloc_from(m.as_ref(), 8 * MIB, SYNC_STREAM)
        .map_err(|e| format!("the parent allocating after the fork: {e}"))?;
    more.free().map_err(|e| e.error.to_string())?;
    held.take()
        .ok_or("the parent lost its block")?
        .free()
        .map_err(|e| e.error.to_string())?;
    m.release_cached().map_err(|e| e.to_string())?;
    Ok(())
}
