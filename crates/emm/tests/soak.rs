//! Soak (issue 36 item 5): random allocate, free, stream, trim and limit churn
//! from several threads over the stand-in driver, on each manager through the
//! façade; the engine and the invariants checked after every phase are in
//! `common/soak.rs`.
//!
//! Short in CI (`EMM_SOAK_SECS`, default 8 s per manager); a background run sets
//! it long, e.g. `EMM_SOAK_SECS=7200 cargo test --release -p emm --test soak`.
//! The seed is printed; `EMM_SOAK_SEED` replays it.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use common::managers::{manager, MANAGERS};
use common::soak::{soak, Config, Target};
use common::{fixture, snapshot};

use emm::{DeviceAllocation, MemoryManager};
use emm_sys::CUstream;

/// Seconds per manager by default: three managers within CI's minute.
const CI_SECS: u64 = 8;

/// A manager through the façade: the blocks it handed out, by address.
struct Facade {
    m: Box<dyn MemoryManager>,
    blocks: Mutex<HashMap<u64, DeviceAllocation>>,
}

impl Target for Facade {
    fn alloc(&self, size: usize, stream: CUstream) -> Result<u64, String> {
        let a = if stream.0.is_null() {
            self.m.memalloc(size)
        } else {
            self.m.memalloc_async(size, stream)
        }
        .map_err(|e| e.to_string())?;
        let ptr = a.ptr();
        if let Some(old) = self
            .blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr, a)
        {
            return Err(format!(
                "{ptr:#x} handed out while a block of {} bytes is live there",
                old.size()
            ));
        }
        Ok(ptr)
    }
    fn free(&self, ptr: u64, size: usize, _stream: CUstream) -> Result<(), String> {
        let a = self
            .blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr)
            .ok_or_else(|| format!("freeing {ptr:#x}, which is not live"))?;
        if a.size() != size {
            return Err(format!("{ptr:#x} has {} bytes, not {size}", a.size()));
        }
        drop(a);
        Ok(())
    }
    fn trim(&self) -> Result<(), String> {
        // A free refused under a limit may be reported by the first call after
        // it; the next one succeeds.
        self.m
            .release_cached()
            .or_else(|_| self.m.release_cached())
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn bytes(&self) -> Result<(u64, u64), String> {
        let (st, managed) = (self.m.stats(), self.m.managed_stats());
        Ok((
            st.allocated_bytes as u64,
            (st.reserved_bytes + managed.allocated_bytes + managed.pending_bytes) as u64,
        ))
    }
}

#[test]
fn soak_every_manager_through_the_facade() {
    let f = fixture();
    let cfg = Config::from_env(CI_SECS);
    for name in MANAGERS {
        let before = snapshot(&f.s);
        let target = Facade {
            m: manager(name, &f.ctx),
            blocks: Mutex::new(HashMap::new()),
        };
        let r = soak(name, &target, &f.ctx, &f.s, before.live.bytes, cfg);
        f.s.control("capacity 8G").unwrap();
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(r.allocs > 0 && r.frees > 0, "{name}: nothing was churned");
        drop(target);
        f.ctx.synchronize().unwrap();
        let _ = f.ctx.take_deferred_errors();
        assert_eq!(
            snapshot(&f.s),
            before,
            "{name} (seed {}): with the manager gone the stand-in is back where it was",
            cfg.seed
        );
    }
}
