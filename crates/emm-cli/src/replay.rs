//! `emm replay`: traces through every manager, on the GPU or the host stand-in.

use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use emm::core::HostClock;
use emm::trace::torch_model::{Limit, TorchConf, TorchModel, DEFAULT_DEVICE_BYTES};
use emm::trace::{
    replay, scan, DriverCosts, Format, ReplayOptions, ReplayResult, ReplayTarget, SteadyRule,
    SteadyStop, Summary, Trace, TraceError,
};
use emm::{EmmError, MemoryManager};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::backend::{Backend, Streams};
use crate::fit;
use crate::home;
use crate::names::{POOL_SHARED, TORCH_MODELS};
use crate::out::{note, Out};
use crate::peak;
use crate::report::{
    self, AtPeak, DriverReport, FitReport, HomeReport, ManagerReport, PassReport, Report, Skipped,
    SteadyRuleReport, TorchReport, TraceReport,
};

/// The trace replayed when none is given.
const BUNDLED_NAME: &str = "gpt_train.csv (bundled)";
const BUNDLED: &str = include_str!("../traces/gpt_train.csv");

/// Points per curve on the page: between this and twice as many (the replay
/// halves them when they reach twice).
const SAMPLES: u64 = 1000;

/// When a replay without `--passes` stops: peak reserved bytes unmoved for 10
/// passes in a row, at most 100 passes, 60 s per trace and manager.
pub const STEADY: SteadyRule = SteadyRule::DEFAULT;

/// The parsed arguments of `emm replay`.
pub struct Args {
    pub traces: Vec<PathBuf>,
    pub managers: Vec<String>,
    pub format: Option<Format>,
    pub json: bool,
    pub html: Option<PathBuf>,
    /// Passes over each trace (at least 1); `None`: until the footprint holds
    /// ([`STEADY`]).
    pub passes: Option<u32>,
    /// PyTorch's allocator settings for the `pytorch-native` and
    /// `pytorch-expandable` models (each sets `expandable_segments` its own way).
    pub torch_conf: TorchConf,
    /// `--device-memory`: replay on a device of this many bytes.
    pub device_memory: Option<u64>,
    /// `--fit`: search each manager's smallest device.
    pub fit: bool,
    /// `--initial-size`: search the smallest home segment of the pool without
    /// virtual memory (`home.rs`).
    pub initial_size: bool,
    /// `--as-fraction`: the PyTorch models are capped as
    /// `set_per_process_memory_fraction` caps, not as a device of that size.
    pub as_fraction: bool,
    /// `--overhead`: what the process holds on the device besides the allocator.
    pub overhead: u64,
    /// `--device-lag`: requests the host stand-in's device runs behind the host
    /// (0: none).
    pub device_lag: u64,
    /// `--ranks`: processes on the host whose pools grow in the same steps (the
    /// driver-time estimates of the pieces' calls are multiplied by it).
    pub ranks: u32,
    /// [`POOL_SHARED`] came with `all`, not by name: replay it only for a trace
    /// of more than one stream, and only while the pool's stream pools are on
    /// (elsewhere it replays exactly as `pool`).
    pub shared_where_streams: bool,
}

impl Args {
    /// What each driver call is estimated to cost under these arguments.
    fn costs(&self) -> DriverCosts {
        DriverCosts::IDLE_H100.sharing_host_with(self.ranks)
    }

    /// A fresh device clock for one replay under `--device-lag` (`None` without).
    fn clock(&self) -> Option<Arc<HostClock>> {
        (self.device_lag > 0).then(|| Arc::new(HostClock::new(self.device_lag)))
    }
}

