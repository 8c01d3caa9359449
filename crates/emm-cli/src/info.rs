//! `emm info`: the driver and its devices.

use std::io;
use std::process::ExitCode;

use emm::driver::{Device, DriverError};

use crate::out::{note, Out};
use crate::units;

pub fn run() -> io::Result<ExitCode> {
    match report() {
        Ok(text) => {
            let mut out = Out::stdout();
            out.bytes(text.as_bytes())?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            note(format_args!("emm: no usable CUDA driver: {e}"));
            note(format_args!("emm {}", env!("CARGO_PKG_VERSION")));
            let mut set: Vec<(String, String)> = std::env::vars_os()
                .filter_map(|(k, v)| {
                    let k = k.into_string().ok()?;
                    k.starts_with("EMM_")
                        .then(|| (k, v.to_string_lossy().into_owned()))
                })
                .collect();
            set.sort();
            if set.is_empty() {
                note("settings: no EMM_* variable is set (defaults apply)");
            } else {
                note("settings in effect:");
                for (k, v) in set {
                    note(format_args!("  {k}={v}"));
                }
            }
            note("hint: set EMM_CUDA_DRIVER to the path of libcuda.so.1 (or of libemm_standin.so, the stand-in");
            note("  driver) when it is not on the loader's path; `emm replay` runs without one, over host memory");
            Ok(ExitCode::from(1))
        }
    }
}

fn report() -> Result<String, DriverError> {
    let drv = emm::driver::driver()?;
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
            "  [{}] {}: {}, compute capability {major}.{minor}, stream-ordered allocator: {}, virtual memory: {}\n",
            dev.ordinal(),
            dev.name()?,
            units::bytes(dev.total_memory()? as u128),
            if dev.supports_memory_pools()? { "yes" } else { "no" },
            if dev.supports_virtual_memory()? { "yes" } else { "no" },
        ));
    }
    Ok(out)
}
