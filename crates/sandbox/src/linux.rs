//! The real [`Kernel`]: performs each effect with nix, rustix, landlock, seccompiler and caps
//! (the few raw calls are in `sys`).

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use caps::{CapSet, Capability};
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::FsFlags;
use nix::unistd::{Gid, Uid};
use rustix::fs::{Mode, OFlags};

use crate::idmap::IdMaps;
use crate::kernel::{Applied, Effect, IdKind, Kernel, LandlockRules};
use crate::report::{LandlockEnforcement, LandlockReport};
use crate::spec::ListenerKind;
use crate::sys;

/// The real kernel.
#[derive(Debug, Default)]
pub(crate) struct Linux {
    /// Read end of the pipe the helper writes to once the init may proceed.
    pub release: Option<OwnedFd>,
    /// The command's stdin, stdout, stderr (for `Effect::Stdio`).
    pub stdio: Option<[OwnedFd; 3]>,
    /// The release pipe once read: it reports end-of-file when the helper dies.
    pub lifeline: Option<std::fs::File>,
    /// Warnings the helper sent with the release.
    pub release_notes: Vec<String>,
    /// The ruleset commands enter (made by `Effect::PrepareLandlock`).
    pub landlock: Option<RulesetCreated>,
    /// The seccomp filters, compiled once by the init (with its Landlock ruleset) and
    /// inherited by each command.
    pub seccomp: Option<crate::seccomp::Programs>,
    /// What an exec allowlist grants, canonical (made by `Effect::PrepareLandlock`),
    /// without the dynamic loaders granted only for loading ([`ExecGrants::loaders`]).
    pub exec_granted: Vec<PathBuf>,
    /// Those loaders, canonical: run by name, they are refused.
    pub exec_loaders: Vec<PathBuf>,
    /// The init's view of its commands' execs (`Effect::WatchExecs`).
    pub exec_watch: Option<crate::execwatch::ExecWatch>,
    /// What is weaker than asked, found while applying (for the start report).
    pub warnings: Vec<String>,
}

