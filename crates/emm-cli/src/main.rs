//! The `emm` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use emm::trace::torch_model::TorchConf;

mod backend;
mod bench;
mod fit;
mod home;
mod html;
mod info;
mod names;
mod out;
mod peak;
mod replay;
mod report;
mod units;
mod verdict;

/// Choose and share CUDA memory managers; replay your program's allocations
/// through each of them.
#[derive(Parser)]
#[command(name = "emm", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay allocation traces through every manager (the main job). Reads PyTorch
    /// memory snapshots (`torch.cuda.memory._dump_snapshot()`), RMM replay logs and
    /// emm's CSV; without a GPU it replays over a host-memory stand-in.
    #[command(
        after_help = "The table: peak live (bytes the trace holds), peak reserved (bytes the manager \
took), reserved/live after pass 1 and at the end, passes, driver calls (the manager's calls to the driver for \
device memory over every pass: allocations, frees, pieces of an expandable segment mapped, moved and \
unmapped) and time. A line per manager replayed over several passes splits the driver calls into pass 1 \
(the manager growing) and each later pass. In --json, upstream_allocs counts the allocations the manager \
took from what it sits on (the driver or the stand-in). A replay with failed requests is marked FAILED."
    )]
    // --as-fraction changes how --device-memory and --fit cap PyTorch's models:
    // without either it would do nothing, so it needs one (or both).
    #[command(group(clap::ArgGroup::new("sizing").multiple(true)))]
    Replay {
        /// Trace files (`-`: standard input); none replays the bundled GPT
        /// training trace.
        traces: Vec<PathBuf>,
        /// Managers to replay through (repeatable).
        #[arg(short, long, value_enum, default_value = "all")]
        manager: Vec<ManagerArg>,
        /// The traces' format; detected from the content when not given.
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
        /// Also write one self-contained HTML page to FILE (nothing fetched): the
        /// verdict, live and reserved bytes over time, each manager's segment map
        /// at its peak, hover details with the snapshot's stack frames, zoom.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Replay each trace exactly N times back to back through the same
        /// manager (1: the first pass only). Without it, each manager replays the
        /// trace pass after pass until its peak reserved bytes have not moved for
        /// 10 passes in a row, at most 100 passes and 60 s per trace and manager
        /// (the first pass always runs whole; a later one is stopped where it is
        /// at 60 s; the table marks a replay stopped by either bound), and the table shows
        /// reserved/live after pass 1 beside the steady figure. Passes repeat the
        /// steps of a long run: what the trace frees is made again each pass; what
        /// it never frees is kept when made in its first half (weights, optimizer
        /// state) and made again each pass when made in its second half (the last
        /// step's gradients).
        #[arg(long, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        passes: Option<u32>,
        /// Settings for the models of PyTorch's allocator, as PyTorch spells
        /// them (e.g. `max_split_size_mb:128,roundup_power2_divisions:4`);
        /// default: `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`.
        /// `pytorch-native` and `pytorch-expandable` each set
        /// `expandable_segments` their own way.
        #[arg(long, value_name = "SETTINGS")]
        pytorch_conf: Option<String>,
        /// Replay every manager on a device of SIZE (e.g. `24G`, binary units)
        /// and say which run and which fail; emm's managers then run over the
        /// host stand-in with that capacity, on a GPU too.
        #[arg(long, value_name = "SIZE", value_parser = emm::core::parse_bytes, group = "sizing")]
        device_memory: Option<u64>,
        /// For each manager, search the smallest device it runs the trace on
        /// (bisection, confirmed by a run at the answer; a larger size that
        /// failed is reported). A search starts no replay after 120 s: it then
        /// answers with the smallest size that ran and says how close that is.
        #[arg(long, group = "sizing")]
        fit: bool,
        /// For the pool without virtual memory (`EMM_POOL_EXPANDABLE=0`, legacy
        /// IPC's path): search the smallest initial size (`EMM_POOL_INITIAL_SIZE`)
        /// whose home segment holds the trace over the pool's passes with no
        /// segment beside it, over the host stand-in (bisection, confirmed by a
        /// run at the answer; bounded at 120 s as `--fit` is). Needs the pool
        /// among the managers.
        #[arg(long)]
        initial_size: bool,
        /// With `--device-memory` or `--fit`: cap the PyTorch models as
        /// `torch.cuda.set_per_process_memory_fraction` does (that many bytes of
        /// an 80 GB H100, checked against each new segment's rounded size before
        /// it is made), not as a device of that size. emm's managers are capped
        /// as a device either way.
        #[arg(long, requires = "sizing")]
        as_fraction: bool,
        /// What the process holds on the device besides the allocator, added to
        /// `--fit`'s answers. The default is what PyTorch 2.11 held on an H100
        /// beyond its allocator's reserved memory after a matmul and a
        /// convolution (the CUDA context, cuBLAS and cuDNN): 693 MiB
        /// (`python/gpu/checks/fit_check.sh`).
        #[arg(long, value_name = "SIZE", value_parser = emm::core::parse_bytes, default_value = "693M")]
        overhead: u64,
        /// Over the host stand-in: model a device that runs N requests behind
        /// the host, as a GPU does while the host queues work ahead (often most
        /// of a step). An event the pool records then completes only N requests
        /// of the trace later, so its reuse across streams waits as it would on
        /// a GPU; 0 (the default): at once. Only the pool records events; on a
        /// GPU the device's own events are used and this is refused.
        #[arg(long, value_name = "N", default_value_t = 0)]
        device_lag: u64,
        /// Processes of the job on one host that grow their pools in the same
        /// steps (the ranks of a DDP or FSDP2 job, one per GPU): the driver runs
        /// the VMM calls of a host's processes one at a time, so the estimated
        /// time of the calls on expandable segments' pieces is multiplied by N
        /// (four FSDP2 ranks on H100s paid about four times a lone process's
        /// price). Counts and footprints do not change.
        #[arg(long, value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u32).range(1..=65_536))]
        ranks: u32,
    },
    /// Allocate+free pairs through every path, side by side.
    Bench {
        /// Print JSON lines instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The CUDA driver and each device (or why there is none).
    Info,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ManagerArg {
    /// emm's managers and both models of PyTorch's allocator (and
    /// `pool-shared` for a trace of several streams while stream pools are on).
    All,
    Default,
    Pool,
    /// The pool with every stream in one shared arena (as with
    /// `EMM_POOL_STREAM_POOLS=0`): `all` adds it for a trace of several streams
    /// while stream pools are on.
    PoolShared,
    Hostonly,
    /// A model of PyTorch's caching allocator, its defaults (no GPU needed).
    PytorchNative,
    /// The same model with `expandable_segments:True`.
    PytorchExpandable,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    /// emm's CSV (`op,id,size,stream`).
    Emm,
    /// RMM's replay log.
    Rmm,
    /// A PyTorch memory snapshot pickle.
    Pytorch,
}

fn managers(chosen: &[ManagerArg]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for m in chosen {
        let names: Vec<&str> = match m {
            ManagerArg::All => {
                let mut all = emm::BUILTIN_MANAGERS.to_vec();
                // Only where it differs from `pool` (see `replay::Args::shared_where_streams`).
                all.push(names::POOL_SHARED);
                all.extend(names::TORCH_MODELS);
                all
            }
            ManagerArg::Default => vec!["default"],
            ManagerArg::Pool => vec!["pool"],
            ManagerArg::PoolShared => vec![names::POOL_SHARED],
            ManagerArg::Hostonly => vec!["hostonly"],
            ManagerArg::PytorchNative => vec!["pytorch-native"],
            ManagerArg::PytorchExpandable => vec!["pytorch-expandable"],
        };
        for n in names {
            if !v.iter().any(|x| x == n) {
                v.push(n.to_owned());
            }
        }
    }
    v
}

/// The log filter for `EMM_LOG`'s value, and, when the value was rejected, what
/// was given, why, and that `warn` is used instead.
fn log_filter(
    value: Result<String, std::env::VarError>,
) -> (tracing_subscriber::EnvFilter, Option<String>) {
    use tracing_subscriber::EnvFilter;
    match value {
        Err(std::env::VarError::NotPresent) => (EnvFilter::new("warn"), None),
        Err(std::env::VarError::NotUnicode(v)) => (
            EnvFilter::new("warn"),
            Some(format!(
                "EMM_LOG={v:?} is not valid UTF-8; using `warn` instead"
            )),
        ),
        Ok(v) => match EnvFilter::try_new(&v) {
            Ok(f) => (f, None),
            Err(e) => (
                EnvFilter::new("warn"),
                Some(format!(
                    "EMM_LOG={v:?} is not a valid log filter ({e}); using `warn` instead"
                )),
            ),
        },
    }
}

fn main() -> ExitCode {
    // emm's warnings (e.g. EMM_MEMORY_MANAGER overriding a choice) on stderr; EMM_LOG
    // filters (an invalid value: `warn`, and a warning that says so).
    let (filter, rejected) = log_filter(std::env::var("EMM_LOG"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Some(why) = rejected {
        out::note(format_args!("emm: warning: {why}"));
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print(); // help and version included; a closed pipe is not an error here
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = match cli.command {
        Command::Info => info::run(),
        Command::Bench { json } => bench::run(json),
        Command::Replay {
            ref traces,
            format: Some(_),
            ..
        } if traces.is_empty() => {
            out::note(
                "emm replay: --format applies to the trace files given, and none was given (the bundled trace is emm's CSV); give a TRACE or drop --format",
            );
            Ok(ExitCode::from(2))
        }
        Command::Replay {
            traces,
            manager,
            format,
            json,
            html,
            passes,
            pytorch_conf,
            device_memory,
            fit,
            initial_size,
            as_fraction,
            overhead,
            device_lag,
            ranks,
        } => {
            let mut managers = managers(&manager);
            let shared_where_streams = !manager.contains(&ManagerArg::PoolShared);
            let wants_models = managers
                .iter()
                .any(|m| names::TORCH_MODELS.contains(&m.as_str()));
            // PyTorch's settings matter only to its models: read (and refused) only
            // when one is asked for. A value from the environment the models cannot
            // follow (e.g. `backend:cudaMallocAsync`) skips them with a note instead
            // of stopping the run.
            let torch_conf = match (pytorch_conf, wants_models) {
                (Some(c), _) => TorchConf::parse(&c).map_err(|e| e.to_string()),
                (None, false) => Ok(TorchConf::default()),
                (None, true) => Ok(TorchConf::from_env().unwrap_or_else(|e| {
                    out::note(format_args!(
                        "emm replay: the models of PyTorch's allocator are skipped: {e}"
                    ));
                    managers.retain(|m| !names::TORCH_MODELS.contains(&m.as_str()));
                    TorchConf::default()
                })),
            };
            match torch_conf {
                Err(e) => {
                    out::note(format_args!("emm replay: {e}"));
                    Ok(ExitCode::from(2))
                }
                Ok(torch_conf) => replay::run(&replay::Args {
                    traces,
                    managers,
                    format: format.map(|f| match f {
                        FormatArg::Emm => emm::trace::Format::EmmCsv,
                        FormatArg::Rmm => emm::trace::Format::RmmLog,
                        FormatArg::Pytorch => emm::trace::Format::TorchSnapshot,
                    }),
                    json,
                    html,
                    passes,
                    torch_conf,
                    device_memory,
                    fit,
                    initial_size,
                    as_fraction,
                    overhead,
                    device_lag,
                    ranks,
                    shared_where_streams,
                }),
            }
        }
    };
    out::finish(result)
}
