//! `capgate`: the command-line front of the capability gate. It parses arguments, calls the
//! libraries, formats output and maps outcomes to exit codes; nothing else.

mod kitref;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes of the external contract (architecture §3).
pub mod exit {
    pub const OK: u8 = 0;
    /// Invalid input or usage; internal error.
    pub const INVALID: u8 = 1;
}

/// capgate runs agent workloads so that they can do what their kits' capabilities grant and
/// nothing else.
///
/// A kit is a descriptor (kit specification v3) that declares every capability the
/// workload needs as a typed, versioned entry. capgate reads kits strictly, composes a
/// workload with its mixins into one grant set, locks it, and enforces it.
#[derive(Debug, Parser)]
#[command(name = "capgate", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read kit descriptors strictly and report every problem (exit 0: all valid, 1: not).
    ///
    /// Each PATH is a descriptor file (YAML or the published JSON form) or a kit directory
    /// holding `kit.yaml`, a `<stem>.yaml` beside `<stem>.dockerfile`, or
    /// `<directory-name>.yaml`. Problems are printed as `file:line:col: path: message`.
    Validate(validate::Args),
    /// Print the JSON Schema of the kit descriptor (generated from capgate's own types).
    Schema,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::INVALID
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Schema => print_schema(),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("capgate: {e:#}");
            ExitCode::from(exit::INVALID)
        }
    }
}

fn print_schema() -> anyhow::Result<u8> {
    let schema = capgate_spec::schema::descriptor_schema();
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(exit::OK)
}
