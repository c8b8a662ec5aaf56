//! The sandbox helper as its own program, for this crate's tests (capgate itself calls
//! `capgate_sandbox::helper_main` from its hidden `__sandbox` subcommand).

fn main() -> std::process::ExitCode {
    capgate_sandbox::helper_main(std::env::args_os().skip(1).collect())
}
