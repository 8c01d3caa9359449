//! Soak (issue 36 item 5): random allocate, free, stream, trim and limit churn
//! from several threads over the stand-in driver, on each manager through the
//! façade; the engine and the invariants checked after every phase are in
//! `common/soak.rs`.
//!
//! Short in CI (`EMM_SOAK_SECS`, default 8 s per manager); a background run sets
//! it long, e.g. `EMM_SOAK_SECS=7200 cargo test --release -p emm --test soak`.
//! The seed is printed; `EMM_SOAK_SEED` replays it.

mod common;

use common::facade::Facade;
use common::managers::{manager, MANAGERS};
use common::soak::{soak, Config, StandInDevice};
use common::{fixture, snapshot};

/// Seconds per manager by default: three managers within CI's minute.
const CI_SECS: u64 = 8;

#[test]
fn soak_every_manager_through_the_facade() {
    let f = fixture();
    let cfg = Config::from_env(CI_SECS);
    for name in MANAGERS {
        let before = snapshot(&f.s);
        let target = Facade::new(manager(name, &f.ctx));
        let mut device = StandInDevice {
            s: &f.s,
            base: before.live.bytes,
        };
        let r = soak(name, &target, &f.ctx, &mut device, cfg);
        f.s.control("capacity 8G").unwrap();
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(r.allocs > 0 && r.frees > 0, "{name}: nothing was churned");
        drop(target);
        f.ctx.synchronize().unwrap();
        let _ = f.ctx.take_deferred_errors();
        assert_eq!(
            snapshot(&f.s),
            before,
            "{name} (seed {}): with the manager gone the stand-in is back where it was",
            cfg.seed
        );
    }
}
