//! Old mappings of moved pieces unmapped on a helper thread.
//!
//! When growth moves pieces of the expandable segment (`arena/growth.rs`), their
//! old addresses stay mapped until the work queued on them is done, and were
//! unmapped by the next growth, on the thread that allocates: about 20-30 us a
//! mapping on an H100 (`python/gpu/benchmarks/vmm_moves.cu`), a fifth of what a
//! growth that moves costs. An [`Unmapper`] takes those unmaps off the allocating
//! thread: a growth hands it an [`UnmapJob`] (the old mappings, and the event
//! after which they may go), its thread waits for the event and unmaps them, and
//! the arena, under its lock as before, later turns the ranges into gaps
//! (`arena/retire.rs`). A helper thread's driver calls did not slow a thread
//! launching kernels (run 218).
//!
//! The arena stays the owner of every job: a job still queued when the arena
//! needs its ranges now (too many waiting, a trim, a pause, a reset) is claimed
//! back and done on the arena's thread, and one the helper has started is
//! waited for. The helper never takes the arena's lock, so that wait cannot
//! deadlock. A job the helper could not do (its event's wait failed) goes back
//! to the arena whole; a mapping the driver refused to unmap stays mapped and
//! the arena tries it again, as before.
//!
//! A growth's mapping and the helper's unmapping take turns ([`Unmapper::quiet`]):
//! the driver runs these calls one at a time whichever thread makes them (run
//! 221), so an unmap slipped in between a growth's maps would lengthen the
//! growth on the allocating thread by its own cost. The helper waits until the
//! growth's maps are done, and lets a growth that waits for the turn go first
//! (a mutex alone is not fair: the helper, taking it again for each mapping,
//! kept a waiting growth behind dozens of unmaps), so a growth waits for about
//! one unmap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use emm_sys::CUdeviceptr;

use crate::events::{EventId, EventSource};
use crate::vmm::VirtualMemory;

/// Where an [`UnmapJob`] stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum JobState {
    /// Waiting for the helper.
    Queued,
    /// The helper is waiting for its event or unmapping.
    Running,
    /// The helper is done: for each mapping, whether it was unmapped.
    Done(Vec<bool>),
    /// The helper did not finish it (its event's wait failed, or a call into the
    /// virtual memory or the events panicked): the arena does the whole job.
    Returned,
    /// The arena took the job back before the helper started it.
    Claimed,
}

/// What the arena finds when it looks at a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Still queued or running.
    Pending,
    /// Done by the helper: for each mapping, whether it was unmapped.
    Done(Vec<bool>),
    /// Not done by the helper: the arena does it (the whole job).
    Yours,
}

/// Old mappings that may be unmapped once `event` completes (at once without).
#[derive(Debug)]
pub(crate) struct UnmapJob {
    maps: Vec<(CUdeviceptr, usize)>,
    event: Option<EventId>,
    state: Mutex<JobState>,
    changed: Condvar,
}