impl Linux {
    /// [`Effect::Beneath`].
    fn apply_beneath(&mut self, root: &Path, inner: &Effect) -> io::Result<Applied> {
        match inner {
            Effect::MakeDir { path, mode, owner } => {
                // The mode and owner go to what was made or found.
                let (fd, _) = make_dir_beneath(root, path, *mode)?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(*mode))
                    .map_err(|e| with_path(e.into(), "chmod", path))?;
                if let Some((uid, gid)) = owner {
                    rustix::fs::fchown(
                        &fd,
                        Some(rustix::fs::Uid::from_raw(*uid)),
                        Some(rustix::fs::Gid::from_raw(*gid)),
                    )
                    .map_err(|e| with_path(e.into(), "chown", path))?;
                }
                Ok(Applied::Nothing)
            }
            Effect::EnsureDir { path, owner } => {
                // Only one just made becomes the agent's; what was there stays as it is.
                let (fd, made) = make_dir_beneath(root, path, 0o755)?;
                if made {
                    rustix::fs::fchown(
                        &fd,
                        Some(rustix::fs::Uid::from_raw(owner.0)),
                        Some(rustix::fs::Gid::from_raw(owner.1)),
                    )
                    .map_err(|e| with_path(e.into(), "chown", path))?;
                }
                Ok(Applied::Nothing)
            }
            Effect::Mount { target, .. } | Effect::Remount { target, .. } => {
                let fd = open_beneath(root, target, OFlags::PATH | OFlags::DIRECTORY)?;
                let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                let rewritten = match inner.clone() {
                    Effect::Mount {
                        source,
                        fstype,
                        flags,
                        data,
                        ..
                    } => Effect::Mount {
                        // A place bound over itself is bound from the descriptor too.
                        source: if source.as_ref() == Some(target) {
                            Some(via.clone())
                        } else {
                            source
                        },
                        target: via,
                        fstype,
                        flags,
                        data,
                    },
                    Effect::Remount { flags, .. } => Effect::Remount { target: via, flags },
                    _ => unreachable!("matched above"),
                };
                self.apply(&rewritten).map_err(|e| {
                    io::Error::new(e.kind(), format!("{e} (at `{}`)", target.display()))
                })
            }
            Effect::BindVetted {
                source,
                identity,
                target,
            } => {
                let src = rustix::fs::open(
                    source,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| with_path(e.into(), "open", source))?;
                let st =
                    rustix::fs::fstat(&src).map_err(|e| with_path(e.into(), "stat", source))?;
                if (st.st_dev, st.st_ino) != *identity {
                    return Err(other(format!(
                        "`{}` is no longer the directory capgate checked: it changed while the sandbox started",
                        source.display()
                    )));
                }
                let fd = open_beneath(root, target, OFlags::PATH | OFlags::DIRECTORY)?;
                self.apply(&Effect::Mount {
                    source: Some(PathBuf::from(format!("/proc/self/fd/{}", src.as_raw_fd()))),
                    target: PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
                    fstype: None,
                    flags: MsFlags::MS_BIND,
                    data: None,
                })
                .map_err(|e| io::Error::new(e.kind(), format!("{e} (at `{}`)", target.display())))
            }
            other_effect => Err(other(format!(
                "only a directory, a mount, a remount or a vetted bind is applied beneath a root, not {other_effect:?}"
            ))),
        }
    }

    /// [`Effect::BindView`].
    fn bind_view(
        &mut self,
        from: &Path,
        rel: &Path,
        view: &Path,
        writable: bool,
        owner: (u32, u32),
    ) -> io::Result<Applied> {
        let source = from.join(rel);
        let src = match open_beneath(from, &source, OFlags::PATH) {
            Ok(fd) => fd,
            // Not in the workspace, or only through a link: not in the view either.
            Err(e)
                if !writable
                    && matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                    ) =>
            {
                return Ok(Applied::Nothing);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A write place the workspace lacks: made there, the agent's.
                let mut at = from.to_path_buf();
                for part in rel.components() {
                    at.push(part);
                    let (fd, made) = make_dir_beneath(from, &at, 0o755)?;
                    if made {
                        rustix::fs::fchown(
                            &fd,
                            Some(rustix::fs::Uid::from_raw(owner.0)),
                            Some(rustix::fs::Gid::from_raw(owner.1)),
                        )
                        .map_err(|e| with_path(e.into(), "chown", &at))?;
                    }
                }
                open_beneath(from, &source, OFlags::PATH)?
            }
            Err(e) => return Err(e),
        };
        let kind = rustix::fs::fstat(&src)
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
            .map_err(|e| with_path(e.into(), "stat", &source))?;
        let is_dir = match kind {
            rustix::fs::FileType::Directory => true,
            // A write place is a directory (as beneath any other mount).
            _ if writable => return Err(not_through_links(from, &source)),
            rustix::fs::FileType::RegularFile => false,
            // A link (opened as itself, never followed), a device, a socket or a pipe where a
            // listed path should be: nothing is shown.
            _ => return Ok(Applied::Nothing),
        };
        // The mount point in the view, parents first (the view is capgate's own tmpfs).
        let target = view.join(rel);
        let mut at = view.to_path_buf();
        let parts: Vec<_> = rel.components().collect();
        for (i, part) in parts.iter().enumerate() {
            at.push(part);
            // Already there (inside a path shown before, whose bind holds it): used as it
            // is, never made or opened for writing through that bind.
            if let Ok(there) = open_beneath(view, &at, OFlags::PATH) {
                let there_dir = rustix::fs::fstat(&there).is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::Directory
                });
                if there_dir != (i + 1 < parts.len() || is_dir) {
                    return Err(not_through_links(view, &at));
                }
                continue;
            }
            if i + 1 < parts.len() || is_dir {
                make_dir_beneath(view, &at, 0o755)?;
            } else {
                let parent = open_beneath(
                    view,
                    at.parent().unwrap_or(view),
                    OFlags::PATH | OFlags::DIRECTORY,
                )?;
                let name = at
                    .file_name()
                    .ok_or_else(|| other("a view path has no name"))?;
                rustix::fs::openat(
                    &parent,
                    name,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::RDONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .map_err(|e| with_path(e.into(), "create", &at))?;
            }
        }
        let dst = open_beneath(view, &target, OFlags::PATH)?;
        nix::mount::mount(
            Some(Path::new(&format!("/proc/self/fd/{}", src.as_raw_fd()))),
            Path::new(&format!("/proc/self/fd/{}", dst.as_raw_fd())),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| nix_err(e, "bind", &target))?;
        let mut flags = MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if !writable {
            flags |= MsFlags::MS_RDONLY;
        }
        // A view of a noexec workspace (under an exec allowlist) stays noexec.
        let source_flags = rustix::fs::fstatvfs(&src)
            .map_err(|e| with_path(e.into(), "statvfs", &source))?
            .f_flag;
        if source_flags.contains(rustix::fs::StatVfsMountFlags::NOEXEC) {
            flags |= MsFlags::MS_NOEXEC;
        }
        // Opened again: the path now leads to the bind just made.
        let bound = open_beneath(view, &target, OFlags::PATH)?;
        self.apply(&Effect::Remount {
            target: PathBuf::from(format!("/proc/self/fd/{}", bound.as_raw_fd())),
            flags,
        })
        .map_err(|e| io::Error::new(e.kind(), format!("{e} (at `{}`)", target.display())))
    }

    /// A copy of the prepared ruleset for a forked command (it shares the kernel object).
    pub(crate) fn landlock_for_child(&self) -> Option<RulesetCreated> {
        self.landlock.as_ref().and_then(|r| r.try_clone().ok())
    }
}

/// Opens a pseudo-terminal in the sandbox's own `devpts` (the init's `/dev/ptmx`) for a
/// command that runs as `id` (its uid and gid): the controlling side and the terminal,
/// sized `rows` × `cols`. The terminal's node belongs to the command's user, as `login`
/// would make it: the init opens the multiplexer with that filesystem identity.
///
/// A terminal that only shows output (`controlling` false: the caller's terminal stays in
/// its own mode, cooked) leaves the line ends as the command writes them: the caller's
/// terminal turns `\n` into `\r\n` itself, and would otherwise show `\r\r\n`. A
/// controlling one does the turning, as the caller's terminal is then raw.
pub(crate) fn open_terminal(
    id: u32,
    (rows, cols): (u16, u16),
    controlling: bool,
) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::{OpenptFlags, ioctl_tiocgptpeer, openpt, unlockpt};
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = as_filesystem_user(id, || openpt(flags).map_err(io::Error::from))
        .map_err(|e| io::Error::new(e.kind(), format!("open /dev/ptmx: {e}")))?;
    unlockpt(&master).map_err(|e| io::Error::new(e.kind(), format!("unlock the pty: {e}")))?;
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(&master, size)
        .map_err(|e| io::Error::new(e.kind(), format!("size the pty: {e}")))?;
    // From the controlling side, never by its name under /dev/pts.
    let terminal = ioctl_tiocgptpeer(&master, flags)
        .map_err(|e| io::Error::new(e.kind(), format!("open the pty's terminal: {e}")))?;
    if !controlling {
        let mut modes = rustix::termios::tcgetattr(&terminal)?;
        modes
            .output_modes
            .remove(rustix::termios::OutputModes::ONLCR);
        rustix::termios::tcsetattr(&terminal, rustix::termios::OptionalActions::Now, &modes)
            .map_err(|e| io::Error::new(e.kind(), format!("set the pty's line ends: {e}")))?;
    }
    Ok((master, terminal))
}

