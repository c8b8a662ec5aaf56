//! Warm sandboxes: `capgate warm` keeps sandboxes of one composition prepared, and
//! `capgate run` with the same options takes one instead of starting its own.
//!
//! A cold `capgate run` spends most of its start before the command: the kits resolved and
//! gated against the lock, the rules provisioned, the gateway configured, the namespaces
//! cloned, the root built, the process hardened. `capgate warm [RUN OPTIONS]` does all of
//! that ahead of time, in worker processes that are ordinary `capgate run`s (the same code,
//! the same checks, the same teardown) stopped just before the workload's command. Each one
//! tells the supervisor it is ready and waits.
//!
//! A later `capgate run` with the same options (the same kits, args, lock, workspace and
//! flags, the same binary, the same `HOME` and SSH agent) computes the same key, finds the
//! supervisor's socket `DATA/warm/KEY.sock`, and sends its command (`Claim`). The
//! supervisor hands the connection to a ready worker. The worker checks that the options
//! are its own, that its sandbox still runs, and that the kit files, the lock and the
//! workspace are what it was prepared from (else it answers `Stale` and the run starts
//! cold, where the lock gate judges the new kits), and answers `Claimed`. The caller
//! commits with `Go`, which carries its stdin, stdout and stderr (until then nothing of the
//! command has run, and the caller may still give up: a signal, or no answer within
//! [`ANSWER_PATIENCE`]); the worker confirms with `Started`, replays what its preparation
//! printed, takes the caller's stdio as its own, runs the command as any run does, kills
//! what it left inside, prints the refusal summary, and sends the exit status. Only then
//! does the caller exit; the worker tears the sandbox down and removes its state after.
//!
//! The caller forwards SIGINT, SIGTERM and SIGHUP to the worker, which handles them as a
//! cold run does; a caller that dies ends the run as a hang-up. A run that is not eligible
//! (a named sandbox, `--copy-back`, a terminal on stdin: the keyboard relay is the caller's
//! own) or finds no supervisor starts cold, as before.

use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use capgate_sandbox::{recv_frame, send_frame};
use capgate_spec::text::printable;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::event::{PollFd, PollFlags, poll};
use serde::{Deserialize, Serialize};

use super::RunArgs;
use crate::exit;

/// Where a worker finds its control socket to the supervisor.
const WORKER_CTL_FD: i32 = 3;

/// How long a worker waits, after sending the status, for its caller to exit before it
/// removes the sandbox.
const CALLER_EXIT_PATIENCE: Duration = Duration::from_millis(100);

/// How long a worker waits for a handed caller to say what it wants, and to commit.
const CLAIM_PATIENCE: Duration = Duration::from_secs(2);

/// How long a caller waits for a prepared sandbox to answer before it starts its own (the
/// supervisor may be stopped, or all its sandboxes still being prepared).
const ANSWER_PATIENCE: Duration = Duration::from_secs(10);

/// How many callers the supervisor keeps waiting for a ready sandbox; more start cold.
const MAX_WAITING: usize = 64;

/// A file changed this close to a worker's start (or after it) may have been read by its
/// preparation in either version: its sandbox is not offered. (File times come from the
/// kernel's coarse clock, up to a tick behind; a network file system's, from its server.)
const CHANGE_MARGIN: Duration = Duration::from_millis(100);

/// Supervisor to worker.
#[derive(Debug, Serialize, Deserialize)]
enum ToWorker {
    /// A caller's connection (the one descriptor of the frame).
    Hand,
}

/// Worker to supervisor.
#[derive(Debug, Serialize, Deserialize)]
enum FromWorker {
    /// Prepared: the next caller may be handed over.
    Ready { sandbox: String },
}

/// Caller to worker.
#[derive(Debug, Serialize, Deserialize)]
enum FromCaller {
    /// The command (empty: the default shell), and the caller's options spelled out,
    /// which must be the worker's (the socket's name is only their digest).
    Claim { argv: Vec<String>, options: String },
    /// After `Claimed`: run it, with the caller's stdin, stdout and stderr (attached: not
    /// before, so that a caller that leaves earlier leaves none of them held in a queue).
    /// Before this, the caller may still leave, and nothing runs.
    Go,
    /// A signal the caller received, for the run.
    Signal { number: i32 },
}

/// Worker to caller.
#[derive(Debug, Serialize, Deserialize)]
enum ToCaller {
    /// The sandbox cannot take this run (why): start cold.
    Stale { why: String },
    /// The sandbox is the caller's if it says `Go`.
    Claimed,
    /// `Go` was taken: the command starts (before this, nothing ran).
    Started,
    /// The run's exit status.
    Exited { code: u8 },
}

/// `capgate warm`: the options of the `capgate run`s it prepares, and how many to keep.
#[derive(Debug, clap::Args)]
pub struct WarmArgs {
    /// How many prepared sandboxes to keep ready (1–16). Each is a whole sandbox: a
    /// helper, an init and a gateway, about 25 MiB resident (4 MiB of it its own, the
    /// rest the binary they share).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    ready: u32,
    #[command(flatten)]
    run: RunArgs,
}

