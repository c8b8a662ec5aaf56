//! `capgate`: the command-line front of the capability gate. It parses arguments, calls the
//! libraries, formats output and maps outcomes to exit codes; nothing else.

/// `println!` that hands the write's error to the caller (`?`, in a function returning
/// `anyhow::Result`) instead of panicking: a reader that closed the pipe ends the command
/// quietly, a full disk with a message (see `main`).
macro_rules! out {
    () => {
        out!("")
    };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
            .map_err(|e| anyhow::Error::new(e).context("cannot write to standard output"))?
    }};
}

/// A line to stderr that never panics: `eprintln!` panics when stderr is a pipe whose
/// reader left or a full device, which in the middle of `capgate run` would skip stopping
/// the sandbox and removing its state. A message that cannot be written is dropped.
macro_rules! say {
    () => {
        say!("")
    };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let message = format!($($arg)*);
        // While a command's terminal is relayed, capgate's terminal is raw: a line needs
        // its own carriage return there (not in a file stderr was sent to).
        let raw = capgate_sandbox::caller_terminal_is_raw()
            && rustix::termios::isatty(std::io::stderr());
        let message = if raw {
            message.replace('\n', "\r\n") + "\r\n"
        } else {
            message + "\n"
        };
        let _ = std::io::stderr().write_all(message.as_bytes());
    }};
}

