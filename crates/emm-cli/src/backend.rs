//! Where the main job runs: a GPU, or the host-memory stand-in. Managers are built
//! through the façade (`emm::build_manager`, `emm::build_host_standin`), fresh for
//! every replay, configured from the environment as in any program.

use std::sync::Arc;

use emm::driver::{Device, Stream};
use emm::sys::CUstream;
use emm::{Context, EmmError, MemoryManager};

/// Bytes of the host stand-in "device": large enough for any trace.
pub const HOST_CAPACITY: usize = 1 << 40;

pub enum Backend {
    Gpu { ctx: Context, name: String },
    Host { why: String },
}

impl Backend {
    pub fn detect() -> Backend {
        let gpu = Device::get(0).and_then(|d| Ok((d.name()?, Context::primary(d)?)));
        match gpu {
            Ok((name, ctx)) => Backend::Gpu { ctx, name },
            Err(e) => Backend::Host { why: e.to_string() },
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Gpu { .. } => "gpu",
            Backend::Host { .. } => "host",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Backend::Gpu { name, .. } => format!("backend: GPU 0 ({name}), device memory"),
            Backend::Host { why } => format!(
                "backend: host-memory stand-in: sizes and counts are real, times are host bookkeeping only\n{}",
                wrap(&format!("no CUDA GPU: {why}"), 116, "  ")
            ),
        }
    }

    /// Whether emm's managers run over the host stand-in here (no GPU).
    pub fn is_host(&self) -> bool {
        matches!(self, Backend::Host { .. })
    }

    /// A fresh manager `name`. `Err(Unsupported)` where it cannot run here.
    pub fn build(&self, name: &str) -> Result<Arc<dyn MemoryManager>, EmmError> {
        match self {
            Backend::Gpu { ctx, .. } => {
                ctx.set_current()?;
                emm::build_manager(name, ctx)
            }
            Backend::Host { .. } => emm::build_host_standin(name, HOST_CAPACITY),
        }
    }

    /// A fresh pool with `config` on the GPU, or over the host stand-in.
    pub fn build_pool(
        &self,
        config: emm::emm_pool::PoolConfig,
    ) -> Result<Arc<dyn MemoryManager>, EmmError> {
        use emm::emm_pool::{PoolManager, PoolUpstream};
        Ok(match self {
            Backend::Gpu { ctx, .. } => {
                ctx.set_current()?;
                Arc::new(PoolManager::with_config(
                    PoolUpstream::Driver(ctx.clone()),
                    config,
                )?)
            }
            Backend::Host { .. } => Arc::new(PoolManager::host(HOST_CAPACITY, config)?),
        })
    }

    /// The streams of one replay: the trace's stream `n` (dense, 0 the default
    /// stream) gets its own stream, created on first use and kept until the
    /// [`Streams`] drop (after the replay and a synchronization).
    pub fn streams(&self) -> Streams<'_> {
        Streams {
            backend: self,
            created: Vec::new(),
        }
    }

    /// Waits for the device's work (after a replay, before its streams go).
    pub fn synchronize(&self) -> Result<(), EmmError> {
        match self {
            Backend::Gpu { ctx, .. } => Ok(ctx.synchronize()?),
            Backend::Host { .. } => Ok(()),
        }
    }
}

/// `text` in lines of at most `width` characters (a longer word stands alone),
/// each begun with `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
        .iter()
        .map(|l| format!("{indent}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub struct Streams<'a> {
    backend: &'a Backend,
    created: Vec<Stream>,
}

impl Streams<'_> {
    /// The handle for the trace's stream `n`.
    pub fn get(&mut self, n: u64) -> CUstream {
        if n == 0 {
            return emm::core::SYNC_STREAM;
        }
        match self.backend {
            // Distinct handles the host stand-in only uses as keys; never
            // dereferenced, never passed to a driver.
            Backend::Host { .. } => {
                CUstream(0x1000usize.wrapping_add((n as usize).wrapping_mul(0x100)) as *mut _)
            }
            Backend::Gpu { ctx, .. } => match Stream::new(ctx) {
                Ok(s) => {
                    let raw = s.raw();
                    self.created.push(s);
                    raw
                }
                Err(e) => {
                    crate::out::note(format_args!(
                        "emm replay: cannot create a stream for the trace's stream {n} ({e}); using the default stream"
                    ));
                    emm::core::SYNC_STREAM
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_stand_in_keeps_streams_distinct() {
        let b = Backend::Host { why: "test".into() };
        let mut s = b.streams();
        let h: Vec<usize> = (0..5).map(|n| s.get(n).0 as usize).collect();
        let mut d = h.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 5, "{h:?}");
        assert_eq!(s.get(0), emm::core::SYNC_STREAM);
        assert!(
            h[1..].iter().all(|&x| x > 2),
            "never a default-stream handle"
        );
    }
}
