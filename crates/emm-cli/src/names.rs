//! The replay's manager names beyond the façade's built-in managers: the
//! models of PyTorch's allocator and the pool with one shared arena. A leaf:
//! `replay.rs` builds them, `verdict.rs` and `main.rs` name them.

/// The models of PyTorch's caching allocator `emm replay` offers beside emm's
/// managers.
pub const TORCH_MODELS: [&str; 2] = ["pytorch-native", "pytorch-expandable"];

/// The pool with every stream in one shared arena (`pool_stream_pools` 0), as a
/// manager of the replay: stream pools (the pool's default) lose where streams
/// share memory by turns, and a user's trace says which suits their job.
pub const POOL_SHARED: &str = "pool-shared";