impl UnmapJob {
    /// A job for `maps`, to be unmapped after `event` (recorded on the stream
    /// that used them; `None`: their work is already done).
    pub fn new(maps: Vec<(CUdeviceptr, usize)>, event: Option<EventId>) -> Arc<UnmapJob> {
        Arc::new(UnmapJob {
            maps,
            event,
            state: Mutex::new(JobState::Queued),
            changed: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, JobState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, to: JobState) {
        *self.state() = to;
        self.changed.notify_all();
    }

    /// Where the job stands, without waiting.
    pub fn poll(&self) -> Outcome {
        match &*self.state() {
            JobState::Queued | JobState::Running => Outcome::Pending,
            JobState::Done(r) => Outcome::Done(r.clone()),
            JobState::Returned | JobState::Claimed => Outcome::Yours,
        }
    }

    /// The outcome now: a queued job is claimed back (the helper will skip it)
    /// and one the helper started is waited for.
    pub fn settle(&self) -> Outcome {
        let mut st = self.state();
        loop {
            match &*st {
                JobState::Queued => {
                    *st = JobState::Claimed;
                    return Outcome::Yours;
                }
                JobState::Running => {
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                JobState::Done(r) => return Outcome::Done(r.clone()),
                JobState::Returned | JobState::Claimed => return Outcome::Yours,
            }
        }
    }

    /// The helper starts the job: `false` when the arena claimed it first.
    fn start(&self) -> bool {
        let mut st = self.state();
        if *st != JobState::Queued {
            return false;
        }
        *st = JobState::Running;
        true
    }
}

/// A helper thread that unmaps old mappings (see the module's documentation),
/// started by the first job handed to it.
pub(crate) struct Unmapper {
    vmm: Arc<dyn VirtualMemory>,
    events: Arc<dyn EventSource>,
    helper: Mutex<Option<Helper>>,
    /// Held by a growth while it maps, and by the helper around each unmap.
    turn: Arc<Turn>,
}

/// Whose turn it is to call the driver: a growth's maps or the helper's unmaps.
#[derive(Default)]
struct Turn {
    held: Mutex<()>,
    /// Growths waiting for `held`: the helper lets them go first.
    waiting: AtomicUsize,
}

impl Turn {
    /// A growth's turn: waits for the unmap under way, if any.
    fn for_growth(&self) -> MutexGuard<'_, ()> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// The helper's turn for one unmap, once no growth waits or maps.
    fn for_helper(&self) -> MutexGuard<'_, ()> {
        loop {
            while self.waiting.load(Ordering::Acquire) > 0 {
                std::thread::yield_now();
            }
            let g = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if self.waiting.load(Ordering::Acquire) == 0 {
                return g;
            }
            // A growth came while this thread took the turn: it goes first.
        }
    }
}

struct Helper {
    jobs: Sender<Arc<UnmapJob>>,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for Unmapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unmapper").finish_non_exhaustive()
    }
}

impl Unmapper {
    /// An unmapper of `vmm`'s mappings, waiting on `events`' events.
    pub fn new(vmm: Arc<dyn VirtualMemory>, events: Arc<dyn EventSource>) -> Unmapper {
        Unmapper {
            vmm,
            events,
            helper: Mutex::new(None),
            turn: Arc::new(Turn::default()),
        }
    }

    /// Keeps the helper from unmapping while the guard lives: a growth holds it
    /// around its maps (see the module's documentation). It waits for the unmap
    /// the helper may be making.
    pub fn quiet(&self) -> MutexGuard<'_, ()> {
        self.turn.for_growth()
    }

    /// Hands `job` to the helper thread (started now if it is not yet); `false`
    /// when no thread could be started or the helper has gone (the caller keeps
    /// the job: nothing was done with it).
    pub fn submit(&self, job: &Arc<UnmapJob>) -> bool {
        let mut helper = self.helper.lock().unwrap_or_else(|p| p.into_inner());
        if helper.is_none() {
            let (tx, rx) = channel();
            let (vmm, events, turn) = (self.vmm.clone(), self.events.clone(), self.turn.clone());
            match std::thread::Builder::new()
                .name("emm-unmap".into())
                .spawn(move || run(rx, vmm.as_ref(), events.as_ref(), &turn))
            {
                Ok(thread) => *helper = Some(Helper { jobs: tx, thread }),
                Err(e) => {
                    tracing::warn!(error = %e, "starting the thread that unmaps moved pieces failed; the allocating thread unmaps them");
                    return false;
                }
            }
        }
        helper
            .as_ref()
            .is_some_and(|h| h.jobs.send(job.clone()).is_ok())
    }
}

impl Drop for Unmapper {
    fn drop(&mut self) {
        let helper = self
            .helper
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(Helper { jobs, thread }) = helper {
            // The helper ends once the channel closes and its queue is empty.
            drop(jobs);
            if thread.join().is_err() {
                tracing::error!("the thread that unmaps moved pieces panicked");
            }
        }
    }
}

/// The helper's loop: each job's event waited for, then its mappings unmapped.
/// A job is always left finished or returned, so the arena never waits forever:
/// a panic inside the virtual memory or the events (a user's implementation,
/// through [`PoolUpstream::Custom`](crate::PoolUpstream::Custom)) returns it.
fn run(
    jobs: Receiver<Arc<UnmapJob>>,
    vmm: &dyn VirtualMemory,
    events: &dyn EventSource,
    turn: &Turn,
) {
    for job in jobs {
        if !job.start() {
            continue;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            do_job(&job, vmm, events, turn)
        }));
        job.set(outcome.unwrap_or_else(|_| {
            tracing::error!("unmapping moved pieces panicked on the unmapping thread; the allocating thread unmaps them");
            JobState::Returned
        }));
    }
}

