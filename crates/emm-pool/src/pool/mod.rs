//! [`PoolManager`]: the caching pool as an emm plugin.
//!
//! - `config.rs`: [`PoolConfig`] and its environment variables.
//! - `stats.rs`: [`PoolStats`], under PyTorch's names where they fit.
//! - `source.rs`: what the arena takes memory from (upstream, virtual memory).
//! - `threads.rs`: each thread's counters and caches, and the thread-local
//!   registry; knows the pool only as a [`CacheOwner`](threads::CacheOwner).
//! - `shared.rs`: the pool's shared state (`Core`) and its allocation and free
//!   paths.
//! - `siblings.rs`: how a pool makes further pools of its family (the
//!   parent's upstream again, in its `Family`).
//! - `tagged.rs`: the pools of tagged allocations, one per tag, and their
//!   pause and resume.
//! - `streams.rs`: the pools of created streams (`pool_stream_pools`).
//! - `upstream.rs`: [`PoolUpstream`], and the shared state made over it.
//! - `manager.rs`: [`PoolManager`] over it.
//! - `plugin.rs`: [`PoolManager`]'s `MemoryManager` interface.
//!
//! Files point one way: `plugin` -> `manager` -> `tagged`, `streams` -> `siblings` ->
//! `upstream` -> `shared` -> `threads`, `source`, `config`;
//! `stats` and `config` import no other file of the pool.

mod config;
mod manager;
mod plugin;
mod shared;
mod siblings;
mod source;
mod stats;
mod streams;
mod tagged;
mod threads;
mod upstream;

pub use config::{
    PoolConfig, DEFAULT_STREAM_POOLS, DEFAULT_THREAD_CACHE_KEEP, DEFAULT_THREAD_CACHE_LARGEST,
    MAX_STREAM_CACHES, MAX_STREAM_POOLS,
};
pub use manager::PoolManager;
pub use stats::PoolStats;
pub use upstream::PoolUpstream;
