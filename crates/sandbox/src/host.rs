//! The caller's handle on a running sandbox.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::{CommandExt as _, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};

use crate::error::SandboxError;
use crate::helper::CTL_FD;
use crate::proto::{self, Reply, Request, WireCommand, WireTerminal};
use crate::report::{ExecRefusal, StartReport};
use crate::spec::{HelperCommand, ListenerKind, RunCommand, SandboxSpec};
use crate::sys;
use crate::terminal::{Copier, TerminalRelay, WindowWatch};

/// Which way a relayed descriptor's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Into the sandbox (stdin).
    In,
    /// Out of it (stdout, stderr).
    Out,
}

/// A pipe between a command's stdio and the caller's, where handing over the caller's own
/// descriptor would give the workload its host object: a regular file can be reopened
/// through `/proc/self/fd` (reading what the file held before) and chmod'ed, a device such
/// as `/dev/null` too (as root, the agent is the host's root, its owner). Pipes and sockets
/// are handed over as they are (nothing to reopen or chmod). A terminal is never handed
/// over: the command's output goes to a pty of the sandbox's own (`terminal`).
#[derive(Debug)]
enum Relay {
    /// Handed over as it is.
    Direct,
    /// A pipe: the end the sandbox gets, and the end plus the caller's descriptor that a
    /// thread copies between.
    Pipe {
        inner: OwnedFd,
        outer: OwnedFd,
        host: OwnedFd,
        direction: Direction,
    },
    /// Copying, on its own thread; `done` says when it has.
    Running {
        done: std::sync::mpsc::Receiver<()>,
        direction: Direction,
    },
}

impl Relay {
    fn for_fd(fd: BorrowedFd<'_>, direction: Direction) -> Result<Relay, SandboxError> {
        let stat =
            nix::sys::stat::fstat(fd).map_err(|e| os("stat a stdio descriptor")(e.into()))?;
        let kind =
            nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode) & nix::sys::stat::SFlag::S_IFMT;
        if kind == nix::sys::stat::SFlag::S_IFIFO || kind == nix::sys::stat::SFlag::S_IFSOCK {
            return Ok(Relay::Direct);
        }
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| os("make a stdio pipe")(e.into()))?;
        let (inner, outer) = match direction {
            Direction::In => (read, write),
            Direction::Out => (write, read),
        };
        let host = fd
            .try_clone_to_owned()
            .map_err(os("duplicate a stdio descriptor"))?;
        Ok(Relay::Pipe {
            inner,
            outer,
            host,
            direction,
        })
    }

    /// The descriptor the sandbox gets instead of the caller's, if relayed.
    fn inner_end(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Relay::Pipe { inner, .. } => Some(inner.as_fd()),
            Relay::Direct | Relay::Running { .. } => None,
        }
    }

    /// Drops the sandbox's end (it has its own copy now) and starts copying.
    fn started(self) -> Result<Relay, SandboxError> {
        let Relay::Pipe {
            inner,
            outer,
            host,
            direction,
        } = self
        else {
            return Ok(self);
        };
        drop(inner);
        let (tx, done) = std::sync::mpsc::channel();
        let (mut from, mut to) = match direction {
            Direction::In => (std::fs::File::from(host), std::fs::File::from(outer)),
            Direction::Out => (std::fs::File::from(outer), std::fs::File::from(host)),
        };
        std::thread::Builder::new()
            .name("capgate-stdio".into())
            .spawn(move || {
                // Ends at end-of-file, or when the other side is closed (a command that
                // read no more of its input, a reader of the output that went away);
                // neither is an error of the run's. Output that cannot be written (a full
                // disk) is said, not lost without a word.
                if let Err(e) = copy_by_writes(&mut from, &mut to)
                    && direction == Direction::Out
                    && e.kind() != std::io::ErrorKind::BrokenPipe
                {
                    eprintln!(
                        "capgate: the command's output could not be written ({e}); the rest of it is lost"
                    );
                }
                let _ = tx.send(());
            })
            .map_err(os("start a stdio relay"))?;
        Ok(Relay::Running { done, direction })
    }

    /// After the command: waits until `deadline` at most for its output to be copied
    /// out. Input is not waited for.
    fn finish(self, deadline: std::time::Instant) {
        if let Relay::Running {
            done,
            direction: Direction::Out,
        } = self
        {
            let _ =
                done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
        }
    }
}

