//! [`EmmError`]: every failure of a memory manager or of the routing.

use emm_driver::DriverError;

/// A failed memory-management operation.
///
/// Messages say what was asked and what was found, e.g. "out of device memory:
/// requested 96.0 GiB, 79.1 GiB free of 79.6 GiB".
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EmmError {
    /// The request could not be served even after the out-of-memory ladder.
    #[error("out of {what} memory in manager `{manager}`: requested {}, {} free of {} total{}", fmt_bytes(*.requested), fmt_bytes(*.free), fmt_bytes(*.total), fmt_detail(.detail))]
    OutOfMemory {
        /// `device` or `pinned host`.
        what: &'static str,
        /// The manager that was asked.
        manager: String,
        /// Bytes requested.
        requested: usize,
        /// Free bytes (of the device, or of the manager's limit) when it failed.
        free: usize,
        /// Total bytes (of the device, or the manager's limit).
        total: usize,
        /// A manager's report (live, reserved, largest free block…), may be empty.
        detail: String,
    },
    /// A size the manager cannot serve (zero where not allowed, or absurdly large).
    #[error("invalid size {requested} bytes: {reason}")]
    InvalidSize {
        /// Bytes requested.
        requested: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An argument that is not valid for the operation: an unknown event, a
    /// negative device ordinal, a range that is not mapped, a foreign handle.
    #[error("invalid {what}: found {found}, expected {expected}")]
    InvalidArgument {
        /// What was asked for, e.g. `device ordinal`.
        what: &'static str,
        /// The value found.
        found: String,
        /// What a valid value is.
        expected: String,
    },
    /// A state emm's own code should never reach (a bug in emm; please report it).
    #[error("internal error in {operation} (a bug in emm; please report it): {detail}")]
    Internal {
        /// The operation that found the state.
        operation: &'static str,
        /// What was found.
        detail: String,
    },
    /// A view or copy range outside its allocation.
    #[error("range {offset}..{offset}+{len} is outside an allocation of {size} bytes")]
    OutOfRange {
        /// Start of the range asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Size of the allocation.
        size: usize,
    },
    /// The driver failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The manager does not implement this operation (NBEP 7 lets
    /// `get_memory_info` and `get_ipc_handle` be unsupported).
    #[error("manager `{manager}` does not support {operation}")]
    Unsupported {
        /// The manager.
        manager: String,
        /// The operation.
        operation: &'static str,
    },
    /// `set_memory_manager` after memory was already allocated.
    #[error("cannot switch the memory manager to `{requested}`: `{current}` has already served allocations in this process")]
    AlreadyInUse {
        /// The manager in use.
        current: String,
        /// The manager asked for.
        requested: String,
    },
    /// A manager name that is not registered.
    #[error("unknown memory manager `{name}`{}; known managers: {}", fmt_source(.source_var), .known.join(", "))]
    UnknownManager {
        /// The name asked for.
        name: String,
        /// The environment variable it came from, if any.
        source_var: Option<&'static str>,
        /// The registered names.
        known: Vec<String>,
    },
    /// A manager reports an interface version this core does not support.
    #[error("manager `{manager}` implements interface version {found}; this emm supports versions {supported}")]
    InterfaceVersion {
        /// The manager.
        manager: String,
        /// The version it reports.
        found: u32,
        /// The supported range, e.g. `1..=1`.
        supported: String,
    },
    /// IPC handle bytes that are not a valid emm handle.
    #[error("invalid IPC handle: {reason}")]
    InvalidIpcHandle {
        /// What was wrong.
        reason: String,
    },
    /// Opening an IPC handle needs a file descriptor of the exporting process
    /// (mempool and virtual-memory handles), and no process has the handle's pid
    /// any more: the exporter exited (or the handle names a foreign pid).
    #[error("cannot open the IPC handle: it asks for file descriptor {fd} of process {pid}, and {detail}")]
    #[non_exhaustive]
    IpcExporterGone {
        /// The exporting process the handle names.
        pid: u32,
        /// Its descriptor the handle names.
        fd: i32,
        /// What was found (the system's error).
        detail: String,
    },
    /// The exporting process is there but would not give its descriptor:
    /// `pidfd_getfd` needs ptrace permission over it (the same user with Yama's
    /// `kernel.yama.ptrace_scope` at most 1 and the exporter a descendant or
    /// not protected, or `CAP_SYS_PTRACE`), and Linux 5.6 or later.
    #[error("cannot take file descriptor {fd} of process {pid}: {detail}")]
    #[non_exhaustive]
    IpcDescriptorRefused {
        /// The exporting process.
        pid: u32,
        /// Its descriptor asked for.
        fd: i32,
        /// What was found: the system's error, and the ptrace setting where known.
        detail: String,
    },
    /// A configuration value (environment variable or builder) is invalid.
    #[error("invalid value {value:?} for {name}: {reason}")]
    InvalidConfig {
        /// The variable or option.
        name: String,
        /// The value found.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A configuration key set after a manager was created (configuration is read
    /// once, when a manager starts).
    #[error("cannot configure `{key}`: manager `{manager}` has already been created in this process; configure before the first allocation")]
    ConfiguredTooLate {
        /// The key.
        key: String,
        /// The manager that was created.
        manager: String,
    },
    /// A free the driver refused: the block is still allocated, still counted as
    /// handed out, and still the caller's, to free again once the fault clears.
    #[error("manager `{manager}` could not free {} at {ptr:#x}: {source}; the block is still allocated and still yours: free it again once the fault clears", fmt_bytes(*.size))]
    FreeFailed {
        /// The manager asked to free it.
        manager: String,
        /// The block's address.
        ptr: u64,
        /// Its size in bytes.
        size: usize,
        /// What the driver said (boxed: it keeps every `EmmError` small).
        source: Box<DriverError>,
    },
    /// The allocation was invalidated by `reset`; its memory is gone.
    #[error("the allocation at {ptr:#x} was invalidated by a reset of manager `{manager}`")]
    Invalidated {
        /// The allocation's address.
        ptr: u64,
        /// The manager that was reset.
        manager: String,
    },
    /// An operation a tag's state does not allow: allocating under a paused tag,
    /// pausing a paused tag or `"default"`, resuming an active one, or pausing
    /// memory that cannot be paused (see [`Region`](crate::Region)).
    #[error("cannot {operation} under tag `{tag}`: {found}")]
    TagState {
        /// The tag's name.
        tag: String,
        /// What was asked: `allocate`, `pause` or `resume`.
        operation: &'static str,
        /// What was found.
        found: String,
    },
    /// This process was forked after its parent initialised CUDA: neither CUDA
    /// nor the parent's pools (copied into this process by `fork`) can be used
    /// here. Nothing was allocated or freed.
    #[error(transparent)]
    Forked(#[from] emm_sys::Forked),
}

/// The result type of emm's managers.
pub type Result<T, E = EmmError> = core::result::Result<T, E>;

impl EmmError {
    /// `true` for [`EmmError::OutOfMemory`] and for a driver out-of-memory code.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            EmmError::OutOfMemory { .. } => true,
            EmmError::Driver(d) => d.is_out_of_memory(),
            _ => false,
        }
    }

    /// `true` for a driver error that says the driver is shutting down
    /// ([`DriverError::is_shutting_down`]): at process exit, where what is left
    /// to release goes with the driver.
    pub fn is_driver_shutting_down(&self) -> bool {
        match self {
            EmmError::Driver(d) => d.is_shutting_down(),
            EmmError::FreeFailed { source, .. } => source.is_shutting_down(),
            _ => false,
        }
    }

    /// The fork this process came from, when the error is that CUDA cannot be
    /// used in a forked child ([`EmmError::Forked`], or the driver refusing to
    /// load for that reason).
    pub fn forked(&self) -> Option<emm_sys::Forked> {
        match self {
            EmmError::Forked(f) => Some(*f),
            EmmError::Driver(DriverError::Load(emm_sys::LoadError::Forked(f))) => Some(*f),
            _ => None,
        }
    }
}

/// [`EmmError::Forked`] in a child forked after CUDA was initialised, else `Ok`:
/// the check every entry point that would touch a manager's state runs first.
#[inline]
pub fn check_not_forked() -> Result<()> {
    Ok(emm_sys::check_not_forked()?)
}

/// Formats a byte count for people: `512 B`, `64.0 KiB`, `1.5 GiB`.
pub fn fmt_bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

fn fmt_detail(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
    }
}

