//! Tries segment policies on a trace over the host stand-in:
//! `cargo run --release -p emm-trace --example tune -- crates/emm-cli/traces/gpt_train.csv`
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};
use emm_trace::{replay, scan, ReplayOptions, Trace};

fn main() {
    let mut traces: Vec<Trace> = std::env::args()
        .skip(1)
        .flat_map(|p| Trace::open(std::path::Path::new(&p), None).expect("trace"))
        .collect();
    traces.push(emm_trace::synth::inference(7, 200));
    traces.push(emm_trace::synth::inference(11, 200));
    traces.push(emm_trace::synth::conv_training(3, 30));
    for t in traces {
        let path = t.name().to_owned();
        let live = scan(&t).expect("scan").peak_live_bytes as f64;
        for (expandable, step) in [
            (false, 0usize),
            (true, 2usize << 20),
            (true, 8 << 20),
            (true, 20 << 20),
            (true, 64 << 20),
        ] {
            let segments = SegmentPolicy {
                expandable,
                expand_step: step.max(2 << 20),
                ..SegmentPolicy::default()
            };
            let p = PoolManager::host(
                1 << 40,
                PoolConfig {
                    segments,
                    ..PoolConfig::default()
                },
            )
            .unwrap();
            let r = replay(
                &t,
                &p,
                &mut |_| emm_core::SYNC_STREAM,
                &ReplayOptions::default(),
                &mut |_| {},
            )
            .expect("replay");
            println!(
                "{path}: expandable {expandable} step {:>3} MiB: reserved/live {:.3}, upstream {}, {:.2} ms",
                step >> 20,
                r.peak_reserved_bytes as f64 / live,
                r.upstream_allocs,
                r.elapsed.as_secs_f64() * 1e3
            );
        }
    }
}