/// A fresh target for manager `m`: a model of PyTorch's allocator, or one of
/// emm's managers (on a device of `cap` bytes, emm's managers run over the host
/// stand-in with that capacity, on a GPU as on a machine without one).
fn build_target(
    backend: &Backend,
    m: &str,
    torch_conf: &TorchConf,
    cap: Option<u64>,
    as_fraction: bool,
    clock: Option<Arc<HostClock>>,
) -> Result<Target, EmmError> {
    if TORCH_MODELS.contains(&m) {
        let conf = TorchConf {
            expandable_segments: m == "pytorch-expandable",
            ..torch_conf.clone()
        };
        // A device of `cap` bytes, or `cap` bytes of the default device as
        // `setMemoryFraction` allows them (on a larger device if `cap` passes it).
        let (device, limit) = match cap {
            Some(c) if as_fraction => (DEFAULT_DEVICE_BYTES.max(c), Some(Limit::Fraction(c))),
            Some(c) => (c, Some(Limit::Device(c))),
            None => (DEFAULT_DEVICE_BYTES, None),
        };
        return Ok(Target::Torch(TorchModel::with_device(conf, device, limit)));
    }
    if m == POOL_SHARED {
        let capacity = cap.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
        return build_shared_pool(backend, capacity, clock).map(Target::Emm);
    }
    let standin = |capacity: usize| match clock {
        Some(c) => emm::build_host_standin_lagged(m, capacity, c),
        None => emm::build_host_standin(m, capacity),
    };
    match cap {
        Some(c) => standin(usize::try_from(c).unwrap_or(usize::MAX)).map(Target::Emm),
        None if backend.is_host() => standin(crate::backend::HOST_CAPACITY).map(Target::Emm),
        None => backend.build(m).map(Target::Emm),
    }
}

/// `--fit` for manager `m`: the smallest device (to 2 MiB or a thousandth of
/// `high`) on which `t` replays without a failure, between its peak live bytes
/// and `high` (what the uncapped replay reserved).
fn fit_manager(
    backend: &Backend,
    args: &Args,
    t: &Trace,
    summary: &Summary,
    m: &str,
    high: u64,
    passes: u32,
) -> Result<fit::Fit, String> {
    let low = u64::try_from(summary.peak_live_bytes).unwrap_or(u64::MAX);
    let step = (2 << 20).max(high / 1000);
    fit::smallest(low, high.max(low), step, fit::SEARCH_TIME, |cap| {
        let clock = args.clock();
        let target = build_target(
            backend,
            m,
            &args.torch_conf,
            Some(cap),
            args.as_fraction,
            clock.clone(),
        )
        .map_err(|e| e.to_string())?;
        // Exactly the passes the uncapped replay made, so that every size is
        // judged on the same run (the steady rule's clock could stop one early).
        let opts = ReplayOptions {
            total_events: summary.events,
            samples: 0,
            passes,
            until_steady: None,
            peak_map: false,
            clock,
        };
        let mut streams = backend.streams();
        let label = format!(
            "{} through {m}: --fit at {}",
            t.name(),
            crate::units::bytes(u128::from(cap))
        );
        let r = match &target {
            Target::Emm(mm) => drive(
                t,
                mm.as_ref(),
                &mut streams,
                &opts,
                Some(passes),
                summary.events,
                label,
            ),
            Target::Torch(tm) => drive(
                t,
                tm,
                &mut streams,
                &opts,
                Some(passes),
                summary.events,
                label,
            ),
        }
        .map_err(|e| e.to_string())?;
        Ok(r.failures == 0)
    })
}

/// The pool's configuration from the environment, with one shared arena.
fn shared_pool_config() -> Result<emm::emm_pool::PoolConfig, EmmError> {
    Ok(emm::emm_pool::PoolConfig {
        stream_pools: 0,
        ..emm::emm_pool::PoolConfig::from_env()?
    })
}

/// A fresh [`POOL_SHARED`]: over the host stand-in of `capacity` bytes (its
/// device `clock` behind, when given), or on the GPU.
fn build_shared_pool(
    backend: &Backend,
    capacity: Option<usize>,
    clock: Option<Arc<HostClock>>,
) -> Result<Arc<dyn emm::MemoryManager>, EmmError> {
    use emm::emm_pool::PoolManager;
    let config = shared_pool_config()?;
    let host = capacity.or(backend.is_host().then_some(crate::backend::HOST_CAPACITY));
    let m: Arc<dyn emm::MemoryManager> = match (host, clock) {
        (Some(c), Some(clock)) => Arc::new(PoolManager::host_lagged(c, config, clock)?),
        (Some(c), None) => Arc::new(PoolManager::host(c, config)?),
        (None, _) => backend.build_pool(config)?,
    };
    m.initialize()?;
    Ok(m)
}

