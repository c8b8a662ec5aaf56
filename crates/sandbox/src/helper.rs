//! The helper process (host side, a fresh single-threaded exec of the caller's binary) and
//! the sandbox's init (pid 1 of the new pid namespace, cloned from the helper).
//!
//! ```text
//! caller (capgate, maybe multithreaded)
//!   └─ helper: cgroup, clone(NEWUSER|NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS), id maps, waits, cleans up
//!        └─ init (pid 1): builds the root, listeners, hardens itself, then serves Run requests
//!             └─ command: setsid, stdio (a pty of the sandbox's own for a caller's terminal,
//!                  its controlling terminal), ids, caps cleared, seccomp, execve
//! ```
//! The caller talks to the init directly over the control socket (the helper closes its
//! copy once the init runs). The caller's death closes the socket: the init exits, and the
//! kernel kills every process of the pid namespace with it. The helper's death kills the
//! init (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cgroup;
use crate::error::{RemoteError, Step};
use crate::idmap;
use crate::kernel::{Applied, Effect, Kernel};
use crate::linux::Linux;
use crate::plan::{self, HostView};
use crate::proto::{self, Reply, Request, WireCommand};
use crate::report::{LandlockEnforcement, StartReport};
use crate::spec::{
    ListenerKind, OVERLAY_LOWER, OVERLAY_UPPER, OVERLAY_WORK, SandboxSpec, VolumeSource,
    WorkspaceMode,
};
use crate::sys::{self, Forked};

/// The descriptor number the caller passes the control socket on.
pub(crate) const CTL_FD: i32 = 3;

/// The hidden entry point: `capgate __sandbox --ctl-fd 3` calls this with `["--ctl-fd", "3"]`.
/// It must be called at the start of a fresh process (before any thread is spawned).
pub fn helper_main(args: Vec<OsString>) -> ExitCode {
    let fd = match args.as_slice() {
        [flag, n] if flag == "--ctl-fd" => n.to_str().and_then(|n| n.parse::<i32>().ok()),
        _ => None,
    };
    let Some(fd) = fd else {
        eprintln!(
            "capgate sandbox helper: expected `--ctl-fd N`; this entry point is started by capgate itself"
        );
        return ExitCode::from(2);
    };
    let ctl = match sys::take_inherited_fd(fd) {
        Ok(ctl) => ctl,
        Err(e) => {
            eprintln!("capgate sandbox helper: control descriptor {fd}: {e}");
            return ExitCode::from(2);
        }
    };
    sys::ignore_terminal_signals();
    // The caller may start the helper before it knows the spec (`Sandbox::prepare`): what
    // does not depend on the spec is read while it works out the rest.
    let facts = HostFacts::read();
    let spec = match proto::recv::<Request>(ctl.as_fd()) {
        Ok(Some((Request::Start { version, spec }, _))) if version == proto::VERSION => spec,
        Ok(Some((Request::Start { version, .. }, _))) => {
            fail(
                &ctl,
                RemoteError::setup(
                    Step::Request,
                    format!("protocol version {version}, expected {}", proto::VERSION),
                ),
            );
            return ExitCode::from(2);
        }
        Ok(_) | Err(_) => return ExitCode::from(2),
    };
    match run_helper(ctl, &spec, facts) {
        Ok(code) => code,
        Err((ctl, e)) => {
            fail(&ctl, e);
            ExitCode::from(1)
        }
    }
}

fn fail(ctl: &OwnedFd, e: RemoteError) {
    // The caller may be gone; nothing more to do then.
    let _ = proto::send(ctl.as_fd(), &Reply::Failed(e), &[]);
}

type HelperResult<T> = Result<T, (OwnedFd, RemoteError)>;

fn setup_err(step: Step) -> impl Fn(std::io::Error) -> RemoteError {
    move |e| RemoteError::setup(step, e)
}

fn apply_all(k: &mut impl Kernel, effects: &[(Step, Effect)]) -> Result<(), RemoteError> {
    for (step, effect) in effects {
        k.apply(effect).map_err(setup_err(*step))?;
    }
    Ok(())
}

fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// The first mount point of `mountinfo` (the host's) strictly beneath `dir`, if any.
fn mount_beneath(mountinfo: &str, dir: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|point| PathBuf::from(crate::cgroup::unescape_mountinfo(point)))
        .find(|point| point != dir && point.starts_with(dir))
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// What the helper reads of the host whatever the spec says.
struct HostFacts {
    uid: u32,
    gid: u32,
    user: Option<String>,
    subuid: Option<String>,
    subgid: Option<String>,
    cgroups: cgroup::Layout,
    /// The host's `/proc/self/mountinfo`, for the cgroups and the workspace check.
    mountinfo: String,
    swap_kb: u64,
    host: HostView,
}