/// SIGKILL to every process of the init's pid namespace but the init. The init has no
/// `CAP_KILL`, and its own credentials never change (a change of its effective uid would
/// reset its dumpable flag and parent-death signal, and for a moment let the agent's
/// processes act on it): a child of it takes the agent's effective uid and signals
/// (`kill(-1)` spares the caller and the namespace's init). With its real uid 0 it may
/// signal root's processes, with the effective one the agent's: all there are, as nothing
/// inside can take another uid. The init is single-threaded, so the child may do anything.
pub(crate) fn kill_every_process() -> io::Result<()> {
    match crate::sys::fork_single_threaded()? {
        crate::sys::Forked::Child => {
            let agent = Uid::from_raw(crate::spec::AGENT_ID);
            let unchanged = Uid::from_raw(u32::MAX);
            let killed = caps::raise(None, CapSet::Effective, Capability::CAP_SETUID).is_ok()
                && nix::unistd::setresuid(unchanged, agent, unchanged).is_ok()
                && matches!(
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(-1),
                        nix::sys::signal::Signal::SIGKILL
                    ),
                    // Nobody to signal: nothing is left.
                    Ok(()) | Err(nix::errno::Errno::ESRCH)
                );
            crate::sys::exit_immediately(if killed { 0 } else { 1 })
        }
        crate::sys::Forked::Parent(pid) => loop {
            match nix::sys::wait::waitpid(pid, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => return Ok(()),
                Ok(status) => return Err(other(format!("the killer ended as {status:?}"))),
                Err(e) => return Err(io::Error::from(e)),
            }
        },
    }
}

/// Runs `f` with the filesystem uid and gid `id` (the init is single-threaded, and these
/// are per thread), then takes 0 back; `CAP_SETUID` and `CAP_SETGID` are effective only
/// meanwhile.
fn as_filesystem_user<T>(id: u32, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let raise = || {
        caps::raise(None, CapSet::Effective, Capability::CAP_SETUID)
            .and_then(|()| caps::raise(None, CapSet::Effective, Capability::CAP_SETGID))
            .map_err(caps_err)
    };
    let switch = |to: u32| {
        nix::unistd::setfsgid(Gid::from_raw(to));
        nix::unistd::setfsuid(Uid::from_raw(to));
        // Both calls answer the previous identity, never an error: asked again, they say
        // whether the switch took.
        let (g, u) = (
            nix::unistd::setfsgid(Gid::from_raw(to)),
            nix::unistd::setfsuid(Uid::from_raw(to)),
        );
        (g.as_raw() == to && u.as_raw() == to)
            .then_some(())
            .ok_or_else(|| other(format!("cannot take the filesystem identity {to}")))
    };
    // Whatever fails on the way, the way back is taken (taking 0 back as 0 needs no
    // capability; dropping one not raised is no error).
    let result = raise().and_then(|()| switch(id)).and_then(|()| f());
    let back = switch(0).and_then(|()| {
        caps::drop(None, CapSet::Effective, Capability::CAP_SETUID)
            .and_then(|()| caps::drop(None, CapSet::Effective, Capability::CAP_SETGID))
            .map_err(caps_err)
    });
    // The init must not go on as another user or with capabilities raised: it ends, and
    // the sandbox with it.
    if back.is_err() {
        sys::exit_immediately(1);
    }
    result
}

/// `mkdir` of `path` beneath `root` (through descriptors, never following a link), then
/// the directory opened again by name from its parent's descriptor, so that a link someone
/// swapped in is refused: the directory and whether this call made it.
fn make_dir_beneath(root: &Path, path: &Path, mode: u32) -> io::Result<(OwnedFd, bool)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(other(format!("`{}` has no parent", path.display())));
    };
    let parent_fd = open_beneath(root, parent, OFlags::PATH | OFlags::DIRECTORY)?;
    let made = match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(mode)) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        Err(e) => return Err(with_path(e.into(), "mkdir", path)),
    };
    let fd = rustix::fs::openat(
        &parent_fd,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP => not_through_links(root, path),
        e => with_path(e.into(), "open", path),
    })?;
    Ok((fd, made))
}

fn other(message: impl std::fmt::Display) -> io::Error {
    io::Error::other(message.to_string())
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} `{}`: {e}", path.display()))
}

fn nix_err(e: nix::Error, what: &str, path: &Path) -> io::Error {
    with_path(io::Error::from(e), what, path)
}

/// Flags a remount must keep because the kernel locks them when the mount came from a more
/// privileged namespace (dropping one gives EPERM).
/// The error for a path that crosses a symbolic link (or something not a directory).
fn not_through_links(root: &Path, at: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotADirectory,
        format!(
            "`/{}` is a symbolic link or not a directory (left in a volume or the workspace?): nothing is made or mounted through one",
            at.strip_prefix(root).unwrap_or(at).display()
        ),
    )
}

/// Opens `path` below `root` one component at a time, never following a symbolic link
/// (`O_PATH | O_NOFOLLOW | O_DIRECTORY`); the last component with `last` flags.
fn open_beneath(root: &Path, path: &Path, last: OFlags) -> io::Result<OwnedFd> {
    let below = path.strip_prefix(root).map_err(|_| {
        other(format!(
            "`{}` is not below `{}`",
            path.display(),
            root.display()
        ))
    })?;
    let walk = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir: OwnedFd = rustix::fs::open(root, walk, Mode::empty())
        .map_err(|e| with_path(e.into(), "open", root))?;
    let parts: Vec<_> = below.components().collect();
    let mut at = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        let Component::Normal(name) = part else {
            return Err(other(format!(
                "`{}`: unexpected path component",
                path.display()
            )));
        };
        at.push(name);
        let flags = if i + 1 == parts.len() { last } else { walk };
        dir = match rustix::fs::openat(
            &dir,
            *name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
                return Err(not_through_links(root, &at));
            }
            Err(e) => return Err(with_path(e.into(), "open", &at)),
        };
    }
    Ok(dir)
}