/// What a manager name replays through.
enum Target {
    /// One of emm's managers, on the GPU or the host stand-in.
    Emm(Arc<dyn MemoryManager>),
    /// A model of PyTorch's allocator (no device needed).
    Torch(TorchModel),
}

/// Replays `t` through `target` with a progress bar: `passes` passes, or until
/// the footprint holds.
fn drive<T: ReplayTarget + ?Sized>(
    t: &Trace,
    target: &T,
    streams: &mut Streams<'_>,
    opts: &ReplayOptions,
    passes: Option<u32>,
    events: u64,
    label: String,
) -> Result<ReplayResult, TraceError> {
    match passes {
        Some(n) => {
            let bar = progress_bar(events.saturating_mul(u64::from(n)), label);
            let r = replay(t, target, &mut |n| streams.get(n), opts, &mut |done| {
                bar.set_position(done)
            });
            bar.finish_and_clear();
            r
        }
        // The passes to come are unknown: the bar shows the pass under way.
        None => {
            let bar = progress_bar(events, label.clone());
            let per = events.max(1);
            let mut shown = 0;
            let r = replay(t, target, &mut |n| streams.get(n), opts, &mut |done| {
                let pass = done / per + 1;
                if pass != shown {
                    bar.set_message(format!("{label}, pass {pass}"));
                    shown = pass;
                }
                bar.set_position(done % per);
            });
            bar.finish_and_clear();
            r
        }
    }
}

fn progress_bar(total: u64, label: String) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}%") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label);
    bar
}