/// Copies `from` to `to` with read(2) and write(2) until end-of-file. Not `io::copy`,
/// which splices into a file: splice(2) moves the file's offset without the lock that
/// write(2) takes, so the stdout and stderr relays of a command whose output goes to one
/// file (`> log 2>&1`) would write over each other, and lines would be lost.
fn copy_by_writes(from: &mut std::fs::File, to: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::Read as _;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // The caller's descriptor may be non-blocking (a terminal shares that flag with
        // every process that has it open).
        crate::terminal::write_all(to.as_fd(), &buf[..n])?;
    }
}

/// Ends a sandbox from another thread: its helper is killed, which takes the init and every
/// process inside with it. The owner's [`Sandbox::run`] then returns
/// [`SandboxError::Gone`], and its `stop` (or drop) cleans up as usual. Use it only while
/// the owner has not stopped the sandbox (after that the helper's pid may be reused).
#[derive(Debug, Clone, Copy)]
pub struct Stopper(i32);

impl Stopper {
    /// Kills the helper (`SIGKILL`).
    pub fn stop(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A running sandbox: namespaces, filesystem, cgroup and a waiting init. Dropping it stops it.
#[derive(Debug)]
pub struct Sandbox {
    name: String,
    ctl: Option<OwnedFd>,
    helper: Option<Child>,
    report: StartReport,
    dialer: Option<Dialer>,
    /// Execs the allowlist did not grant, as the init reported them.
    exec_refusals: ExecRefusals,
    /// Told of the caller's window size changes; its pipe's read end until the first
    /// command with a terminal starts the relay.
    window: WindowWatch,
    window_changes: Option<OwnedFd>,
    /// The relay of the caller's keyboard, from the first interactive command on.
    keyboard: Option<TerminalRelay>,
    /// The copiers of the commands' terminals' output.
    copiers: Vec<Copier>,
}

/// The most exec refusals a sandbox keeps until they are taken; a workload that execs in a
/// loop makes the rest a count.
const MAX_EXEC_REFUSALS: usize = 4096;

/// Exec refusals not taken yet: at most [`MAX_EXEC_REFUSALS`], and how many more there
/// were.
#[derive(Debug, Default)]
struct ExecRefusals {
    kept: Vec<ExecRefusal>,
    dropped: u64,
}

impl ExecRefusals {
    fn keep(&mut self, refusal: ExecRefusal) {
        if self.kept.len() < MAX_EXEC_REFUSALS {
            self.kept.push(refusal);
        } else {
            self.dropped += 1;
        }
    }
}

/// Makes sockets inside a sandbox's network namespace (asked for with
/// [`SandboxSpec::dialer`]), for the host side of a published port: the sandbox's init
/// creates each socket and passes it out, and the caller connects it to a port inside.
/// The caller is outside Landlock and seccomp, which bind only the sandbox's processes, so
/// the connection reaches any port that listens inside. Safe to share between threads.
#[derive(Debug)]
pub struct Dialer {
    sock: std::sync::Mutex<OwnedFd>,
}

impl Dialer {
    /// A new, unconnected socket of the sandbox's network namespace: IPv6 or IPv4, TCP or
    /// UDP, close-on-exec and blocking. Fails once the sandbox is gone.
    pub fn socket(&self, v6: bool, kind: ListenerKind) -> std::io::Result<OwnedFd> {
        // One request and its reply at a time on the channel.
        let sock = self
            .sock
            .lock()
            .map_err(|_| std::io::Error::other("the dialer's lock is poisoned"))?;
        proto::send(sock.as_fd(), &proto::Dial { v6, kind }, &[])?;
        match proto::recv::<proto::Dialed>(sock.as_fd())? {
            Some((proto::Dialed::Made, fds)) if fds.len() == 1 => Ok(fds
                .into_iter()
                .next()
                .ok_or_else(|| std::io::Error::other("no socket"))?),
            Some((proto::Dialed::Failed { errno }, _)) => {
                Err(std::io::Error::from_raw_os_error(errno))
            }
            Some(_) => Err(std::io::Error::other(
                "the sandbox's dialer answered out of turn",
            )),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the sandbox is gone",
            )),
        }
    }
}