fn locked_flags(target: &Path) -> io::Result<MsFlags> {
    let vfs = nix::sys::statvfs::statvfs(target).map_err(|e| nix_err(e, "statvfs", target))?;
    let f = vfs.flags();
    let mut out = MsFlags::empty();
    for (st, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(st) {
            out |= ms;
        }
    }
    Ok(out)
}

/// The handled filesystem rights: everything that modifies the filesystem. Reads and
/// execution are not handled (the new root only holds what may be read).
fn handled_fs() -> BitFlags<AccessFs> {
    AccessFs::WriteFile
        | AccessFs::RemoveDir
        | AccessFs::RemoveFile
        | AccessFs::MakeChar
        | AccessFs::MakeDir
        | AccessFs::MakeReg
        | AccessFs::MakeSock
        | AccessFs::MakeFifo
        | AccessFs::MakeBlock
        | AccessFs::MakeSym
        | AccessFs::Refer
        | AccessFs::Truncate
}

/// What an exec allowlist lets run ([`exec_grants`]).
#[derive(Debug, Default)]
struct ExecGrants {
    /// Each listed path, and the interpreters granted with them.
    programs: Vec<PathBuf>,
    /// Of those interpreters, the dynamic loaders: the `PT_INTERP` files of ELF programs.
    /// Landlock must grant a loader, or no dynamically linked program could start, yet
    /// the kernel loads it without an `execve` of its own; an `execve` of it by name runs
    /// any readable program (`ld.so /bin/sh`), so the init's exec watch refuses that,
    /// unless the list names the loader itself (see `PrepareLandlock`).
    loaders: Vec<PathBuf>,
}

/// The programs an exec allowlist lets run: each listed path, and for each listed file the
/// interpreter it names, and that one's own (a script's `#!` interpreter is itself an ELF
/// program with a loader), each only if it is a regular file. Read in the sandbox's own
/// view of the files; the listed paths are never beneath a place the workload can write
/// (`SandboxSpec::validate`), so it cannot choose what they name.
fn exec_grants(roots: &[PathBuf]) -> ExecGrants {
    let mut out = ExecGrants::default();
    let mut queue: Vec<(PathBuf, u8)> = roots.iter().map(|r| (r.clone(), 0)).collect();
    while let Some((path, depth)) = queue.pop() {
        if out.programs.contains(&path) {
            continue;
        }
        // A named interpreter is granted only as the regular file it is (never a directory
        // a `#!` line names, which would grant all beneath it).
        let is_file = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
        if depth > 0 && !is_file {
            continue;
        }
        if depth < 2
            && is_file
            && let Ok(file) = std::fs::File::open(&path)
        {
            let mut head = Vec::new();
            let _ = std::io::Read::take(file, crate::elf::HEAD_LEN as u64).read_to_end(&mut head);
            if let Some(interp) = crate::elf::interpreter(&head) {
                if head.starts_with(b"\x7fELF") && !out.loaders.contains(&interp) {
                    out.loaders.push(interp.clone());
                }
                queue.push((interp, depth + 1));
            }
        }
        out.programs.push(path);
    }
    out
}

fn landlock_error(e: impl std::fmt::Display) -> io::Error {
    other(format!("landlock: {e}"))
}

/// The ruleset for `rules`, whose exec allowlist grants `programs` ([`exec_grants`]).
fn build_landlock(rules: &LandlockRules, programs: &[PathBuf]) -> io::Result<RulesetCreated> {
    let handled = match rules.exec_roots {
        Some(_) => handled_fs() | AccessFs::Execute,
        None => handled_fs(),
    };
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)
        .map_err(landlock_error)?
        .handle_access(AccessNet::ConnectTcp)
        .map_err(landlock_error)?
        .scope(Scope::from_all(ABI::V6))
        .map_err(landlock_error)?;
    let mut created = ruleset.create().map_err(landlock_error)?;
    for root in &rules.write_roots {
        // PathFd follows a link: a write root that is one would grant where it leads.
        if std::fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(landlock_error(format!(
                "`{}` is a symbolic link; a write place is granted only as itself",
                root.display()
            )));
        }
        let fd =
            PathFd::new(root).map_err(|e| landlock_error(format!("`{}`: {e}", root.display())))?;
        created = created
            .add_rule(PathBeneath::new(fd, handled_fs()))
            .map_err(landlock_error)?;
    }
    for file in &rules.write_files {
        let fd =
            PathFd::new(file).map_err(|e| landlock_error(format!("`{}`: {e}", file.display())))?;
        created = created
            .add_rule(PathBeneath::new(
                fd,
                AccessFs::WriteFile | AccessFs::Truncate,
            ))
            .map_err(landlock_error)?;
    }
    for program in programs {
        let fd = PathFd::new(program)
            .map_err(|e| landlock_error(format!("`{}`: {e}", program.display())))?;
        created = created
            .add_rule(PathBeneath::new(fd, AccessFs::Execute))
            .map_err(landlock_error)?;
    }
    for &port in &rules.tcp_connect_ports {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(landlock_error)?;
    }
    // Denials by the exec'd workload go to the audit log too (ABI 7; the default logs only
    // denials before the next exec).
    created.log_new_exec(true).map_err(landlock_error)
}