/// A run's options, spelled out: equal for `capgate warm` and `capgate run` given the same
/// options in the same place, by the same binary.
fn description(args: &RunArgs) -> Result<String> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let workspace = canonical(&args.workspace_dir()?);
    let kits: Vec<PathBuf> = args.kits.iter().map(|k| canonical(k)).collect();
    let env = |name: &str| std::env::var_os(name);
    // Everything `run` reads from its options and environment before the command, spelled
    // out; a field added to `RunArgs` must be added here (the destructuring says so).
    let RunArgs {
        kits: _,
        args: kit_args,
        name,
        workspace: _,
        mount,
        copy_back,
        memory,
        cpus,
        pids,
        fail_on_violation,
        approve,
        lock,
        upstream_ca,
        dangerously_resolve,
        dangerously_skip_limits,
        skills,
        git_identity,
        warm_ctl: _,
        command: _,
    } = args;
    use std::os::unix::fs::MetadataExt as _;
    let exe = std::env::current_exe().ok();
    // The binary itself, not only its path: a rebuild is another program.
    let built = exe
        .as_deref()
        .and_then(|e| std::fs::metadata(e).ok())
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec()));
    Ok(format!(
        "capgate {} {exe:?} {built:?}\nkits {kits:?}\nargs {kit_args:?}\nname {name:?}\nworkspace {workspace:?}\n\
         mount {mount} copy_back {copy_back} memory {memory:?} cpus {cpus:?} pids {pids}\n\
         fail_on_violation {fail_on_violation} approve {approve}\nlock {:?}\nupstream_ca {:?}\n\
         resolve {dangerously_resolve:?} skip_limits {dangerously_skip_limits}\nskills {skills:?}\n\
         identity {git_identity:?}\nHOME {:?} SSH_AUTH_SOCK {:?} XDG_CONFIG_HOME {:?}",
        env!("CARGO_PKG_VERSION"),
        lock.as_deref().map(canonical),
        upstream_ca.as_deref().map(canonical),
        env("HOME"),
        env("SSH_AUTH_SOCK"),
        env("XDG_CONFIG_HOME"),
    ))
}

/// The signals that end a run (Ctrl-C, a service manager, a closed terminal): a caller
/// passes them on to the run it handed over, the supervisor stops on them.
fn relayed_signals() -> SigSet {
    SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP])
}

/// The name of the supervisor's socket for a run's options (`description`).
fn key(described: &str) -> String {
    let digest = capgate_resolve::digest_of(described.as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    hex[..32.min(hex.len())].to_owned()
}

/// The supervisor's socket for a run's options (`description`).
fn socket_path(described: &str) -> Result<PathBuf> {
    Ok(crate::state::data_dir()?
        .join("warm")
        .join(format!("{}.sock", key(described))))
}

// ---------------------------------------------------------------------------------------
// The caller: `capgate run` taking a prepared sandbox.

/// How a remote run ended, for the caller.
enum Remote {
    /// The worker ran the command: its status.
    Exited(u8),
    /// Nothing ran: the caller starts cold, after saying why if there is something to say.
    Cold { why: Option<String> },
    /// Nothing ran, and a signal came while the caller waited: it ends as interrupted.
    Interrupted { signal: i32 },
    /// The worker took the command and vanished without a status.
    Lost,
}

/// Runs `args` in a prepared sandbox if a `capgate warm` keeps one for these options:
/// `Some(exit status)`, or `None` when the run must start cold (nothing ran).
pub fn claim(args: &RunArgs) -> Option<u8> {
    if args.name.is_some()
        || args.copy_back
        || args.warm_ctl.is_some()
        || rustix::termios::isatty(std::io::stdin())
    {
        return None;
    }
    let described = description(args).ok()?;
    let path = socket_path(&described).ok()?;
    // No supervisor (no socket, or a dead one's), or one whose queue is full: the common
    // case, said nothing about.
    let stream = connect(&path)?;
    // Signals wait while the run is elsewhere, and are passed on to it.
    let signals = relayed_signals();
    let mut before = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut before))
        .ok()?;
    let remote = match SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC) {
        Ok(signalfd) => remote(&stream, (&args.command, described), &signalfd),
        Err(_) => Remote::Cold { why: None },
    };
    // Signals read from the signalfd are taken; the mask is as it was before.
    let restored = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    match remote {
        Remote::Exited(code) => Some(code),
        Remote::Lost => {
            say!("capgate: the prepared sandbox ended without reporting the command's status");
            Some(exit::CANNOT_START)
        }
        // Nothing ran; the caller ends as interrupted programs do.
        Remote::Interrupted { signal } => {
            Some(128u8.saturating_add(u8::try_from(signal).unwrap_or(0)))
        }
        Remote::Cold { why } => {
            if let Some(why) = why {
                say!("capgate: {}; starting a new sandbox", printable(&why));
            }
            if restored.is_err() {
                // Signals would stay blocked for the cold run's own handling.
                say!("capgate: the signal mask could not be restored");
                return Some(exit::INVALID);
            }
            None
        }
    }
}

