//! What `emm replay` found, as data: the structures `--json` serialises
//! (`serde_json`) and the table, the sentences and the page read.

use emm::trace::{Sample, Trace};
use serde::Serialize;

use crate::peak;

/// The whole run.
#[derive(Serialize)]
pub struct Report {
    /// The version of this JSON document's layout (1: this one).
    pub schema_version: u32,
    /// The `emm` that wrote it.
    pub emm_version: String,
    /// The command line that made it.
    pub command: String,
    pub backend: &'static str,
    pub backend_detail: String,
    /// When each replay stopped on its own (without `--passes`); `null` with
    /// `--passes N`.
    pub steady_rule: Option<SteadyRuleReport>,
    /// `--device-memory`: the device size every manager replayed on; `null`:
    /// unlimited.
    pub device_memory_bytes: Option<u64>,
    /// How `--device-memory` and `--fit` capped the PyTorch models: `"device"`
    /// (a device of that size) or `"fraction"` (`--as-fraction`: as
    /// `set_per_process_memory_fraction` caps).
    pub pytorch_cap: &'static str,
    /// `--overhead`: what the process holds on the device besides the
    /// allocator, added to `--fit`'s answers.
    pub overhead_bytes: u64,
    /// `--device-lag`: requests the host stand-in's device ran behind the host
    /// (the pool's events completed that late); 0: at once.
    pub device_lag_requests: u64,
    /// `--ranks`: processes on one host whose pools grow in the same steps; the
    /// pieces' calls are estimated at that many times a lone process's cost.
    pub ranks: u32,
    /// Whether the run failed (it exits 1): a trace that could not be read, a
    /// replay in which requests failed, nothing replayed, …
    pub failed: bool,
    /// What failed, a line each.
    pub errors: Vec<String>,
    pub traces: Vec<TraceReport>,
    /// The pool replayed without its expandable segment and without an
    /// initial size (`EMM_POOL_EXPANDABLE=0`, no `EMM_POOL_INITIAL_SIZE`): a
    /// loose footprint gets a line naming `--initial-size` ([`home_hint_line`](super::home_hint_line)).
    #[serde(skip)]
    pub pool_without_home: bool,
}

/// `--fit`: the smallest device on which a manager ran the trace.
#[derive(Serialize)]
pub struct FitReport {
    pub manager: String,
    /// Allocator memory needed (`null`: it did not run even at its own
    /// uncapped peak).
    pub needs_bytes: Option<u64>,
    /// The same with `--overhead` added: the device memory to have.
    pub with_overhead_bytes: Option<u64>,
    /// A larger device on which it failed (caching allocators are not monotone).
    pub larger_failed_bytes: Option<u64>,
    /// Replays the search made.
    pub runs: u32,
    /// How far above the smallest device `needs_bytes` may be (the search's
    /// step, more where it stopped for time).
    pub within_bytes: u64,
    /// The search stopped at its time bound (`fit::SEARCH_TIME`) before it
    /// finished.
    pub stopped_for_time: bool,
}

/// `--initial-size`: the smallest home segment of the pool without virtual
/// memory that held the trace.
#[derive(Serialize)]
pub struct HomeReport {
    /// `EMM_POOL_INITIAL_SIZE` to set (`null`: not even 16 times the peak of
    /// live bytes held it, `fit::DOUBLINGS`).
    pub bytes: Option<u64>,
    /// The same over the peak of live bytes.
    pub over_live: Option<f64>,
    /// A larger size that did not hold it (placement is not monotone).
    pub larger_failed_bytes: Option<u64>,
    /// Passes each size was judged on (the pool's in this replay).
    pub passes: u32,
    /// Replays the search made.
    pub runs: u32,
    /// How far above the smallest home `bytes` may be (the search's step, more
    /// where it stopped for time).
    pub within_bytes: u64,
    /// The search stopped at its time bound (`fit::SEARCH_TIME`) before it
    /// finished.
    pub stopped_for_time: bool,
}