impl HostFacts {
    fn read() -> HostFacts {
        let uid = nix::unistd::getuid().as_raw();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        HostFacts {
            uid,
            gid: nix::unistd::getgid().as_raw(),
            user: user_name(uid),
            subuid: idmap::read_optional(Path::new("/etc/subuid")),
            subgid: idmap::read_optional(Path::new("/etc/subgid")),
            cgroups: cgroup::Layout::of_host(
                &mountinfo,
                &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
            ),
            mountinfo,
            swap_kb: cgroup::swap_total_kb(
                &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            ),
            host: HostView::read(),
        }
    }
}

/// Host-side preparation: directories the mounts need. `mountinfo` is the host's.
fn prepare_state(spec: &SandboxSpec, mountinfo: &str) -> Result<(), RemoteError> {
    let e = |what: &str, path: &Path, err: std::io::Error| {
        RemoteError::setup(
            Step::StateDir,
            format!("{what} `{}`: {err}", path.display()),
        )
    };
    if !spec.workspace.host_dir.is_dir() {
        return Err(RemoteError::setup(
            Step::StateDir,
            format!(
                "the workspace `{}` is not a directory",
                spec.workspace.host_dir.display()
            ),
        ));
    }
    // The workspace is bound (or overlaid) without what is mounted beneath it, which a
    // user namespace refuses (the mounts it inherits are locked together): said plainly,
    // rather than as the kernel's EINVAL at the mount.
    if let Some(inner) = mount_beneath(mountinfo, &spec.workspace.host_dir) {
        return Err(RemoteError::setup(
            Step::StateDir,
            format!(
                "the workspace `{}` has a filesystem mounted beneath it, at `{}`: a sandbox cannot show a directory without the mounts inside it; use a workspace with no mount inside",
                spec.workspace.host_dir.display(),
                inner.display()
            ),
        ));
    }
    for dir in [spec.state_dir.clone(), spec.state_dir.join("root")] {
        create_private_dir(&dir).map_err(|err| e("create", &dir, err))?;
    }
    if spec.workspace_read.is_some() {
        // Where the whole workspace is mounted, outside the new root, for the view.
        let view = spec.state_dir.join("view");
        create_private_dir(&view).map_err(|err| e("create", &view, err))?;
    }
    if spec.workspace.mode == WorkspaceMode::Copy {
        for name in [OVERLAY_UPPER, OVERLAY_WORK, OVERLAY_LOWER] {
            let dir = spec.state_dir.join(name);
            create_private_dir(&dir).map_err(|err| e("create", &dir, err))?;
        }
        // The overlay's root takes the upper directory's mode: give it the host directory's
        // (the state directory itself stays 0700 on the host).
        use std::os::unix::fs::PermissionsExt;
        let upper = spec.state_dir.join(OVERLAY_UPPER);
        let mode = std::fs::metadata(&spec.workspace.host_dir)
            .map_err(|err| e("stat", &spec.workspace.host_dir, err))?
            .permissions()
            .mode()
            & 0o7777;
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(mode))
            .map_err(|err| e("chmod", &upper, err))?;
    }
    for v in &spec.volumes {
        if let VolumeSource::Dir(src) = &v.source {
            create_private_dir(src).map_err(|err| e("create", src, err))?;
        }
    }
    Ok(())
}

/// This process's soft limit of `quota` (`None`: unlimited, or unreadable).
fn current_rlimit(quota: crate::kernel::UserQuota) -> Option<u64> {
    use rustix::process::{Resource, getrlimit};
    let resource = match quota {
        crate::kernel::UserQuota::SigPending => Resource::Sigpending,
        crate::kernel::UserQuota::MsgQueue => Resource::Msgqueue,
        crate::kernel::UserQuota::Memlock => Resource::Memlock,
    };
    getrlimit(resource).current
}