pub fn run(args: &Args) -> io::Result<ExitCode> {
    // The page's file is made before the work, so a path that cannot be written
    // fails at once, not after minutes of replay; made then, a page named as one
    // of the traces would empty that trace before it is read.
    if let Some(page) = &args.html {
        // (Standard input is compared as the file it was redirected from.)
        let stdin = std::path::Path::new("/dev/stdin");
        if let Some(trace) = args
            .traces
            .iter()
            .find(|t| same_file(page, if t.as_os_str() == "-" { stdin } else { t }))
        {
            note(format_args!(
                "emm replay: --html {} is the trace {}: writing the page would overwrite it; name another file",
                page.display(),
                trace.display()
            ));
            return Ok(ExitCode::from(2));
        }
    }
    if args.traces.iter().filter(|t| is_stdin(t)).count() > 1 {
        note("emm replay: standard input (-, or /dev/stdin) is named more than once; it can be read once");
        return Ok(ExitCode::from(2));
    }
    let html_file = match &args.html {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(f),
            Err(e) => {
                note(format_args!(
                    "emm replay: cannot create --html {}: {e}",
                    path.display()
                ));
                return Ok(ExitCode::from(1));
            }
        },
        None => None,
    };
    let backend = Backend::detect();
    if args.device_lag > 0 && !backend.is_host() && args.device_memory.is_none() {
        note("emm replay: --device-lag models the host stand-in's device, and this replay runs on the GPU (whose own events complete when its work does); drop --device-lag, or add --device-memory, which replays emm's managers over the stand-in");
        return Ok(ExitCode::from(2));
    }
    // A reader that goes away (`| head`) stops the output, not the run: what
    // failed still reaches stderr and the exit status, and --html its page.
    let mut out = Out::stdout_past_close();
    if !args.json {
        out.line(backend.describe())?;
        if args.device_lag > 0 {
            out.line(format!(
                "device lag: the stand-in's events complete {} requests after they are recorded (--device-lag; only the pool records events)",
                args.device_lag
            ))?;
        }
    }
    // What failed, said on standard error at once and kept for the report.
    let mut errors: Vec<String> = Vec::new();
    let mut fail = |line: String| {
        note(&line);
        errors.push(line);
    };
    let mut traces: Vec<Trace> = Vec::new();
    if args.traces.is_empty() {
        match Trace::from_text(BUNDLED_NAME, BUNDLED) {
            Ok(t) => traces.push(t),
            Err(e) => {
                note(format_args!("emm replay: {e}"));
                return Ok(ExitCode::from(1));
            }
        }
    }
    for p in &args.traces {
        let opened = if p.as_os_str() == "-" {
            Trace::from_reader("(standard input)", io::stdin().lock(), args.format)
        } else {
            Trace::open(p, args.format)
        };
        match opened {
            Ok(ts) => traces.extend(ts),
            Err(e) => fail(format!("emm replay: {e}")),
        }
    }
    let until_steady = args.passes.is_none().then_some(STEADY);
    let mut report = Report {
        schema_version: 1,
        emm_version: env!("CARGO_PKG_VERSION").to_owned(),
        command: std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        backend: backend.name(),
        backend_detail: backend.describe(),
        steady_rule: until_steady.map(|r| SteadyRuleReport {
            quiet_passes: r.quiet_passes,
            max_passes: r.max_passes,
            max_seconds: r.max_time.as_secs_f64(),
        }),
        device_memory_bytes: args.device_memory,
        pytorch_cap: if args.as_fraction {
            "fraction"
        } else {
            "device"
        },
        overhead_bytes: args.overhead,
        device_lag_requests: args.device_lag,
        ranks: args.ranks,
        failed: false,
        errors: Vec::new(),
        traces: Vec::new(),
        // (Not with --initial-size: its answer, or why there is none, is said.)
        pool_without_home: !args.initial_size
            && emm::emm_pool::PoolConfig::from_env()
                .is_ok_and(|c| !c.segments.expandable && c.segments.initial_size == 0),
    };
    let mut skipped_said: Vec<String> = Vec::new();
    let costs = args.costs();
    for t in &traces {
        let summary = match scan(t) {
            Ok(s) => s,
            Err(e) => {
                fail(format!("emm replay: {e}"));
                continue;
            }
        };
        say_diagnostics(t, &summary);
        let mut tr = trace_report(t, &summary);
        for m in &args.managers {
            if m == POOL_SHARED && args.shared_where_streams {
                if let Some(why) = shared_repeats_pool(&summary) {
                    tr.left_out.push(Skipped {
                        manager: m.clone(),
                        why: why.to_owned(),
                    });
                    continue;
                }
            }
            let clock = args.clock();
            let manager = match build_target(
                &backend,
                m,
                &args.torch_conf,
                args.device_memory,
                args.as_fraction,
                clock.clone(),
            ) {
                Ok(x) => x,
                // A manager this driver, device or the stand-in cannot run (e.g.
                // `hostonly` without stream-ordered memory pools) is skipped, and
                // the others run.
                Err(EmmError::Unsupported { operation, .. }) => {
                    let why = match backend {
                        Backend::Host { .. } => {
                            "needs CUDA's stream-ordered allocator, and there is no GPU here"
                                .to_owned()
                        }
                        Backend::Gpu { .. } => format!("not supported here: {operation}"),
                    };
                    if !skipped_said.contains(m) {
                        note(format_args!("emm replay: {m} skipped: {why}"));
                        skipped_said.push(m.clone());
                    }
                    tr.skipped.push(Skipped {
                        manager: m.clone(),
                        why,
                    });
                    continue;
                }
                Err(e) => {
                    // A configuration error (e.g. EMM_POOL_LIMIT=abc) stops the run.
                    note(format_args!("emm replay: cannot build manager `{m}`: {e}"));
                    return Ok(ExitCode::from(1));
                }
            };
            let opts = ReplayOptions {
                total_events: summary.events,
                samples: SAMPLES,
                passes: args.passes.unwrap_or(1),
                until_steady,
                // The page's segment maps.
                peak_map: args.html.is_some(),
                clock,
            };
            let label = format!("{} through {m}", t.name());
            let mut streams = backend.streams();
            let (passes, events) = (args.passes, summary.events);
            let r = match &manager {
                Target::Emm(mm) => {
                    drive(t, mm.as_ref(), &mut streams, &opts, passes, events, label)
                }
                Target::Torch(tm) => drive(t, tm, &mut streams, &opts, passes, events, label),
            };
            if let Err(e) = backend.synchronize() {
                fail(format!(
                    "emm replay: {} through {m}: synchronizing: {e}",
                    t.name()
                ));
            }
            drop(manager);
            drop(streams);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    fail(format!("emm replay: {e}"));
                    continue;
                }
            };
            let first_failure = r.first_failure.clone();
            if r.failures > 0 {
                fail(format!(
                    "emm replay: {} through {m}: FAILED: {} of {} requests failed; the first: {}",
                    t.name(),
                    r.failures,
                    r.requests,
                    first_failure.as_deref().unwrap_or("?")
                ));
            }
            let map = r.peak_map.as_ref().map(peak::read);
            let at_peak = r
                .peak_map
                .as_ref()
                .zip(map.as_ref())
                .map(|(p, m)| at_peak(t, summary.events, p, m));
            let first = r.passes.first();
            let first_live = first.map_or(0, |p| p.peak_live_bytes);
            let first_reserved = first.map_or(0, |p| p.peak_reserved_bytes);
            tr.managers.push(ManagerReport {
                manager: m.clone(),
                first_pass_peak_live_bytes: first_live,
                first_pass_peak_reserved_bytes: first_reserved,
                first_pass_reserved_over_live: (first_live > 0)
                    .then(|| first_reserved as f64 / first_live as f64),
                steady_passes: r.passes.len() as u64,
                steady_reached: r.steady.is_some_and(SteadyStop::settled),
                stopped_by: match r.steady {
                    Some(SteadyStop::Settled) => "steady",
                    Some(SteadyStop::MaxPasses) => "max_passes",
                    Some(SteadyStop::MaxTime) => "max_time",
                    None => "passes",
                },
                steady_from_pass: r.peak_reserved_from_pass() as u64,
                abandoned_events: r.abandoned_events,
                requests: r.requests,
                peak_live_bytes: r.peak_live_bytes,
                peak_reserved_bytes: r.peak_reserved_bytes,
                reserved_over_live: (r.peak_live_bytes > 0)
                    .then(|| r.peak_reserved_bytes as f64 / r.peak_live_bytes as f64),
                upstream_allocs: r.upstream_allocs,
                driver: DriverReport::priced(r.driver, &costs),
                seconds: r.elapsed.as_secs_f64(),
                failed: r.failures > 0,
                failures: r.failures,
                first_failure,
                curve: r.samples.clone(),
                at_peak,
                peak_slack: (!r.peak_slack.is_empty()).then(|| {
                    r.peak_slack
                        .iter()
                        .map(|&(name, v)| (name.strip_prefix("emm.peak_slack.").unwrap_or(name), v))
                        .collect()
                }),
                map,
                passes: r
                    .passes
                    .iter()
                    .map(|p| PassReport {
                        requests: p.requests,
                        failures: p.failures,
                        driver: DriverReport::priced(p.driver, &costs),
                        peak_live_bytes: p.peak_live_bytes,
                        peak_reserved_bytes: p.peak_reserved_bytes,
                        reserved_bytes: p.reserved_bytes,
                        allocated_bytes: p.allocated_bytes,
                        seconds: p.elapsed.as_secs_f64(),
                    })
                    .collect(),
            });
        }
        if args.fit {
            let ran: Vec<(String, u64, bool, u32)> = tr
                .managers
                .iter()
                .map(|m| {
                    let passes = u32::try_from(m.steady_passes.max(1)).unwrap_or(u32::MAX);
                    (m.manager.clone(), m.peak_reserved_bytes, m.failed, passes)
                })
                .collect();
            for (m, high, replay_failed, passes) in ran {
                if replay_failed {
                    continue; // it did not run uncapped: no size to search below
                }
                // Under a size, emm's managers run over the host stand-in, where
                // `hostonly` (CUDA's own pool) cannot: said, not failed.
                if !TORCH_MODELS.contains(&m.as_str())
                    && matches!(
                        emm::build_host_standin(&m, 1 << 30),
                        Err(EmmError::Unsupported { .. })
                    )
                {
                    note(format_args!(
                        "emm replay: {} through {m}: --fit skipped: it sizes emm's managers over the host stand-in, where {m} cannot run",
                        t.name()
                    ));
                    continue;
                }
                match fit_manager(&backend, args, t, &summary, &m, high, passes) {
                    Ok(f) => tr.fit.push(FitReport {
                        manager: m,
                        needs_bytes: f.needs,
                        with_overhead_bytes: f.needs.map(|n| n.saturating_add(args.overhead)),
                        larger_failed_bytes: f.larger_failed,
                        runs: f.runs,
                        within_bytes: f.within,
                        stopped_for_time: f.stopped_for_time,
                    }),
                    Err(e) => fail(format!("emm replay: {} through {m}: --fit: {e}", t.name())),
                }
            }
        }
        if args.initial_size {
            let pool = tr
                .managers
                .iter()
                .find(|m| m.manager == "pool" && !m.failed)
                .map(|m| u32::try_from(m.steady_passes.max(1)).unwrap_or(u32::MAX));
            match pool {
                None => {
                    // Why: the pool was not asked for, its replay failed, or
                    // it did not replay this trace (skipped, or an error said
                    // above).
                    let why = if !args.managers.iter().any(|m| m == "pool") {
                        "it needs a replay through the pool (-m pool), and the pool was not among the managers"
                    } else if tr.managers.iter().any(|m| m.manager == "pool") {
                        "the pool's replay failed (a request it could not serve), so no home segment can hold the trace"
                    } else {
                        "the pool did not replay this trace (the reason is said above)"
                    };
                    note(format_args!(
                        "emm replay: {}: --initial-size skipped: {why}",
                        t.name()
                    ))
                }
                Some(passes) => {
                    let live = u64::try_from(summary.peak_live_bytes).unwrap_or(u64::MAX);
                    let mut streams = backend.streams();
                    match home::smallest_home(t, live, summary.events, passes, &mut streams) {
                        Ok(f) => {
                            tr.initial_size = Some(HomeReport {
                                bytes: f.needs,
                                over_live: f.needs.map(|n| n as f64 / live.max(1) as f64),
                                larger_failed_bytes: f.larger_failed,
                                passes,
                                runs: f.runs,
                                within_bytes: f.within,
                                stopped_for_time: f.stopped_for_time,
                            })
                        }
                        Err(e) => fail(format!("emm replay: {}: --initial-size: {e}", t.name())),
                    }
                }
            }
        }
        report.traces.push(tr);
    }
    // Every manager asked for was skipped: nothing ran, and the run says so.
    let replayed = report.traces.iter().any(|t| !t.managers.is_empty());
    if !replayed && !report.traces.is_empty() {
        let why: Vec<String> = report
            .traces
            .iter()
            .flat_map(|t| &t.skipped)
            .map(|s| format!("{} skipped: {}", s.manager, s.why))
            .fold(Vec::new(), |mut v, s| {
                if !v.contains(&s) {
                    v.push(s);
                }
                v
            });
        fail(format!(
            "emm replay: nothing was replayed: {}",
            if why.is_empty() {
                "no manager was asked for".to_owned()
            } else {
                why.join("; ")
            }
        ));
    }
    if report.traces.is_empty() && errors.is_empty() {
        errors.push("emm replay: no trace was read".to_owned());
    }
    report.failed = !errors.is_empty();
    report.errors = errors;
    if args.json {
        report::json(&mut out, &report)?;
    } else if replayed {
        report::table(&mut out, &report)?;
    }
    if let (Some(path), Some(mut file)) = (&args.html, html_file) {
        use std::io::Write as _;
        if let Err(e) = file.write_all(crate::html::page(&report).as_bytes()) {
            note(format_args!(
                "emm replay: cannot write {}: {e}",
                path.display()
            ));
            report.failed = true;
        } else if !args.json {
            out.line(format_args!("wrote {}", path.display()))?;
        }
    }
    out.flush()?;
    Ok(if report.failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether `p` names standard input: `-`, or one of the paths Linux gives it.
fn is_stdin(p: &std::path::Path) -> bool {
    ["-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"]
        .iter()
        .any(|s| p.as_os_str() == *s)
}

/// Whether `a` and `b` name one existing file: the same device and inode.
#[cfg(unix)]
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Whether `a` and `b` name one existing file: the same canonical path.
#[cfg(not(unix))]
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    matches!(
        (std::fs::canonicalize(a), std::fs::canonicalize(b)),
        (Ok(p), Ok(q)) if p == q
    )
}