/// emm-trace's `SteadyRule`, as the report gives it.
#[derive(Serialize)]
pub struct SteadyRuleReport {
    /// Passes in a row without a move of peak reserved bytes that make it steady.
    pub quiet_passes: u32,
    /// The most passes a trace is replayed through one manager.
    pub max_passes: u32,
    /// The most seconds a trace is replayed through one manager (checked after
    /// each pass).
    pub max_seconds: f64,
}

/// One trace and its replays.
#[derive(Serialize)]
pub struct TraceReport {
    pub trace: String,
    pub format: &'static str,
    pub events: u64,
    pub requests: u64,
    pub streams: u64,
    pub peak_live_bytes: u128,
    pub malformed_lines: u64,
    /// Allocations of an id that was still live (the earlier one taken as freed).
    pub reused_live_ids: u64,
    pub pytorch: Option<TorchReport>,
    pub managers: Vec<ManagerReport>,
    pub skipped: Vec<Skipped>,
    /// Managers `--manager all` names that were not replayed because they would
    /// repeat another here (`pool-shared` on a trace of one stream, or with
    /// stream pools off), and why: in the JSON only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<Skipped>,
    /// `--fit`'s answers, one per manager that ran.
    pub fit: Vec<FitReport>,
    /// `--initial-size`'s answer, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_size: Option<HomeReport>,
    /// The trace itself, for what the page shows of it (times, stacks,
    /// PyTorch's reserved bytes along it).
    #[serde(skip)]
    pub source: Option<Trace>,
}

/// PyTorch's own figures from a snapshot.
#[derive(Serialize)]
pub struct TorchReport {
    /// `null` when the snapshot has no segments and no segment events: it does
    /// not tell what PyTorch reserved.
    pub peak_reserved_bytes: Option<u128>,
    pub reserved_at_dump_bytes: u128,
    pub allocated_at_dump_bytes: u128,
    pub reconstructed_allocations: u64,
    pub cross_stream_frees: u64,
    pub ooms: u64,
    /// Segment events in the trace (`segment_alloc`, `segment_free`, …).
    pub segment_events: u64,
}

/// One manager's replay.
#[derive(Serialize)]
pub struct ManagerReport {
    pub manager: String,
    /// Allocation requests replayed, over every pass.
    pub requests: u64,
    /// Peak live bytes of this replay: the trace's, or more over several passes
    /// (what the trace never frees is kept from pass to pass).
    pub peak_live_bytes: u128,
    pub peak_reserved_bytes: u64,
    pub reserved_over_live: Option<f64>,
    pub upstream_allocs: u64,
    /// Driver calls for memory over the whole replay.
    pub driver: DriverReport,
    pub seconds: f64,
    /// Whether any request failed: the figures are then not the trace's (what
    /// failed was never held).
    pub failed: bool,
    /// Requests that failed, over every pass.
    pub failures: u64,
    /// The first failure's message (with the byte limit in effect, when one
    /// was set through the environment).
    pub first_failure: Option<String>,
    /// Live and reserved bytes along the replay (for the page).
    #[serde(skip)]
    pub curve: Vec<Sample>,
    /// The memory at the manager's peak: its most reserved bytes, and of those
    /// moments the one with the most live bytes (`--html` only;
    /// `null` without it).
    pub at_peak: Option<AtPeak>,
    /// emm's pool: its reserved bytes at the last growth that raised their peak,
    /// by what held them (`emm.peak_slack.*` without the prefix: live bytes,
    /// threads' caches, free blocks of the growing stream, of other streams,
    /// settled, parked behind events, in small segments; the request; the
    /// streams holding free blocks). `null` for a manager that does not say.
    pub peak_slack: Option<std::collections::BTreeMap<&'static str, u64>>,
    /// The same, block by block (for the page).
    #[serde(skip)]
    pub map: Option<peak::Map>,
    /// Each pass over the trace (one entry for a single pass).
    pub passes: Vec<PassReport>,
    /// Peak live bytes of the first pass.
    pub first_pass_peak_live_bytes: u128,
    /// Peak reserved bytes of the first pass: the footprint of one pass, beside
    /// `peak_reserved_bytes` over every pass.
    pub first_pass_peak_reserved_bytes: u64,
    /// `first_pass_peak_reserved_bytes / first_pass_peak_live_bytes`.
    pub first_pass_reserved_over_live: Option<f64>,
    /// Passes replayed (as many as `passes` has).
    pub steady_passes: u64,
    /// Whether peak reserved bytes held for the steady rule's quiet passes (false
    /// with `--passes N`, which does not look).
    pub steady_reached: bool,
    /// Why the passes ended: `steady` (peak reserved held), `max_passes` or
    /// `max_time` (the steady rule's bounds, before it held), `passes` (`--passes N`).
    pub stopped_by: &'static str,
    /// The pass (from 1) from which peak reserved bytes held their final value.
    pub steady_from_pass: u64,
    /// Events of a pass the time bound stopped part way, after `steady_passes`
    /// whole ones (0: none). What that part did is in the manager's own figures
    /// (requests, peaks, driver calls), not in `passes`.
    pub abandoned_events: u64,
}

