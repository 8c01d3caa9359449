//! Thread caches over the host stand-in: blocks one thread freed and cached are
//! taken back before the pool grows for another thread on the same stream, so a
//! program whose frees happen on one thread and allocations on another (PyTorch's
//! autograd thread and its main thread) does not reserve that memory twice.

use std::sync::mpsc;
use std::thread;

use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;

const S: CUstream = emm_core::SYNC_STREAM;
const MIB: usize = 1 << 20;

/// The defaults with caches that keep blocks of any size: these tests are about
/// what a cache holds and who takes it back, with large blocks among them (the
/// default keeps blocks of at most 1 MiB; `growth_step.rs` tests that).
fn caching() -> PoolConfig {
    PoolConfig {
        thread_cache_largest: usize::MAX,
        ..PoolConfig::default()
    }
}

/// Runs `work` on a thread that stays alive (its caches with it) until the
/// returned sender is dropped.
fn parked_thread(
    work: impl FnOnce() + Send + 'static,
) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        work();
        done_tx.send(()).unwrap();
        let _ = release_rx.recv(); // parked: its thread-local caches stay
    });
    done_rx.recv().unwrap();
    (release_tx, handle)
}

#[test]
fn another_threads_cached_blocks_serve_a_request_before_the_pool_grows() {
    for size in [8 * MIB, 512 * 1024] {
        let pool = std::sync::Arc::new(PoolManager::host(1 << 36, caching()).unwrap());
        let p = pool.clone();
        // Thread A allocates eight blocks and frees them: they sit in its cache.
        let (release, a) = parked_thread(move || {
            let blocks: Vec<_> = (0..8).map(|_| p.alloc(size, S).unwrap()).collect();
            drop(blocks);
        });
        let before = pool.stats();
        assert_eq!(
            before.thread_cached_bytes,
            8 * size,
            "A's cache holds its blocks"
        );
        // The main thread asks for the same memory: A's cache gives it back.
        let held: Vec<_> = (0..8).map(|_| pool.alloc(size, S).unwrap()).collect();
        let after = pool.stats();
        assert_eq!(
            after.reserved_bytes, before.reserved_bytes,
            "size {size}: the pool grew instead of taking back the cached blocks"
        );
        assert_eq!(after.thread_cached_bytes, 0);
        assert_eq!(after.allocated_bytes, 8 * size);
        drop(held);
        drop(release);
        a.join().unwrap();
    }
}

#[test]
fn a_threads_own_cache_serves_its_next_request_of_the_same_size_without_the_arena() {
    let pool = PoolManager::host(1 << 36, caching()).unwrap();
    // More distinct sizes than the old scan-based cache held (8): every one is
    // served from the cache on the second pass.
    let sizes: Vec<usize> = (1..=40).map(|i| i * 64 * 1024).collect();
    let first: Vec<_> = sizes.iter().map(|&n| pool.alloc(n, S).unwrap()).collect();
    drop(first);
    let locked = pool.stats().counts.locked_allocs;
    let again: Vec<_> = sizes.iter().map(|&n| pool.alloc(n, S).unwrap()).collect();
    assert_eq!(
        pool.stats().counts.locked_allocs,
        locked,
        "a request of a cached size took the locked path"
    );
    drop(again);
}

#[test]
fn out_of_memory_takes_back_every_threads_cached_blocks_of_any_stream() {
    // A 64 MiB pool: thread A leaves 48 MiB cached on its own stream; the main
    // thread then asks for 48 MiB on another stream, which fits only once A's
    // blocks are back.
    // One shared pool: with stream pools (the default) A's blocks would be in
    // the other stream's pool, which the family's out-of-memory path trims,
    // not the arena's ladder this tests.
    let config = PoolConfig {
        limit: Some(64 * MIB),
        stream_pools: 0,
        ..caching()
    };
    let pool = std::sync::Arc::new(PoolManager::host(1 << 36, config).unwrap());
    let p = pool.clone();
    let other = CUstream(0x7000_0000 as *mut std::ffi::c_void);
    let (release, a) = parked_thread(move || {
        let blocks: Vec<_> = (0..6).map(|_| p.alloc(8 * MIB, other).unwrap()).collect();
        drop(blocks);
    });
    assert_eq!(pool.stats().thread_cached_bytes, 48 * MIB);
    let held = pool
        .alloc(48 * MIB, S)
        .expect("A's cached blocks should have gone back before out of memory");
    assert_eq!(pool.stats().thread_cached_bytes, 0);
    assert!(pool.stats().reserved_bytes <= 64 * MIB);
    drop(held);
    drop(release);
    a.join().unwrap();
}

#[test]
fn trim_gives_back_the_blocks_other_threads_cached() {
    let pool = std::sync::Arc::new(PoolManager::host(1 << 36, caching()).unwrap());
    let p = pool.clone();
    let (release, a) = parked_thread(move || {
        let blocks: Vec<_> = (0..4).map(|_| p.alloc(8 * MIB, S).unwrap()).collect();
        drop(blocks);
    });
    assert_eq!(pool.stats().thread_cached_bytes, 32 * MIB);
    pool.trim();
    let after = pool.stats();
    assert_eq!(after.thread_cached_bytes, 0);
    assert_eq!(
        after.reserved_bytes, 0,
        "every segment went back: {after:?}"
    );
    drop(release);
    a.join().unwrap();
}

