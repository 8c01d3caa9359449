//! Tries segment policies on a trace over the host stand-in:
//! `cargo run --release -p emm-pool --example tune -- traces/gpt_train.csv`
use emm_pool::replay::{replay, Target, Trace};
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};

fn main() {
    let mut traces: Vec<Trace> = std::env::args()
        .skip(1)
        .map(|p| Trace::read(std::path::Path::new(&p)).expect("trace"))
        .collect();
    traces.push(emm_pool::synth::inference(7, 200));
    traces.push(emm_pool::synth::inference(11, 200));
    traces.push(emm_pool::synth::conv_training(3, 30));
    for t in traces {
        let path = t.name.clone();
        let live = t.peak_live_bytes() as f64;
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
            let probe = || {
                let s = p.stats();
                (s.reserved_bytes_peak, s.num_device_alloc)
            };
            let r = replay(
                &t,
                &Target {
                    manager: &p,
                    probe: &probe,
                    sample: None,
                },
                &|_| emm_core::SYNC_STREAM,
                &mut |_| {},
            );
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