/// A manager's memory at its peak: the first moment its reserved bytes were at
/// their most with live bytes at their most then (see
/// `peak.rs` for what is stranded).
#[derive(Serialize)]
pub struct AtPeak {
    /// Events replayed (over every pass) then.
    pub event: u64,
    /// The pass then (from 1).
    pub pass: u64,
    /// When that event happened in the recording (`time_us`; snapshots only).
    pub time_us: Option<u64>,
    /// The manager's reserved bytes then.
    pub reserved_bytes: u64,
    /// Live requested bytes then.
    pub live_bytes: u128,
    /// Segments (`null`: the manager keeps none of its own, only totals are known).
    pub segments: Option<u64>,
    /// Live allocations.
    pub live_blocks: u64,
    /// Free bytes held in threads' caches.
    pub cached_bytes: u64,
    /// Free bytes that could go back to the device.
    pub free_bytes: u64,
    /// Free bytes that cannot go back while live blocks share their segment (or,
    /// in an expandable segment, their 2 MiB page).
    pub stranded_bytes: u64,
    /// Reserved by a manager without segments besides its live bytes (frees it
    /// has queued, rounding).
    pub held_bytes: u64,
}

/// Driver calls for memory (emm-trace's `DriverCalls`, with their sum and what
/// they would take on a GPU).
#[derive(Clone, Copy, Serialize)]
pub struct DriverReport {
    pub total: u64,
    pub allocs: u64,
    pub frees: u64,
    pub pieces_mapped: u64,
    pub pieces_moved: u64,
    pub pieces_unmapped: u64,
    /// Seconds these calls take at an idle H100's per-call costs
    /// (`emm_trace::DriverCosts::IDLE_H100`), those of the pieces multiplied by
    /// `--ranks` (`DriverCosts::sharing_host_with`): a lone process's price
    /// for the pieces' calls without it, rough for allocations and frees.
    pub estimated_seconds: f64,
}

impl DriverReport {
    /// The calls `d`, timed at `costs`.
    pub fn priced(d: emm::trace::DriverCalls, costs: &emm::trace::DriverCosts) -> Self {
        DriverReport {
            total: d.total(),
            allocs: d.allocs,
            frees: d.frees,
            pieces_mapped: d.pieces_mapped,
            pieces_moved: d.pieces_moved,
            pieces_unmapped: d.pieces_unmapped,
            estimated_seconds: costs.time(&d).as_secs_f64(),
        }
    }
}

/// One pass of a replay.
#[derive(Serialize)]
pub struct PassReport {
    pub requests: u64,
    pub failures: u64,
    pub driver: DriverReport,
    /// Peak live from the start to the end of this pass.
    pub peak_live_bytes: u128,
    /// Peak reserved from the start to the end of this pass.
    pub peak_reserved_bytes: u64,
    /// Reserved at the end of this pass.
    pub reserved_bytes: u64,
    /// Held for callers at the end of this pass.
    pub allocated_bytes: u64,
    pub seconds: f64,
}

/// A manager that could not run here, and why.
#[derive(Serialize)]
pub struct Skipped {
    pub manager: String,
    pub why: String,
}