/// A thread that stays alive (its caches with it) and runs each job sent to it,
/// answering when done.
struct Worker {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    done: mpsc::Receiver<()>,
    handle: thread::JoinHandle<()>,
}

impl Worker {
    fn new() -> Self {
        let (jobs, job_rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (done_tx, done) = mpsc::channel();
        let handle = thread::spawn(move || {
            for job in job_rx {
                job();
                done_tx.send(()).unwrap();
            }
        });
        Worker { jobs, done, handle }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.send(Box::new(job)).unwrap();
        self.done.recv().unwrap();
    }

    fn stop(self) {
        drop(self.jobs);
        self.handle.join().unwrap();
    }
}

#[test]
fn a_miss_on_one_stream_claims_only_the_threads_caching_blocks_of_it() {
    let size = 8 * MIB;
    let other = CUstream(0x7000_0000 as *mut std::ffi::c_void);
    // One shared pool: with stream pools (the default) the other stream's
    // blocks would be cached for a pool of their own, and no thread of this
    // pool could be claimed for them.
    let config = PoolConfig {
        stream_pools: 0,
        ..caching()
    };
    let pool = std::sync::Arc::new(PoolManager::host(1 << 36, config).unwrap());
    let cache = |stream: CUstream| {
        let p = pool.clone();
        move || {
            let blocks: Vec<_> = (0..4).map(|_| p.alloc(size, stream).unwrap()).collect();
            drop(blocks);
        }
    };
    let reclaims = || pool.stats().counts.cache_reclaims;
    // Thread A caches blocks of the other stream only.
    let a = Worker::new();
    a.run(cache(other));
    assert_eq!(pool.stats().thread_cached_bytes, 4 * size);
    // The main thread misses on S: A holds no block of S, so it is not claimed
    // (a claim costs every thread a process-wide barrier) and keeps its blocks.
    let start = reclaims();
    let first = pool.alloc(size, S).unwrap();
    assert_eq!(
        reclaims(),
        start,
        "a thread caching only another stream's blocks was claimed"
    );
    assert_eq!(
        pool.stats().thread_cached_bytes,
        4 * size,
        "A's blocks left its cache"
    );
    // Thread B caches blocks of S: the main thread's misses on S claim B once
    // (its mask is exact once its cache was taken) and reuse its blocks instead
    // of growing; A is left alone.
    let b = Worker::new();
    b.run(cache(S));
    let (before, reserved) = (reclaims(), pool.stats().reserved_bytes);
    let held: Vec<_> = (0..4).map(|_| pool.alloc(size, S).unwrap()).collect();
    let after = pool.stats();
    assert_eq!(
        after.counts.cache_reclaims,
        before + 1,
        "B claimed other than once"
    );
    assert_eq!(
        after.reserved_bytes, reserved,
        "the pool grew instead of taking back B's cached blocks"
    );
    assert_eq!(
        after.thread_cached_bytes,
        4 * size,
        "A's blocks left its cache"
    );
    // B caches blocks of the other stream too; once a claim took its blocks of
    // S, a miss on S (a request no free block serves) leaves it alone.
    b.run(cache(other));
    b.run(cache(S));
    let big = pool.alloc(size, S).unwrap(); // claims B and takes its S blocks
    let before = reclaims();
    let huge = pool.alloc(64 * size, S).unwrap();
    assert_eq!(
        reclaims(),
        before,
        "B was claimed again for a stream whose blocks were taken from it"
    );
    drop((big, huge));
    // B caches blocks of S again after its mask was made exact: the next misses
    // on S claim it again.
    drop(held);
    pool.trim(); // the main thread's cached blocks go back: B's next requests grow
    assert_eq!(pool.stats().thread_cached_bytes, 0);
    a.run(cache(other));
    b.run(cache(S));
    let before = reclaims();
    let held: Vec<_> = (0..4).map(|_| pool.alloc(size, S).unwrap()).collect();
    assert_eq!(
        reclaims(),
        before + 1,
        "B's blocks cached after a claim were not seen"
    );
    assert_eq!(
        pool.stats().thread_cached_bytes,
        4 * size,
        "A's blocks left its cache"
    );
    // Out of memory or a trim still takes every thread's blocks, of any stream.
    drop((held, first));
    pool.trim();
    assert_eq!(
        pool.stats().thread_cached_bytes,
        0,
        "the trim left cached blocks"
    );
    a.stop();
    b.stop();
}

/// A small request that finds no free small block while the thread's cache
/// holds `cached` small blocks of 512 KiB: returns how many of the cached
/// blocks' next allocations the cache served, with `keep` as
/// `PoolConfig::thread_cache_keep`, and the bytes reserved before and after.
fn small_miss_beside_a_cache(keep: usize, cached: usize) -> (u64, usize, usize) {
    let config = PoolConfig {
        thread_cache_keep: keep,
        ..PoolConfig::default()
    };
    small_miss_in(config, cached, false)
}

/// As [`small_miss_beside_a_cache`] with `config`; with `two_streams`, the
/// per-thread default stream allocates from the same arena just before the
/// miss.
fn small_miss_in(config: PoolConfig, cached: usize, two_streams: bool) -> (u64, usize, usize) {
    let pool = PoolManager::host(1 << 36, config).unwrap();
    let half = 512 * 1024;
    // A small segment filled with small blocks (made before the expandable
    // segment holds anything free, so they take a small segment of their own).
    let mut small: Vec<_> = (0..4).map(|_| pool.alloc(half, S).unwrap()).collect();
    // Free memory in the expandable segment: a large block made and freed (it
    // waits in the thread's slot until the next call, then joins the arena).
    drop(pool.alloc(16 * MIB, S).unwrap());
    // `cached` of the small blocks into this thread's cache.
    for _ in 0..cached {
        drop(small.pop());
    }
    assert_eq!(pool.stats().thread_cached_bytes, cached * half);
    // The other stream's block, held (it takes the expandable segment's free
    // memory, the small segment being full).
    let other = two_streams.then(|| pool.alloc(4096, emm_sys::CU_STREAM_PER_THREAD).unwrap());
    let reserved = pool.stats().reserved_bytes;
    // A size the cache lacks, with no free small block for it in the arena.
    let odd = pool.alloc(768 * 1024, S).unwrap();
    let hits = pool.stats().thread_cache_hits;
    let again: Vec<_> = (0..cached).map(|_| pool.alloc(half, S).unwrap()).collect();
    let served = pool.stats().thread_cache_hits - hits;
    let after = pool.stats().reserved_bytes;
    drop((odd, again, small, other));
    (served, reserved, after)
}

#[test]
fn a_small_miss_keeps_a_cache_holding_little_and_takes_the_expandable_segments_free_memory() {
    // Holding 512 KiB, below the default 1 MiB: the request took the
    // expandable segment's free memory, and the cached block served its size
    // next, without the arena.
    let (served, before, after) = small_miss_beside_a_cache(emm_pool::DEFAULT_THREAD_CACHE_KEEP, 1);
    assert_eq!(
        served, 1,
        "the cached block went back to the arena at the miss"
    );
    assert_eq!(
        after, before,
        "the miss grew the pool instead of taking free memory"
    );
    // With the setting at 0, the cache goes back to the arena at the miss, as
    // before: the block's size is served by the arena next.
    let (served, before, after) = small_miss_beside_a_cache(0, 1);
    assert_eq!(
        served, 0,
        "the cache was kept with pool_thread_cache_keep = 0"
    );
    assert_eq!(after, before);
    // Holding 1 MiB (two blocks), not below the default: it goes back first.
    let (served, before, after) = small_miss_beside_a_cache(emm_pool::DEFAULT_THREAD_CACHE_KEEP, 2);
    assert_eq!(served, 0, "a cache of 1 MiB was kept at a miss");
    assert_eq!(after, before);
}

#[test]
fn where_streams_share_the_arena_a_small_miss_still_gives_the_cache_back() {
    // Stream pools off: every stream shares the pool's arena.
    let shared = PoolConfig {
        stream_pools: 0,
        ..PoolConfig::default()
    };
    let (served, _, _) = small_miss_in(shared, 1, false);
    assert_eq!(served, 0, "the cache was kept with stream pools off");
    // An arena that has served another stream (the per-thread default stream,
    // which never gets a pool of its own).
    let (served, before, after) = small_miss_in(PoolConfig::default(), 1, true);
    assert_eq!(served, 0, "the cache was kept in an arena of two streams");
    assert_eq!(after, before);
    // The control: the same without the other stream keeps it.
    let (served, _, _) = small_miss_in(PoolConfig::default(), 1, false);
    assert_eq!(served, 1);
}

#[test]
fn a_small_miss_takes_back_another_threads_blocks_of_the_stream_before_keeping_its_own_cache() {
    let pool = std::sync::Arc::new(PoolManager::host(1 << 36, PoolConfig::default()).unwrap());
    let half = 512 * 1024;
    // This thread fills a small segment, and the expandable segment gets free
    // memory (as in `small_miss_in`).
    let mut small: Vec<_> = (0..4).map(|_| pool.alloc(half, S).unwrap()).collect();
    drop(pool.alloc(16 * MIB, S).unwrap());
    // Another thread caches a block of the same stream (as PyTorch's autograd
    // thread caches what the backward pass frees).
    let p = pool.clone();
    let (release, other) = parked_thread(move || drop(p.alloc(half, S).unwrap()));
    // This thread caches one block: less than the default 1 MiB.
    drop(small.pop());
    assert_eq!(pool.stats().thread_cached_bytes, 2 * half);
    let reclaims = pool.stats().counts.cache_reclaims;
    let odd = pool.alloc(768 * 1024, S).unwrap();
    assert_eq!(
        pool.stats().counts.cache_reclaims,
        reclaims + 1,
        "the other thread's cached block of the stream was not taken back first"
    );
    drop((odd, small));
    drop(release);
    other.join().unwrap();
}