mod context;
mod copyback;
mod gateway;
mod identity;
mod interrupt;
mod kitref;
mod kits;
mod lock;
mod peer;
mod policy;
mod ports;
mod resolve;
mod run;
mod sandbox;
mod skills;
mod sshagent;
mod sshbind;
mod state;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes of the external contract (architecture §3).
pub mod exit {
    pub const OK: u8 = 0;
    /// Invalid input or usage; internal error.
    pub const INVALID: u8 = 1;
    /// Refused on purpose: a policy denial, a refused composition, a required capability
    /// this runtime does not honour.
    pub const REFUSED: u8 = 2;
    /// The update widens the grant set and needs approval.
    /// The workload committed a capability violation (`run --fail-on-violation`).
    pub const VIOLATION: u8 = 3;
    pub const NEEDS_APPROVAL: u8 = 4;
    /// `capgate run` could not start the sandbox (as container runtimes say it).
    pub const CANNOT_START: u8 = 125;
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
    /// Check that valid kits say what their authors mean (exit 0: no errors, 1: errors).
    ///
    /// Checks, each with a code: `invalid-host` (a host the gateway cannot judge, an
    /// error: creating a sandbox from the kit would fail), `invalid-path` (a path glob the
    /// gateway cannot judge, an error for the same reason), `wildcard-host` (an allow with `*`), `address-host` (an
    /// allowed IP address or network instead of a name), `shadowed-allow` (an allow a deny of
    /// the same kit and phase overrides), `tier-mismatch` (grants that contradict the
    /// `dev.capgate/determinism@1` tier: changing HTTP methods or a host mount in a
    /// `read-only` workload, every host without `unrestricted`), `unused-install-grant`
    /// (install-phase grants in a workload that runs no install hook), `unwritable-place`
    /// (a `dev.capgate/filesystem@1` place beneath no writable mount), `invalid-read-path`
    /// (a read path outside the workspace, or a write place covering it; an error),
    /// `exec-in-writable-place` (a `dev.capgate/exec@1` program the workload could replace;
    /// an error), `broad-exec` (an exec list entry that is a directory of system programs
    /// or of the dynamic loader), `unusable-inject-domain` (a credential inject domain the
    /// broker cannot use; an error),
    /// `non-ascii-host` (an allowed host written beyond ASCII), `content-file` (an
    /// agent-context@1 `contentFile` that cannot be read). Findings are warnings;
    /// `--strict` makes `wildcard-host`, `non-ascii-host`, `broad-exec` and
    /// `tier-mismatch` errors, and a read-only
    /// grant of changing methods only is always an error. An invalid kit reports its
    /// validation problems (check `invalid`). Printed as `file:line:col: error[check]:
    /// path: message`, then `N errors · M warnings`.
    Lint(validate::LintArgs),
    /// Compose a workload with its mixins and print the merged grant set.
    ///
    /// The kits are resolved (exactly one workload, one provider per name, one owner per
    /// credential, requires/integrates/conflicts), selected (a required capability capgate
    /// does not honour refuses the composition; an optional one is skipped and listed), and
    /// merged; the result is judged strictly. Exit 0, 1 for invalid input, 2 when refused.
    Resolve(resolve::Args),
    /// Record the grant set in a lock; on update, list widenings and stop for approval.
    ///
    /// No lock yet: write it. A composition within the lock: apply silently. A composition
    /// that widens it (a new allow, a removed deny, a new credential, path, port, …): print
    /// each widening as `+ category: detail`, then ask on a terminal; without one, or with
    /// --check, change nothing and exit 4. --approve writes the new lock.
    Lock(lock::Args),
    /// Run a workload in a sandbox whose only exit is the gateway.
    ///
    /// Resolves the kits, gates them against the lock, provisions the rules, starts the
    /// gateway and the kernel sandbox, runs install hooks under install grants, then the
    /// command under runtime grants, and reports what was refused. Each port a kit publishes (port@1) is
    /// reachable on the host's 127.0.0.1 at a port named on stderr while the run lasts, by
    /// the invoking user and root only; an
    /// ssh-agent@1 grant relays the host's agent (`SSH_AUTH_SOCK`), for listing keys and
    /// signing within its phases and bounds only; git-identity@1 gets the host's global
    /// git name and email (or --git-identity). Without `--kit`, a built-in shell with no
    /// network grants; the workspace is the current directory, copied. Run from a terminal
    /// (stdin, in its foreground, stdout not a pipe), the command gets a terminal of the
    /// sandbox's own, relayed as `ssh -t` does: job control, Ctrl-C and Ctrl-Z act inside;
    /// otherwise it reads nothing from the terminal, and output to it still goes through a
    /// terminal of the sandbox's own. Hooks read nothing of stdin. Exits with the
    /// command's status (3 with --fail-on-violation when anything was refused; 125 when the
    /// sandbox cannot start, 126/127 when the command cannot).
    Run(run::RunArgs),
    /// Keep sandboxes of one set of `run` options prepared, so that a `capgate run` with
    /// the same options starts its command in one at once.
    ///
    /// Takes the options of `capgate run` (not --name, --copy-back, --mount or a command),
    /// gates the kits against the lock as `capgate lock` does, and keeps
    /// --ready sandboxes (default 2) prepared for them in the foreground until Ctrl-C: the
    /// kits resolved and gated against the lock, the rules provisioned, the gateway and
    /// the kernel sandbox started, install and startup hooks run. A later `capgate run`
    /// with the same options, in the same directory, not reading a terminal, sends its
    /// command and stdio to one of them and exits with its status; another is prepared at
    /// once. Each sandbox serves one run and is removed after it, as an ephemeral run's is.
    /// The kit files, the lock and the workspace directory are checked again when a run
    /// takes a sandbox: if they changed, that run starts its own sandbox (and the lock gate
    /// judges the change). A run waiting for a sandbox can be interrupted (nothing runs)
    /// and starts its own after 10 s. The command runs in this process's context (cgroup,
    /// rlimits), not the caller's.
    /// Exits 0 when stopped; a sandbox that cannot be prepared stops it with that run's
    /// exit code and messages.
    Warm(run::WarmArgs),
    /// Create (or recreate) a sandbox: resolve its kits, gate them against the lock, record
    /// it, and provision its kit grants as rules (`kit:NAME`, visible, not editable).
    Create(sandbox::CreateArgs),
    /// List sandboxes.
    Ls(sandbox::LsArgs),
    /// Remove a sandbox with its provisioned rules and the user rules scoped to it.
    Rm(sandbox::RmArgs),
    /// Rules, decisions and the audit log: init, ls, allow, deny, rm, check, log.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Run a sandbox's gateway in the foreground: an HTTP proxy that enforces its rules
    /// (also useful on its own, as a policy proxy for any program).
    Gateway(gateway::GatewayArgs),
    /// Print the environment a sandbox's workload receives (proxy, CA and credential
    /// sentinels), one `NAME=value` per line.
    Env(gateway::EnvArgs),
    /// The capgate CA that signs intercepted hosts' certificates.
    #[command(subcommand)]
    Ca(gateway::CaCommand),
    /// Host-side secrets bound to credential services: set (from stdin), ls, rm.
    #[command(subcommand)]
    Secret(gateway::SecretCommand),
    /// Audit events one by one, newest first (decisions and refusals, with the deciding
    /// rule); `capgate policy log` groups them per host.
    Log(policy::LogArgs),
    /// What this host offers the sandbox (user namespaces, Landlock ABI, seccomp and its
    /// user notifications, cgroup controllers for pids and memory, overlayfs) and what is
    /// missing, with how to fix it.
    /// Exit 0 when everything `capgate run` needs is there, 1 otherwise.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the kit descriptor (generated from capgate's own types).
    Schema,
}

