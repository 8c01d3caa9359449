//! Routing: which manager serves which context.
//!
//! - Managers are registered by name ([`Router::register`]); the `emm` crate
//!   registers the built-ins (`default`, `pool`, `hostonly`).
//! - [`Router::set_memory_manager`] picks one before first use; after a manager has
//!   served a context, switching is [`EmmError::AlreadyInUse`].
//! - `EMM_MEMORY_MANAGER` wins over `set_memory_manager` (with a `tracing` warning,
//!   as NBEP 7 specifies); an unknown name is an error listing the known ones.
//! - One manager instance per context, created on first use: the interface version
//!   is checked, then `initialize` runs, then it serves.
//! - Registering and choosing never touch the driver, so set-up order does not
//!   matter (NBEP 7, "Import order").
//! - Without a choice the manager is [`DEFAULT_MANAGER`], `pool`: the same in Rust,
//!   C, Python and PyTorch.
//! - The process-wide router closes [`crate::config`] when it creates its first
//!   manager: configuration is read once, when a manager starts.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use emm_driver::Context;
use emm_sys::CUstream;

use crate::config_store::{Config, MANAGER_ENV};
use crate::error::{EmmError, Result};
use crate::managed::{ManagedAttach, ManagedMemory};
use crate::manager::{check_interface_version, MemoryManager};
use crate::pointer::DeviceAllocation;
use crate::setting::AnySetting;
use crate::tags::{Keep, PauseReport, Tag, TagStats};

/// The manager used when nothing else is chosen: `pool`, emm's caching pool, in
/// every language (Rust, the C ABI, Python, PyTorch's allocator pair).
pub const DEFAULT_MANAGER: &str = "pool";

/// Makes a manager for a context.
pub trait ManagerFactory: Send + Sync {
    /// A new manager serving `ctx`.
    fn create(&self, ctx: &Context) -> Result<Arc<dyn MemoryManager>>;

    /// The settings the manager reads, declared in its crate
    /// ([`crate::setting`]): registering the factory in a router declares them in
    /// the router's store, so `configure` knows their keys. None by default.
    fn settings(&self) -> Vec<&'static dyn AnySetting> {
        Vec::new()
    }
}

impl<F> ManagerFactory for F
where
    F: Fn(&Context) -> Result<Arc<dyn MemoryManager>> + Send + Sync,
{
    fn create(&self, ctx: &Context) -> Result<Arc<dyn MemoryManager>> {
        self(ctx)
    }
}

#[derive(Default)]
struct State {
    factories: BTreeMap<String, Arc<dyn ManagerFactory>>,
    requested: Option<String>,
    in_use: Option<String>,
    managers: Vec<(usize, Arc<dyn MemoryManager>)>,
}

impl State {
    /// [`Router::check_known`] under a lock already held.
    fn check_known(&self, name: &str) -> Result<()> {
        if self.factories.contains_key(name) {
            return Ok(());
        }
        Err(EmmError::UnknownManager {
            name: name.to_owned(),
            source_var: None,
            known: self.factories.keys().cloned().collect(),
        })
    }
}

/// The routing table. Most programs use the process-wide one ([`Router::global`])
/// through the free functions of this crate.
#[derive(Default)]
pub struct Router {
    state: RwLock<State>,
    /// The configuration this router closes when it creates its first manager
    /// (the process-wide one for [`Router::global`]).
    config: Option<&'static Config>,
}

impl core::fmt::Debug for Router {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = self.read();
        f.debug_struct("Router")
            .field("registered", &s.factories.keys().collect::<Vec<_>>())
            .field("requested", &s.requested)
            .field("in_use", &s.in_use)
            .field("contexts", &s.managers.len())
            .finish()
    }
}

impl Router {
    /// An empty router.
    pub fn new() -> Router {
        Router::default()
    }

