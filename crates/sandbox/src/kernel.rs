//! Kernel effects as data, behind one small trait: the real implementation
//! ([`crate::linux::Linux`]) performs them, the recording fake ([`Recorder`], tests only)
//! lists them, so the order of effects is tested without root.

use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

use nix::mount::MsFlags;

use crate::idmap::IdRange;
use crate::report::LandlockReport;
use crate::spec::ListenerSpec;

/// uid or gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdKind {
    Uid,
    Gid,
}

/// What Landlock allows (everything not listed among the handled write rights is allowed:
/// reads and execution everywhere in the new root).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LandlockRules {
    /// Create, write, remove, rename and truncate beneath these.
    pub write_roots: Vec<PathBuf>,
    /// Write (and truncate) these files or the files beneath these directories, but create
    /// or remove nothing.
    pub write_files: Vec<PathBuf>,
    /// TCP ports the workload may `connect` to (ABI ≥ 4); all others are refused.
    pub tcp_connect_ports: Vec<u16>,
    /// When set, execution is handled too: only these programs (files, or everything
    /// beneath directories) may be executed, with the interpreters they need.
    pub exec_roots: Option<Vec<PathBuf>>,
}

/// One kernel effect. Paths before `PivotRoot` are host paths; after it, sandbox paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    // ---- helper (host side, before and after creating the init) ----
    /// `setgroups(0, NULL)`: the init must not carry the invoker's supplementary groups.
    ClearSupplementaryGroups,
    /// Lower a per-user resource limit (soft and hard) before the user namespace exists:
    /// the namespace keeps it as its bound on what all of it may charge to the invoking
    /// user, whose quota the workload would otherwise share to the last unit.
    LowerRlimit { quota: UserQuota, limit: u64 },
    /// Write `+pids +memory` to a v2 `cgroup.subtree_control`.
    CgroupEnableControllers { dir: PathBuf, controllers: String },
    /// `mkdir -p` a cgroup.
    CgroupCreate(PathBuf),
    /// Write a cgroup limit file.
    CgroupWrite { file: PathBuf, value: String },
    /// Add a process to a cgroup (`cgroup.procs`).
    CgroupAddProcess { dir: PathBuf, pid: i32 },
    /// The calling (single-threaded) process joins a v1 cgroup: `0` to its `tasks`.
    CgroupJoinSelf(PathBuf),
    /// `unshare(CLONE_NEWCGROUP)`, once in the sandbox's cgroups: `/proc/self/cgroup`
    /// inside shows `/`, not the host's cgroup paths.
    NewCgroupNamespace,
    /// Remove a cgroup directory.
    CgroupRemove(PathBuf),
    /// `echo deny > /proc/<pid>/setgroups`.
    DenySetgroups { pid: i32 },
    /// Write `/proc/<pid>/{uid,gid}_map` (directly, or with `newuidmap`/`newgidmap`).
    WriteIdMap {
        pid: i32,
        kind: IdKind,
        ranges: Vec<IdRange>,
        via_setuid_helper: bool,
    },
    // ---- the sandbox's init ----
    /// `PR_SET_PDEATHSIG(SIGKILL)`: the init dies with the helper.
    SetParentDeathSignal,
    /// Block until the helper has written the id maps (and added the init to any v2
    /// cgroups).
    AwaitRelease,
    /// `setresgid(g,g,g)` then `setresuid(u,u,u)` (inside ids).
    SetIds { uid: u32, gid: u32 },
    /// `sethostname`.
    SetHostname(String),
    /// `mount --make-rprivate /`: nothing propagates back to the host.
    MakeMountsPrivate,
    /// `mount(2)`.
    Mount {
        source: Option<PathBuf>,
        target: PathBuf,
        fstype: Option<&'static str>,
        flags: MsFlags,
        data: Option<String>,
    },
    /// Remount (a bind with `MS_BIND`, or a whole filesystem) with `flags`; flags the
    /// kernel locked on the source mount are kept.
    Remount { target: PathBuf, flags: MsFlags },
    /// `inner` (a `MakeDir`, `Mount`, `Remount` or `BindVetted`) applied to its path below `root`, each
    /// component opened without following a symbolic link (`O_NOFOLLOW`, one at a time
    /// from a descriptor of `root`), and the effect applied through that descriptor: for
    /// paths in persistent places a workload could change, even while this runs.
    Beneath { root: PathBuf, inner: Box<Effect> },
    /// A bind mount of a host directory the caller vetted: the source, opened as a path,
    /// must be the directory with this device and inode number, and the mount is made from
    /// that descriptor, so nothing that changes the path after the caller looked (a link
    /// swapped in) can redirect it. Applied beneath a root only (the target like `Mount`'s).
    BindVetted {
        source: PathBuf,
        identity: (u64, u64),
        target: PathBuf,
    },
    /// `mkdir` with a mode and an owner (inside ids).
    MakeDir {
        path: PathBuf,
        mode: u32,
        owner: Option<(u32, u32)>,
    },
    /// `mkdir` (mode 0755, owned by `owner`, inside ids) unless the directory is there
    /// already, which is left exactly as it is (it may be the host's, in a `--mount`
    /// workspace). Applied beneath a root only.
    EnsureDir { path: PathBuf, owner: (u32, u32) },
    /// Shows `rel` of the workspace (mounted at `from`, outside the new root) in the
    /// view: opened beneath `from` without following a link, the matching
    /// directory or empty file made at `view/rel` (parents too), bound there, read-only unless
    /// `writable`. A missing `rel` stays missing, unless `writable`: then it is made (the
    /// agent's) in the workspace first.
    BindView {
        from: PathBuf,
        rel: PathBuf,
        /// The view: where the workspace is shown (`to` is `view/rel`).
        view: PathBuf,
        writable: bool,
        /// Inside ids of what is made in the workspace for a writable `rel`.
        owner: (u32, u32),
    },
    /// Create a file with contents and mode.
    WriteFile {
        path: PathBuf,
        contents: Vec<u8>,
        mode: u32,
    },
    /// `symlink(target, link)`.
    Symlink { target: PathBuf, link: PathBuf },
    /// `pivot_root` into the directory, detach the old root, `chdir /`.
    PivotRoot(PathBuf),
    /// Bring `lo` up.
    LoopbackUp,
    /// Create a listener (returned to the caller).
    Listen(ListenerSpec),
    /// Write `/proc/self/oom_score_adj` (raising it needs no privilege).
    OomScoreAdj(i32),
    /// Write one of the sandbox's user namespace limits (`/proc/sys/user/max_*`, as the
    /// sandbox's proc shows them): what each of its users may charge to the invoking user's
    /// count of the same kind. A limit this kernel lacks is `Absent`.
    UserNamespaceLimit { file: PathBuf, value: u64 },
    /// `PR_SET_DUMPABLE(0)`: /proc/<pid> of this process is closed to others.
    SetDumpable(bool),
    /// Empty the capability bounding set.
    DropBoundingSet,
    /// Empty the ambient capability set.
    ClearAmbient,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// Create the Landlock ruleset (best effort by ABI) that every command enters, and learn
    /// what the kernel enforces of it (a short-lived child enters it and reports).
    PrepareLandlock(LandlockRules),
    /// Keep only `permitted` (none effective, none inheritable).
    LimitCapabilities { permitted: Vec<caps::Capability> },
    /// Under an exec allowlist: install the exec notifier (`seccomp::exec_notifier`) and
    /// keep its listener, so the init sees its commands' execs (`execwatch`). Where the
    /// kernel refuses it, the sandbox starts with a warning that exec refusals go
    /// unrecorded.
    WatchExecs,
    /// Install the seccomp programs.
    Seccomp,
    // ---- a command (a child of the init) ----
    /// `setsid`: no controlling terminal.
    NewSession,
    /// Default dispositions and an empty signal mask.
    ResetSignals,
    /// `dup2` the three fds onto 0, 1, 2.
    Stdio([RawFd; 3]),
    /// `TIOCSCTTY`: the terminal on this fd (a pty of the sandbox's own) becomes the new
    /// session's controlling terminal, with the command's process group in the foreground.
    ControllingTerminal(RawFd),
    /// Mark every fd ≥ 3 close-on-exec.
    CloseOnExecFrom3,
    /// Enter the Landlock ruleset prepared by the init.
    EnterLandlock,
    /// Raise `CAP_SETUID`/`CAP_SETGID` into the effective set (from the init's permitted set).
    RaiseSetIdCapabilities,
    /// Empty every capability set.
    ClearCapabilities,
    /// `chdir`.
    Chdir(PathBuf),
    /// `execve` the first candidate that exists.
    Exec {
        candidates: Vec<PathBuf>,
        argv: Vec<String>,
        env: Vec<String>,
    },
}