fn os(action: &'static str) -> impl Fn(std::io::Error) -> SandboxError {
    move |source| SandboxError::Os { action, source }
}

/// A helper started before its spec is known ([`Sandbox::prepare`]): it reads the host
/// (ids, cgroups, the `/etc` it copies) while the caller resolves kits and configures the
/// gateway, so that its start-up costs no wall time. Dropping it ends the helper.
#[derive(Debug)]
pub struct Prepared(Sandbox);

impl Prepared {
    /// Sends the spec: the helper builds the sandbox's namespaces and filesystem (no
    /// workload yet). Returns the listeners created inside its network namespace (in the
    /// order of `spec.listeners`) for the gateway to accept on.
    pub fn start(self, spec: &SandboxSpec) -> Result<(Sandbox, Vec<OwnedFd>), SandboxError> {
        spec.validate()?;
        let mut sandbox = self.0;
        sandbox.name.clone_from(&spec.name);
        let request = Request::Start {
            version: proto::VERSION,
            spec: Box::new(spec.clone()),
        };
        let ctl = sandbox.ctl()?;
        proto::send(ctl, &request, &[]).map_err(os("sending the sandbox spec"))?;
        match proto::recv::<Reply>(ctl) {
            Ok(Some((Reply::Ready(report), mut fds))) => {
                let asked = spec.listeners.len() + usize::from(spec.dialer);
                if fds.len() != asked {
                    return Err(SandboxError::Protocol {
                        detail: format!("{asked} descriptors asked for, {} received", fds.len()),
                    });
                }
                if spec.dialer {
                    sandbox.dialer = fds.pop().map(|sock| Dialer {
                        sock: std::sync::Mutex::new(sock),
                    });
                }
                sandbox.report = report;
                Ok((sandbox, fds))
            }
            Ok(Some((Reply::Failed(e), _))) => {
                sandbox.shutdown();
                Err(e.into())
            }
            Ok(Some((other, _))) => Err(SandboxError::Protocol {
                detail: format!("unexpected reply to start: {other:?}"),
            }),
            Ok(None) | Err(_) => {
                let status = sandbox.shutdown();
                Err(SandboxError::Setup {
                    step: crate::error::Step::Namespaces,
                    message: format!("the helper exited before the sandbox was ready ({status})"),
                })
            }
        }
    }
}

impl Sandbox {
    /// Execs the helper (a fresh single-threaded process: never a fork of the caller, which
    /// may be a multithreaded tokio program), ready for [`Prepared::start`].
    pub fn prepare(helper: &HelperCommand) -> Result<Prepared, SandboxError> {
        let (ours, theirs) = proto::pair().map_err(os("creating the control socket"))?;
        let mut cmd = Command::new(&helper.exe);
        // The sandbox's init is a clone of the helper, and its command line is readable in
        // the sandbox (`/proc/1/cmdline`): a bare name there tells it no host path.
        cmd.arg0("capgate")
            .args(&helper.args)
            .arg("--ctl-fd")
            .arg(CTL_FD.to_string())
            .env_clear()
            .stdin(Stdio::null());
        sys::pass_fd_as(&mut cmd, theirs.as_raw_fd(), CTL_FD);
        let child = cmd.spawn().map_err(|source| SandboxError::Spawn {
            exe: helper.exe.clone(),
            source,
        })?;
        drop(theirs);
        let (window_changes, window) =
            crate::terminal::window_pipe().map_err(os("making the terminal's window pipe"))?;
        Ok(Prepared(Sandbox {
            name: String::new(),
            ctl: Some(ours),
            helper: Some(child),
            report: StartReport::default(),
            dialer: None,
            exec_refusals: ExecRefusals::default(),
            window,
            window_changes: Some(window_changes),
            keyboard: None,
            copiers: Vec::new(),
        }))
    }

    /// Starts the sandbox's namespaces and filesystem (no workload yet): [`Sandbox::prepare`]
    /// then [`Prepared::start`].
    pub fn start(
        spec: &SandboxSpec,
        helper: &HelperCommand,
    ) -> Result<(Sandbox, Vec<OwnedFd>), SandboxError> {
        spec.validate()?;
        Sandbox::prepare(helper)?.start(spec)
    }

