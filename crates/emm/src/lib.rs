//! emm: choose and share the CUDA memory manager of a program.
//!
//! This crate wires the built-in managers into the process-wide router of
//! `emm-core`: `default` ([`emm_default::DefaultManager`]), `pool`
//! ([`emm_pool::PoolManager`]) and `hostonly` ([`emm_hostonly::HostOnlyManager`]).
//! Without a choice the manager is `pool` (the same default in Rust, C, Python and
//! PyTorch). `EMM_MEMORY_MANAGER=default|pool|hostonly` picks one;
//! [`set_memory_manager`] picks one in code (the variable wins, with a warning).
//! [`configure`] sets any `EMM_*` setting in code before the first allocation
//! (or, for run-time settings such as `pool_limit`, later too); [`settings`]
//! lists the keys, each declared by the crate that reads it (see
//! [`emm_core::setting`]; the environment wins here too).
//!
//! `EMM_RECORD=path` records every device allocation and free of the managers the
//! router builds into `path` (emm's CSV, what `emm replay` reads); later contexts
//! record into `path.1`, `path.2`, ….
//!
//! ```no_run
//! emm::configure("pool_limit", "8589934592")?; // or EMM_POOL_LIMIT
//! emm::set_memory_manager("pool")?;
//! let ctx = emm::Context::on_device(0)?;
//! let manager = emm::memory_manager(&ctx)?;
//! let _block = manager.memalloc(1 << 20)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

pub use emm_core::{
    self as core, memory_manager, pause, register_manager, resume, set_memory_manager, tag_stats,
    DeviceAllocation, EmmError, Keep, ManagerFactory, MemoryManager, PauseReport, Region, Result,
    Router, Tag, TagStats,
};
pub use emm_driver::{self as driver, Context, Device, Stream};
pub use emm_sys as sys;
pub use emm_trace as trace;
pub use {emm_default, emm_hostonly, emm_pool};

/// The names of the built-in managers.
pub const BUILTIN_MANAGERS: &[&str] = &["default", "pool", "hostonly"];

/// Sets configuration key `key` (see [`settings`]) to `value`: before the first
/// allocation, or at any time for a run-time setting (`pool_limit`,
/// `pool_release_threshold`), which every manager applies at once (see
/// [`emm_core::config`]). Registers the built-in managers first, so
/// `configure("manager", "hostonly")` works without another call.
///
/// Errors: [`EmmError::InvalidConfig`], [`EmmError::UnknownManager`],
/// [`EmmError::AlreadyInUse`], [`EmmError::ConfiguredTooLate`].
pub fn configure(key: &str, value: &str) -> Result<()> {
    register_builtin_managers();
    emm_core::config::configure(key, value)
}

/// Whether [`configure`] would take `value` for `key`, applying nothing: a known
/// key, a value that parses, a registered manager's name. Whether a manager has
/// been created (after which a setting read at creation can only be repeated) is
/// not asked. Check every setting of a batch first, and a bad one applies none.
///
/// Errors: [`EmmError::InvalidConfig`], [`EmmError::UnknownManager`].
pub fn check_configuration(key: &str, value: &str) -> Result<()> {
    register_builtin_managers();
    emm_core::config::check(key, value)
}

/// Every setting `configure` knows, in the order of the documentation: the
/// router's `manager`, then those of the registered managers (the built-in ones
/// are registered first).
pub fn settings() -> Vec<core::setting::Key> {
    register_builtin_managers();
    core::config::Config::global().keys()
}

/// Registers `default`, `pool` and `hostonly` in the process-wide router (once;
/// later calls do nothing). Never touches the driver.
pub fn register_builtin_managers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| register_builtins_in(Router::global()));
}

/// Registers the built-in managers in `router`, with the settings each reads;
/// each is wrapped in a [`trace::RecordingManager`] when `EMM_RECORD` is set.
pub fn register_builtins_in(router: &Router) {
    // The pool first: its settings lead the list of keys (it is the default).
    for name in ["pool", "default", "hostonly"] {
        debug_assert!(BUILTIN_MANAGERS.contains(&name));
        router.register(name, Builtin(name));
    }
}

/// The factory of built-in manager `.0`.
struct Builtin(&'static str);

impl ManagerFactory for Builtin {
    fn create(&self, ctx: &Context) -> Result<Arc<dyn MemoryManager>> {
        record_if_asked(build_manager(self.0, ctx)?)
    }

    fn settings(&self) -> Vec<&'static dyn core::setting::AnySetting> {
        match self.0 {
            "pool" => emm_pool::PoolManager::settings(),
            "default" => emm_default::DefaultManager::settings(),
            "hostonly" => emm_hostonly::HostOnlyManager::settings(),
            _ => Vec::new(),
        }
    }
}

