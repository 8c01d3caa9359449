//! The stand-in driver for the bridge's unit tests (`libemm_standin.so` beside
//! the test binary's folder, as `cargo build --workspace` or `cargo xtask ci`
//! leaves it). The tests share the process's devices, so each takes one lock.

use std::sync::{Mutex, MutexGuard, Once};

/// Loads the stand-in once (unless `EMM_CUDA_DRIVER` names a driver already)
/// and holds the lock every bridge test takes.
pub(crate) fn standin() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        let exe = std::env::current_exe().expect("the test executable's path");
        let path = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>/deps")
            .join("libemm_standin.so");
        assert!(
            path.is_file(),
            "{} is missing: run `cargo build -p emm-standin` (cargo xtask ci does)",
            path.display()
        );
        if std::env::var_os(emm_sys::DRIVER_PATH_ENV).is_none() {
            std::env::set_var(emm_sys::DRIVER_PATH_ENV, &path);
        }
    });
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The value of `memory_stats` entry `name` of `manager` (0 when it has none).
pub(crate) fn stat(manager: &dyn emm_core::MemoryManager, name: &str) -> u64 {
    manager
        .memory_stats()
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |&(_, v)| v)
}