fn say_diagnostics(t: &Trace, s: &Summary) {
    for e in &s.diagnostics.first {
        note(format_args!("emm replay: {}: {e} (skipped)", t.name()));
    }
    let more = s.diagnostics.bad - s.diagnostics.first.len() as u64;
    if more > 0 {
        note(format_args!(
            "emm replay: {}: {more} more malformed lines skipped",
            t.name()
        ));
    }
    if s.reused_live_ids > 0 {
        note(format_args!(
            "emm replay: {}: {} allocations of an id that was still live (the earlier allocation is taken as freed there)",
            t.name(),
            s.reused_live_ids
        ));
    }
    if s.unknown_frees > 0 {
        note(format_args!(
            "emm replay: {}: {} frees of allocations that were not live (skipped)",
            t.name(),
            s.unknown_frees
        ));
    }
}

fn trace_report(t: &Trace, s: &Summary) -> TraceReport {
    TraceReport {
        trace: t.name().to_owned(),
        format: t.format().name(),
        events: s.events,
        requests: s.requests,
        streams: s.streams,
        peak_live_bytes: s.peak_live_bytes,
        malformed_lines: s.diagnostics.bad,
        reused_live_ids: s.reused_live_ids,
        pytorch: t.torch_figures().map(|f| TorchReport {
            peak_reserved_bytes: f.reserved_known().then_some(f.peak_reserved_bytes),
            reserved_at_dump_bytes: f.reserved_at_dump,
            allocated_at_dump_bytes: f.allocated_at_dump,
            reconstructed_allocations: f.reconstructed_allocs,
            cross_stream_frees: f.cross_stream_frees,
            ooms: f.ooms,
            segment_events: f.segment_events,
        }),
        managers: Vec::new(),
        skipped: Vec::new(),
        left_out: Vec::new(),
        fit: Vec::new(),
        initial_size: None,
        source: Some(t.clone()),
    }
}

