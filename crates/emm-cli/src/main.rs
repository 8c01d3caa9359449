//! The `emm` command.

use std::process::ExitCode;

mod backend;
mod bench;
mod info;
mod replay;

const USAGE: &str = "usage: emm <command>

commands:
  replay    replay allocation traces through managers (the main job):
            emm replay [TRACE...] [--manager default|pool|hostonly|all] [--json]
  bench     allocate+free pairs through every path, side by side [--json]
  info      the CUDA driver and each device (or why there is none)
";

fn main() -> ExitCode {
    // emm's warnings (e.g. EMM_MEMORY_MANAGER overriding a choice) on stderr; EMM_LOG filters.
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMM_LOG");
    tracing_subscriber::fmt()
        .with_env_filter(filter.unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("info") => info::run(),
        Some("replay") => replay::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("emm: unknown command `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
