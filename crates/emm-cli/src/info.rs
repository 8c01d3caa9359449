//! `emm info`: the driver and its devices.

use std::process::ExitCode;

use emm_driver::{Device, DriverError};

pub fn run() -> ExitCode {
    match report() {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("emm: no usable CUDA driver: {e}");
            ExitCode::from(1)
        }
    }
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn report() -> Result<String, DriverError> {
    let drv = emm_driver::driver()?;
    let version = drv.version().unwrap_or(0);
    let mut out = format!(
        "driver: {} (CUDA {}.{}), loaded from {}\n",
        version,
        version / 1000,
        (version % 1000) / 10,
        drv.path()
    );
    if drv.is_stand_in() {
        out.push_str(
            "driver is the emm-standin test driver (host memory, fault injection), not CUDA\n",
        );
    }
    let missing = drv.missing_optional();
    if !missing.is_empty() {
        out.push_str(&format!("driver lacks: {}\n", missing.join(", ")));
    }
    let devices = Device::all()?;
    out.push_str(&format!("devices: {}\n", devices.len()));
    for dev in devices {
        let (major, minor) = dev.compute_capability()?;
        out.push_str(&format!(
            "  [{}] {}: {:.1} GiB, compute capability {major}.{minor}, stream-ordered allocator: {}, virtual memory: {}\n",
            dev.ordinal(),
            dev.name()?,
            gib(dev.total_memory()?),
            if dev.supports_memory_pools()? { "yes" } else { "no" },
            if dev.supports_virtual_memory()? { "yes" } else { "no" },
        ));
    }
    Ok(out)
}
