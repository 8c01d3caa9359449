//! `configure` reaches the pool's settings, before the first manager and, for the
//! run-time ones, after it, over the stand-in driver. Its own test binary:
//! configuration is process-wide, and other tests build pools with the defaults.

mod common;

use common::fixture;
use emm::EmmError;

const MIB: usize = 1 << 20;

fn reserved(m: &dyn emm::MemoryManager) -> u64 {
    m.memory_stats()
        .iter()
        .find(|(k, _)| *k == "reserved_bytes.all.current")
        .map_or(0, |&(_, v)| v)
}

#[test]
fn configured_settings_reach_the_pool_before_and_while_it_serves() {
    if [
        "EMM_POOL_LIMIT",
        "EMM_POOL_EXPANDABLE",
        "EMM_MEMORY_MANAGER",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
    {
        eprintln!("EMM_POOL_LIMIT, EMM_POOL_EXPANDABLE or EMM_MEMORY_MANAGER is set: the environment wins, nothing to test");
        return;
    }
    let f = fixture();
    // Every key, declared by the crate that reads it, pool first.
    let keys = emm::settings();
    let names: Vec<_> = keys.iter().map(|k| k.name).collect();
    assert_eq!(
        &names[..3],
        ["manager", "pool_limit", "pool_release_threshold"]
    );
    for key in [
        "pool_expandable",
        "pool_thread_cache",
        "max_pending_deallocs_count",
        "hostonly_release_threshold",
    ] {
        assert!(names.contains(&key), "{key} missing from {names:?}");
    }
    let limit = keys.iter().find(|k| k.name == "pool_limit").unwrap();
    assert!(limit.runtime && limit.env == "EMM_POOL_LIMIT" && !limit.doc.is_empty());
    assert!(
        !keys
            .iter()
            .find(|k| k.name == "pool_expandable")
            .unwrap()
            .runtime
    );

    // Before the first manager: values are parsed once and reach the config.
    assert_eq!(emm::emm_pool::PoolConfig::from_env().unwrap().limit, None);
    emm::configure("pool_limit", "1M").unwrap();
    emm::configure("pool_thread_cache", "0").unwrap();
    let c = emm::emm_pool::PoolConfig::from_env().unwrap();
    assert_eq!(c.limit, Some(MIB));
    assert_eq!(c.thread_cache_blocks, 0);
    let e = emm::configure("pool_limit", "a lot").unwrap_err();
    assert!(matches!(e, EmmError::InvalidConfig { .. }), "{e}");
    let e = emm::configure("manager", "rmm").unwrap_err();
    assert!(matches!(e, EmmError::UnknownManager { .. }), "{e}");

    // The first manager closes the settings read at creation...
    let m = emm::memory_manager(&f.ctx).unwrap();
    let e = m.memalloc(4 * MIB).unwrap_err();
    assert!(e.to_string().contains("byte limit"), "{e}");
    let e = emm::configure("pool_expandable", "0").unwrap_err();
    assert!(matches!(e, EmmError::ConfiguredTooLate { .. }), "{e}");
    // ...and the run-time ones change while it serves.
    emm::configure("pool_limit", "max").unwrap();
    let blocks: Vec<_> = (0..4).map(|_| m.memalloc(64 * MIB).unwrap()).collect();
    drop(blocks);
    assert!(reserved(m.as_ref()) >= 256 * MIB as u64);
    emm::configure("EMM_POOL_LIMIT", "128M").unwrap();
    assert!(
        reserved(m.as_ref()) <= 128 * MIB as u64,
        "lowering the limit trims"
    );
    let e = m.memalloc(160 * MIB).unwrap_err();
    assert!(matches!(e, EmmError::OutOfMemory { .. }), "{e}");
    emm::configure("pool_limit", "max").unwrap();
    let big = m.memalloc(160 * MIB).unwrap();
    drop(big);
    emm::configure("pool_release_threshold", "32M").unwrap();
    assert!(
        reserved(m.as_ref()) <= 32 * MIB as u64,
        "a threshold set while serving releases"
    );
    let blocks: Vec<_> = (0..4).map(|_| m.memalloc(64 * MIB).unwrap()).collect();
    drop(blocks);
    assert!(
        reserved(m.as_ref()) <= 32 * MIB as u64,
        "frees give back what is above the threshold"
    );
    emm::configure("pool_release_threshold", "max").unwrap();
}
