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
//! supervisor's socket `DATA/warm/KEY.sock`, and sends its command with its stdin, stdout
//! and stderr. The supervisor hands the connection to a ready worker and starts another.
//! The worker checks that the kit files and the lock it was prepared from are byte for byte
//! what they were (else it answers `Stale` and the run starts cold, where the lock gate
//! judges the new kits), replays what its preparation printed, takes the caller's stdio as
//! its own, runs the command as any run does, prints the refusal summary, and sends the
//! exit status. Only then does the caller exit; the worker removes its state afterwards.
//!
//! The caller forwards SIGINT, SIGTERM and SIGHUP to the worker, which handles them as a
//! cold run does; a caller that dies ends the run as a hang-up. A run that is not eligible
//! (a named sandbox, `--copy-back`, a terminal on stdin: the keyboard relay is the caller's
//! own) or finds no supervisor starts cold, as before.

use std::io::{Read as _, Seek as _};
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

/// How long a worker waits for a handed caller to say what it wants.
const CLAIM_PATIENCE: Duration = Duration::from_secs(2);

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
    /// The command (empty: the default shell), with the caller's stdin, stdout and stderr;
    /// and the caller's options spelled out, which must be the worker's (the socket's name
    /// is only their digest).
    Claim { argv: Vec<String>, options: String },
    /// A signal the caller received, for the run.
    Signal { number: i32 },
}

/// Worker to caller.
#[derive(Debug, Serialize, Deserialize)]
enum ToCaller {
    /// The kit files or the lock changed since the sandbox was prepared: start cold.
    Stale,
    /// The command is starting: from here the run is the worker's.
    Started,
    /// The run's exit status.
    Exited { code: u8 },
}

/// `capgate warm`: the options of the `capgate run`s it prepares, and how many to keep.
#[derive(Debug, clap::Args)]
pub struct WarmArgs {
    /// How many prepared sandboxes to keep ready (1–16). Each is a whole sandbox: a
    /// helper, an init and a gateway, about 25 MiB.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    ready: u32,
    #[command(flatten)]
    run: RunArgs,
}

/// A run's options, spelled out: equal for `capgate warm` and `capgate run` given the same
/// options in the same place, by the same binary.
fn description(args: &RunArgs) -> Result<String> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let workspace = match &args.workspace {
        Some(w) => canonical(w),
        None => canonical(&std::env::current_dir().context("cannot read the current directory")?),
    };
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
    Ok(format!(
        "capgate {} {:?}\nkits {kits:?}\nargs {kit_args:?}\nname {name:?}\nworkspace {workspace:?}\n\
         mount {mount} copy_back {copy_back} memory {memory:?} cpus {cpus:?} pids {pids}\n\
         fail_on_violation {fail_on_violation} approve {approve}\nlock {:?}\nupstream_ca {:?}\n\
         resolve {dangerously_resolve:?} skip_limits {dangerously_skip_limits}\nskills {skills:?}\n\
         identity {git_identity:?}\nHOME {:?} SSH_AUTH_SOCK {:?} XDG_CONFIG_HOME {:?}",
        env!("CARGO_PKG_VERSION"),
        std::env::current_exe().ok(),
        lock.as_deref().map(canonical),
        upstream_ca.as_deref().map(canonical),
        env("HOME"),
        env("SSH_AUTH_SOCK"),
        env("XDG_CONFIG_HOME"),
    ))
}

