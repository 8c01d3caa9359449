//! Without a usable driver every entry point returns a typed error; nothing panics.
//! Runs everywhere (CI included): it points the loader at a path that does not exist.

#[test]
fn a_missing_driver_is_a_typed_error_naming_the_path() {
    // This test binary holds only this test, so the process-wide driver is first
    // loaded here, after the variable is set.
    std::env::set_var(
        emm_sys::DRIVER_PATH_ENV,
        "/nonexistent/emm-test/libcuda.so.1",
    );
    let err = emm_driver::Device::count().unwrap_err();
    assert!(
        matches!(
            err,
            emm_driver::DriverError::Load(emm_sys::LoadError::NotFound { .. })
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/emm-test/libcuda.so.1"), "{msg}");
    // Every later call gives the same error, still without panicking.
    assert!(emm_driver::Context::on_device(0).is_err());
    assert!(emm_driver::Device::get(0).is_err());
}
