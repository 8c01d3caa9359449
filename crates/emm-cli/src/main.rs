//! The `emm` command.

use std::process::ExitCode;

mod info;

const USAGE: &str = "usage: emm <command>

commands:
  info      the CUDA driver and each device (or why there is none)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("info") => info::run(),
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
