//! Fragmentation on the bundled trace and on synthetic traces of other workloads,
//! through the pool over the host stand-in: deterministic, so a regression fails here.

use emm_pool::{PoolConfig, PoolManager};
use emm_trace::{replay, scan, synth, ReplayOptions, Trace};

#[test]
fn peak_reserved_stays_within_ten_percent_of_peak_live() {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../emm-cli/traces/gpt_train.csv");
    let traces = vec![
        Trace::open(&root, None).unwrap().remove(0),
        synth::inference(7, 100),
        synth::inference(11, 100),
        synth::conv_training(3, 20),
    ];
    for t in traces {
        let summary = scan(&t).unwrap();
        let pool = PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
        let opts = ReplayOptions {
            total_events: summary.events,
            samples: 100,
        };
        let r = replay(
            &t,
            &pool,
            &mut |_| emm_core::SYNC_STREAM,
            &opts,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(r.failures, 0);
        assert_eq!(r.peak_live_bytes, summary.peak_live_bytes);
        let ratio = r.peak_reserved_bytes as f64 / r.peak_live_bytes as f64;
        assert!(
            ratio <= 1.10,
            "{}: peak reserved / peak live = {ratio:.3}",
            t.name()
        );
        assert!(
            r.upstream_allocs < summary.requests / 20,
            "{}: {} upstream calls",
            t.name(),
            r.upstream_allocs
        );
        assert!(
            (100..=110).contains(&r.samples.len()),
            "{}",
            r.samples.len()
        );
        let last = r.samples.last().unwrap();
        assert_eq!(last.event, summary.events);
        assert!(r
            .samples
            .iter()
            .all(|s| s.live_bytes <= summary.peak_live_bytes));
    }
}