/// The name of the supervisor's socket for a run's options (`description`).
fn key(described: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, described.as_bytes());
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
    /// Nothing ran (the sandbox was stale, or the supervisor went away before a worker
    /// took the call); a signal that came meanwhile, if one did.
    NotStarted(Option<Signal>, &'static str),
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
    // No supervisor (no socket, or a dead one's): the common case, said nothing about.
    let stream = UnixStream::connect(&path).ok()?;
    // Signals wait while the run is elsewhere, and are passed on to it.
    let signals = SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]);
    let mut before = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut before))
        .ok()?;
    let remote = match SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC) {
        Ok(signalfd) => remote(&stream, (&args.command, described), &signalfd),
        Err(_) => Remote::NotStarted(None, ""),
    };
    // A signal that came before the run was taken is delivered now (with its default
    // action: the caller ends as interrupted programs do).
    let restored = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    match remote {
        Remote::Exited(code) => Some(code),
        Remote::Lost => {
            say!("capgate: the prepared sandbox ended without reporting the command's status");
            Some(exit::CANNOT_START)
        }
        Remote::NotStarted(Some(signal), _) => {
            Some(128u8.saturating_add(u8::try_from(signal as i32).unwrap_or(0)))
        }
        Remote::NotStarted(None, why) => {
            if !why.is_empty() {
                say!("capgate: {why}; starting a new sandbox");
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
    if send_frame(stream.as_fd(), &claim, &stdio).is_err() {
        return Remote::NotStarted(None, "");
    }
    let mut started = false;
    let mut pending: Option<Signal> = None;
    loop {
        let mut fds = [
            PollFd::new(stream, PollFlags::IN),
            PollFd::new(signalfd, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                return if started {
                    Remote::Lost
                } else {
                    Remote::NotStarted(pending, "")
                };
            }
        }
        let (from_worker, signalled) = (
            !fds[0].revents().is_empty(),
            fds[1].revents().contains(PollFlags::IN),
        );
        if signalled && let Ok(Some(info)) = signalfd.read_signal() {
            let number = i32::try_from(info.ssi_signo).unwrap_or(0);
            if started {
                let _ = send_frame(stream.as_fd(), &FromCaller::Signal { number }, &[]);
            } else {
                pending = pending.or(Signal::try_from(number).ok());
            }
        }
        if !from_worker {
            continue;
        }
        match recv_frame::<ToCaller>(stream.as_fd()) {
            Ok(Some((ToCaller::Started, _))) => {
                started = true;
                if let Some(signal) = pending.take() {
                    let number = signal as i32;
                    let _ = send_frame(stream.as_fd(), &FromCaller::Signal { number }, &[]);
                }
            }
            Ok(Some((ToCaller::Exited { code }, _))) => return Remote::Exited(code),
            Ok(Some((ToCaller::Stale, _))) => {
                return Remote::NotStarted(
                    pending,
                    "the prepared sandboxes were made from kit files, a lock or a workspace directory that changed since",
                );
            }
            Ok(None) | Err(_) if started => return Remote::Lost,
            Ok(None) | Err(_) => return Remote::NotStarted(pending, ""),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worker: a `capgate run --warm-ctl 3` that stops before the command.

/// The inputs a prepared sandbox was made from: the kit files (descriptors, context
/// bodies), the lock, and which descriptor each kit directory names.
#[derive(Debug, Default)]
struct Inputs {
    files: Vec<PathBuf>,
    /// Kit directories, and the workspace (whose copy shows the directory that was there
    /// when the sandbox was prepared: one replaced since must not be shown).
    dirs: Vec<PathBuf>,
    digest: Vec<u8>,
}

impl Inputs {
    fn digest(files: &[PathBuf], dirs: &[PathBuf]) -> Vec<u8> {
        use std::os::unix::fs::MetadataExt as _;
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        for file in files {
            ctx.update(file.as_os_str().as_encoded_bytes());
            match std::fs::read(file) {
                Ok(bytes) => {
                    ctx.update(&(bytes.len() as u64).to_le_bytes());
                    ctx.update(&bytes);
                }
                Err(e) => ctx.update(format!("\0unreadable: {:?}", e.kind()).as_bytes()),
            }
        }
        for dir in dirs {
            let named = crate::kitref::descriptor_path(dir).ok();
            let identity = std::fs::metadata(dir).map(|m| (m.dev(), m.ino())).ok();
            ctx.update(format!("\0{dir:?} {identity:?} names {named:?}").as_bytes());
        }
        ctx.finish().as_ref().to_vec()
    }

    fn unchanged(&self) -> bool {
        Self::digest(&self.files, &self.dirs) == self.digest
    }
}

/// A worker's side: its supervisor, what it printed while preparing, and the caller once
/// one has claimed it.
pub struct Worker {
    ctl: OwnedFd,
    /// What the preparation printed (stdout and stderr), replayed to the caller.
    log: std::fs::File,
    /// The supervisor's stderr, for a worker that ends before any caller came.
    own_stderr: OwnedFd,
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
        let options = description(args)?;
        // The supervisor blocks these while it waits on them; a run handles them itself.
        SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP])
            .thread_unblock()
            .context("cannot unblock signals")?;
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
            inputs: Inputs::default(),
            options,
            caller: None,
            hung_up: None,
            finished: Arc::new(AtomicBool::new(false)),
            handed: false,
        })
    }

    /// Records the files the composition was read from and the directories it shows, to
    /// check them when a caller claims the sandbox.
    pub fn watch_inputs(&mut self, files: Vec<PathBuf>, dirs: Vec<PathBuf>) {
        let digest = Inputs::digest(&files, &dirs);
        self.inputs = Inputs {
            files,
            dirs,
            digest,
        };
    }

    /// Tells the supervisor this sandbox is ready and waits for a caller: its command, with
    /// the caller's stdio installed as this process's own. `None`: no caller will come (the
    /// supervisor stopped, the inputs changed, a signal came).
    pub fn claim(
        &mut self,
        sandbox: &str,
        signalled: impl Fn() -> bool,
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
        let (argv, stdio) = match recv_frame::<FromCaller>(caller.as_fd()) {
            Ok(Some((FromCaller::Claim { argv, options }, stdio)))
                if stdio.len() == 3 && options == self.options =>
            {
                (argv, stdio)
            }
            // A caller that said nothing usable: this sandbox was handed over and is not
            // offered again (the supervisor has started another).
            _ => return Ok(None),
        };
        caller.set_read_timeout(None)?;
        if !self.inputs.unchanged() {
            let _ = send_frame(caller.as_fd(), &ToCaller::Stale, &[]);
            return Ok(None);
        }
        // What the preparation printed, as a cold run would have shown it; then the
        // caller's stdio is this process's.
        let mut printed = Vec::new();
        self.log.rewind()?;
        self.log.read_to_end(&mut printed)?;
        let _ = rustix::io::write(&stdio[2], &printed);
        rustix::stdio::dup2_stdin(&stdio[0]).context("cannot take the caller's stdin")?;
        rustix::stdio::dup2_stdout(&stdio[1]).context("cannot take the caller's stdout")?;
        rustix::stdio::dup2_stderr(&stdio[2]).context("cannot take the caller's stderr")?;
        drop(stdio);
        send_frame(caller.as_fd(), &ToCaller::Started, &[])
            .context("the caller went away before its command started")?;
        // The caller's signals come as frames; its end of the connection closing before
        // the status was sent means it died: a hang-up, as a closed terminal is.
        let listen = caller.try_clone()?;
        let finished = Arc::clone(&self.finished);
        let (hang_up, hung_up) = std::sync::mpsc::channel();
        self.hung_up = Some(hung_up);
        std::thread::Builder::new()
            .name("capgate-warm-caller".to_owned())
            .spawn(move || {
                let me = rustix::process::getpid();
                loop {
                    let signal = match recv_frame::<FromCaller>(listen.as_fd()) {
                        Ok(Some((FromCaller::Signal { number }, _))) => {
                            match rustix::process::Signal::from_named_raw(number) {
                                Some(
                                    s @ (rustix::process::Signal::INT
                                    | rustix::process::Signal::TERM
                                    | rustix::process::Signal::HUP),
                                ) => s,
                                _ => continue,
                            }
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) | Err(_) => {
                            if finished.load(Ordering::SeqCst) {
                                let _ = hang_up.send(());
                                return;
                            }
                            rustix::process::Signal::HUP
                        }
                    };
                    let _ = rustix::process::kill_process(me, signal);
                    if signal == rustix::process::Signal::HUP {
                        return;
                    }
                }
            })?;
        self.caller = Some(caller);
        Ok(Some(argv))
    }

    /// Sends the run's exit status to the caller, if one claimed this sandbox.
    pub fn finish(&mut self, code: u8) {
        self.finished.store(true, Ordering::SeqCst);
        if let Some(caller) = self.caller.take() {
            let _ = send_frame(caller.as_fd(), &ToCaller::Exited { code }, &[]);
            // The caller exits before this sandbox's removal (and the supervisor's next
            // preparation, which waits for this process to end) takes the CPU from it.
            drop(caller);
            if let Some(hung_up) = self.hung_up.take() {
                let _ = hung_up.recv_timeout(CALLER_EXIT_PATIENCE);
            }
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
            let mut printed = Vec::new();
            if self.log.rewind().is_ok() && self.log.read_to_end(&mut printed).is_ok() {
                let _ = rustix::io::write(&self.own_stderr, &printed);
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

/// The arguments of a worker: the supervisor's own, as `run`, without `--ready`.
fn worker_args(argv: &[std::ffi::OsString]) -> Result<Vec<std::ffi::OsString>> {
    let at = argv
        .iter()
        .position(|a| a == "warm")
        .context("cannot find `warm` in the command line")?;
    let mut out: Vec<std::ffi::OsString> = argv[1..at].to_vec();
    out.push("run".into());
    out.push("--warm-ctl".into());
    out.push(WORKER_CTL_FD.to_string().into());
    let mut rest = argv[at + 1..].iter();
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
    let path = socket_path(&description(run)?)?;
    let dir = path.parent().context("the socket has no directory")?;
    crate::state::private_dir(dir)?;
    if path.as_os_str().len() >= 108 {
        bail!(
            "the socket path `{}` is too long for a UNIX socket (107 bytes); use a shorter CAPGATE_HOME",
            path.display()
        );
    }
    if UnixStream::connect(&path).is_ok() {
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
    let signals = SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]);
    signals.thread_block().context("cannot block signals")?;
    let signalfd =
        SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC).context("cannot watch signals")?;
    let exe = std::env::current_exe().context("cannot find the capgate executable")?;
    let worker_argv = worker_args(&std::env::args_os().collect::<Vec<_>>())?;
    let outcome = supervise(
        args.ready as usize,
        &listener,
        &signalfd,
        || spawn_worker(&exe, &worker_argv),
        &path,
    );
    let _ = std::fs::remove_file(&path);
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

fn supervise(
    ready: usize,
    listener: &UnixListener,
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
    // Unhanded workers see their control socket close and end as a run does; a run in
    // progress goes on.
    let stop = |pending: Vec<Pending>| {
        let mut children: Vec<Child> = pending.into_iter().map(|p| p.child).collect();
        for child in &mut children {
            let _ = child.wait();
        }
    };
    loop {
        // A run whose command ended, or that has gone on for a while, gives its place back.
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
                    stop(pending);
                    return Err(e);
                }
            }
        }
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 250_000_000,
        };
        let mut fds: Vec<PollFd<'_>> = vec![
            PollFd::new(listener, PollFlags::IN),
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
            let _ = std::fs::remove_file(path);
            stop(pending);
            return Ok(exit::OK);
        }
        if events[0] {
            while let Ok((caller, _)) = listener.accept() {
                // Only this user's runs (the directory is private already).
                match rustix::net::sockopt::socket_peercred(&caller) {
                    Ok(cred) if cred.uid == me => callers.push_back(caller),
                    _ => {}
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
        let mut failed = None;
        for (i, p) in pending.iter_mut().enumerate() {
            if !events[2 + i] {
                continue;
            }
            match recv_frame::<FromWorker>(p.ctl.as_fd()) {
                Ok(Some((FromWorker::Ready { sandbox }, _))) => {
                    say!("capgate warm: the sandbox {sandbox} is ready");
                    p.ready = Some(sandbox);
                }
                _ => failed = Some(i),
            }
        }
        if let Some(i) = failed {
            let mut p = pending.remove(i);
            let status = p.child.wait().ok().and_then(|s| s.code());
            say!(
                "capgate warm: a sandbox could not be prepared (its run exited {}); stopping",
                status.map_or_else(|| "on a signal".to_owned(), |c| c.to_string())
            );
            let _ = std::fs::remove_file(path);
            stop(pending);
            return Ok(status
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(exit::INVALID));
        }
        if !announced && pending.len() == ready && pending.iter().all(|p| p.ready.is_some()) {
            announced = true;
            say!(
                "capgate warm: {ready} sandboxes ready; `capgate run` with the same options (not from a terminal) takes one (Ctrl-C stops)"
            );
        }
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
            "k",
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
                "k",
                "--arg",
                "a=b",
                "--",
                "--ready"
            ])
        );
    }

    #[test]
    fn changed_inputs_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kit.yaml");
        std::fs::write(&file, "a").unwrap();
        let mut inputs = Inputs {
            files: vec![file.clone()],
            dirs: vec![],
            digest: vec![],
        };
        inputs.digest = Inputs::digest(&inputs.files, &inputs.dirs);
        assert!(inputs.unchanged());
        std::fs::write(&file, "b").unwrap();
        assert!(!inputs.unchanged());
        std::fs::write(&file, "a").unwrap();
        assert!(inputs.unchanged());
        std::fs::remove_file(&file).unwrap();
        assert!(!inputs.unchanged());
    }
}