fn fmt_source(s: &Option<&'static str>) -> String {
    s.map(|v| format!(" (from {v})")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_was_asked_and_found() {
        let e = EmmError::OutOfMemory {
            what: "device",
            manager: "pool".into(),
            requested: 96 << 30,
            free: 79 << 30,
            total: 80 << 30,
            detail: "live 1.0 GiB".into(),
        };
        assert_eq!(
            e.to_string(),
            "out of device memory in manager `pool`: requested 96.0 GiB, 79.0 GiB free of 80.0 GiB total (live 1.0 GiB)"
        );
        assert!(e.is_out_of_memory());
        let u = EmmError::UnknownManager {
            name: "poool".into(),
            source_var: Some("EMM_MEMORY_MANAGER"),
            known: vec!["default".into(), "pool".into()],
        };
        assert_eq!(u.to_string(), "unknown memory manager `poool` (from EMM_MEMORY_MANAGER); known managers: default, pool");
        let a = EmmError::InvalidArgument {
            what: "device ordinal",
            found: "-1".into(),
            expected: "0 or more".into(),
        };
        assert_eq!(
            a.to_string(),
            "invalid device ordinal: found -1, expected 0 or more"
        );
        assert!(!a.is_out_of_memory());
        let i = EmmError::Internal {
            operation: "pool alloc",
            detail: "no block after growing".into(),
        };
        assert_eq!(
            i.to_string(),
            "internal error in pool alloc (a bug in emm; please report it): no block after growing"
        );
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }
}
