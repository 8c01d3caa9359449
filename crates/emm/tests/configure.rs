//! `configure` reaches the pool's settings. Its own test binary: configuration is
//! process-wide, and other tests build pools with the defaults.

use emm::EmmError;

#[test]
fn configured_pool_settings_reach_the_pool_config() {
    if std::env::var_os("EMM_POOL_LIMIT").is_some()
        || std::env::var_os("EMM_POOL_EXPANDABLE").is_some()
    {
        eprintln!(
            "EMM_POOL_LIMIT or EMM_POOL_EXPANDABLE is set: the environment wins, nothing to test"
        );
        return;
    }
    assert_eq!(emm::emm_pool::PoolConfig::from_env().unwrap().limit, None);
    emm::configure("pool_limit", "1048576").unwrap();
    emm::configure("pool_expandable", "false").unwrap();
    let c = emm::emm_pool::PoolConfig::from_env().unwrap();
    assert_eq!(c.limit, Some(1 << 20));
    assert!(!c.segments.expandable);
    let e = emm::configure("pool_limit", "a lot").unwrap_err();
    assert!(matches!(e, EmmError::InvalidConfig { .. }), "{e}");
    let e = emm::configure("manager", "rmm").unwrap_err();
    assert!(matches!(e, EmmError::UnknownManager { .. }), "{e}");
}