/// A per-user resource limit (`setrlimit`) counted for the real user across every process
/// it has, sandboxes included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UserQuota {
    /// `RLIMIT_SIGPENDING`: queued signals (and POSIX timers).
    SigPending,
    /// `RLIMIT_MSGQUEUE`: bytes of POSIX message queues.
    MsgQueue,
    /// `RLIMIT_MEMLOCK`: locked memory.
    Memlock,
}

/// What applying an effect produced.
#[derive(Debug)]
pub(crate) enum Applied {
    Nothing,
    Listener(OwnedFd),
    Landlock(LandlockReport),
    /// An optional file (swap cap) does not exist.
    Absent,
}

/// Performs kernel effects.
pub(crate) trait Kernel {
    /// Performs one effect.
    fn apply(&mut self, effect: &Effect) -> Result<Applied, std::io::Error>;
}

/// Test fake: records every effect and succeeds.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub effects: Vec<Effect>,
}

#[cfg(test)]
impl Kernel for Recorder {
    fn apply(&mut self, effect: &Effect) -> Result<Applied, std::io::Error> {
        self.effects.push(effect.clone());
        Ok(match effect {
            Effect::PrepareLandlock(_) => Applied::Landlock(LandlockReport::default()),
            _ => Applied::Nothing,
        })
    }
}
