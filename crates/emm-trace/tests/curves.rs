//! What `emm replay --html` draws from a replay: the curves (reserved never below
//! live), the map of each manager's memory at its peak, and what a snapshot
//! tells beside its events (times, stacks, PyTorch's reserved bytes).

use emm_core::{MemoryManager, SYNC_STREAM};
use emm_default::{DefaultManager, HostUpstream, PendingConfig};
use emm_pool::{PoolConfig, PoolManager};
use emm_trace::torch_model::{TorchConf, TorchModel};
use emm_trace::{replay, scan, ReplayOptions, ReplayResult, ReplayTarget, Trace};

mod common;
use common::{bundled, data};

fn run<T: ReplayTarget + ?Sized>(t: &Trace, target: &T, passes: u32, map: bool) -> ReplayResult {
    let summary = scan(t).unwrap();
    let options = ReplayOptions {
        total_events: summary.events,
        samples: 600,
        passes,
        until_steady: None,
        peak_map: map,
        clock: None,
    };
    let r = replay(t, target, &mut |_| SYNC_STREAM, &options, &mut |_| {}).unwrap();
    assert_eq!(r.failures, 0, "{}: {:?}", t.name(), r.first_failure);
    r
}

/// Every drawn point has reserved at or above live, for every manager, over
/// many passes. The default manager gives memory back (its queue of frees
/// flushes): with reserved read only at each bucket's end and live taken as the
/// bucket's most, its reserved curve was drawn below live with `--passes 20`.
#[test]
fn reserved_is_never_drawn_below_live() {
    let t = bundled("gpt_train.csv");
    let default = DefaultManager::over(HostUpstream::new(1 << 40, false), PendingConfig::default());
    let pool = PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
    let torch = TorchModel::new(TorchConf::default());
    let mut checked = 0;
    for (name, r) in [
        ("default", run(&t, &default, 20, false)),
        ("pool", run(&t, &pool as &dyn MemoryManager, 20, false)),
        ("pytorch-native", run(&t, &torch, 20, false)),
    ] {
        assert!(r.samples.len() > 500, "{name}: {}", r.samples.len());
        for s in &r.samples {
            assert!(
                u128::from(s.reserved_bytes) >= s.live_bytes,
                "{name}: at event {}: reserved {} below live {}",
                s.event,
                s.reserved_bytes,
                s.live_bytes
            );
            checked += 1;
        }
        // The curve reaches the manager's peak: the bucket where it rose has it.
        let most = r.samples.iter().map(|s| s.reserved_bytes).max().unwrap();
        assert_eq!(most, r.peak_reserved_bytes, "{name}");
    }
    assert!(checked > 1500);
}

/// The map at the peak: the pool's and the model's segments sum to their
/// reserved bytes then, the blocks tile each segment, and every live allocation
/// lies in a block of its own size or more; the default manager keeps no
/// segments, and its map has the live allocations alone. Taking the map does not
/// change the replay's figures.
#[test]
fn the_map_at_the_peak_places_every_live_allocation() {
    let t = bundled("gpt_train.csv");
    let pool = || PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
    let plain = run(&t, &pool() as &dyn MemoryManager, 3, false);
    assert!(plain.peak_map.is_none());
    let mapped = run(&t, &pool() as &dyn MemoryManager, 3, true);
    assert_eq!(plain.peak_reserved_bytes, mapped.peak_reserved_bytes);
    assert_eq!(plain.samples, mapped.samples);
    let torch = run(&t, &TorchModel::new(TorchConf::default()), 3, true);
    for (name, r) in [("pool", &mapped), ("pytorch-native", &torch)] {
        let m = r.peak_map.as_ref().unwrap();
        assert_eq!(m.reserved_bytes, r.peak_reserved_bytes, "{name}");
        let segs = m.segments.as_ref().unwrap();
        let total: usize = segs.iter().map(|s| s.total_size).sum();
        assert_eq!(total as u64, m.reserved_bytes, "{name}");
        let mut blocks = std::collections::HashMap::new();
        for s in segs {
            let mut at = s.address;
            for b in &s.blocks {
                assert_eq!(b.address, at, "{name}: blocks tile the segment");
                at += b.size as u64;
                blocks.insert(b.address, (b.size, b.allocated));
            }
            assert_eq!(at, s.address + s.total_size as u64, "{name}");
        }
        let live: u128 = m.live.iter().map(|l| u128::from(l.size)).sum();
        assert_eq!(live, m.live_bytes, "{name}");
        assert!(!m.live.is_empty());
        for l in &m.live {
            let (size, allocated) = blocks[&l.address.unwrap()];
            assert!(allocated && size as u64 >= l.size, "{name}: {l:?}");
        }
        assert!(m.event > 0 && m.event <= 3 * scan(&t).unwrap().events);
    }
    let default = DefaultManager::over(HostUpstream::new(1 << 40, false), PendingConfig::default());
    let r = run(&t, &default, 1, true);
    let m = r.peak_map.unwrap();
    assert!(m.segments.is_none());
    assert!(u128::from(m.reserved_bytes) >= m.live_bytes);
    assert!(m.live.iter().all(|l| l.address.is_some()));
}

/// A snapshot's events keep their times and their allocations' stacks (kept
/// once each), and PyTorch's reserved bytes along the trace end at the dump and
/// reach the peak the snapshot implies.
#[test]
fn a_snapshot_keeps_times_stacks_and_pytorchs_reserved_bytes() {
    let p = data("emm-trace/tests/fixtures/h200_infer.pickle");
    let t = Trace::open(&p, None).unwrap().remove(0);
    let d = t.details().unwrap();
    let events = scan(&t).unwrap().events;
    assert!(d.has_times());
    let times: Vec<u64> = (0..events).map(|e| d.time_us(e).unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(
        times[times.len() - 1] - times[0] > 100_000,
        "a recording of more than 0.1 s"
    );
    let ops: Vec<_> = t.events().unwrap().collect();
    let allocs = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, emm_trace::Op::Alloc { .. }));
    let with_stack = allocs
        .clone()
        .filter(|(k, _)| d.stack_of(*k as u64).is_some())
        .count();
    // 51 allocations are reconstructed from before the recording, without one.
    assert_eq!(allocs.count() - with_stack, 51);
    assert!(d.stack_count() > 10 && d.stack_count() < with_stack / 4);
    let some = (0..events).find_map(|e| d.stack_of(e)).unwrap();
    assert!(d.stack(some).any(|f| f.filename.ends_with(".py")));
    let f = t.torch_figures().unwrap();
    let reserved = d.torch_reserved();
    assert_eq!(reserved.len() as u64, f.segment_events + 1);
    assert_eq!(reserved.last().unwrap().bytes, f.reserved_at_dump);
    assert_eq!(
        reserved.iter().map(|r| r.bytes).max(),
        Some(f.peak_reserved_bytes)
    );
    assert!(reserved.windows(2).all(|w| w[0].event <= w[1].event));
    // A CSV trace tells none of this.
    assert!(bundled("gpt_train.csv").details().is_none());
}
