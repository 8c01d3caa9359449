//! Routing on a GPU: the variable selects the manager, which then serves the context.

#[test]
#[ignore = "needs a CUDA GPU"]
fn emm_memory_manager_selects_a_builtin_and_it_serves_allocations() {
    // This test binary holds only this test, so the environment is ours.
    std::env::set_var("EMM_MEMORY_MANAGER", "pool");
    emm::register_builtin_managers();
    // set_memory_manager names another: the variable still wins (with a warning).
    emm::set_memory_manager("default").unwrap();
    let ctx = emm::Context::on_device(0).unwrap();
    let m = emm::memory_manager(&ctx).unwrap();
    assert_eq!(m.name(), "pool");
    let a = emm::Router::global()
        .alloc(&ctx, 1 << 20, emm::core::SYNC_STREAM)
        .unwrap();
    let data = vec![9u8; 1 << 20];
    // SAFETY: 1 MiB.
    unsafe { emm::driver::memory::copy_htod(&ctx, a.ptr(), &data) }.unwrap();
    let mut back = vec![0u8; 1 << 20];
    // SAFETY: 1 MiB.
    unsafe { emm::driver::memory::copy_dtoh(&ctx, &mut back, a.ptr()) }.unwrap();
    assert_eq!(back, data);
    // After use, switching is a typed error.
    let e = emm::set_memory_manager("hostonly").unwrap_err();
    assert!(matches!(e, emm::EmmError::AlreadyInUse { .. }), "{e}");
    // The process-wide manager lives until exit: give its cache back so that the
    // sanitizer's leak check sees nothing left (it counts cached segments).
    drop(a);
    assert!(m.release_cached().unwrap() > 0);
}