/// Removes a leftover cgroup of a previous sandbox with the same name, if it is empty.
fn clear_stale_cgroups(dirs: &[PathBuf], name: &str) -> Result<(), RemoteError> {
    for dir in dirs {
        if !dir.exists() {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if !procs.trim().is_empty() {
            return Err(RemoteError::setup(
                Step::Cgroup,
                format!(
                    "a sandbox named `{name}` is already running (cgroup `{}` has processes)",
                    dir.display()
                ),
            ));
        }
        std::fs::remove_dir(dir).map_err(|err| {
            RemoteError::setup(
                Step::Cgroup,
                format!("remove stale `{}`: {err}", dir.display()),
            )
        })?;
    }
    Ok(())
}

/// Removes the sandbox's cgroups, killing anything still in them first.
fn remove_cgroups(k: &mut Linux, dirs: &[PathBuf]) -> bool {
    let mut clean = true;
    for dir in dirs {
        let mut removed = false;
        for _ in 0..50 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            if k.apply(&Effect::CgroupRemove(dir.clone())).is_ok() || !dir.exists() {
                removed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !removed {
            eprintln!(
                "capgate sandbox helper: could not remove the cgroup `{}`",
                dir.display()
            );
            clean = false;
        }
    }
    clean
}

fn run_helper(ctl: OwnedFd, spec: &SandboxSpec, facts: HostFacts) -> HelperResult<ExitCode> {
    macro_rules! tryh {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(err) => return Err((ctl, err)),
            }
        };
    }
    tryh!(
        spec.validate()
            .map_err(|e| RemoteError::setup(Step::Request, e))
    );
    let HostFacts {
        uid,
        gid,
        user,
        subuid,
        subgid,
        cgroups: layout,
        mountinfo,
        swap_kb,
        host,
    } = facts;
    let maps = tryh!(
        idmap::choose(
            uid,
            gid,
            user.as_deref(),
            subuid.as_deref(),
            subgid.as_deref(),
        )
        .map_err(|explanation| RemoteError::Unavailable {
            feature: "a second mapped id (root inside)".into(),
            explanation,
        })
    );
    tryh!(prepare_state(spec, &mountinfo));

    // cgroups.
    let limits = spec.limits;
    let mut cg = tryh!(
        cgroup::plan(
            &layout,
            &spec.name,
            limits.pids,
            (limits.memory, limits.millicpus),
            limits.skip_unavailable
        )
        .map_err(|m| {
            RemoteError::Unavailable {
                feature: m.feature,
                explanation: m.explanation,
            }
        })
    );
    tryh!(clear_stale_cgroups(&cg.dirs, &spec.name));
    let mut k = Linux::default();
    // The invoking user's per-user limits, of which the sandbox gets a share.
    let rlimits: Vec<_> = plan::USER_QUOTAS
        .iter()
        .map(|&(quota, _)| (quota, current_rlimit(quota)))
        .collect();
    let before = plan::helper_effects_before_clone(&cg, uid == 0, &rlimits);
    for (step, effect) in &before {
        match k.apply(effect) {
            Ok(Applied::Absent) => {
                // Only the swap cap is optional, and only as far as the host has no swap.
                let Effect::CgroupWrite { file, .. } = effect else {
                    continue;
                };
                let explanation = format!(
                    "`{}` does not exist: the kernel has no swap accounting (boot with swapaccount=1), so swap cannot be capped",
                    file.display()
                );
                if swap_kb == 0 {
                    continue;
                } else if limits.skip_unavailable {
                    cg.warnings.push(format!(
                        "WARNING: swap NOT capped (--dangerously-skip-limits): {explanation}"
                    ));
                } else {
                    remove_cgroups(&mut k, &cg.dirs);
                    return Err((
                        ctl,
                        RemoteError::Unavailable {
                            feature: "swap capping for the memory limit".into(),
                            explanation,
                        },
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => {
                remove_cgroups(&mut k, &cg.dirs);
                return Err((ctl, RemoteError::setup(*step, e)));
            }
        }
    }

    let warnings_before_clone = cg.warnings.len();
    let root = spec.state_dir.join("root");
    let (release_r, release_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            remove_cgroups(&mut k, &cg.dirs);
            return Err((ctl, RemoteError::setup(Step::Namespaces, e)));
        }
    };
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    // A v2 cgroup: the init is born into it where the kernel can (no migration, no wait);
    // elsewhere it is added by pid after the clone.
    let v2_dir = cg.dirs.iter().find(|d| !cg.v1.contains(d));
    let v2_fd = v2_dir.and_then(|d| std::fs::File::open(d).ok());
    let (forked, born_in_v2) = match &v2_fd {
        Some(fd) => match sys::clone_into_namespaces_and_cgroup(flags, fd.as_fd()) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL)
                ) =>
            {
                (sys::clone_into_namespaces(flags), false)
            }
            other => (other, true),
        },
        None => (sys::clone_into_namespaces(flags), false),
    };
    let pid = match forked {
        Ok(Forked::Child) => {
            drop(release_w);
            drop(v2_fd);
            init_main(
                ctl,
                release_r,
                spec,
                &host,
                &root,
                (&cg, maps.via_setuid_helpers),
            )
        }
        Ok(Forked::Parent(pid)) => pid,
        Err(e) => {
            remove_cgroups(&mut k, &cg.dirs);
            let msg = match v2_dir.filter(|_| born_in_v2) {
                Some(dir) => format!(
                    "clone into the cgroup `{}`: {e}; {}",
                    dir.display(),
                    namespaces_hint()
                ),
                None => format!("clone: {e}; {}", namespaces_hint()),
            };
            return Err((ctl, RemoteError::setup(Step::Namespaces, msg)));
        }
    };
    drop(release_r);
    drop(v2_fd);
    if let Err(e) = apply_all(
        &mut k,
        &plan::helper_effects_after_clone(pid.as_raw(), &maps, &cg, born_in_v2),
    ) {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        remove_cgroups(&mut k, &cg.dirs);
        return Err((ctl, e));
    }
    // The release: one byte, then the warnings found after the clone, one per line, then a
    // NUL. The pipe stays open while the helper lives: it is the init's lifeline (the
    // parent-death signal is reset when the init changes its ids, see `plan`).
    let mut release = std::fs::File::from(release_w);
    let mut message = vec![1u8];
    for w in cg.warnings.iter().skip(warnings_before_clone) {
        message.extend_from_slice(w.replace(['\n', '\0'], " ").as_bytes());
        message.push(b'\n');
    }
    message.push(0);
    if release.write_all(&message).is_err() {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    // From here on the init reports to the caller.
    drop(ctl);
    let status = loop {
        match nix::sys::wait::waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    drop(release);
    let clean = remove_cgroups(&mut k, &cg.dirs);
    match (status, clean) {
        (Ok(_), true) => Ok(ExitCode::SUCCESS),
        _ => Ok(ExitCode::from(3)),
    }
}

fn namespaces_hint() -> String {
    let report = crate::probe::probe_host();
    report
        .check(crate::probe::Feature::UserNamespaces)
        .map(|c| c.detail.clone())
        .unwrap_or_default()
}

/// Why this kernel's Landlock cannot hold what `spec` asks of it alone, if it cannot.
fn landlock_shortfall(
    spec: &SandboxSpec,
    report: &crate::report::LandlockReport,
) -> Option<String> {
    let asks = match (spec.write_only.is_some(), spec.exec_only.is_some()) {
        (false, false) => return None,
        (true, false) => "the kit's write places (dev.capgate/filesystem@1)",
        (false, true) => "the kit's exec allowlist (dev.capgate/exec@1)",
        (true, true) => "the kit's write places and exec allowlist",
    };
    (report.enforcement != LandlockEnforcement::Fully).then(|| {
        format!(
            "{asks} rely on Landlock, which this kernel enforces {} (ABI {}); capgate doctor says what is missing",
            if report.enforcement == LandlockEnforcement::Partially {
                "only partially"
            } else {
                "not at all"
            },
            report.abi
        )
    })
}

/// Landlock gaps as report warnings.
fn landlock_warnings(report: &crate::report::LandlockReport) -> Vec<String> {
    let mut w = Vec::new();
    if report.enforcement != LandlockEnforcement::Fully {
        w.push(format!(
            "WARNING: Landlock is {} (kernel ABI {}); the mount and namespace walls still hold",
            if report.enforcement == LandlockEnforcement::Partially {
                "only partially enforced"
            } else {
                "NOT enforced"
            },
            report.abi
        ));
    }
    if !report.tcp_connect_restricted {
        w.push("WARNING: Landlock cannot restrict TCP connect on this kernel (ABI < 4); the network namespace still holds".into());
    }
    w
}

/// The sandbox's init. Never returns.
fn init_main(
    ctl: OwnedFd,
    release: OwnedFd,
    spec: &SandboxSpec,
    host: &HostView,
    root: &Path,
    (cgroups, shed_groups): (&cgroup::Plan, bool),
) -> ! {
    let mut warnings = cgroups.warnings.clone();
    let mut k = Linux {
        release: Some(release),
        ..Linux::default()
    };
    let mut listeners: Vec<OwnedFd> = Vec::new();
    let mut landlock = None;
    for (step, effect) in plan::init_effects(spec, host, root, (&cgroups.v1, shed_groups)) {
        match k.apply(&effect) {
            Ok(Applied::Listener(fd)) => listeners.push(fd),
            Ok(Applied::Landlock(r)) => {
                // A pack's write places and exec allowlist are Landlock's alone to hold:
                // where the kernel cannot, the sandbox does not start.
                if let Some(problem) = landlock_shortfall(spec, &r) {
                    let _ = proto::send(
                        ctl.as_fd(),
                        &Reply::Failed(RemoteError::setup(step, problem)),
                        &[],
                    );
                    sys::exit_immediately(1);
                }
                landlock = Some(r);
            }
            Ok(_) => {}
            Err(e) => {
                let _ = proto::send(
                    ctl.as_fd(),
                    &Reply::Failed(RemoteError::setup(step, e)),
                    &[],
                );
                sys::exit_immediately(1);
            }
        }
    }
    let landlock = landlock.unwrap_or_default();
    warnings.append(&mut k.release_notes);
    warnings.append(&mut k.warnings);
    warnings.extend(landlock_warnings(&landlock));
    let report = StartReport {
        landlock,
        cgroups: cgroups.dirs.clone(),
        warnings,
    };
    // The dialer's caller end leaves with the listeners, after them.
    let dialer = if spec.dialer {
        let (ours, theirs) = match proto::pair() {
            Ok(pair) => pair,
            Err(e) => {
                let _ = proto::send(
                    ctl.as_fd(),
                    &Reply::Failed(RemoteError::setup(
                        Step::Network,
                        format!("the dialer's socket pair: {e}"),
                    )),
                    &[],
                );
                sys::exit_immediately(1);
            }
        };
        listeners.push(theirs);
        Some(ours)
    } else {
        None
    };
    if proto::send(
        ctl.as_fd(),
        &Reply::Ready(report),
        &proto::borrow_all(&listeners),
    )
    .is_err()
    {
        sys::exit_immediately(1);
    }
    drop(listeners);
    serve(ctl, dialer, &spec.env, &k)
}

/// Answers one request on the dialer channel: a socket made here, inside the network
/// namespace, passed to the caller. `false` when the channel is closed or garbled, and the
/// init stops serving it (the sandbox goes on).
fn dial(dialer: BorrowedFd<'_>) -> bool {
    let Ok(Some((request, _))) = proto::recv::<proto::Dial>(dialer) else {
        return false;
    };
    let family = if request.v6 {
        rustix::net::AddressFamily::INET6
    } else {
        rustix::net::AddressFamily::INET
    };
    let kind = match request.kind {
        ListenerKind::Tcp => rustix::net::SocketType::STREAM,
        ListenerKind::Udp => rustix::net::SocketType::DGRAM,
    };
    let sent = match rustix::net::socket_with(family, kind, rustix::net::SocketFlags::CLOEXEC, None)
    {
        Ok(sock) => proto::send(dialer, &proto::Dialed::Made, &[sock.as_fd()]),
        Err(e) => proto::send(
            dialer,
            &proto::Dialed::Failed {
                errno: e.raw_os_error(),
            },
            &[],
        ),
    };
    sent.is_ok()
}

/// Raw wait status from nix's decoded form.
fn raw_status(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, core) => Some(sig as i32 | if core { 0x80 } else { 0 }),
        _ => None,
    }
}