/// Enters the ruleset (in a command's child, or in the probe child) and reports the outcome.
fn enter_landlock(ruleset: &RulesetCreated) -> io::Result<LandlockReport> {
    let abi = sys::landlock_abi();
    let status = ruleset
        .try_clone()?
        .restrict_self()
        .map_err(landlock_error)?;
    let enforcement = match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockEnforcement::Fully,
        RulesetStatus::PartiallyEnforced => LandlockEnforcement::Partially,
        RulesetStatus::NotEnforced => LandlockEnforcement::NotEnforced,
    };
    let enforced = enforcement != LandlockEnforcement::NotEnforced;
    Ok(LandlockReport {
        abi,
        enforcement,
        tcp_connect_restricted: enforced && abi >= 4,
        scoped: enforced && abi >= 6,
        audit_logging: enforced && abi >= 7 && status.log_new_exec,
        no_new_privs: status.no_new_privs,
    })
}

/// What the kernel enforces of the ruleset, learned by a short-lived child that enters it
/// (entering is irreversible, so the init itself stays outside).
fn probe_landlock(ruleset: &RulesetCreated) -> io::Result<LandlockReport> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    match sys::fork_single_threaded()? {
        sys::Forked::Child => {
            drop(r);
            let code = match enter_landlock(ruleset) {
                Ok(report) => {
                    let text = serde_json::to_vec(&report).unwrap_or_default();
                    let mut w = std::fs::File::from(w);
                    if w.write_all(&text).is_ok() { 0 } else { 1 }
                }
                Err(e) => {
                    let mut w = std::fs::File::from(w);
                    let _ = w.write_all(format!("!{e}").as_bytes());
                    1
                }
            };
            sys::exit_immediately(code)
        }
        sys::Forked::Parent(pid) => {
            drop(w);
            let mut text = String::new();
            std::fs::File::from(r).read_to_string(&mut text)?;
            let _ = nix::sys::wait::waitpid(pid, None);
            if let Some(message) = text.strip_prefix('!') {
                return Err(other(message));
            }
            serde_json::from_str(&text).map_err(|e| other(format!("landlock probe: {e}")))
        }
    }
}

fn caps_err(e: caps::errors::CapsError) -> io::Error {
    other(format!("capabilities: {e}"))
}

/// Checks the kernel's view of this process's capability sets (`/proc/self/status`).
fn verify_no_capabilities() -> io::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    for line in status.lines() {
        for field in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            if let Some(value) = line.strip_prefix(field)
                && !value.trim().trim_start_matches('0').is_empty()
            {
                {
                    return Err(other(format!(
                        "{field} is {} after dropping every capability",
                        value.trim()
                    )));
                }
            }
        }
    }
    Ok(())
}

fn write_id_map(
    pid: i32,
    kind: IdKind,
    maps: &[crate::idmap::IdRange],
    via_helper: bool,
) -> io::Result<()> {
    let (file, tool) = match kind {
        IdKind::Uid => ("uid_map", "newuidmap"),
        IdKind::Gid => ("gid_map", "newgidmap"),
    };
    if via_helper {
        let mut cmd = std::process::Command::new(tool);
        cmd.arg(pid.to_string());
        for r in maps {
            cmd.args([
                r.inside.to_string(),
                r.outside.to_string(),
                r.count.to_string(),
            ]);
        }
        let status = cmd
            .status()
            .map_err(|e| other(format!("`{tool}`: {e} (install the `uidmap` package)")))?;
        if !status.success() {
            return Err(other(format!(
                "`{tool}` failed with {status}; check /etc/subuid and /etc/subgid"
            )));
        }
        return Ok(());
    }
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    let text = IdMaps::render(maps);
    // One write(2): the kernel accepts the map only as a single write.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| with_path(e, "open", &path))?;
    f.write_all(text.as_bytes())
        .map_err(|e| with_path(e, "write", &path))
}

fn exec(candidates: &[PathBuf], argv: &[String], env: &[String]) -> io::Error {
    let to_c = |s: &str| CString::new(s).map_err(|_| other(format!("`{s}` contains a NUL byte")));
    let argv: Result<Vec<CString>, io::Error> = argv.iter().map(|a| to_c(a)).collect();
    let env: Result<Vec<CString>, io::Error> = env.iter().map(|a| to_c(a)).collect();
    let (argv, env) = match (argv, env) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    let mut saw_eacces = false;
    for path in candidates {
        let Some(text) = path.to_str() else { continue };
        let Ok(c_path) = CString::new(text) else {
            continue;
        };
        let Err(e) = nix::unistd::execve(&c_path, &argv, &env);
        let e = io::Error::from(e);
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => {}
            Some(libc::EACCES) => {
                saw_eacces = true;
                last = e;
            }
            _ => return e,
        }
    }
    if saw_eacces {
        return io::Error::from_raw_os_error(libc::EACCES);
    }
    last
}