    /// The process-wide router.
    pub fn global() -> &'static Router {
        static GLOBAL: OnceLock<Router> = OnceLock::new();
        GLOBAL.get_or_init(|| Router {
            config: Some(Config::global()),
            ..Router::default()
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers (or replaces) the factory of manager `name`, and declares its
    /// settings in the process-wide store when this is the process-wide router.
    pub fn register(&self, name: &str, factory: impl ManagerFactory + 'static) {
        if let Some(c) = self.config {
            c.declare(&factory.settings());
        }
        self.write()
            .factories
            .insert(name.to_owned(), Arc::new(factory));
    }

    /// The registered names, sorted.
    pub fn known(&self) -> Vec<String> {
        self.read().factories.keys().cloned().collect()
    }

    /// Whether `name` is registered: [`EmmError::UnknownManager`] naming the
    /// registered ones when it is not.
    pub fn check_known(&self, name: &str) -> Result<()> {
        self.read().check_known(name)
    }

    /// Chooses manager `name` for every context not yet served.
    ///
    /// Errors: [`EmmError::UnknownManager`] for a name not registered;
    /// [`EmmError::AlreadyInUse`] when another manager has already served a context.
    /// When `EMM_MEMORY_MANAGER` is set it still wins, and a warning says so.
    pub fn set_memory_manager(&self, name: &str) -> Result<()> {
        self.set_memory_manager_with_env(name, env_choice().as_deref())
    }

    fn set_memory_manager_with_env(&self, name: &str, env: Option<&str>) -> Result<()> {
        let mut s = self.write();
        s.check_known(name)?;
        if let Some(current) = &s.in_use {
            if current != name {
                return Err(EmmError::AlreadyInUse {
                    current: current.clone(),
                    requested: name.to_owned(),
                });
            }
        }
        if let Some(env) = env {
            if env != name {
                tracing::warn!(
                    requested = name,
                    environment = env,
                    "{MANAGER_ENV}={env} overrides set_memory_manager(\"{name}\")"
                );
            }
        }
        s.requested = Some(name.to_owned());
        Ok(())
    }

    /// The name that will serve the next new context: `EMM_MEMORY_MANAGER`, else the
    /// one set, else [`DEFAULT_MANAGER`] (`pool`).
    pub fn selected(&self) -> Result<String> {
        self.selected_with_env(env_choice().as_deref())
    }

    fn selected_with_env(&self, env: Option<&str>) -> Result<String> {
        let s = self.read();
        Self::resolve(&s, env)
    }

    fn resolve(s: &State, env: Option<&str>) -> Result<String> {
        let (name, source_var) = match (env, &s.requested) {
            (Some(e), _) => (e.to_owned(), Some(MANAGER_ENV)),
            (None, Some(r)) => (r.clone(), None),
            (None, None) => (DEFAULT_MANAGER.to_owned(), None),
        };
        if s.factories.contains_key(&name) {
            Ok(name)
        } else {
            Err(EmmError::UnknownManager {
                name,
                source_var,
                known: s.factories.keys().cloned().collect(),
            })
        }
    }

    /// The manager serving `ctx`, created (version-checked and initialised) on first
    /// use.
    ///
    /// In a child forked after CUDA was initialised: [`EmmError::Forked`].
    pub fn manager(&self, ctx: &Context) -> Result<Arc<dyn MemoryManager>> {
        crate::error::check_not_forked()?;
        self.manager_for_key(ctx.raw().0 as usize, env_choice().as_deref(), |f| {
            f.create(ctx)
        })
    }

    fn manager_for_key(
        &self,
        key: usize,
        env: Option<&str>,
        create: impl FnOnce(&dyn ManagerFactory) -> Result<Arc<dyn MemoryManager>>,
    ) -> Result<Arc<dyn MemoryManager>> {
        if let Some((_, m)) = self.read().managers.iter().find(|(k, _)| *k == key) {
            return Ok(m.clone());
        }
        let mut s = self.write();
        if let Some((_, m)) = s.managers.iter().find(|(k, _)| *k == key) {
            return Ok(m.clone()); // another thread won the race
        }
        let name = Self::resolve(&s, env)?;
        let factory = s.factories[&name].clone();
        // Configuration closes before the manager reads it, so a value configured
        // concurrently is refused rather than lost.
        let closed_here = self.config.is_some_and(|c| c.freeze(&name));
        let started = create(factory.as_ref()).and_then(|manager| {
            check_interface_version(manager.as_ref())?;
            manager.initialize()?;
            Ok(manager)
        });
        let manager = match started {
            Ok(m) => m,
            Err(e) => {
                if closed_here && s.in_use.is_none() {
                    if let Some(c) = self.config {
                        c.thaw();
                    }
                }
                return Err(e);
            }
        };
        s.in_use = Some(name);
        s.managers.push((key, manager.clone()));
        Ok(manager)
    }

    /// Every live manager, for statistics and the out-of-memory ladder.
    pub fn managers(&self) -> Vec<Arc<dyn MemoryManager>> {
        self.read()
            .managers
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Tells every manager that run-time setting `name` changed (see
    /// [`configure`](crate::config::configure)); each reads the new value through
    /// its [`Setting`](crate::setting::Setting). Every manager is told even when
    /// one fails; the first error is returned.
    pub fn setting_changed(&self, name: &str) -> Result<()> {
        let mut first = Ok(());
        for m in self.managers() {
            if let Err(e) = m.setting_changed(name) {
                tracing::warn!(manager = m.name(), setting = name, error = %e, "applying a changed setting failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Asks every manager to release its cached memory; returns the bytes released.
    /// Releases nothing in a forked child (the caches are the parent's).
    pub fn release_cached_everywhere(&self) -> usize {
        if emm_sys::forked() {
            return 0;
        }
        let mut total = 0;
        for m in self.managers() {
            match m.release_cached() {
                Ok(n) => total += n,
                Err(e) => tracing::warn!(manager = m.name(), error = %e, "release_cached failed"),
            }
        }
        total
    }

    /// Pauses `tags` process-wide: each is marked paused (allocating under it is
    /// then [`EmmError::TagState`]), and every manager of the process gives back
    /// the device memory of its blocks under the tag, keeping their addresses
    /// ([`MemoryManager::pause_tag`]; with [`Keep::Host`] their contents go to
    /// host memory first). Returns what was given back, summed. Pauses and
    /// resumes of the process run one at a time (every router's).
    ///
    /// Refusals change nothing: a tag that is `"default"` or already paused, and
    /// a manager that cannot pause (memory without virtual memory management, a
    /// tag it holds paused; [`MemoryManager::check_pause_tag`], asked of every
    /// manager before any pauses) fail the call first. A manager that cannot
    /// pause at all (`default`, `hostonly`) is an error only when it has served
    /// allocations. A driver failure during the pause has every manager that
    /// already paused resumed again and the tags marked active (with
    /// [`Keep::Nothing`] the contents of what was unmapped are lost: fresh memory
    /// comes back); a tag a manager could not resume again stays marked paused,
    /// so that a later [`resume`](Router::resume) finishes the job.
    pub fn pause(&self, tags: &[Tag], keep: Keep) -> Result<PauseReport> {
        crate::check_not_forked()?;
        let _one = crate::tags::PAUSING
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let unique = distinct(tags);
        for &t in &unique {
            if t == Tag::DEFAULT {
                return Err(t.state_error(
                    "pause",
                    "the default tag cannot be paused: allocate what is to be paused inside a region of its own",
                ));
            }
            if t.is_paused() {
                return Err(t.state_error("pause", "it is already paused"));
            }
        }
        let managers = self.managers();
        for m in &managers {
            for &t in &unique {
                match m.check_pause_tag(t) {
                    Ok(()) => {}
                    Err(EmmError::Unsupported { .. }) if m.stats().allocations == 0 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for (i, &t) in unique.iter().enumerate() {
            if let Err(e) = t.set_paused(true) {
                for &done in &unique[..i] {
                    let _ = done.set_paused(false);
                }
                return Err(e);
            }
        }
        let mut total = PauseReport::default();
        let mut done: Vec<(Arc<dyn MemoryManager>, Tag)> = Vec::new();
        for m in &managers {
            for &t in &unique {
                match m.pause_tag(t, keep) {
                    Ok(r) => {
                        total.add(r);
                        done.push((m.clone(), t));
                    }
                    Err(EmmError::Unsupported { .. }) if m.stats().allocations == 0 => {}
                    Err(e) => {
                        // Undo; a tag some manager still holds paused (one
                        // that could not put its memory back, or whose resume
                        // fails now) stays marked paused, for a later resume.
                        for (m, t) in done.iter().rev() {
                            if let Err(again) = m.resume_tag(*t) {
                                tracing::error!(manager = m.name(), tag = %t.name(), error = %again, "resuming after a failed pause failed; the tag stays paused");
                            }
                        }
                        let held = |t: Tag| {
                            let name = t.name();
                            managers
                                .iter()
                                .any(|m| m.tag_stats().iter().any(|s| s.paused && *s.tag == *name))
                        };
                        for &t in &unique {
                            if !held(t) {
                                let _ = t.set_paused(false);
                            }
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(total)
    }

    /// Resumes `tags`: every manager maps fresh memory under the blocks it paused,
    /// at the same addresses, and copies back what the pause kept; then the tags
    /// are active again. A tag that is not paused fails the call before anything
    /// changes. A manager that fails (out of memory while mapping, the pool's
    /// byte limit) leaves its blocks paused and the tags paused; the managers
    /// already resumed stay resumed, and calling `resume` again after freeing
    /// memory finishes the job (each manager resumes only what it still holds
    /// paused).
    pub fn resume(&self, tags: &[Tag]) -> Result<PauseReport> {
        crate::check_not_forked()?;
        let _one = crate::tags::PAUSING
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let unique = distinct(tags);
        for &t in &unique {
            if !t.is_paused() {
                return Err(t.state_error("resume", "it is not paused"));
            }
        }
        let mut total = PauseReport::default();
        for m in self.managers() {
            for &t in &unique {
                match m.resume_tag(t) {
                    Ok(r) => total.add(r),
                    Err(EmmError::Unsupported { .. }) if m.stats().allocations == 0 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for &t in &unique {
            // (Marked paused above, under the same lock: cannot fail.)
            let _ = t.set_paused(false);
        }
        Ok(total)
    }

    /// Every manager's memory per tag, with the manager's name.
    pub fn tag_stats(&self) -> Vec<(String, TagStats)> {
        self.managers()
            .iter()
            .flat_map(|m| {
                let name = m.name().to_owned();
                m.tag_stats().into_iter().map(move |s| (name.clone(), s))
            })
            .collect()
    }

    /// Allocates `size` bytes on `stream` from `ctx`'s manager. On out-of-memory
    /// every manager of the process releases its cache and the allocation is retried
    /// once (the out-of-memory hook that lets two pools share a card).
    pub fn alloc(&self, ctx: &Context, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        let m = self.manager(ctx)?;
        self.alloc_from(m.as_ref(), size, stream)
    }

    /// Allocates `size` bytes on `stream` from `manager` itself (no look-up: the
    /// fast path is one call of `memalloc_async`). Only when that fails with out of
    /// memory does every manager of this router release its cache, and the
    /// allocation is retried once: the out-of-memory hook for callers that hold a
    /// manager already (the C ABI, `MemArray`, Python).
    ///
    /// In a child forked after CUDA was initialised: [`EmmError::Forked`], and the
    /// manager (the parent's, copied by `fork`) is not touched.
    pub fn alloc_from(
        &self,
        manager: &dyn MemoryManager,
        size: usize,
        stream: CUstream,
    ) -> Result<DeviceAllocation> {
        crate::error::check_not_forked()?;
        match manager.memalloc_async(size, stream) {
            Err(e) if e.is_out_of_memory() => self.retry_after_oom(manager, size, stream),
            other => other,
        }
    }

    #[cold]
    fn retry_after_oom(
        &self,
        manager: &dyn MemoryManager,
        size: usize,
        stream: CUstream,
    ) -> Result<DeviceAllocation> {
        let freed = self.release_cached_everywhere();
        tracing::info!(
            size,
            freed,
            "out of memory: released cached memory of every manager; retrying once"
        );
        manager.memalloc_async(size, stream)
    }

    /// Managed memory from `manager` (its `memallocmanaged`), through the same
    /// out-of-memory hook as [`alloc_from`](Self::alloc_from): only when it fails
    /// for lack of memory does every manager of this router release its cache, and
    /// the allocation is retried once.
    pub fn alloc_managed_from(
        &self,
        manager: &dyn MemoryManager,
        size: usize,
        attach: ManagedAttach,
    ) -> Result<ManagedMemory> {
        crate::error::check_not_forked()?;
        match manager.memallocmanaged(size, attach) {
            Err(e) if e.is_out_of_memory() => {
                let freed = self.release_cached_everywhere();
                tracing::info!(
                    size,
                    freed,
                    "out of memory for managed memory: released cached memory of every manager; retrying once"
                );
                manager.memallocmanaged(size, attach)
            }
            other => other,
        }
    }
}

/// `EMM_MEMORY_MANAGER`, trimmed (blank: unset, as for every `EMM_*`
/// variable). A value that is not UTF-8 is kept as lossy text, which names no
/// manager: [`EmmError::UnknownManager`] says what was found, where it once
/// read as unset and the default served.
fn env_choice() -> Option<String> {
    choice_from(std::env::var_os(MANAGER_ENV))
}

/// [`env_choice`] of the variable's value `os`.
fn choice_from(os: Option<std::ffi::OsString>) -> Option<String> {
    let v = os?.to_string_lossy().trim().to_owned();
    (!v.is_empty()).then_some(v)
}

/// Registers `name` in the process-wide router.
pub fn register_manager(name: &str, factory: impl ManagerFactory + 'static) {
    Router::global().register(name, factory)
}

/// Chooses the process-wide manager (see [`Router::set_memory_manager`]).
pub fn set_memory_manager(name: &str) -> Result<()> {
    Router::global().set_memory_manager(name)
}

/// Allocates from `manager` through the process-wide out-of-memory hook (see
/// [`Router::alloc_from`]).
pub fn alloc_from(
    manager: &dyn MemoryManager,
    size: usize,
    stream: CUstream,
) -> Result<DeviceAllocation> {
    Router::global().alloc_from(manager, size, stream)
}

/// Managed memory from `manager` through the process-wide out-of-memory hook
/// (see [`Router::alloc_managed_from`]).
pub fn alloc_managed_from(
    manager: &dyn MemoryManager,
    size: usize,
    attach: ManagedAttach,
) -> Result<ManagedMemory> {
    Router::global().alloc_managed_from(manager, size, attach)
}

/// `tags` without repeats, in their first order.
fn distinct(tags: &[Tag]) -> Vec<Tag> {
    let mut out: Vec<Tag> = Vec::with_capacity(tags.len());
    for &t in tags {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// [`Router::pause`] on the process-wide router.
pub fn pause(tags: &[Tag], keep: Keep) -> Result<PauseReport> {
    Router::global().pause(tags, keep)
}

/// [`Router::resume`] on the process-wide router.
pub fn resume(tags: &[Tag]) -> Result<PauseReport> {
    Router::global().resume(tags)
}

/// [`Router::tag_stats`] on the process-wide router.
pub fn tag_stats() -> Vec<(String, TagStats)> {
    Router::global().tag_stats()
}

/// The process-wide manager of `ctx` (see [`Router::manager`]).
pub fn memory_manager(ctx: &Context) -> Result<Arc<dyn MemoryManager>> {
    Router::global().manager(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::IpcHandle;
    use crate::manager::{DeferGuard, MemoryInfo};
    use crate::pointer::{DeviceView, HostAllocFlags, HostMemory};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `EMM_MEMORY_MANAGER` trimmed, blank as unset (as every `EMM_*`), and a
    /// value that is not UTF-8 kept as lossy text (an unknown manager, said
    /// so), not read as unset.
    #[test]
    fn the_manager_variable_is_trimmed_and_never_silently_unset() {
        use std::os::unix::ffi::OsStringExt as _;
        let os = |b: &[u8]| Some(std::ffi::OsString::from_vec(b.to_vec()));
        assert_eq!(choice_from(None), None);
        assert_eq!(choice_from(os(b"  ")), None);
        assert_eq!(choice_from(os(b" default ")).as_deref(), Some("default"));
        assert_eq!(
            choice_from(os(b"defa\xfflt")).as_deref(),
            Some("defa\u{fffd}lt")
        );
    }

    struct Fake {
        name: &'static str,
        version: u32,
        inits: AtomicUsize,
        told: AtomicUsize,
    }

    impl MemoryManager for Fake {
        fn name(&self) -> &str {
            self.name
        }
        fn interface_version(&self) -> u32 {
            self.version
        }
        fn initialize(&self) -> Result<()> {
            self.inits.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
            Err(EmmError::InvalidSize {
                requested: size,
                reason: "fake",
            })
        }
        fn memhostalloc(&self, _: usize, _: HostAllocFlags) -> Result<HostMemory> {
            Err(EmmError::Unsupported {
                manager: self.name.into(),
                operation: "memhostalloc",
            })
        }
        unsafe fn mempin(&self, _: *mut u8, _: usize, _: bool) -> Result<HostMemory> {
            Err(EmmError::Unsupported {
                manager: self.name.into(),
                operation: "mempin",
            })
        }
        fn get_memory_info(&self) -> Result<MemoryInfo> {
            Err(EmmError::Unsupported {
                manager: self.name.into(),
                operation: "get_memory_info",
            })
        }
        fn get_ipc_handle(&self, _: DeviceView<'_>) -> Result<IpcHandle> {
            Err(EmmError::Unsupported {
                manager: self.name.into(),
                operation: "get_ipc_handle",
            })
        }
        fn reset(&self) -> Result<()> {
            Ok(())
        }
        fn defer_cleanup(&self) -> DeferGuard {
            DeferGuard::noop()
        }
        fn setting_changed(&self, name: &str) -> Result<()> {
            self.told.fetch_add(1, Ordering::SeqCst);
            match name {
                "refused" => Err(EmmError::InvalidConfig {
                    name: name.into(),
                    value: String::new(),
                    reason: "refused by the fake".into(),
                }),
                _ => Ok(()),
            }
        }
    }

    fn fake(name: &'static str, version: u32) -> Arc<dyn MemoryManager> {
        Arc::new(Fake {
            name,
            version,
            inits: AtomicUsize::new(0),
            told: AtomicUsize::new(0),
        })
    }

    fn router() -> Router {
        let r = Router::new();
        r.register("default", |_: &Context| -> Result<Arc<dyn MemoryManager>> {
            unreachable!("tests create directly")
        });
        r.register("pool", |_: &Context| -> Result<Arc<dyn MemoryManager>> {
            unreachable!()
        });
        r
    }

    #[test]
    fn pool_unless_set_and_env_wins() {
        let r = router();
        assert_eq!(DEFAULT_MANAGER, "pool");
        assert_eq!(r.selected_with_env(None).unwrap(), "pool");
        r.set_memory_manager_with_env("default", None).unwrap();
        assert_eq!(r.selected_with_env(None).unwrap(), "default");
        r.set_memory_manager_with_env("pool", None).unwrap();
        assert_eq!(r.selected_with_env(None).unwrap(), "pool");
        assert_eq!(r.selected_with_env(Some("default")).unwrap(), "default");
        // The env var wins even when set_memory_manager names another (with a warning).
        r.set_memory_manager_with_env("pool", Some("default"))
            .unwrap();
        assert_eq!(r.selected_with_env(Some("default")).unwrap(), "default");
    }

    #[test]
    fn a_manager_without_managed_memory_says_so_typed_and_counts_none() {
        let r = router();
        let m = fake("fake", 1);
        let e = r
            .alloc_managed_from(m.as_ref(), 4096, ManagedAttach::Global)
            .unwrap_err();
        assert!(
            matches!(&e, EmmError::Unsupported { manager, operation: "memallocmanaged" } if manager == "fake"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "manager `fake` does not support memallocmanaged"
        );
        let stats = m.memory_stats();
        for key in [
            "emm.managed_bytes.current",
            "emm.managed_allocations.allocated",
        ] {
            assert_eq!(
                stats.iter().find(|(k, _)| *k == key).map(|(_, v)| *v),
                Some(0),
                "{key}"
            );
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let r = router();
        let e = r.set_memory_manager_with_env("poool", None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown memory manager `poool`; known managers: default, pool"
        );
        let e = r.selected_with_env(Some("rmm")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown memory manager `rmm` (from EMM_MEMORY_MANAGER); known managers: default, pool"
        );
        assert!(Router::new().selected_with_env(None).is_err());
    }

    #[test]
    fn one_instance_per_context_initialised_once_and_no_switch_after_use() {
        let r = router();
        let made = AtomicUsize::new(0);
        let mk = |_: &dyn ManagerFactory| {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(fake("pool", 1))
        };
        let a = r.manager_for_key(1, None, mk).unwrap();
        let b = r
            .manager_for_key(1, None, |_| {
                unreachable!("a second instance for the same context")
            })
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = r.manager_for_key(2, None, |_| Ok(fake("pool", 1))).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert_eq!(r.managers().len(), 2);
        // Switching after use is a typed error, not a silent ignore.
        let e = r.set_memory_manager_with_env("default", None).unwrap_err();
        assert!(matches!(e, EmmError::AlreadyInUse { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "cannot switch the memory manager to `default`: `pool` has already served allocations in this process"
        );
        // Setting the manager already in use is fine.
        r.set_memory_manager_with_env("pool", None).unwrap();
    }

    #[test]
    fn initialize_runs_before_first_use() {
        let r = router();
        let m = Arc::new(Fake {
            name: "default",
            version: 1,
            inits: AtomicUsize::new(0),
            told: AtomicUsize::new(0),
        });
        let m2 = m.clone();
        r.manager_for_key(5, None, move |_| Ok(m2 as Arc<dyn MemoryManager>))
            .unwrap();
        assert_eq!(m.inits.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_wrong_interface_version_is_rejected_with_the_supported_range() {
        let r = router();
        let Err(e) = r.manager_for_key(9, None, |_| Ok(fake("default", 2))) else {
            panic!("accepted version 2")
        };
        assert_eq!(
            e.to_string(),
            "manager `default` implements interface version 2; this emm supports versions 1..=1"
        );
        assert!(r.managers().is_empty());
    }

    #[test]
    fn the_first_manager_closes_configuration_and_a_failed_start_reopens_it() {
        let config: &'static Config = Box::leak(Box::new(Config::new()));
        let mut r = router();
        r.config = Some(config);
        let e = r
            .manager_for_key(3, None, |_| Ok(fake("pool", 2)))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("interface version 2")));
        assert_eq!(config.frozen_by(), None, "a failed start reopens");
        r.manager_for_key(3, None, |_| Ok(fake("pool", 1))).unwrap();
        assert_eq!(config.frozen_by().as_deref(), Some("pool"));
        let e = config.set("manager", "default").unwrap_err();
        assert!(matches!(e, EmmError::ConfiguredTooLate { .. }), "{e}");
    }

    #[test]
    fn registering_a_factory_declares_its_settings_and_changes_reach_every_manager() {
        use crate::setting::{parse, Key, Setting, ValueKind};
        static KNOB: Setting<usize> = Setting::new(
            Key::new(
                "router_test_knob",
                "EMM_ROUTER_TEST_KNOB",
                ValueKind::Count,
                "0",
                "a knob",
            )
            .at_run_time(),
            parse::count,
        );
        struct WithKnob;
        impl ManagerFactory for WithKnob {
            fn create(&self, _: &Context) -> Result<Arc<dyn MemoryManager>> {
                Ok(fake("knobbed", 1))
            }
            fn settings(&self) -> Vec<&'static dyn AnySetting> {
                vec![&KNOB]
            }
        }
        let config: &'static Config = Box::leak(Box::new(Config::new()));
        let mut r = router();
        r.config = Some(config);
        r.register("knobbed", WithKnob);
        assert!(config.key("router_test_knob").is_some_and(|k| k.runtime));
        assert!(config.key("EMM_ROUTER_TEST_KNOB").is_some());
        let a = Arc::new(Fake {
            name: "knobbed",
            version: 1,
            inits: AtomicUsize::new(0),
            told: AtomicUsize::new(0),
        });
        let b = Arc::new(Fake {
            name: "knobbed",
            version: 1,
            inits: AtomicUsize::new(0),
            told: AtomicUsize::new(0),
        });
        let (a2, b2) = (a.clone(), b.clone());
        r.manager_for_key(4, None, move |_| Ok(a2 as Arc<dyn MemoryManager>))
            .unwrap();
        r.manager_for_key(5, None, move |_| Ok(b2 as Arc<dyn MemoryManager>))
            .unwrap();
        r.setting_changed("router_test_knob").unwrap();
        // Every manager is told even when one refuses; the error comes back.
        let e = r.setting_changed("refused").unwrap_err();
        assert!(e.to_string().contains("refused by the fake"), "{e}");
        assert_eq!(a.told.load(Ordering::SeqCst), 2);
        assert_eq!(b.told.load(Ordering::SeqCst), 2);
    }
}