fn unknown(name: &str) -> EmmError {
    EmmError::UnknownManager {
        name: name.to_owned(),
        source_var: None,
        known: BUILTIN_MANAGERS.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// A new built-in manager `name` serving `ctx`, initialised, configured from the
/// environment (`EMM_POOL_*`, `EMM_MAX_PENDING_DEALLOCS_*`,
/// `EMM_HOSTONLY_RELEASE_THRESHOLD`), registered nowhere. `emm replay` builds one
/// per replay so that each starts empty.
pub fn build_manager(name: &str, ctx: &Context) -> Result<Arc<dyn MemoryManager>> {
    let m: Arc<dyn MemoryManager> = match name {
        "default" => Arc::new(emm_default::DefaultManager::new(ctx)?),
        "pool" => Arc::new(emm_pool::PoolManager::new(ctx)?),
        "hostonly" => Arc::new(emm_hostonly::HostOnlyManager::new(ctx)?),
        other => return Err(unknown(other)),
    };
    m.initialize()?;
    Ok(m)
}

/// A new built-in manager `name` over host memory standing in for a device of
/// `capacity` bytes (no GPU needed; sizes and counts are real), configured from the
/// environment like [`build_manager`]. `hostonly` has no stand-in (it is CUDA's
/// stream-ordered allocator): [`EmmError::Unsupported`], after its environment was
/// checked.
pub fn build_host_standin(name: &str, capacity: usize) -> Result<Arc<dyn MemoryManager>> {
    let m: Arc<dyn MemoryManager> = match name {
        "default" => Arc::new(emm_default::DefaultManager::over(
            emm_default::HostUpstream::new(capacity, false),
            emm_default::PendingConfig::from_env()?,
        )),
        "pool" => Arc::new(emm_pool::PoolManager::host(
            capacity,
            emm_pool::PoolConfig::from_env()?,
        )?),
        "hostonly" => {
            emm_hostonly::HostOnlyConfig::from_env()?;
            return Err(EmmError::Unsupported {
                manager: "hostonly".into(),
                operation: "running without a GPU (it is CUDA's stream-ordered allocator)",
            });
        }
        other => return Err(unknown(other)),
    };
    m.initialize()?;
    Ok(m)
}

/// As [`build_host_standin`], with the stand-in's device running `clock.lag()`
/// requests behind the host ([`emm_core::HostClock`]; the caller ticks the clock
/// once a request, as `emm replay --device-lag` does). Only the pool records
/// events, so only its placement changes; the others are built as without a clock.
pub fn build_host_standin_lagged(
    name: &str,
    capacity: usize,
    clock: Arc<emm_core::HostClock>,
) -> Result<Arc<dyn MemoryManager>> {
    if name != "pool" {
        return build_host_standin(name, capacity);
    }
    let m: Arc<dyn MemoryManager> = Arc::new(emm_pool::PoolManager::host_lagged(
        capacity,
        emm_pool::PoolConfig::from_env()?,
        clock,
    )?);
    m.initialize()?;
    Ok(m)
}

/// Wraps `m` in a [`trace::RecordingManager`] when `EMM_RECORD` names a file.
fn record_if_asked(m: Arc<dyn MemoryManager>) -> Result<Arc<dyn MemoryManager>> {
    static RECORDERS: AtomicUsize = AtomicUsize::new(0);
    let Some(path) = std::env::var_os(trace::RECORD_ENV).filter(|p| !p.is_empty()) else {
        return Ok(m);
    };
    let n = RECORDERS.fetch_add(1, Ordering::Relaxed);
    let mut path = std::path::PathBuf::from(path);
    if n > 0 {
        let mut s = path.into_os_string();
        s.push(format!(".{n}"));
        path = s.into();
    }
    let rec = trace::RecordingManager::to_file(m, &path).map_err(|e| EmmError::InvalidConfig {
        name: trace::RECORD_ENV.into(),
        value: path.display().to_string(),
        reason: format!("cannot create the trace file: {e}"),
    })?;
    Ok(Arc::new(rec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_registered_without_touching_the_driver() {
        let r = Router::new();
        register_builtins_in(&r);
        assert_eq!(r.known(), vec!["default", "hostonly", "pool"]);
        r.set_memory_manager("pool").unwrap();
        let e = r.set_memory_manager("rmm").unwrap_err();
        assert!(
            e.to_string()
                .contains("known managers: default, hostonly, pool"),
            "{e}"
        );
    }

    #[test]
    fn host_standins_are_built_and_hostonly_says_why_not() {
        for name in ["default", "pool"] {
            let m = build_host_standin(name, 1 << 30).unwrap();
            drop(m.memalloc_async(4096, core::SYNC_STREAM).unwrap());
            assert!(m.stats().reserved_bytes_peak >= 4096, "{name}");
        }
        let e = build_host_standin("hostonly", 1 << 30).err().unwrap();
        assert!(e.to_string().contains("without a GPU"), "{e}");
        let e = build_host_standin("rmm", 1 << 30).err().unwrap();
        assert!(
            e.to_string().contains("unknown memory manager `rmm`"),
            "{e}"
        );
    }

    #[test]
    fn recording_writes_a_trace_emm_replay_reads() {
        let path = std::env::temp_dir().join(format!("emm-record-{}.csv", std::process::id()));
        let inner = build_host_standin("pool", 1 << 30).unwrap();
        let rec = trace::RecordingManager::to_file(inner, &path).unwrap();
        let a = rec.memalloc_async(1000, core::SYNC_STREAM).unwrap();
        let b = rec.memalloc_async(24, core::SYNC_STREAM).unwrap();
        drop(a);
        drop(b);
        rec.flush().unwrap();
        let t = trace::Trace::open(&path, None).unwrap().remove(0);
        let s = trace::scan(&t).unwrap();
        assert_eq!((s.requests, s.events, s.peak_live_bytes), (2, 4, 1024));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn without_a_choice_the_manager_is_the_pool() {
        let r = Router::new();
        register_builtins_in(&r);
        if std::env::var_os(emm_core::MANAGER_ENV).is_none() {
            assert_eq!(r.selected().unwrap(), "pool");
        }
    }
}

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// This crate's own README's examples, compiled as doc tests too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
