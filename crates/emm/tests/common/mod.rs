//! What the stand-in test binaries share: the stand-in library's path, a fixture
//! that loads it once and serializes the tests, snapshots of its live resources,
//! the managers by name (`managers.rs`), the fault sweep's engine (`sweep.rs`),
//! the soak test's (`soak.rs`) and its façade target (`facade.rs`).

#![allow(dead_code)] // each test file uses its own part

pub mod facade;
pub mod managers;
pub mod soak;
pub mod sweep;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};

use emm::Context;
use emm_sys::{CUresult, Live, StandIn};

/// `target/<profile>/libemm_standin.so`, from this executable's place in
/// `target/<profile>/deps/`.
pub fn standin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable lives in target/<profile>/deps");
    profile_dir.join("libemm_standin.so")
}

/// Serializes the tests (the stand-in's counters are process-wide) and loads the
/// stand-in once.
pub struct Fixture {
    _serial: MutexGuard<'static, ()>,
    pub s: StandIn<'static>,
    pub ctx: Context,
}

pub fn fixture() -> Fixture {
    static SERIAL: Mutex<()> = Mutex::new(());
    static LOAD: Once = Once::new();
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    LOAD.call_once(|| {
        let path = standin_path();
        assert!(
            path.is_file(),
            "{} is missing: run `cargo build -p emm-standin` first (cargo xtask ci does)",
            path.display()
        );
        std::env::set_var(emm_sys::DRIVER_PATH_ENV, &path);
    });
    let drv = emm_sys::driver().expect("the stand-in loads");
    let s = drv
        .stand_in()
        .expect("the loaded driver is emm-standin (EMM_CUDA_DRIVER was set elsewhere?)");
    println!(
        "driver: {} (emm-standin, the stand-in driver: host memory, not a GPU)",
        drv.path()
    );
    s.reset().unwrap();
    s.control("capacity 8G").unwrap();
    let ctx = Context::on_device(0).unwrap();
    Fixture {
        _serial: serial,
        s,
        ctx,
    }
}

/// The stand-in's live resources and bad-free counters, to compare before and
/// after a test.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub live: Live,
    pub double_frees: u64,
    pub invalid_frees: u64,
}

pub fn snapshot(s: &StandIn<'_>) -> Snapshot {
    Snapshot {
        live: s.live().unwrap(),
        double_frees: s.control("double_frees").unwrap(),
        invalid_frees: s.control("invalid_frees").unwrap(),
    }
}

/// The error the tests inject for an exhausted device.
pub fn oom() -> CUresult {
    CUresult::ERROR_OUT_OF_MEMORY
}