/// The JSON's summary of a manager's memory at its peak: `p` taken from a replay
/// of `t` (`events` a pass), `m` read from it.
fn at_peak(t: &Trace, events: u64, p: &emm::trace::PeakMap, m: &peak::Map) -> AtPeak {
    let last = p.event.saturating_sub(1);
    let per = events.max(1);
    AtPeak {
        event: p.event,
        pass: last / per + 1,
        time_us: t.details().and_then(|d| d.time_us(last % per)),
        reserved_bytes: p.reserved_bytes,
        live_bytes: p.live_bytes,
        segments: m.segments.as_ref().map(|s| s.len() as u64),
        live_blocks: m.totals.live_count,
        cached_bytes: m.totals.cached,
        free_bytes: m.totals.free,
        stranded_bytes: m.totals.stranded,
        held_bytes: m.totals.held,
    }
}

/// Why [`POOL_SHARED`] would repeat `pool` on a trace of `summary`, if it
/// would: the trace has one stream, or the pool makes no stream pools.
fn shared_repeats_pool(summary: &Summary) -> Option<&'static str> {
    if summary.streams <= 1 {
        return Some("the trace has one stream: one shared pool is the pool");
    }
    match emm::emm_pool::PoolConfig::from_env() {
        Ok(c) if c.stream_pools == 0 => {
            Some("stream pools are off (EMM_POOL_STREAM_POOLS=0): the pool is one shared pool")
        }
        Ok(c) if c.stream_pools_made() == 0 => Some(
            "the pool keeps a home segment (EMM_POOL_INITIAL_SIZE without the expandable segment), which every stream shares: the pool is one shared pool",
        ),
        Ok(_) => None,
        Err(_) => Some("the pool's settings are invalid"),
    }
}
