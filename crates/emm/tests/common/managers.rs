//! The built-in managers by name, as the stand-in tests build them.

use emm::{Context, MemoryManager};
use emm_default::DefaultManager;
use emm_hostonly::HostOnlyManager;
use emm_pool::{PoolConfig, PoolManager, PoolUpstream};

/// Every built-in manager.
pub const MANAGERS: [&str; 3] = ["default", "pool", "hostonly"];

/// A fresh, initialized manager `name` (one of [`MANAGERS`], or
/// `"pool-shared"`: the pool without stream pools, every stream in one arena)
/// on `ctx`.
pub fn manager(name: &str, ctx: &Context) -> Box<dyn MemoryManager> {
    let m: Box<dyn MemoryManager> = match name {
        "default" => Box::new(DefaultManager::new(ctx).unwrap()),
        "pool" => Box::new(PoolManager::new(ctx).unwrap()),
        "pool-shared" => {
            let config = PoolConfig {
                stream_pools: 0,
                ..PoolConfig::from_env().unwrap()
            };
            Box::new(PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), config).unwrap())
        }
        _ => Box::new(HostOnlyManager::new(ctx).unwrap()),
    };
    m.initialize().unwrap();
    m
}
