//! Soak on a GPU (issue 36 item 5): the stand-in soak's churn and invariants
//! (`common/soak.rs`) on the real driver, each manager through the façade. The
//! device's used bytes (`cuMemGetInfo`) stand in for the stand-in's exact count,
//! and a limit is a ballast buffer that leaves only a little of the device free,
//! so the managers' out-of-memory paths meet a really exhausted device.
//!
//! `EMM_SOAK_SECS` seconds per manager (default 20: the GPU bundle runs every
//! test); `EMM_SOAK_MANAGERS=pool,default` picks managers. A long run:
//! `EMM_SOAK_SECS=600 ./bin/emm__soak_gpu --include-ignored --nocapture`.

mod common;

use common::facade::Facade;
use common::managers::{manager, MANAGERS};
use common::soak::{soak, Config, Device, GpuDevice};

use emm::Context;

const DEFAULT_SECS: u64 = 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn soak_every_manager_on_the_gpu() {
    let ctx = Context::on_device(0).expect("device 0");
    let cfg = Config::from_env(DEFAULT_SECS);
    let chosen = std::env::var("EMM_SOAK_MANAGERS").unwrap_or_default();
    let names: Vec<&str> = MANAGERS
        .into_iter()
        .filter(|n| chosen.is_empty() || chosen.split(',').any(|c| c.trim() == *n))
        .collect();
    assert!(
        !names.is_empty(),
        "EMM_SOAK_MANAGERS={chosen:?} names no manager of {MANAGERS:?}"
    );
    for name in names {
        ctx.synchronize().unwrap();
        let mut device = GpuDevice::new(&ctx);
        let target = Facade::new(manager(name, &ctx));
        let r = soak(name, &target, &ctx, &mut device, cfg);
        device.ballast = None;
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(r.allocs > 0 && r.frees > 0, "{name}: nothing was churned");
        // The ballast really exhausted the device now and then (limits counts
        // only phases whose ballast the device took: under compute-sanitizer a
        // ballast of nearly all free memory can be refused, and such a phase
        // runs unlimited).
        assert!(
            r.limits < 5 || r.refused > 0,
            "{name}: {} limits and not one refusal: {r:?}",
            r.limits
        );
        drop(target);
        ctx.synchronize().unwrap();
        let held = device.held();
        println!("{name}: with the manager gone the device holds {held} bytes more than before");
        assert!(
            held <= 64 << 20,
            "{name} (seed {}): with the manager gone the device still holds {held} bytes more than before",
            cfg.seed
        );
    }
}