/// Waits for `job`'s event and unmaps its mappings, each in its `turn` (not
/// while a growth maps): what the job came to.
fn do_job(
    job: &UnmapJob,
    vmm: &dyn VirtualMemory,
    events: &dyn EventSource,
    turn: &Turn,
) -> JobState {
    if let Some(id) = job.event {
        if let Err(e) = events.wait(id) {
            // At process exit the driver shuts down under the thread: what is
            // still mapped goes with it, and nobody is left to warn.
            if e.is_driver_shutting_down() {
                tracing::debug!(error = %e, "the driver is shutting down; moved pieces are left to it");
            } else {
                tracing::warn!(error = %e, "waiting for moved pieces' work failed on the unmapping thread; the allocating thread unmaps them");
            }
            return JobState::Returned;
        }
    }
    let mut shutting_down = false;
    JobState::Done(
        job.maps
            .iter()
            .map(|&(addr, len)| {
                if shutting_down {
                    return false;
                }
                let unmapped = {
                    let _turn = turn.for_helper();
                    vmm.unmap_done(addr, len)
                };
                match unmapped {
                    Ok(()) => true,
                    // One line for the job, not one a piece (thousands at exit).
                    Err(e) if e.is_driver_shutting_down() => {
                        tracing::debug!(error = %e, "the driver is shutting down; moved pieces are left to it");
                        shutting_down = true;
                        false
                    }
                    Err(e) => {
                        tracing::error!(error = %e, addr, len, "unmapping a moved piece's old mapping failed; it stays mapped");
                        false
                    }
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::HostEvents;
    use crate::vmm::HostVmm;
    use emm_default::HostUpstream;

    fn vmm() -> Arc<HostVmm> {
        Arc::new(HostVmm::new(Arc::new(HostUpstream::new(1 << 30, false))))
    }

    #[test]
    fn a_claimed_job_is_never_started_and_a_done_one_reports_each_mapping() {
        let v = vmm();
        let base = v.reserve(64 << 20).unwrap();
        v.map(base, 2 << 20).unwrap();
        let unmapper = Unmapper::new(v.clone(), Arc::new(HostEvents::immediate()));
        // Claimed before the helper saw it: the helper skips it.
        let claimed = UnmapJob::new(vec![(base, 2 << 20)], None);
        assert_eq!(claimed.settle(), Outcome::Yours);
        assert!(unmapper.submit(&claimed));
        // Done by the helper: the mapped one unmapped, the unknown one refused.
        let job = UnmapJob::new(vec![(base, 2 << 20), (base + (4 << 20), 2 << 20)], None);
        assert!(unmapper.submit(&job));
        let start = std::time::Instant::now();
        while job.poll() == Outcome::Pending && start.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(job.poll(), Outcome::Done(vec![true, false]));
        // Settling a finished job takes nothing back.
        assert_eq!(job.settle(), Outcome::Done(vec![true, false]));
        assert_eq!(claimed.poll(), Outcome::Yours);
        drop(unmapper);
        // Unmapped once, by the job (the claimed job did not run).
        assert!(v.unmap_done(base, 2 << 20).is_err());
    }

    /// A driver that has shut down (the process exiting): every unmap fails
    /// with `CUDA_ERROR_DEINITIALIZED`.
    struct ShutDown {
        unmaps: std::sync::atomic::AtomicUsize,
    }

    impl VirtualMemory for ShutDown {
        fn reserve(&self, _: usize) -> emm_core::Result<CUdeviceptr> {
            unreachable!("the job only unmaps")
        }
        fn map(&self, _: CUdeviceptr, _: usize) -> emm_core::Result<()> {
            unreachable!("the job only unmaps")
        }
        fn unmap(&self, _: CUdeviceptr, _: usize) -> emm_core::Result<()> {
            self.unmaps
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(emm_core::EmmError::Driver(emm_driver::DriverError::Call {
                call: "cuMemUnmap",
                code: emm_sys::CUresult::ERROR_DEINITIALIZED,
                name: "CUDA_ERROR_DEINITIALIZED".into(),
                text: "driver shutting down".into(),
            }))
        }
    }

    #[test]
    fn a_driver_shutting_down_ends_the_job_at_its_first_refusal() {
        let v = ShutDown {
            unmaps: std::sync::atomic::AtomicUsize::new(0),
        };
        let maps: Vec<_> = (0..1000u64).map(|i| (i << 21, 2 << 20)).collect();
        let job = UnmapJob::new(maps, None);
        assert!(job.start());
        let state = do_job(&job, &v, &HostEvents::immediate(), &Turn::default());
        // One call, not a thousand (each was an error line at exit); every
        // mapping reported as not unmapped.
        assert_eq!(v.unmaps.load(std::sync::atomic::Ordering::Relaxed), 1);
        match state {
            JobState::Done(done) => {
                assert_eq!(done.len(), 1000);
                assert!(done.iter().all(|&d| !d));
            }
            _ => panic!("the job is done"),
        }
    }
}
