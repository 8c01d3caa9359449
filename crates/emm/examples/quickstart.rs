//! emm in a few lines: choose the manager, allocate device memory through it, copy
//! data there and back, read the manager's figures, give its cache back.
//!
//! ```sh
//! cargo run -p emm --example quickstart            # on a GPU
//! cargo build -p emm-standin                       # no GPU: the host stand-in driver
//! EMM_CUDA_DRIVER=target/debug/libemm_standin.so cargo run -p emm --example quickstart
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    // The built-in managers (`default`, `pool`, `hostonly`); `pool` unless
    // EMM_MEMORY_MANAGER or set_memory_manager names another.
    emm::register_builtin_managers();
    let ctx = match emm::Context::on_device(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!(
                "quickstart: {e}\n  without a GPU, run it over the host stand-in driver:\n  \
                 cargo build -p emm-standin && EMM_CUDA_DRIVER=target/debug/libemm_standin.so \
                 cargo run -p emm --example quickstart"
            );
            return ExitCode::FAILURE;
        }
    };
    match run(&ctx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(ctx: &emm::Context) -> Result<(), Box<dyn std::error::Error>> {
    let stream = emm::Stream::new(ctx)?;
    let manager = emm::memory_manager(ctx)?; // one per device, shared in the process
    println!("manager: {}", manager.name());

    // 1 MiB, ordered on `stream`: freed on that stream when dropped.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let block = manager.memalloc_async(data.len(), stream.raw())?;
    // SAFETY: `block` holds `data.len()` bytes of device memory of `ctx`; the copies
    // are synchronous, so nothing else uses the block meanwhile.
    unsafe { emm::driver::memory::copy_htod(ctx, block.ptr(), &data)? };
    let mut back = vec![0u8; data.len()];
    // SAFETY: as above; `back` holds exactly the block's size.
    unsafe { emm::driver::memory::copy_dtoh(ctx, &mut back, block.ptr())? };
    assert_eq!(
        back, data,
        "the device returned other bytes than it was given"
    );
    println!("copied {} bytes to the device and back: equal", data.len());

    let stats = manager.stats();
    println!(
        "allocated {} bytes, reserved {} bytes (the pool keeps freed blocks for reuse)",
        stats.allocated_bytes, stats.reserved_bytes
    );
    drop(block);
    stream.synchronize()?;
    let released = manager.release_cached()?;
    println!("gave {released} cached bytes back to the device");
    Ok(())
}