impl Kernel for Linux {
    fn apply(&mut self, effect: &Effect) -> io::Result<Applied> {
        match effect {
            Effect::ClearSupplementaryGroups => match nix::unistd::setgroups(&[]) {
                Ok(()) => {}
                // Nothing to shed: a `deny` written by newgidmap changes nothing then.
                Err(_) if nix::unistd::getgroups().is_ok_and(|g| g.is_empty()) => {}
                Err(e) => {
                    return Err(other(format!(
                        "cannot shed the invoking user's supplementary groups ({e}): every process inside would keep them; this host's newgidmap denies setgroups in the sandbox's user namespace"
                    )));
                }
            },
            Effect::CgroupEnableControllers { dir, controllers } => {
                let file = dir.join("cgroup.subtree_control");
                std::fs::write(&file, controllers).map_err(|e| with_path(e, "write", &file))?;
            }
            Effect::CgroupCreate(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| with_path(e, "mkdir", dir))?;
            }
            Effect::CgroupWrite { file, value } => {
                if !file.exists() {
                    return Ok(Applied::Absent);
                }
                std::fs::write(file, value).map_err(|e| with_path(e, "write", file))?;
            }
            Effect::CgroupAddProcess { dir, pid } => {
                let file = dir.join("cgroup.procs");
                std::fs::write(&file, pid.to_string()).map_err(|e| with_path(e, "write", &file))?;
            }
            Effect::CgroupJoinSelf(dir) => {
                let file = dir.join("tasks");
                std::fs::write(&file, "0").map_err(|e| with_path(e, "write", &file))?;
            }
            Effect::CgroupRemove(dir) => {
                std::fs::remove_dir(dir).map_err(|e| with_path(e, "rmdir", dir))?;
            }
            Effect::NewCgroupNamespace => {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
                    .map_err(|e| other(format!("unshare(CLONE_NEWCGROUP): {e}")))?;
            }
            Effect::DenySetgroups { pid } => {
                let path = PathBuf::from(format!("/proc/{pid}/setgroups"));
                std::fs::write(&path, "deny").map_err(|e| with_path(e, "write", &path))?;
            }
            Effect::WriteIdMap {
                pid,
                kind,
                ranges,
                via_setuid_helper,
            } => write_id_map(*pid, *kind, ranges, *via_setuid_helper)?,
            Effect::SetParentDeathSignal => {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(io::Error::from)?;
            }
            Effect::AwaitRelease => {
                let pipe = self
                    .release
                    .take()
                    .ok_or_else(|| other("no release pipe"))?;
                let mut file = std::fs::File::from(pipe);
                let mut message = Vec::new();
                let mut byte = [0u8; 1];
                loop {
                    if file.read(&mut byte)? == 0 {
                        return Err(other("the helper exited before releasing the sandbox"));
                    }
                    if byte[0] == 0 {
                        break;
                    }
                    message.push(byte[0]);
                }
                if message.first() != Some(&1) {
                    return Err(other("malformed release from the helper"));
                }
                self.release_notes = String::from_utf8_lossy(&message[1..])
                    .lines()
                    .map(str::to_string)
                    .collect();
                self.lifeline = Some(file);
            }
            Effect::SetIds { uid, gid } => {
                let (u, g) = (Uid::from_raw(*uid), Gid::from_raw(*gid));
                nix::unistd::setresgid(g, g, g).map_err(io::Error::from)?;
                nix::unistd::setresuid(u, u, u).map_err(io::Error::from)?;
            }
            Effect::SetHostname(name) => nix::unistd::sethostname(name).map_err(io::Error::from)?,
            Effect::MakeMountsPrivate => {
                nix::mount::mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&str>,
                )
                .map_err(|e| nix_err(e, "make private", Path::new("/")))?;
            }
            Effect::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => {
                nix::mount::mount(
                    source.as_deref(),
                    target.as_path(),
                    *fstype,
                    *flags,
                    data.as_deref(),
                )
                .map_err(|e| {
                    nix_err(
                        e,
                        &format!(
                            "mount {} {}",
                            fstype.unwrap_or("bind"),
                            source
                                .as_deref()
                                .map(|s| s.display().to_string())
                                .unwrap_or_default()
                        ),
                        target,
                    )
                })?;
            }
            Effect::Remount { target, flags } => {
                let keep = locked_flags(target)?;
                let mut flags = *flags | MsFlags::MS_REMOUNT;
                // Keep the atime flags the kernel locked, but never re-add MS_RDONLY to a
                // mount meant to be writable unless it was locked so (then the caller learns
                // of it on the first write, as on the host).
                flags |= keep;
                nix::mount::mount(
                    None::<&str>,
                    target.as_path(),
                    None::<&str>,
                    flags,
                    None::<&str>,
                )
                .map_err(|e| nix_err(e, "remount", target))?;
            }
            Effect::Beneath { root, inner } => return self.apply_beneath(root, inner),
            Effect::EnsureDir { path, .. } => {
                return Err(other(format!(
                    "`{}` is made beneath a root only, never by path",
                    path.display()
                )));
            }
            Effect::BindVetted { target, .. } => {
                return Err(other(format!(
                    "`{}` is bound beneath a root only, never by path",
                    target.display()
                )));
            }
            Effect::BindView {
                from,
                rel,
                view,
                writable,
                owner,
            } => return self.bind_view(from, rel, view, *writable, *owner),
            Effect::MakeDir { path, mode, owner } => {
                match std::fs::DirBuilder::new().mode(*mode).create(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
                    Err(e) => return Err(with_path(e, "mkdir", path)),
                }
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                    .map_err(|e| with_path(e, "chmod", path))?;
                if let Some((uid, gid)) = owner {
                    nix::unistd::chown(
                        path.as_path(),
                        Some(Uid::from_raw(*uid)),
                        Some(Gid::from_raw(*gid)),
                    )
                    .map_err(|e| nix_err(e, "chown", path))?;
                }
            }
            Effect::WriteFile {
                path,
                contents,
                mode,
            } => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(*mode)
                    .open(path)
                    .map_err(|e| with_path(e, "create", path))?;
                f.write_all(contents)
                    .map_err(|e| with_path(e, "write", path))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                    .map_err(|e| with_path(e, "chmod", path))?;
            }
            Effect::Symlink { target, link } => {
                std::os::unix::fs::symlink(target, link)
                    .map_err(|e| with_path(e, "symlink", link))?;
            }
            Effect::PivotRoot(root) => {
                nix::unistd::chdir(root.as_path()).map_err(|e| nix_err(e, "chdir", root))?;
                nix::unistd::pivot_root(".", ".").map_err(|e| nix_err(e, "pivot_root", root))?;
                nix::mount::umount2(".", MntFlags::MNT_DETACH)
                    .map_err(|e| nix_err(e, "detach old root", root))?;
                nix::unistd::chdir("/").map_err(|e| nix_err(e, "chdir", Path::new("/")))?;
            }
            Effect::LoopbackUp => {
                sys::loopback_up().map_err(|e| other(format!("bringing up lo: {e}")))?
            }
            Effect::Listen(spec) => {
                let fd: OwnedFd = match spec.kind {
                    ListenerKind::Tcp => std::net::TcpListener::bind(spec.addr)
                        .map_err(|e| other(format!("listen on {}: {e}", spec.addr)))?
                        .into(),
                    ListenerKind::Udp => std::net::UdpSocket::bind(spec.addr)
                        .map_err(|e| other(format!("bind udp {}: {e}", spec.addr)))?
                        .into(),
                };
                return Ok(Applied::Listener(fd));
            }
            Effect::SetDumpable(on) => {
                nix::sys::prctl::set_dumpable(*on).map_err(io::Error::from)?
            }
            Effect::DropBoundingSet => caps::clear(None, CapSet::Bounding).map_err(caps_err)?,
            Effect::ClearAmbient => caps::clear(None, CapSet::Ambient).map_err(caps_err)?,
            Effect::NoNewPrivs => nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)?,
            Effect::PrepareLandlock(rules) => {
                // The seccomp programs depend on the same allowlist; compiled here, once,
                // for the init and every command (`Effect::Seccomp` installs them).
                self.seccomp =
                    Some(crate::seccomp::compile(rules.exec_roots.is_some()).map_err(other)?);
                let roots = rules.exec_roots.as_deref().unwrap_or_default();
                let grants = exec_grants(roots);
                let ruleset = build_landlock(rules, &grants.programs)?;
                // For the exec watch: what the list grants, and the loaders it does not
                // name (a loader beneath a listed directory, or listed, is the list's).
                let canonical = |paths: &[PathBuf]| -> Vec<PathBuf> {
                    paths
                        .iter()
                        .filter_map(|p| std::fs::canonicalize(p).ok())
                        .collect()
                };
                let listed = canonical(roots);
                self.exec_loaders = canonical(&grants.loaders)
                    .into_iter()
                    .filter(|l| !crate::execwatch::is_granted(l, &listed))
                    .collect();
                self.exec_granted = canonical(&grants.programs)
                    .into_iter()
                    .filter(|g| !self.exec_loaders.contains(g))
                    .collect();
                let report = probe_landlock(&ruleset)?;
                self.landlock = Some(ruleset);
                return Ok(Applied::Landlock(report));
            }
            Effect::EnterLandlock => {
                let ruleset = self
                    .landlock
                    .as_ref()
                    .ok_or_else(|| other("no landlock ruleset prepared"))?;
                enter_landlock(ruleset)?;
            }
            Effect::LimitCapabilities { permitted } => {
                let keep: caps::CapsHashSet = permitted.iter().copied().collect();
                caps::clear(None, CapSet::Effective).map_err(caps_err)?;
                caps::clear(None, CapSet::Inheritable).map_err(caps_err)?;
                caps::set(None, CapSet::Permitted, &keep).map_err(caps_err)?;
            }
            Effect::WatchExecs => {
                match sys::install_listener(&crate::seccomp::exec_notifier()) {
                    Ok(listener) => {
                        self.exec_watch = Some(crate::execwatch::ExecWatch::new(
                            listener,
                            std::mem::take(&mut self.exec_granted),
                            std::mem::take(&mut self.exec_loaders),
                        ));
                    }
                    // Landlock still refuses; only the record is missing, and said so.
                    Err(e) => self.warnings.push(format!(
                        "refused execs are not recorded: this kernel refuses a seccomp user notification listener ({e}; Linux 5.5 or later is needed, and none may be installed already by a sandbox capgate runs in)"
                    )),
                }
            }
            Effect::Seccomp => {
                let programs = self.seccomp.as_ref().ok_or_else(|| {
                    other("no seccomp filter compiled (no Landlock ruleset prepared)")
                })?;
                for program in &programs.0 {
                    seccompiler::apply_filter(program)
                        .map_err(|e| other(format!("seccomp: {e}")))?;
                }
            }
            Effect::NewSession => {
                nix::unistd::setsid().map_err(io::Error::from)?;
            }
            Effect::LowerRlimit { quota, limit } => {
                use rustix::process::{Resource, Rlimit, setrlimit};
                let resource = match quota {
                    crate::kernel::UserQuota::SigPending => Resource::Sigpending,
                    crate::kernel::UserQuota::MsgQueue => Resource::Msgqueue,
                    crate::kernel::UserQuota::Memlock => Resource::Memlock,
                };
                let limit = Rlimit {
                    current: Some(*limit),
                    maximum: Some(*limit),
                };
                setrlimit(resource, limit).map_err(io::Error::from)?;
            }
            Effect::UserNamespaceLimit { file, value } => {
                match std::fs::OpenOptions::new().write(true).open(file) {
                    Ok(mut f) => {
                        use std::io::Write as _;
                        f.write_all(value.to_string().as_bytes())
                            .map_err(|e| with_path(e, "write", file))?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Applied::Absent),
                    Err(e) => return Err(with_path(e, "open", file)),
                }
            }
            Effect::OomScoreAdj(value) => {
                let path = Path::new("/proc/self/oom_score_adj");
                std::fs::write(path, value.to_string()).map_err(|e| with_path(e, "write", path))?;
            }
            Effect::ResetSignals => sys::reset_signals()?,
            Effect::Stdio(_) => {
                let [stdin, stdout, stderr] = self
                    .stdio
                    .take()
                    .ok_or_else(|| other("no stdio to install"))?;
                nix::unistd::dup2_stdin(&stdin).map_err(io::Error::from)?;
                nix::unistd::dup2_stdout(&stdout).map_err(io::Error::from)?;
                nix::unistd::dup2_stderr(&stderr).map_err(io::Error::from)?;
            }
            Effect::ControllingTerminal(fd) => {
                use std::os::fd::AsFd as _;
                let (stdin, stdout, stderr) = (io::stdin(), io::stdout(), io::stderr());
                let fd = match fd {
                    0 => stdin.as_fd(),
                    1 => stdout.as_fd(),
                    2 => stderr.as_fd(),
                    _ => return Err(other("a controlling terminal is one of fds 0, 1, 2")),
                };
                rustix::process::ioctl_tiocsctty(fd).map_err(io::Error::from)?;
            }
            Effect::CloseOnExecFrom3 => sys::cloexec_from_3()?,
            Effect::RaiseSetIdCapabilities => {
                caps::raise(None, CapSet::Effective, Capability::CAP_SETUID).map_err(caps_err)?;
                caps::raise(None, CapSet::Effective, Capability::CAP_SETGID).map_err(caps_err)?;
            }
            Effect::ClearCapabilities => {
                caps::clear(None, CapSet::Ambient).map_err(caps_err)?;
                caps::clear(None, CapSet::Effective).map_err(caps_err)?;
                caps::clear(None, CapSet::Inheritable).map_err(caps_err)?;
                caps::clear(None, CapSet::Permitted).map_err(caps_err)?;
                verify_no_capabilities()?;
            }
            Effect::Chdir(dir) => {
                nix::unistd::chdir(dir.as_path()).map_err(|e| nix_err(e, "chdir", dir))?
            }
            Effect::Exec {
                candidates,
                argv,
                env,
            } => return Err(exec(candidates, argv, env)),
        }
        Ok(Applied::Nothing)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn write_in(dir: &Path) -> io::Result<()> {
        std::fs::write(dir.join("probe.txt"), "x")
    }

    /// The probe learns what the kernel enforces without confining its caller (the init):
    /// only the probe's child is confined (its twin, a thread that enters the same ruleset,
    /// cannot write outside the granted root).
    #[test]
    fn the_landlock_probe_leaves_its_caller_unconfined() {
        if sys::landlock_abi() < 1 {
            return; // nothing to probe on a kernel without Landlock
        }
        let (granted, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ruleset = build_landlock(
            &LandlockRules {
                write_roots: vec![granted.path().to_path_buf()],
                ..LandlockRules::default()
            },
            &[],
        )
        .unwrap();
        let report = probe_landlock(&ruleset).unwrap();
        assert_ne!(report.enforcement, LandlockEnforcement::NotEnforced);
        write_in(other_dir.path()).unwrap();

        let confined = std::thread::scope(|s| {
            s.spawn(|| {
                enter_landlock(&ruleset).unwrap();
                (write_in(granted.path()), write_in(other_dir.path()))
            })
            .join()
            .unwrap()
        });
        assert!(confined.0.is_ok(), "{confined:?}");
        assert_eq!(
            confined.1.unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        // And still not this thread.
        write_in(other_dir.path()).unwrap();
    }

    #[test]
    fn the_loaders_are_the_elf_programs_interpreters_only() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "#!/usr/bin/env sh\necho\n").unwrap();
        let grants = exec_grants(std::slice::from_ref(&script));
        // The script's interpreter (`/usr/bin/env`) is granted, and its loader with it;
        // only the loader is one.
        assert!(
            grants.programs.contains(&PathBuf::from("/usr/bin/env")),
            "{grants:?}"
        );
        let loaders = &grants.loaders;
        assert_eq!(loaders.len(), 1, "{loaders:?}");
        assert!(
            loaders[0].to_string_lossy().contains("ld-linux"),
            "{loaders:?}"
        );
        assert!(grants.programs.contains(&loaders[0]), "{grants:?}");
        // A program without a loader (a script whose interpreter is missing) has none.
        let alone = dir.path().join("alone");
        std::fs::write(&alone, "#!/no/such/interpreter\n").unwrap();
        assert!(exec_grants(&[alone]).loaders.is_empty());
    }

    /// A listed script's `#!` line adds its interpreter when that is a regular file, and
    /// nothing when it names a directory (which would grant everything beneath it) or
    /// nothing at all.
    #[test]
    fn a_named_interpreter_is_granted_only_as_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let interp = dir.path().join("interp");
        std::fs::write(&interp, "plain data\n").unwrap();
        let script = |name: &str, line: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!{line}\necho\n")).unwrap();
            path
        };
        let to_file = script("to-file", interp.display().to_string());
        assert_eq!(
            exec_grants(std::slice::from_ref(&to_file)).programs,
            [to_file, interp.clone()]
        );
        for (name, line) in [
            ("to-dir", dir.path().display().to_string()),
            ("to-root", "/".to_owned()),
            (
                "to-missing",
                dir.path().join("missing").display().to_string(),
            ),
        ] {
            let path = script(name, line);
            let listed = vec![path];
            assert_eq!(exec_grants(&listed).programs, listed, "{name}");
        }
        // A listed directory stays granted as itself (the list's own choice).
        assert_eq!(
            exec_grants(&[dir.path().to_path_buf()]).programs,
            [dir.path().to_path_buf()]
        );
    }
}