    /// Tells the sandbox when the caller's window changes size (call it on `SIGWINCH`), so
    /// that a command's terminal follows.
    pub fn window_watch(&self) -> WindowWatch {
        self.window.clone()
    }

    /// What the start established (Landlock status, cgroups, warnings).
    pub fn report(&self) -> &StartReport {
        &self.report
    }

    /// The sandbox's [`Dialer`], when its spec asked for one; `None` after the first call.
    pub fn take_dialer(&mut self) -> Option<Dialer> {
        self.dialer.take()
    }

    /// Whether the sandbox still runs: its helper, which ends when the init does (and so
    /// the whole sandbox), has not exited.
    pub fn is_alive(&self) -> bool {
        // Asked without reaping it: its pid stays the helper's for a `Stopper`.
        let Some(pid) = self
            .helper
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
        else {
            return false;
        };
        let flags = nix::sys::wait::WaitPidFlag::WEXITED
            | nix::sys::wait::WaitPidFlag::WNOHANG
            | nix::sys::wait::WaitPidFlag::WNOWAIT;
        matches!(
            nix::sys::wait::waitid(
                nix::sys::wait::Id::Pid(nix::unistd::Pid::from_raw(pid)),
                flags
            ),
            Ok(nix::sys::wait::WaitStatus::StillAlive)
        )
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A way to end this sandbox from elsewhere (a signal handler), while its owner waits
    /// in [`Sandbox::run`]; `None` once it is stopped.
    pub fn stopper(&self) -> Option<Stopper> {
        let pid = self.helper.as_ref()?.id();
        Some(Stopper(i32::try_from(pid).ok()?))
    }

    fn ctl(&self) -> Result<BorrowedFd<'_>, SandboxError> {
        self.ctl
            .as_ref()
            .map(AsFd::as_fd)
            .ok_or_else(|| SandboxError::Gone {
                name: self.name.clone(),
            })
    }