/// Connects without waiting: a full listen queue (a stopped supervisor) is no supervisor.
fn connect(path: &Path) -> Option<UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .ok()?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path).ok()?).ok()?;
    rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::empty()).ok()?;
    Some(UnixStream::from(fd))
}

fn remote(
    stream: &UnixStream,
    (argv, options): (&[String], String),
    signalfd: &SignalFd,
) -> Remote {
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    let claim = FromCaller::Claim {
        argv: argv.to_vec(),
        options,
    };
    if send_frame(stream.as_fd(), &claim, &[]).is_err() {
        return Remote::Cold { why: None };
    }
    let deadline = Instant::now() + ANSWER_PATIENCE;
    // Whether `Go` was sent (the caller is committed), and whether the worker took it (from
    // then on the run is the worker's; before, an end of the connection means nothing ran).
    let (mut committed, mut started) = (false, false);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if !committed && left.is_zero() {
            // Leaving before `Go`: the worker sees the connection close and runs nothing.
            return Remote::Cold {
                why: Some(format!(
                    "no prepared sandbox answered within {} s",
                    ANSWER_PATIENCE.as_secs()
                )),
            };
        }
        let timeout = rustix::event::Timespec::try_from(left).ok();
        let mut fds = [
            PollFd::new(stream, PollFlags::IN),
            PollFd::new(signalfd, PollFlags::IN),
        ];
        match poll(&mut fds, if committed { None } else { timeout.as_ref() }) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) if started => return Remote::Lost,
            Err(_) => return Remote::Cold { why: None },
        }
        let (from_worker, signalled) = (
            !fds[0].revents().is_empty(),
            fds[1].revents().contains(PollFlags::IN),
        );
        if signalled && let Ok(Some(info)) = signalfd.read_signal() {
            let number = i32::try_from(info.ssi_signo).unwrap_or(0);
            if !committed {
                return Remote::Interrupted { signal: number };
            }
            let _ = send_frame(stream.as_fd(), &FromCaller::Signal { number }, &[]);
        }
        if !from_worker {
            continue;
        }
        match recv_frame::<ToCaller>(stream.as_fd()) {
            Ok(Some((ToCaller::Claimed, _))) if !committed => {
                if send_frame(stream.as_fd(), &FromCaller::Go, &stdio).is_err() {
                    return Remote::Cold { why: None };
                }
                committed = true;
            }
            Ok(Some((ToCaller::Started, _))) if committed && !started => started = true,
            Ok(Some((ToCaller::Exited { code }, _))) if started => return Remote::Exited(code),
            Ok(Some((ToCaller::Stale { why }, _))) if !committed => {
                return Remote::Cold { why: Some(why) };
            }
            _ if started => return Remote::Lost,
            _ => return Remote::Cold { why: None },
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worker: a `capgate run --warm-ctl 3` that stops before the command.

/// The inputs a prepared sandbox was made from: the kit files (descriptors, context
/// bodies) and the lock, as named (a link re-pointed is a change); the kit directories
/// (which descriptor each names) and the workspace (the same directory, not one put in its
/// place). Not offered at all (`unfit`) when the preparation may have read another version
/// than the one recorded.
#[derive(Debug, Default)]
struct Inputs {
    /// Each kit's descriptor and the digest of the bytes the composition was made from
    /// (exact, whenever they changed).
    descriptors: Vec<(PathBuf, String)>,
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    digest: String,
    unfit: Option<String>,
}

impl Inputs {
    fn digest(files: &[PathBuf], dirs: &[PathBuf]) -> String {
        use std::os::unix::fs::MetadataExt as _;
        let mut seen = Vec::new();
        for file in files {
            let resolved = std::fs::canonicalize(file).ok();
            seen.extend_from_slice(format!("\0{file:?} is {resolved:?}").as_bytes());
            match std::fs::read(file) {
                Ok(bytes) => {
                    seen.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                    seen.extend_from_slice(&bytes);
                }
                Err(e) => {
                    seen.extend_from_slice(format!("\0unreadable: {:?}", e.kind()).as_bytes())
                }
            }
        }
        for dir in dirs {
            let resolved = std::fs::canonicalize(dir).ok();
            let named = crate::kitref::descriptor_path(dir).ok();
            let identity = std::fs::metadata(dir).map(|m| (m.dev(), m.ino())).ok();
            seen.extend_from_slice(
                format!("\0{dir:?} is {resolved:?} {identity:?} names {named:?}").as_bytes(),
            );
        }
        capgate_resolve::digest_of(&seen)
    }

    /// Why the sandbox cannot take a run now, if it cannot.
    fn changed(&self) -> Option<String> {
        if let Some(why) = &self.unfit {
            return Some(why.clone());
        }
        let descriptors_changed = self.descriptors.iter().any(|(path, digest)| {
            std::fs::read(path).map_or(true, |bytes| capgate_resolve::digest_of(&bytes) != *digest)
        });
        (descriptors_changed || Self::digest(&self.files, &self.dirs) != self.digest).then(|| {
            "the prepared sandboxes were made from kit files, a lock or a workspace directory that changed since".to_owned()
        })
    }
}

/// A worker's side: its supervisor, what it printed while preparing, and the caller once
/// one has claimed it.
pub struct Worker {
    ctl: OwnedFd,
    /// What the preparation printed (stdout and stderr), replayed to the caller.
    log: std::fs::File,
    /// The supervisor's stderr: for a worker that ends before any caller came, and for
    /// what a worker says after its caller has its status.
    own_stderr: OwnedFd,
    /// When this worker started: inputs changed after it are not trusted.
    started: std::time::SystemTime,
    inputs: Inputs,
    /// This run's options spelled out, for the caller's to match.
    options: String,
    caller: Option<UnixStream>,
    /// Told when the caller has hung up after its status was sent.
    hung_up: Option<std::sync::mpsc::Receiver<()>>,
    /// Set once the exit status is sent: the caller's hang-up is then no signal.
    finished: Arc<AtomicBool>,
    /// A caller was handed over (whether or not it then claimed the sandbox).
    handed: bool,
}

impl Worker {
    /// Takes the control socket the supervisor passed (`--warm-ctl 3`) and sends what the
    /// preparation prints into a log until a caller comes. Call first, before any thread.
    pub fn adopt(fd: i32, args: &RunArgs) -> Result<Worker> {
        if fd != WORKER_CTL_FD {
            bail!("--warm-ctl is internal to `capgate warm`");
        }
        let ctl = capgate_sandbox::take_inherited_fd(fd)
            .context("--warm-ctl: no control socket from `capgate warm`")?;
        let started = std::time::SystemTime::now();
        // The supervisor blocks these to read them from a signalfd, and a blocked mask
        // survives fork and exec: a run handles them itself.
        relayed_signals()
            .thread_unblock()
            .context("cannot unblock signals")?;
        let options = description(args)?;
        let log = rustix::fs::memfd_create("capgate-warm-log", rustix::fs::MemfdFlags::CLOEXEC)
            .context("cannot make the preparation's log")?;
        let own_stderr = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .context("cannot keep stderr")?;
        rustix::stdio::dup2_stdout(&log).context("cannot redirect stdout")?;
        rustix::stdio::dup2_stderr(&log).context("cannot redirect stderr")?;
        Ok(Worker {
            ctl,
            log: std::fs::File::from(log),
            own_stderr,
            started,
            inputs: Inputs::default(),
            options,
            caller: None,
            hung_up: None,
            finished: Arc::new(AtomicBool::new(false)),
            handed: false,
        })
    }

    /// Records what the composition was made from, to check it when a caller claims the
    /// sandbox: each kit's descriptor with the digest of the bytes it was made from, the
    /// other files read (the lock, context bodies), the directories it shows; `lost`: kits
    /// whose descriptor cannot be found any more.
    pub fn watch_inputs(
        &mut self,
        descriptors: Vec<(PathBuf, String)>,
        (files, dirs): (Vec<PathBuf>, Vec<PathBuf>),
        lost: &[String],
    ) {
        let digest = Inputs::digest(&files, &dirs);
        let since = self
            .started
            .checked_sub(CHANGE_MARGIN)
            .unwrap_or(self.started);
        let unfit = unfit(&files, lost, since);
        self.inputs = Inputs {
            descriptors,
            files,
            dirs,
            digest,
            unfit,
        };
    }

    /// Tells the supervisor this sandbox is ready and waits for a caller: its command, with
    /// the caller's stdio installed as this process's own. `None`: no caller will come (the
    /// supervisor stopped, a signal came), or the one that came could not take it (other
    /// options, changed inputs, the sandbox ended, no `Go`).
    pub fn claim(
        &mut self,
        sandbox: &str,
        signalled: impl Fn() -> bool,
        mut alive: impl FnMut() -> bool,
    ) -> Result<Option<Vec<String>>> {
        let ready = FromWorker::Ready {
            sandbox: sandbox.to_owned(),
        };
        if send_frame(self.ctl.as_fd(), &ready, &[]).is_err() {
            return Ok(None);
        }
        let caller = loop {
            if signalled() {
                return Ok(None);
            }
            let mut fds = [PollFd::new(&self.ctl, PollFlags::IN)];
            let tick = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 200_000_000,
            };
            match poll(&mut fds, Some(&tick)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(e).context("cannot wait for a caller"),
            }
            match recv_frame::<ToWorker>(self.ctl.as_fd()) {
                Ok(Some((ToWorker::Hand, mut fds))) if fds.len() == 1 => {
                    break UnixStream::from(fds.remove(0));
                }
                // The supervisor stopped (or said something else): no caller comes.
                _ => return Ok(None),
            }
        };
        // Handed over: whatever happens next, this sandbox is not offered again, and what
        // its preparation printed is the caller's (or nobody's), not the supervisor's.
        self.handed = true;
        caller.set_read_timeout(Some(CLAIM_PATIENCE))?;
        let argv = match recv_frame::<FromCaller>(caller.as_fd()) {
            Ok(Some((FromCaller::Claim { argv, options }, _))) if options == self.options => argv,
            // Other options (a digest that matched by chance), or nothing usable.
            Ok(Some((FromCaller::Claim { .. }, _))) => {
                let why = "the prepared sandboxes are for other options".to_owned();
                let _ = send_frame(caller.as_fd(), &ToCaller::Stale { why }, &[]);
                return Ok(None);
            }
            _ => return Ok(None),
        };
        let unfit = if alive() {
            self.inputs.changed()
        } else {
            Some("the prepared sandbox had ended".to_owned())
        };
        if let Some(why) = unfit {
            let _ = send_frame(caller.as_fd(), &ToCaller::Stale { why }, &[]);
            return Ok(None);
        }
        // Nothing runs unless the caller, told the sandbox is its, commits.
        if send_frame(caller.as_fd(), &ToCaller::Claimed, &[]).is_err() {
            return Ok(None);
        }
        let stdio = match recv_frame::<FromCaller>(caller.as_fd()) {
            Ok(Some((FromCaller::Go, stdio))) if stdio.len() == 3 => stdio,
            _ => return Ok(None),
        };
        caller.set_read_timeout(None)?;
        send_frame(caller.as_fd(), &ToCaller::Started, &[])
            .context("the caller went away before its command started")?;
        // What the preparation printed, as a cold run would have shown it (on stderr, its
        // hooks' stdout too); then the caller's stdio is this process's.
        self.replay_log(stdio[2].as_fd());
        rustix::stdio::dup2_stdin(&stdio[0]).context("cannot take the caller's stdin")?;
        rustix::stdio::dup2_stdout(&stdio[1]).context("cannot take the caller's stdout")?;
        rustix::stdio::dup2_stderr(&stdio[2]).context("cannot take the caller's stderr")?;
        drop(stdio);
        // The caller's signals come as frames; its end of the connection closing before
        // the status was sent means it died: a hang-up, as a closed terminal is.
        let listen = caller.try_clone()?;
        let finished = Arc::clone(&self.finished);
        let (hang_up, hung_up) = std::sync::mpsc::channel();
        self.hung_up = Some(hung_up);
        std::thread::Builder::new()
            .name("capgate-warm-caller".to_owned())
            .spawn(move || follow_caller(&listen, &finished, &hang_up))?;
        self.caller = Some(caller);
        Ok(Some(argv))
    }

    /// Writes what the preparation printed to `to` (best effort: lost output is no reason
    /// to stop a run).
    fn replay_log(&mut self, to: std::os::fd::BorrowedFd<'_>) {
        let mut printed = Vec::new();
        if self.log.rewind().is_ok()
            && self.log.read_to_end(&mut printed).is_ok()
            && let Ok(to) = to.try_clone_to_owned()
        {
            let _ = std::fs::File::from(to).write_all(&printed);
        }
    }

    /// Sends the run's exit status to the caller, if one claimed this sandbox; what this
    /// process says afterwards (its state's removal) goes to the supervisor's stderr.
    pub fn finish(&mut self, code: u8) {
        self.finished.store(true, Ordering::SeqCst);
        if let Some(caller) = self.caller.take() {
            let _ = send_frame(caller.as_fd(), &ToCaller::Exited { code }, &[]);
            drop(caller);
            let _ = rustix::stdio::dup2_stdout(&self.own_stderr);
            let _ = rustix::stdio::dup2_stderr(&self.own_stderr);
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = rustix::stdio::dup2_stdin(&null);
            }
            // The caller exits before this sandbox's removal (and the supervisor's next
            // preparation, which waits for this process to end) takes the CPU from it.
            if let Some(hung_up) = self.hung_up.take() {
                let _ = hung_up.recv_timeout(CALLER_EXIT_PATIENCE);
            }
        }
    }
}