fn main() -> ExitCode {
    // The sandbox's helper process: a fresh, single-threaded exec of this binary. It must
    // run before anything else starts a thread.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "__sandbox") {
        return capgate_sandbox::helper_main(argv[2..].to_vec());
    }
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
    harden_process();
    let result = match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Lint(args) => validate::lint(&args),
        Command::Resolve(args) => resolve::run(&args),
        Command::Lock(args) => lock::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Warm(args) => run::warm(&args),
        Command::Create(args) => sandbox::create(&args),
        Command::Ls(args) => sandbox::ls(&args),
        Command::Rm(args) => sandbox::rm(&args),
        Command::Policy(cmd) => policy::run(&cmd),
        Command::Log(args) => policy::events_command(&args),
        Command::Gateway(args) => gateway::run_gateway(&args),
        Command::Env(args) => gateway::env_command(&args),
        Command::Ca(cmd) => gateway::ca_command(&cmd),
        Command::Secret(cmd) => gateway::secret_command(&cmd),
        Command::Schema => print_schema(),
        Command::Doctor { json } => doctor(json),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        // A closed pipe (`capgate … | head`) is the reader's choice, not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::from(exit::OK),
        Err(e) => {
            // Errors quote kit values, paths and lock contents: spelled out, never acting
            // on the terminal.
            say!(
                "capgate: {}",
                capgate_spec::text::printable(&format!("{e:#}"))
            );
            if let Some(hint) = state::full_disk_hint(&e) {
                say!("capgate: {}", capgate_spec::text::printable(&hint));
            }
            ExitCode::from(exit::INVALID)
        }
    }
}

/// `value` as pretty JSON for stdout: the same value, with what would act on a terminal
/// (C1 controls, invisible and bidirectional characters, which serde leaves as they are)
/// written as `\u` escapes. Kit text and workload hosts reach `--json` output too.
pub fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    Ok(capgate_spec::text::json_safe(&text).into_owned())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
        || e.downcast_ref::<serde_json::Error>()
            .and_then(serde_json::Error::io_error_kind)
            == pipe
}

/// capgate holds real secrets and the CA key in memory (the gateway of `run` and
/// `gateway`, `secret set`): no other process of the same user may read them through
/// ptrace or `/proc/<pid>/mem` (not dumpable), and no crash writes them into a core file
/// (soft core limit 0; children may raise it again).
fn harden_process() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let core = rustix::process::getrlimit(rustix::process::Resource::Core);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: core.maximum,
        },
    );
}

fn doctor(json: bool) -> anyhow::Result<u8> {
    let report = capgate_sandbox::probe_host();
    if json {
        out!("{}", crate::json_text(&report)?);
    } else {
        use std::io::Write as _;
        write!(std::io::stdout().lock(), "{report}")
            .map_err(|e| anyhow::Error::new(e).context("cannot write to standard output"))?;
    }
    Ok(if report.problems().next().is_none() {
        exit::OK
    } else {
        exit::INVALID
    })
}

fn print_schema() -> anyhow::Result<u8> {
    let schema = capgate_spec::schema::descriptor_schema();
    out!("{}", crate::json_text(&schema)?);
    Ok(exit::OK)
}