/// The init's loop: reap every child, run commands, exit when the caller says so or goes.
fn serve(
    ctl: OwnedFd,
    mut dialer: Option<OwnedFd>,
    base_env: &[(String, String)],
    init: &Linux,
) -> ! {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if mask.thread_block().is_err() {
        sys::exit_immediately(1);
    }
    let Ok(sigfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        sys::exit_immediately(1);
    };
    let Some(lifeline) = init.lifeline.as_ref() else {
        sys::exit_immediately(1);
    };
    let mut running: Option<Pid> = None;
    loop {
        let (ctl_ready, child_ready, dial_ready, exec_ready) = {
            let mut fds = vec![
                PollFd::new(ctl.as_fd(), PollFlags::POLLIN),
                PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
                PollFd::new(lifeline.as_fd(), PollFlags::POLLIN),
            ];
            let exec_at = init.exec_watch.as_ref().map(|w| {
                fds.push(PollFd::new(w.fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let dial_at = dialer.as_ref().map(|d| {
                fds.push(PollFd::new(d.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => sys::exit_immediately(1),
            }
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            // The helper is gone (its end of the lifeline closed): so is the sandbox.
            if ready(&fds[2]) {
                sys::exit_immediately(0);
            }
            (
                ready(&fds[0]),
                ready(&fds[1]),
                dial_at.is_some_and(|i| ready(&fds[i])),
                exec_at.is_some_and(|i| ready(&fds[i])),
            )
        };
        if exec_ready
            && let Some(w) = &init.exec_watch
            && !report_exec(ctl.as_fd(), w)
        {
            sys::exit_immediately(0);
        }
        if dial_ready
            && let Some(d) = &dialer
            && !dial(d.as_fd())
        {
            dialer = None;
        }
        if child_ready {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            loop {
                match nix::sys::wait::waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    // Orphans reparented to pid 1 are reaped here too.
                    Ok(status) => {
                        if status.pid() == running
                            && let Some(raw) = raw_status(status)
                        {
                            running = None;
                            if proto::send(ctl.as_fd(), &Reply::Exited { status: raw }, &[])
                                .is_err()
                            {
                                sys::exit_immediately(0);
                            }
                        }
                    }
                }
            }
        }
        if ctl_ready {
            match proto::recv::<Request>(ctl.as_fd()) {
                Ok(Some((Request::Run(cmd), fds))) => {
                    let reply = if running.is_some() {
                        Some(not_started(&cmd, "another command is still running"))
                    } else {
                        match spawn(&cmd, base_env, init, fds, ctl.as_fd()) {
                            Ok(pid) => {
                                running = Some(pid);
                                None
                            }
                            Err(message) => Some(not_started(&cmd, &message)),
                        }
                    };
                    if let Some(reply) = reply
                        && proto::send(ctl.as_fd(), &reply, &[]).is_err()
                    {
                        sys::exit_immediately(0);
                    }
                }
                // Stop: the execs waiting are answered (and the refused ones reported)
                // first, as the caller reads on until the stream ends.
                Ok(Some((Request::Stop, _))) => {
                    if let Some(w) = &init.exec_watch {
                        answer_pending_execs(ctl.as_fd(), w);
                    }
                    sys::exit_immediately(0)
                }
                // Empty: as Stop, but the init stays (the namespaces' teardown, which takes
                // a while, comes with a later Stop): the refused execs waiting are
                // reported, every other process is killed and reaped.
                Ok(Some((Request::Empty, _))) => {
                    if let Some(w) = &init.exec_watch {
                        answer_pending_execs(ctl.as_fd(), w);
                    }
                    let complete = crate::linux::kill_every_process().is_ok() && reap_all();
                    running = None;
                    if proto::send(ctl.as_fd(), &Reply::Emptied { complete }, &[]).is_err() {
                        sys::exit_immediately(0);
                    }
                }
                // End of stream (the caller is gone) or garbage: pid 1 exits and the
                // kernel kills every process of the namespace.
                _ => sys::exit_immediately(0),
            }
        }
    }
}

/// Reaps every child of the init until it has none (every process of a pid namespace
/// descends from its init: none left means the namespace holds the init alone); `false`
/// when some are still there after [`REAP_PATIENCE`].
fn reap_all() -> bool {
    let deadline = std::time::Instant::now() + REAP_PATIENCE;
    loop {
        match nix::sys::wait::waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Err(nix::errno::Errno::ECHILD) => return true,
            Ok(WaitStatus::StillAlive) | Err(_) => {
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(_) => {}
        }
    }
}

/// How long `Empty` waits for the killed processes to be gone.
const REAP_PATIENCE: Duration = Duration::from_millis(500);

/// Answers one exec notification and sends the caller a refusal it found. `false` when the
/// caller is gone.
fn report_exec(ctl: BorrowedFd<'_>, watch: &crate::execwatch::ExecWatch) -> bool {
    match watch.answer() {
        Some(refusal) => proto::send(ctl, &Reply::ExecRefused(refusal), &[]).is_ok(),
        None => true,
    }
}

/// Most exec notifications answered at the stop: a workload that execs in a loop does not
/// hold the stop up.
const MAX_ANSWERED_AT_STOP: usize = 4096;

/// Answers the exec notifications pending now (none waited for), reporting refusals.
fn answer_pending_execs(ctl: BorrowedFd<'_>, watch: &crate::execwatch::ExecWatch) {
    for _ in 0..MAX_ANSWERED_AT_STOP {
        let mut fds = [PollFd::new(watch.fd(), PollFlags::POLLIN)];
        let pending = matches!(nix::poll::poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0);
        if !pending || !report_exec(ctl, watch) {
            return;
        }
    }
}

/// The command's stdin, stdout and stderr: the descriptors attached, in order, with a
/// terminal of the sandbox's own where the caller's was a terminal (never handed in); and
/// that terminal's controlling side, for the caller.
fn command_stdio(
    cmd: &WireCommand,
    fds: Vec<OwnedFd>,
) -> Result<([OwnedFd; 3], Option<OwnedFd>), String> {
    let Some(t) = cmd.terminal else {
        let stdio = fds
            .try_into()
            .map_err(|_| "expected three descriptors for stdio".to_string())?;
        return Ok((stdio, None));
    };
    let expected = t.stdio.iter().filter(|&&is| !is).count();
    if fds.len() != expected {
        return Err(format!(
            "expected {expected} descriptors for stdio beside the terminal"
        ));
    }
    let (master, terminal) =
        crate::linux::open_terminal(cmd.user.id(), (t.rows, t.cols), t.controlling)
            .map_err(|e| format!("cannot open a terminal: {e}"))?;
    let mut attached = fds.into_iter();
    let mut next = |is_terminal: bool| -> Result<OwnedFd, String> {
        if is_terminal {
            terminal
                .try_clone()
                .map_err(|e| format!("cannot open a terminal: {e}"))
        } else {
            attached
                .next()
                .ok_or_else(|| "a stdio descriptor is missing".to_string())
        }
    };
    let stdio = [next(t.stdio[0])?, next(t.stdio[1])?, next(t.stdio[2])?];
    Ok((stdio, Some(master)))
}

fn not_started(cmd: &WireCommand, message: &str) -> Reply {
    Reply::NotStarted {
        program: cmd.argv.first().cloned().unwrap_or_default(),
        message: message.to_string(),
    }
}

/// Forks and execs a command; returns once it has exec'd (or failed to).
fn spawn(
    cmd: &WireCommand,
    base_env: &[(String, String)],
    init: &Linux,
    fds: Vec<OwnedFd>,
    ctl: BorrowedFd<'_>,
) -> Result<Pid, String> {
    if cmd.argv.is_empty() {
        return Err("empty command".into());
    }
    let (stdio, master) = command_stdio(cmd, fds)?;
    let raw = [
        stdio[0].as_raw_fd(),
        stdio[1].as_raw_fd(),
        stdio[2].as_raw_fd(),
    ];
    let env = plan::command_env(base_env, &cmd.env);
    let terminal = cmd
        .terminal
        .filter(|t| t.controlling)
        .and_then(|t| t.stdio.iter().position(|&is| is))
        .and_then(|i| i32::try_from(i).ok());
    let effects = plan::command_effects(&cmd.argv, &env, cmd.user, &cmd.cwd, raw, terminal);
    // Under an exec allowlist the command's own first exec is judged here, as the init
    // will run it: the notifications cannot read it (see `execwatch`). A dynamic loader
    // does not start (it would run any program); a file the list does not grant is
    // reported (Landlock refuses it).
    if let Some(w) = init.exec_watch.as_ref().filter(|_| !cmd.own) {
        // The candidates the child will try (after its chdir: a relative one is the cwd's).
        let candidates: Vec<PathBuf> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Exec { candidates, .. } => Some(candidates),
                _ => None,
            })
            .flatten()
            .map(|c| cmd.cwd.join(c))
            .collect();
        // A root command is dumpable: the notification judges and reports it already.
        let report = cmd.user != crate::spec::User::Root;
        let refused = match w.judge_first(&candidates, report) {
            Ok(None) => None,
            Ok(Some(refusal)) => Some((refusal, false)),
            Err(refusal) => Some((refusal, true)),
        };
        if let Some((refusal, stop)) = refused {
            let what = refusal.resolved.clone();
            if proto::send(ctl, &Reply::ExecRefused(refusal), &[]).is_err() {
                sys::exit_immediately(0);
            }
            if stop {
                return Err(format!(
                    "exec: {what} is a dynamic loader, which runs any program: the exec allowlist does not grant it"
                ));
            }
        }
    }
    let (mut err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map(|(r, w)| (std::fs::File::from(r), std::fs::File::from(w)))
        .map_err(|e| format!("pipe: {e}"))?;
    match sys::fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
        Forked::Child => {
            drop(err_r);
            let mut err_w = err_w;
            let mut k = Linux {
                release: None,
                stdio: Some(stdio),
                landlock: init.landlock_for_child(),
                seccomp: init.seccomp.clone(),
                ..Linux::default()
            };
            for (i, effect) in effects.iter().enumerate() {
                if let Err(e) = k.apply(effect) {
                    let what = match effect {
                        Effect::Exec { .. } => "exec".to_string(),
                        Effect::Chdir(_) => "chdir".to_string(),
                        other => format!("step {i} ({other:?})"),
                    };
                    let _ = err_w.write_all(format!("{what}: {e}").as_bytes());
                    sys::exit_immediately(127);
                }
            }
            sys::exit_immediately(127)
        }
        Forked::Parent(pid) => {
            drop(err_w);
            drop(stdio);
            // The command's own exec waits for the init's answer under an exec allowlist:
            // answered while waiting for the exec's outcome.
            if let Some(w) = &init.exec_watch {
                loop {
                    let mut fds = [
                        PollFd::new(err_r.as_fd(), PollFlags::POLLIN),
                        PollFd::new(w.fd(), PollFlags::POLLIN),
                    ];
                    match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) => {}
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => break,
                    }
                    let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
                    let (outcome, exec) = (ready(&fds[0]), ready(&fds[1]));
                    if exec && !report_exec(ctl, w) {
                        sys::exit_immediately(0);
                    }
                    if outcome {
                        break;
                    }
                }
            }
            let mut message = String::new();
            let _ = err_r.read_to_string(&mut message);
            if message.is_empty() {
                // The caller relays the terminal; the init keeps no end of it.
                if let Some(master) = master
                    && proto::send(ctl, &Reply::Terminal, &[master.as_fd()]).is_err()
                {
                    sys::exit_immediately(0);
                }
                Ok(pid)
            } else {
                let _ = nix::sys::wait::waitpid(pid, None);
                Err(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use crate::report::LandlockReport;
    use crate::spec::{Workspace, WorkspaceMode};

    #[test]
    fn a_mount_strictly_beneath_the_workspace_is_found() {
        let info = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
40 22 0:40 / /home/u/proj/my\\040data rw - tmpfs tmpfs rw
41 22 0:41 / /home/u/proj rw - tmpfs tmpfs rw
42 22 0:42 / /home/u/project2/x rw - tmpfs tmpfs rw
";
        assert_eq!(
            mount_beneath(info, Path::new("/home/u/proj")),
            Some(PathBuf::from("/home/u/proj/my data"))
        );
        // The workspace being a mount point itself, or a name that merely begins alike,
        // is no mount beneath it.
        assert_eq!(mount_beneath(info, Path::new("/home/u/project2/x")), None);
        assert_eq!(mount_beneath(info, Path::new("/home/u/pro")), None);
        assert_eq!(mount_beneath(info, Path::new("/srv")), None);
    }

    /// A pack's write places or exec allowlist refuse a start Landlock cannot fully hold;
    /// a sandbox that asks neither starts with a warning only.
    #[test]
    fn lists_only_landlock_holds_need_it_fully_enforced() {
        let mut spec = SandboxSpec::new(
            "box",
            "/state".into(),
            Workspace {
                host_dir: "/src".into(),
                mode: WorkspaceMode::Copy,
            },
        );
        let report = |enforcement| LandlockReport {
            abi: 3,
            enforcement,
            ..LandlockReport::default()
        };
        for e in [
            LandlockEnforcement::Fully,
            LandlockEnforcement::Partially,
            LandlockEnforcement::NotEnforced,
        ] {
            assert_eq!(landlock_shortfall(&spec, &report(e)), None);
        }
        spec.exec_only = Some(vec!["/usr/bin/python3".into()]);
        assert_eq!(
            landlock_shortfall(&spec, &report(LandlockEnforcement::Fully)),
            None
        );
        let why = landlock_shortfall(&spec, &report(LandlockEnforcement::Partially)).unwrap();
        assert!(
            why.contains("exec allowlist") && why.contains("only partially"),
            "{why}"
        );
        spec.write_only = Some(vec!["/tmp".into()]);
        let why = landlock_shortfall(&spec, &report(LandlockEnforcement::NotEnforced)).unwrap();
        assert!(
            why.contains("write places and exec allowlist") && why.contains("not at all"),
            "{why}"
        );
    }
}