    /// Runs one command inside (a fresh process, as `cmd.user`, all capabilities dropped,
    /// seccomp applied) and waits for it. Stdio not given is the caller's.
    pub fn run(&mut self, cmd: &RunCommand) -> Result<ExitStatus, SandboxError> {
        if cmd.argv.is_empty() {
            return Err(SandboxError::InvalidSpec {
                field: "argv",
                value: String::new(),
                reason: "must name a program",
            });
        }
        crate::spec::sandbox_path("cwd", &cmd.cwd)?;
        let (own_in, own_out, own_err) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        let stdin = cmd
            .stdin
            .as_ref()
            .map(AsFd::as_fd)
            .unwrap_or_else(|| own_in.as_fd());
        let stdout = cmd
            .stdout
            .as_ref()
            .map(AsFd::as_fd)
            .unwrap_or_else(|| own_out.as_fd());
        let stderr = cmd
            .stderr
            .as_ref()
            .map(AsFd::as_fd)
            .unwrap_or_else(|| own_err.as_fd());
        let caller = [stdin, stdout, stderr];
        let is_terminal = crate::terminal::terminals(caller);
        let interactive = cmd.interactive && crate::terminal::interactive(caller, is_terminal);
        // The caller's terminals become a pty of the sandbox's own: its output ones always,
        // stdin only for the interactive command, whose controlling terminal it is.
        let own = [interactive, is_terminal[1], is_terminal[2]];
        // Every other command reads nothing of the caller's keyboard, nor of the caller's
        // stdin unless given one.
        let null = ((is_terminal[0] && !interactive) || (!cmd.interactive && cmd.stdin.is_none()))
            .then(|| std::fs::File::open("/dev/null"))
            .transpose()
            .map_err(os("open /dev/null"))?;
        let stdio = [null.as_ref().map_or(stdin, AsFd::as_fd), stdout, stderr];
        let (rows, cols) = crate::terminal::window_size(caller, is_terminal);
        let wire = WireCommand {
            argv: cmd.argv.clone(),
            env: cmd.env.clone(),
            user: cmd.user,
            cwd: cmd.cwd.clone(),
            terminal: own.contains(&true).then_some(WireTerminal {
                stdio: own,
                controlling: interactive,
                rows,
                cols,
            }),
            own: cmd.capgate_own,
        };
        // Where the pty's output goes: the caller's stdout if a terminal, else its stderr,
        // else (interactive, stdout a file) the terminal of its stdin.
        let shown_on = [1, 2, 0].into_iter().find(|&i| own[i]).map(|i| caller[i]);
        let name = self.name.clone();
        let gone = |_| SandboxError::Gone { name: name.clone() };
        // The terminals are not handed over (the command gets its own): the other
        // descriptors are, in order.
        let directions = [Direction::In, Direction::Out, Direction::Out];
        let mut relays = Vec::with_capacity(3);
        for ((fd, direction), own) in stdio.into_iter().zip(directions).zip(own) {
            if !own {
                relays.push((fd, Relay::for_fd(fd, direction)?));
            }
        }
        let given: Vec<BorrowedFd<'_>> = relays
            .iter()
            .map(|(fd, relay)| relay.inner_end().unwrap_or(*fd))
            .collect();
        if interactive
            && self.keyboard.is_none()
            && let Some(changes) = self.window_changes.take()
        {
            self.keyboard = Some(
                TerminalRelay::start(stdin, shown_on.unwrap_or(stdin), changes, &self.window)
                    .map_err(os("relay the terminal"))?,
            );
        }
        // Cooked again when this goes, on every path out of the run.
        let raw = match self.keyboard.as_ref().filter(|_| interactive) {
            Some(relay) => Some(relay.raw().map_err(os("put the terminal in raw mode"))?),
            None => None,
        };
        // The socket is borrowed as a field, so that refusals can be kept while reading it.
        let ctl = self
            .ctl
            .as_ref()
            .map(AsFd::as_fd)
            .ok_or_else(|| SandboxError::Gone {
                name: self.name.clone(),
            })?;
        let sent = proto::send(ctl, &Request::Run(wire), &given);
        // The sandbox holds its ends now: the relays see end-of-file (or a closed pipe)
        // when the command and whatever inherited them are gone.
        let outputs: Vec<Relay> = relays
            .into_iter()
            .map(|(_, relay)| relay.started())
            .collect::<Result<_, _>>()?;
        // Copiers of terminals nobody holds any more have ended.
        self.copiers.retain(|c| !c.is_finished());
        let copiers_before = self.copiers.len();
        let reply = sent.map_err(gone).and_then(|()| {
            loop {
                match proto::recv::<Reply>(ctl) {
                    Ok(Some((Reply::ExecRefused(refusal), _))) => self.exec_refusals.keep(refusal),
                    Ok(Some((Reply::Terminal, mut fds))) => {
                        let (Some(master), true, Some(out)) = (fds.pop(), fds.is_empty(), shown_on)
                        else {
                            break Err(SandboxError::Protocol {
                                detail: "a terminal came without its descriptor".into(),
                            });
                        };
                        let master = std::sync::Arc::new(master);
                        let out = out
                            .try_clone_to_owned()
                            .map_err(os("relay the command's terminal"))?;
                        let copier = Copier::start(std::sync::Arc::clone(&master), out)
                            .map_err(os("relay the command's terminal"))?;
                        self.copiers.push(copier);
                        if let Some(relay) = self.keyboard.as_ref().filter(|_| interactive) {
                            relay
                                .attach(master)
                                .map_err(os("relay the command's terminal"))?;
                        }
                    }
                    other => break other.map_err(gone),
                }
            }
        });
        // Whatever the outcome, the caller's terminal is itself again.
        drop(raw);
        if let Some(relay) = self.keyboard.as_ref().filter(|_| interactive) {
            relay.detach();
        }
        let reply = reply?;
        // The command's output is waited for (briefly, all of it within one deadline), so
        // that it comes before anything the caller prints next. A process left inside
        // holding a pipe or the terminal keeps its copy going until the sandbox stops.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        for relay in outputs {
            relay.finish(deadline);
        }
        for copier in &self.copiers[copiers_before..] {
            copier.wait_until(deadline);
        }
        match reply {
            Some((Reply::Exited { status }, _)) => Ok(ExitStatus::from_raw(status)),
            Some((Reply::NotStarted { program, message }, _)) => {
                Err(SandboxError::Command { program, message })
            }
            Some((other, _)) => Err(SandboxError::Protocol {
                detail: format!("unexpected reply to run: {other:?}"),
            }),
            None => Err(SandboxError::Gone {
                name: self.name.clone(),
            }),
        }
    }

    /// Kills every process inside but the init and waits until they are gone, keeping
    /// the exec refusals reported meanwhile: what the sandbox ran is over, and its
    /// teardown ([`Sandbox::stop`], which takes longer) can come after. `false` when some
    /// process could not be killed or did not end in time: stop the sandbox before relying
    /// on it being empty.
    pub fn empty(&mut self) -> Result<bool, SandboxError> {
        let name = self.name.clone();
        let gone = |_| SandboxError::Gone { name: name.clone() };
        let ctl = self.ctl()?;
        proto::send(ctl, &Request::Empty, &[]).map_err(gone)?;
        loop {
            let ctl = self.ctl()?;
            match proto::recv::<Reply>(ctl).map_err(gone)? {
                Some((Reply::ExecRefused(refusal), _)) => self.exec_refusals.keep(refusal),
                Some((Reply::Emptied { complete }, _)) => return Ok(complete),
                // A command's late replies (its terminal, its status) no longer matter.
                Some(_) => {}
                // The init ended (its processes end with it, but not necessarily yet):
                // a stop waits for that.
                None => return Ok(false),
            }
        }
    }

    /// Stops the sandbox like [`Sandbox::stop`] and returns the exec refusals not taken
    /// yet, those reported while it stopped included.
    pub fn stop_taking_exec_refusals(
        mut self,
    ) -> (Result<(), SandboxError>, Vec<ExecRefusal>, u64) {
        let status = self.shutdown();
        let (refused, dropped) = self.take_exec_refusals();
        let result = match status.code() {
            Some(0) => Ok(()),
            code => Err(SandboxError::Cleanup {
                name: self.name.clone(),
                status: code.unwrap_or(-1),
            }),
        };
        (result, refused, dropped)
    }

    /// The execs an exec allowlist did not grant since the last call (the sandbox's
    /// [`SandboxSpec::exec_only`]), in order, and how many more were not kept.
    pub fn take_exec_refusals(&mut self) -> (Vec<ExecRefusal>, u64) {
        let taken = std::mem::take(&mut self.exec_refusals);
        (taken.kept, taken.dropped)
    }

    /// Kills everything inside and removes the cgroup. No process of the sandbox survives.
    pub fn stop(self) -> Result<(), SandboxError> {
        self.stop_taking_exec_refusals().0
    }

    /// Tells the init to exit (closing the socket does too), then waits for the helper,
    /// which waits for the whole pid namespace to be gone and removes the cgroup.
    fn shutdown(&mut self) -> ExitStatus {
        if let Some(ctl) = self.ctl.take() {
            if proto::send(ctl.as_fd(), &Request::Stop, &[]).is_ok() {
                // Before it exits, the init answers the execs still waiting and reports
                // the refused ones (a process the command left behind may exec after the
                // command's `Exited`); then the stream ends.
                while let Ok(Some((reply, _))) = proto::recv::<Reply>(ctl.as_fd()) {
                    if let Reply::ExecRefused(refusal) = reply {
                        self.exec_refusals.keep(refusal);
                    }
                }
            }
            drop(ctl);
        }
        let status = match self.helper.take() {
            Some(mut child) => child
                .wait()
                .unwrap_or_else(|_| ExitStatus::from_raw(1 << 8)),
            None => ExitStatus::from_raw(0),
        };
        // Nothing inside holds a terminal now: the last of the output is copied out.
        for copier in self.copiers.drain(..) {
            copier.join();
        }
        // The keyboard's relay ends, and the caller's terminal is as it was.
        drop(self.keyboard.take());
        // The helper removes the cgroups; if it was killed, they are empty now (its death
        // took the init and the whole pid namespace with it) and removed here.
        // A cgroup is busy until the kernel has finished tearing down its last process,
        // which can lag the helper's death a little: retry for up to a second.
        for dir in &self.report.cgroups {
            for _ in 0..100 {
                if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        status
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.shutdown();
    }
}