/// Why a sandbox prepared from `files` (the lock, context bodies: what has no digest of
/// the bytes read) must not be offered: a kit whose descriptor is `lost`, or a file changed
/// since `since` (the preparation may have read either version).
fn unfit(files: &[PathBuf], lost: &[String], since: std::time::SystemTime) -> Option<String> {
    if let Some(kit) = lost.first() {
        return Some(format!(
            "the kit `{kit}` cannot be found where the prepared sandboxes read it"
        ));
    }
    // The name (a link re-pointed) and what it names (a file rewritten). Directories
    // change as files come and go in them (the lock written beside a kit): what they name
    // is in the digest, and the descriptors are held to the bytes they were made from.
    let recent = files.iter().find(|p| {
        [std::fs::symlink_metadata(p), std::fs::metadata(p)]
            .into_iter()
            .any(|m| {
                m.and_then(|m| ctime(&m))
                    .is_ok_and(|changed| changed >= since)
            })
    })?;
    Some(format!(
        "`{}` changed while the prepared sandboxes were being made",
        recent.display()
    ))
}

/// The change time of a file (the kernel sets it on every change; nobody can set it back).
fn ctime(m: &std::fs::Metadata) -> std::io::Result<std::time::SystemTime> {
    use std::os::unix::fs::MetadataExt as _;
    let secs = u64::try_from(m.ctime()).map_err(std::io::Error::other)?;
    let nanos = u32::try_from(m.ctime_nsec()).map_err(std::io::Error::other)?;
    Ok(std::time::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// The claimed run's side of the caller's connection: its signals, raised here; its end
/// before the status, a hang-up.
fn follow_caller(
    caller: &UnixStream,
    finished: &AtomicBool,
    hang_up: &std::sync::mpsc::Sender<()>,
) {
    use rustix::process::Signal as S;
    let me = rustix::process::getpid();
    loop {
        let signal = match recv_frame::<FromCaller>(caller.as_fd()) {
            Ok(Some((FromCaller::Signal { number }, _))) => match S::from_named_raw(number) {
                Some(s @ (S::INT | S::TERM | S::HUP)) => s,
                _ => continue,
            },
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => {
                if finished.load(Ordering::SeqCst) {
                    let _ = hang_up.send(());
                    return;
                }
                S::HUP
            }
        };
        let _ = rustix::process::kill_process(me, signal);
        if signal == S::HUP {
            return;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.caller.is_some() {
            // A claimed run that ended without its status (an error): the caller is told.
            self.finish(exit::INVALID);
        } else if !self.handed {
            // No caller came: what the preparation printed goes to the supervisor (a
            // lock refusal, a kit error).
            if let Ok(stderr) = self.own_stderr.try_clone() {
                self.replay_log(stderr.as_fd());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The supervisor: `capgate warm`.

/// A worker the supervisor started and has not handed a caller yet.
struct Pending {
    child: Child,
    ctl: OwnedFd,
    /// Its sandbox's name once it said it is ready.
    ready: Option<String>,
}

/// The arguments of a worker: the supervisor's own (`capgate warm …`, no option comes
/// before the subcommand), as `run`, without `--ready`.
fn worker_args(argv: &[std::ffi::OsString]) -> Result<Vec<std::ffi::OsString>> {
    if argv.get(1).is_none_or(|a| a != "warm") {
        bail!("`capgate warm` must be called as `capgate warm [OPTIONS]`");
    }
    let mut out: Vec<std::ffi::OsString> = vec![
        "run".into(),
        "--warm-ctl".into(),
        WORKER_CTL_FD.to_string().into(),
    ];
    let mut rest = argv[2..].iter();
    while let Some(a) = rest.next() {
        if a == "--" {
            out.push(a.clone());
            out.extend(rest.cloned());
            break;
        }
        if a == "--ready" {
            rest.next();
            continue;
        }
        if a.as_encoded_bytes().starts_with(b"--ready=") {
            continue;
        }
        out.push(a.clone());
    }
    Ok(out)
}

fn spawn_worker(exe: &Path, args: &[std::ffi::OsString]) -> Result<Pending> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .context("cannot make a worker's control socket")?;
    let mut cmd = Command::new(exe);
    // A process group of its own: a Ctrl-C at the supervisor's terminal stops the
    // supervisor, which ends the prepared sandboxes, not the runs they serve.
    cmd.arg0("capgate")
        .args(args)
        .stdin(Stdio::null())
        .process_group(0);
    capgate_sandbox::pass_fd_as(&mut cmd, theirs.as_raw_fd(), WORKER_CTL_FD);
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{}`", exe.display()))?;
    Ok(Pending {
        child,
        ctl: ours,
        ready: None,
    })
}

/// `capgate warm`: keeps `--ready` sandboxes of the run options prepared until stopped.
pub fn warm(args: &WarmArgs) -> Result<u8> {
    let run = &args.run;
    let refused = if run.name.is_some() {
        Some("--name (a named sandbox keeps state between its runs)")
    } else if run.copy_back {
        Some("--copy-back")
    } else if run.mount {
        Some("--mount (hooks would run in the host directory for runs nobody asked for yet)")
    } else if !run.command.is_empty() {
        Some("a command (the runs that take a prepared sandbox bring their own)")
    } else if run.warm_ctl.is_some() {
        Some("--warm-ctl")
    } else {
        None
    };
    if let Some(what) = refused {
        say!("capgate warm: {what} cannot be prepared ahead");
        return Ok(exit::INVALID);
    }
    // The lock gate first, as `capgate lock` (on a terminal it asks about a widening): a
    // refused composition prepares nothing, and the kit and lock files are in place before
    // the preparations read them (a file that changes while one reads it spoils it).
    let kits = if run.kits.is_empty() {
        vec![super::default_kit()?]
    } else {
        run.kits.clone()
    };
    let gate = crate::lock::Args::of_run(kits, run.args.clone(), run.lock.clone(), run.approve);
    let code = crate::lock::run(&gate)?;
    if code != exit::OK {
        return Ok(code);
    }
    // A lock (or built-in kit) just written is older than the preparations by more than
    // the margin they allow for the clock of file times.
    std::thread::sleep(CHANGE_MARGIN * 2);
    let path = socket_path(&description(run)?)?;
    let dir = path.parent().context("the socket has no directory")?;
    crate::state::private_dir(dir)?;
    if path.as_os_str().len() >= 108 {
        bail!(
            "the socket path `{}` is too long for a UNIX socket (107 bytes); use a shorter CAPGATE_HOME",
            path.display()
        );
    }
    // One supervisor per set of options: the socket is its while it holds this lock.
    let lock_path = path.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open `{}`", lock_path.display()))?;
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        say!(
            "capgate warm: another `capgate warm` already keeps sandboxes of these options ready ({})",
            path.display()
        );
        return Ok(exit::INVALID);
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .with_context(|| format!("cannot listen at `{}`", path.display()))?;
    listener.set_nonblocking(true)?;
    let signals = relayed_signals();
    signals.thread_block().context("cannot block signals")?;
    let signalfd =
        SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC).context("cannot watch signals")?;
    let exe = std::env::current_exe().context("cannot find the capgate executable")?;
    let worker_argv = worker_args(&std::env::args_os().collect::<Vec<_>>())?;
    let outcome = supervise(
        args.ready as usize,
        listener,
        &signalfd,
        || spawn_worker(&exe, &worker_argv),
        &path,
    );
    // Removed while the lock is held: never another supervisor's socket.
    let _ = std::fs::remove_file(&path);
    drop(lock);
    outcome
}

/// A worker running a caller's command. Its replacement waits for the worker to exit (so
/// that the preparation does not compete with the run for the CPU), or [`REPLACE_AFTER`]
/// for a long run. Its control socket closes when it exits.
struct Busy {
    child: Child,
    ctl: Option<OwnedFd>,
    since: Instant,
}

/// How long a run holds its place in the pool before its replacement is prepared anyway.
const REPLACE_AFTER: Duration = Duration::from_secs(1);

/// Ends the unhanded workers (SIGTERM: each stops its sandbox and removes its state as an
/// interrupted run does) and waits for them; a second signal stops the waiting.
fn stop_pending(pending: Vec<Pending>, signalfd: &SignalFd) {
    let mut children: Vec<Child> = pending.into_iter().map(|p| p.child).collect();
    for child in &children {
        if let Some(pid) = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    for child in &mut children {
        while let Ok(None) = child.try_wait() {
            if let Ok(Some(_)) = signalfd.read_signal() {
                say!("capgate warm: not waiting for the prepared sandboxes to be removed");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn supervise(
    ready: usize,
    listener: UnixListener,
    signalfd: &SignalFd,
    spawn: impl Fn() -> Result<Pending>,
    path: &Path,
) -> Result<u8> {
    let mut pending: Vec<Pending> = Vec::new();
    let mut busy: Vec<Busy> = Vec::new();
    let mut done: Vec<Child> = Vec::new();
    let mut callers: std::collections::VecDeque<UnixStream> = Default::default();
    let mut announced = false;
    let me = rustix::process::getuid();
    // The signalfd is non-blocking from here, so that `stop_pending` can poll it.
    let _ = rustix::fs::fcntl_setfl(signalfd, rustix::fs::OFlags::NONBLOCK);
    loop {
        // A run whose worker ended, or that has gone on for a while, gives its place back.
        let (settled, running): (Vec<Busy>, Vec<Busy>) = busy
            .into_iter()
            .partition(|b| b.ctl.is_none() || b.since.elapsed() >= REPLACE_AFTER);
        busy = running;
        done.extend(settled.into_iter().map(|b| b.child));
        done.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        while pending.len() + busy.len() < ready {
            match spawn() {
                Ok(p) => pending.push(p),
                Err(e) => {
                    stop_pending(pending, signalfd);
                    return Err(e);
                }
            }
        }
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 250_000_000,
        };
        let mut fds: Vec<PollFd<'_>> = vec![
            PollFd::new(&listener, PollFlags::IN),
            PollFd::new(signalfd, PollFlags::IN),
        ];
        fds.extend(pending.iter().map(|p| PollFd::new(&p.ctl, PollFlags::IN)));
        fds.extend(
            busy.iter()
                .filter_map(|b| b.ctl.as_ref())
                .map(|ctl| PollFd::new(ctl, PollFlags::IN)),
        );
        match poll(&mut fds, Some(&tick)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).context("cannot wait"),
        }
        let events: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        if events[1] {
            let _ = signalfd.read_signal();
            say!("capgate warm: stopping; the prepared sandboxes are removed");
            // New runs start cold from now; the waiting ones are let go (nothing of theirs
            // ran), and start cold too.
            let _ = std::fs::remove_file(path);
            drop(listener);
            callers.clear();
            stop_pending(pending, signalfd);
            return Ok(exit::OK);
        }
        if events[0] {
            loop {
                match listener.accept() {
                    // Only this user's runs (the directory is private already), and not
                    // more than can be served soon: the others start cold at once.
                    Ok((caller, _)) => match rustix::net::sockopt::socket_peercred(&caller) {
                        Ok(cred) if cred.uid == me && callers.len() < MAX_WAITING => {
                            callers.push_back(caller);
                        }
                        _ => {}
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin on the listener.
                        say!("capgate warm: cannot accept a run: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                        break;
                    }
                }
            }
        }
        // The busy workers' events: a worker's exit (its control socket closes).
        for (b, &event) in busy
            .iter_mut()
            .filter(|b| b.ctl.is_some())
            .zip(&events[2 + pending.len()..])
        {
            if event {
                b.ctl = None;
            }
        }
        let mut ended = Vec::new();
        for (i, p) in pending.iter_mut().enumerate() {
            if !events[2 + i] {
                continue;
            }
            match recv_frame::<FromWorker>(p.ctl.as_fd()) {
                Ok(Some((FromWorker::Ready { sandbox }, _))) => {
                    say!("capgate warm: the sandbox {sandbox} is ready");
                    p.ready = Some(sandbox);
                }
                _ => ended.push(i),
            }
        }
        for i in ended.into_iter().rev() {
            let mut p = pending.remove(i);
            let status = p.child.wait().ok().and_then(|s| s.code());
            let exited = status.map_or_else(|| "on a signal".to_owned(), |c| c.to_string());
            if let Some(sandbox) = &p.ready {
                // A prepared sandbox that ended (its worker was killed): another is made.
                say!(
                    "capgate warm: the prepared sandbox {sandbox} ended (exit {exited}); preparing another"
                );
                continue;
            }
            say!(
                "capgate warm: a sandbox could not be prepared (its run exited {exited}); stopping"
            );
            let _ = std::fs::remove_file(path);
            stop_pending(pending, signalfd);
            return Ok(status
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(exit::INVALID));
        }
        if !announced && pending.len() == ready && pending.iter().all(|p| p.ready.is_some()) {
            announced = true;
            let sandboxes = if ready == 1 { "sandbox" } else { "sandboxes" };
            say!(
                "capgate warm: {ready} {sandboxes} ready; `capgate run` with the same options (not from a terminal) takes one (Ctrl-C stops)"
            );
        }
        // Callers that left while waiting (they started cold) would waste a sandbox.
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        callers.retain(|c| {
            let mut fds = [PollFd::new(c, PollFlags::RDHUP)];
            !matches!(poll(&mut fds, Some(&now)), Ok(1))
        });
        // Callers go to ready workers, oldest first.
        while !callers.is_empty() {
            let Some(i) = pending.iter().position(|p| p.ready.is_some()) else {
                break;
            };
            let Some(caller) = callers.pop_front() else {
                break;
            };
            let p = pending.remove(i);
            let handed = send_frame(p.ctl.as_fd(), &ToWorker::Hand, &[caller.as_fd()]);
            say!(
                "capgate warm: a run took the prepared sandbox {}{}",
                p.ready.as_deref().unwrap_or("?"),
                if handed.is_ok() { "" } else { " (it had gone)" }
            );
            busy.push(Busy {
                child: p.child,
                ctl: handed.is_ok().then_some(p.ctl),
                since: Instant::now(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn os(v: &[&str]) -> Vec<std::ffi::OsString> {
        v.iter().map(Into::into).collect()
    }

    #[test]
    fn a_workers_arguments_are_the_runs_without_ready() {
        let argv = os(&[
            "capgate",
            "warm",
            "--ready",
            "3",
            "--kit",
            "warm",
            "--ready=4",
            "--arg",
            "a=b",
            "--",
            "--ready",
        ]);
        assert_eq!(
            worker_args(&argv).unwrap(),
            os(&[
                "run",
                "--warm-ctl",
                "3",
                "--kit",
                "warm",
                "--arg",
                "a=b",
                "--",
                "--ready"
            ])
        );
        // Only as `capgate warm …`.
        assert!(worker_args(&os(&["warm"])).is_err());
        assert!(worker_args(&os(&["capgate", "run", "warm"])).is_err());
    }

    /// A file that changed after the worker started (while it read the kits) makes its
    /// sandbox unfit: the preparation may have read the other version.
    #[test]
    fn inputs_changed_during_the_preparation_are_unfit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kit.yaml");
        std::fs::write(&file, "a").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let started = std::time::SystemTime::now();
        assert_eq!(unfit(std::slice::from_ref(&file), &[], started), None);
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&file, "b").unwrap();
        assert!(unfit(std::slice::from_ref(&file), &[], started).is_some());
        // A kit whose descriptor is gone is never offered.
        let lost = ["kit".to_owned()];
        assert!(unfit(&[], &lost, started).is_some());
    }

    #[test]
    fn changed_inputs_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2, file) = (
            dir.path().join("v1.yaml"),
            dir.path().join("v2.yaml"),
            dir.path().join("kit.yaml"),
        );
        std::fs::write(&v1, "a").unwrap();
        std::fs::write(&v2, "a").unwrap();
        std::os::unix::fs::symlink(&v1, &file).unwrap();
        let mut inputs = Inputs {
            files: vec![file.clone()],
            ..Inputs::default()
        };
        inputs.digest = Inputs::digest(&inputs.files, &inputs.dirs);
        assert_eq!(inputs.changed(), None);
        // Rewritten, and back.
        std::fs::write(&v1, "b").unwrap();
        assert!(inputs.changed().is_some());
        std::fs::write(&v1, "a").unwrap();
        assert_eq!(inputs.changed(), None);
        // The link pointed at another file with the same bytes.
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&v2, &file).unwrap();
        assert!(inputs.changed().is_some());
        std::fs::remove_file(&file).unwrap();
        assert!(inputs.changed().is_some());
    }
}
