//! What the caller asks for: the sandbox, the commands run in it, and the helper to exec.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::SandboxError;

/// Where the workspace appears inside: `/home/agent/workspace`.
pub const WORKSPACE_DIR: &str = "/home/agent/workspace";
/// The agent's home inside (a `noexec` tmpfs).
pub const AGENT_HOME: &str = "/home/agent";
/// A copy-mode workspace's overlay, in the sandbox's state directory: the upper directory
/// (what the workload changed, which copy-back reads), its work directory, and where the
/// host directory is bound as the lower layer (in the sandbox's mount namespace only).
pub const OVERLAY_UPPER: &str = "upper";
pub(crate) const OVERLAY_WORK: &str = "work";
pub(crate) const OVERLAY_LOWER: &str = "lower";
/// The agent's uid and gid inside the sandbox.
pub const AGENT_ID: u32 = 1000;
/// Default pids limit (the same as CapsCode's and Docker's `PidsLimit` default).
pub const DEFAULT_PIDS: u32 = 1024;
/// Default size of each tmpfs (`/tmp`, `/home/agent`, `/dev/shm`): 512 MiB.
pub const DEFAULT_TMPFS_SIZE: u64 = 512 * 1024 * 1024;

/// Everything the sandbox is made of. Nothing of the host is visible inside unless it is
/// named here (or is one of the reviewed system paths in the `policy` module).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Sandbox name: the hostname inside and the cgroup's name. `[a-z0-9-]`, 1 to 63 characters,
    /// not starting or ending with `-`.
    pub name: String,
    /// Per-sandbox host directory for state: the overlay's `upper`/`work` (copy mode) and the
    /// mount point of the new root. Created (mode 0700) if missing.
    pub state_dir: PathBuf,
    /// The host directory shown at `/home/agent/workspace`, and how.
    pub workspace: Workspace,
    /// Extra mounts (persistent directories or tmpfs). Their targets are writable.
    pub volumes: Vec<VolumeMount>,
    /// The generated `/etc` files.
    pub etc: EtcFiles,
    /// The whole environment of every command (nothing is inherited from the host).
    pub env: Vec<(String, String)>,
    /// Resource limits.
    pub limits: Limits,
    /// Sockets the sandbox's init creates inside its network namespace before anything
    /// untrusted runs; `Sandbox::start` returns them, in this order, for the gateway.
    pub listeners: Vec<ListenerSpec>,
    /// Extra in-sandbox paths (absolute, existing) that Landlock lets the workload write beneath.
    /// The workspace, `/home/agent`, `/tmp`, `/dev/shm` and the volumes are granted already.
    pub writable: Vec<PathBuf>,
    /// When set (a pack's `dev.capgate/filesystem@1`), the only places the sandbox's
    /// commands may write beneath, instead of all of the above: each lies beneath the
    /// workspace, `/home/agent`, `/tmp`, `/dev/shm` or a volume; one that is missing is made
    /// (the agent's) before anything untrusted runs, one that exists is left as it is.
    pub write_only: Option<Vec<PathBuf>>,
    /// When set (a pack's `dev.capgate/exec@1`), the only programs the sandbox's commands
    /// may execute: these files, or anything beneath these directories, and the
    /// interpreters they name (an ELF program's loader, a script's `#!` line). Everything
    /// else fails with EACCES at `execve`.
    pub exec_only: Option<Vec<PathBuf>>,
    /// When set (a pack's `dev.capgate/filesystem@1` `read`), the workspace shows only
    /// these paths (each beneath it, read-only) and the write places within it; nothing
    /// else of it exists inside (ENOENT). Paths missing from the workspace stay missing.
    pub workspace_read: Option<Vec<PathBuf>>,
    /// When set, the init also serves a [`crate::Dialer`]: sockets it makes inside the
    /// network namespace on the caller's request, which the caller connects to a port
    /// inside (a published port@1). Nothing inside can reach the dialer.
    #[serde(default)]
    pub dialer: bool,
}

/// The workspace: a host directory and how it is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    /// The host directory (absolute, existing).
    pub host_dir: PathBuf,
    /// Snapshot (copy) or the directory itself (mount).
    pub mode: WorkspaceMode,
}

/// How the workspace is shown inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkspaceMode {
    /// An overlay: the host directory is the read-only lower layer, writes go to
    /// `state_dir/upper`. The host directory is never modified; starting costs nothing.
    Copy,
    /// The host directory bound read-write: the workload's writes reach the host.
    Mount,
}

/// One extra mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// Absolute path inside the sandbox, beneath `/home/agent` (but not in the workspace),
    /// `/tmp`, or a new top-level directory such as `/cache`.
    pub target: PathBuf,
    /// What is mounted there.
    pub source: VolumeSource,
}

impl VolumeMount {
    /// Whether the sandbox may write beneath it.
    pub fn is_writable(&self) -> bool {
        !matches!(
            self.source,
            VolumeSource::HostDir {
                writable: false,
                ..
            }
        )
    }
}

/// The source of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSource {
    /// A persistent host directory (created, mode 0700, if missing), bound read-write.
    Dir(PathBuf),
    /// An existing host directory the caller vetted (never created): bound only if it is
    /// still the directory with this device and inode number (`identity`, as `stat` gives
    /// them), from a descriptor, so a link swapped into its path meanwhile redirects
    /// nothing. Read-only unless `writable`: then nothing inside can write beneath it,
    /// whatever the Landlock grants.
    HostDir {
        /// The directory on the host.
        path: PathBuf,
        /// Its device and inode number when the caller vetted it.
        identity: (u64, u64),
        /// Bound read-write rather than read-only.
        writable: bool,
    },
    /// A fresh tmpfs of at most `size` bytes, owned by the agent.
    Tmpfs {
        /// Size limit in bytes.
        size: u64,
    },
}

/// Generated `/etc` content. Every other `/etc` file comes from the reviewed list in
/// the `policy` module (`HOST_ETC`), or does not exist.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcFiles {
    /// The agent's login shell (`/bin/bash` or `/bin/sh`).
    pub shell: PathBuf,
    /// `/etc/hosts` (default: localhost entries and the sandbox name).
    pub hosts: Option<String>,
    /// `/etc/resolv.conf` (default: `nameserver 127.0.0.1`, the gateway's DNS listener).
    pub resolv_conf: Option<String>,
    /// PEM certificates the sandbox trusts beside the host's system roots (the capgate CA).
    /// `/etc/ssl/certs/ca-certificates.crt` inside is the host's bundle, which the helper
    /// reads while the caller configures the gateway, followed by these; with neither, the
    /// file is not created.
    pub trusted_ca: String,
}

impl std::fmt::Debug for EtcFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcFiles")
            .field("shell", &self.shell)
            .field("hosts", &self.hosts)
            .field("resolv_conf", &self.resolv_conf)
            .field("trusted_ca_bytes", &self.trusted_ca.len())
            .finish()
    }
}

impl Default for EtcFiles {
    fn default() -> Self {
        Self {
            shell: PathBuf::from("/bin/sh"),
            hosts: None,
            resolv_conf: None,
            trusted_ca: String::new(),
        }
    }
}

/// Resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Maximum number of processes and threads (cgroup `pids.max`).
    pub pids: u32,
    /// Memory limit in bytes, swap capped to the same total; tmpfs files count toward it.
    pub memory: Option<u64>,
    /// CPU time limit in thousandths of a CPU (`1500`: one and a half CPUs' time in every
    /// 100 ms period; cgroup `cpu.max` or `cpu.cfs_quota_us`); `None`: no limit.
    #[serde(default)]
    pub millicpus: Option<u32>,
    /// Size of each tmpfs (`/tmp`, `/home/agent`, `/dev/shm`).
    pub tmpfs_size: u64,
    /// `--dangerously-skip-limits`: start even when the host cannot apply a limit (the
    /// start report then carries a warning for each one not applied).
    pub skip_unavailable: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pids: DEFAULT_PIDS,
            memory: None,
            millicpus: None,
            tmpfs_size: DEFAULT_TMPFS_SIZE,
            skip_unavailable: false,
        }
    }
}

/// A socket the init creates inside the sandbox's network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerSpec {
    /// Address inside, e.g. `127.0.0.1:3128` (proxy) or `127.0.0.1:53` (DNS).
    pub addr: SocketAddr,
    /// Stream (listening) or datagram (bound) socket.
    pub kind: ListenerKind,
}

/// Socket type of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ListenerKind {
    /// A listening TCP socket (`accept` on it).
    Tcp,
    /// A bound UDP socket (`recv_from`/`send_to` on it).
    Udp,
}

/// Which user a command runs as. Either way all capabilities are dropped before `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum User {
    /// uid/gid 0 inside (install hooks).
    Root,
    /// uid/gid 1000 inside (the workload).
    Agent,
}

impl User {
    /// Its uid, which is its gid too, inside.
    pub(crate) fn id(self) -> u32 {
        match self {
            User::Root => 0,
            User::Agent => AGENT_ID,
        }
    }
}

/// One command to run inside.
#[derive(Debug)]
pub struct RunCommand {
    /// Program and arguments; a program without `/` is looked up in the `PATH` of the
    /// command's environment (default `/usr/local/bin:/usr/bin:/bin`).
    pub argv: Vec<String>,
    /// Added to (or replacing entries of) the sandbox's environment for this command.
    pub env: Vec<(String, String)>,
    /// Who runs it.
    pub user: User,
    /// Working directory inside (absolute).
    pub cwd: PathBuf,
    /// Standard input; `None`: the caller's.
    pub stdin: Option<OwnedFd>,
    /// Standard output; `None`: the caller's.
    pub stdout: Option<OwnedFd>,
    /// Standard error; `None`: the caller's.
    pub stderr: Option<OwnedFd>,
    /// The command the user works with (a workload): it reads the caller's stdin, and an
    /// interactive caller's terminal (stdin a terminal, in its foreground, stdout not a
    /// pipe) becomes its controlling terminal: a pty of the sandbox's own, relayed with the
    /// caller's keyboard in raw mode, as `ssh -t` does. Every other command (a hook)
    /// given no stdin reads `/dev/null`, and none gets a controlling terminal (its hang-up
    /// would reach what a hook leaves running). For every command, a caller's stdout or
    /// stderr that is a terminal becomes a pty of the sandbox's own whose output capgate
    /// copies: the caller's terminal itself is never handed over.
    pub interactive: bool,
    /// capgate's own command (a file it writes inside as the agent), not the workload's:
    /// under an exec allowlist its own exec is not the pack's to answer for, so it is not
    /// judged as a violation.
    pub capgate_own: bool,
}

impl RunCommand {
    /// A command run as the agent in the workspace, with the caller's stdio.
    pub fn agent<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            user: User::Agent,
            cwd: PathBuf::from(WORKSPACE_DIR),
            stdin: None,
            stdout: None,
            stderr: None,
            interactive: false,
            capgate_own: false,
        }
    }
}

/// How to start the helper process: a fresh, single-threaded process (never a fork of the
/// caller). `Sandbox::start` runs `exe args… --ctl-fd 3`, and the program must call
/// [`crate::helper_main`] with the arguments that follow `args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCommand {
    /// The executable, e.g. `std::env::current_exe()` of `capgate`.
    pub exe: PathBuf,
    /// Arguments before the helper's own, e.g. `["__sandbox"]`.
    pub args: Vec<OsString>,
}

impl SandboxSpec {
    /// A spec with defaults for everything but the name, state directory and workspace.
    pub fn new(name: impl Into<String>, state_dir: PathBuf, workspace: Workspace) -> Self {
        Self {
            name: name.into(),
            state_dir,
            workspace,
            volumes: Vec::new(),
            etc: EtcFiles::default(),
            env: Vec::new(),
            limits: Limits::default(),
            listeners: Vec::new(),
            writable: Vec::new(),
            write_only: None,
            exec_only: None,
            workspace_read: None,
            dialer: false,
        }
    }

    /// Checks what can be checked without touching the host. Called by `Sandbox::start`.
    pub fn validate(&self) -> Result<(), SandboxError> {
        validate_name(&self.name)?;
        for (field, path) in [
            ("state_dir", &self.state_dir),
            ("workspace.host_dir", &self.workspace.host_dir),
        ] {
            host_path(field, path)?;
        }
        for volume in &self.volumes {
            volume_target(&volume.target)?;
            if let VolumeSource::Dir(dir) | VolumeSource::HostDir { path: dir, .. } = &volume.source
            {
                host_path("volume source", dir)?;
            }
        }
        for path in &self.writable {
            sandbox_path("writable", path)?;
        }
        if self.workspace_read.is_some()
            && let Some(place) = self
                .write_only
                .iter()
                .flatten()
                .find(|p| Path::new(WORKSPACE_DIR).starts_with(p))
        {
            return Err(invalid(
                WRITE_FIELD,
                place,
                "covers the whole workspace, which leaves nothing for a read list to hide; list the write places within it",
            ));
        }
        for path in self.workspace_read.iter().flatten() {
            clean_absolute(READ_FIELD, path)?;
            if !path.starts_with(WORKSPACE_DIR) || path == Path::new(WORKSPACE_DIR) {
                return Err(invalid(
                    READ_FIELD,
                    path,
                    "is not beneath the workspace (/home/agent/workspace); the rest of the root is shown read-only as always",
                ));
            }
        }
        for path in self.exec_only.iter().flatten() {
            clean_absolute(EXEC_FIELD, path)?;
            if self.writable_base(path).is_some() {
                return Err(invalid(
                    EXEC_FIELD,
                    path,
                    "is beneath a place the workload can write (the workspace, /home/agent, /tmp, /dev/shm or a volume), which an exec allowlist keeps noexec: the workload could replace the program; list programs of the read-only system root",
                ));
            }
        }
        for path in self.write_only.iter().flatten() {
            clean_absolute(WRITE_FIELD, path)?;
            if self
                .volumes
                .iter()
                .any(|v| !v.is_writable() && path.starts_with(&v.target))
            {
                return Err(invalid(
                    WRITE_FIELD,
                    path,
                    "is beneath a read-only volume, where nothing can be written",
                ));
            }
            if self.writable_base(path).is_none() {
                return Err(invalid(
                    WRITE_FIELD,
                    path,
                    "is not beneath a writable place (the workspace, /home/agent, /tmp, /dev/shm or a volume)",
                ));
            }
        }
        let mut targets: Vec<&Path> = self.volumes.iter().map(|v| v.target.as_path()).collect();
        targets.sort();
        if let Some(pair) = targets.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid("volume target", pair[0], "is mounted twice"));
        }
        if self.limits.pids == 0 {
            return Err(SandboxError::InvalidSpec {
                field: "limits.pids",
                value: "0".into(),
                reason: "must be at least 1",
            });
        }
        if self.limits.millicpus == Some(0) {
            return Err(SandboxError::InvalidSpec {
                field: "limits.millicpus",
                value: "0".into(),
                reason: "must be at least 1 (no limit is None)",
            });
        }
        if self.limits.tmpfs_size == 0 {
            return Err(SandboxError::InvalidSpec {
                field: "limits.tmpfs_size",
                value: "0".into(),
                reason: "must be at least 1 byte",
            });
        }
        for (key, _) in &self.env {
            env_key(key)?;
        }
        Ok(())
    }
}

impl SandboxSpec {
    /// The writable place (a mount the sandbox makes) that `path` lies beneath, the deepest
    /// one: a volume, the workspace, `/home/agent`, `/tmp` or `/dev/shm`.
    pub(crate) fn writable_base(&self, path: &Path) -> Option<PathBuf> {
        self.writable_mounts()
            .filter(|base| path.starts_with(base))
            .max_by_key(|base| base.components().count())
    }

    /// The mounts the sandbox makes writable: the workspace, `/home/agent`, `/tmp`,
    /// `/dev/shm`, then the volumes.
    pub(crate) fn writable_mounts(&self) -> impl Iterator<Item = PathBuf> + '_ {
        [WORKSPACE_DIR, AGENT_HOME, "/tmp", "/dev/shm"]
            .into_iter()
            .map(PathBuf::from)
            .chain(
                self.volumes
                    .iter()
                    .filter(|v| v.is_writable())
                    .map(|v| v.target.clone()),
            )
    }
}

/// The pack fields as kits spell them (what a user reads in an error).
const EXEC_FIELD: &str = "dev.capgate/exec@1 `allow` path";
const WRITE_FIELD: &str = "dev.capgate/filesystem@1 `write` place";
const READ_FIELD: &str = "dev.capgate/filesystem@1 `read` path";

fn invalid(field: &'static str, path: &Path, reason: &'static str) -> SandboxError {
    SandboxError::InvalidSpec {
        field,
        value: path.display().to_string(),
        reason,
    }
}

/// Sandbox names become the hostname and a cgroup directory name.
fn validate_name(name: &str) -> Result<(), SandboxError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(SandboxError::InvalidSpec {
            field: "name",
            value: name.into(),
            reason: "must be 1 to 63 characters of a-z, 0-9 and `-`, not starting or ending with `-`",
        })
    }
}

/// Host paths are absolute, clean (no `.`/`..`), UTF-8, and on one line. (No host path
/// goes into a mount's options: the overlay names its layers relative to the state
/// directory, so `,`, `:` or `=` in a path are fine.)
pub(crate) fn host_path(field: &'static str, path: &Path) -> Result<(), SandboxError> {
    clean_absolute(field, path)?;
    let text = path
        .to_str()
        .ok_or_else(|| invalid(field, path, "must be valid UTF-8"))?;
    if text.contains('\n') {
        return Err(invalid(field, path, "must not contain a newline"));
    }
    Ok(())
}

fn clean_absolute(field: &'static str, path: &Path) -> Result<(), SandboxError> {
    if !path.is_absolute() {
        return Err(invalid(field, path, "must be absolute"));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(invalid(field, path, "must not contain `.` or `..`"));
    }
    if path.to_str().is_none() {
        return Err(invalid(field, path, "must be valid UTF-8"));
    }
    Ok(())
}

/// Paths inside the sandbox: absolute and clean.
pub(crate) fn sandbox_path(field: &'static str, path: &Path) -> Result<(), SandboxError> {
    clean_absolute(field, path)
}

/// Top-level directories of the new root that are system mounts or generated: a volume may
/// not be placed in or on them.
const RESERVED_ROOTS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc",
    "/sys", "/home", "/var", "/run",
];

/// A volume target is absolute and clean, not a reserved system directory, not the workspace
/// nor inside it (its mount point would have to be created in the host's directory), and
/// not `/tmp` or `/home/agent` themselves.
/// Where a volume may be mounted: beneath `/home/agent` (not the workspace) or `/tmp`, or
/// in a new top-level directory (not a system one).
pub fn volume_target(target: &Path) -> Result<(), SandboxError> {
    const FIELD: &str = "volume target";
    clean_absolute(FIELD, target)?;
    let home = Path::new(AGENT_HOME);
    let workspace = Path::new(WORKSPACE_DIR);
    if target == Path::new("/") || target == Path::new("/tmp") || target == home {
        return Err(invalid(
            FIELD,
            target,
            "must be below `/tmp`, `/home/agent` or a new top-level directory",
        ));
    }
    if target.starts_with(workspace) {
        return Err(invalid(
            FIELD,
            target,
            "must not be the workspace or inside it",
        ));
    }
    if target.starts_with(home) || target.starts_with("/tmp") {
        return Ok(());
    }
    if RESERVED_ROOTS.iter().any(|root| target.starts_with(root)) {
        return Err(invalid(FIELD, target, "must not be in a system directory"));
    }
    Ok(())
}

fn env_key(key: &str) -> Result<(), SandboxError> {
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return Err(SandboxError::InvalidSpec {
            field: "env",
            value: key.into(),
            reason: "a variable name must be non-empty and contain no `=` or NUL",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec::new(
            "box-1",
            PathBuf::from("/var/lib/capgate/box-1"),
            Workspace {
                host_dir: PathBuf::from("/src/project"),
                mode: WorkspaceMode::Copy,
            },
        )
    }

    /// A write place beneath a read-only volume could never be written: refused, while one
    /// beneath a writable volume (the twin) is fine.
    #[test]
    fn write_places_beneath_a_read_only_volume_are_refused() {
        for (writable, ok) in [(false, false), (true, true)] {
            let mut s = spec();
            s.volumes.push(VolumeMount {
                target: PathBuf::from("/home/agent/skills"),
                source: VolumeSource::HostDir {
                    path: PathBuf::from("/store"),
                    identity: (1, 2),
                    writable,
                },
            });
            s.write_only = Some(vec![PathBuf::from("/home/agent/skills/out")]);
            assert_eq!(s.validate().is_ok(), ok, "writable: {writable}");
        }
    }

    #[test]
    fn defaults_are_valid_and_match_the_seed() {
        let s = spec();
        assert!(s.validate().is_ok());
        assert_eq!(s.limits.pids, 1024);
        assert_eq!(s.limits.memory, None);
    }

    #[test]
    fn names_are_hostnames() {
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            let mut s = spec();
            s.name = bad.into();
            assert!(s.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_paths_must_be_clean_and_on_one_line() {
        for bad in ["relative", "/a/../b", "/a\nb"] {
            let mut s = spec();
            s.workspace.host_dir = PathBuf::from(bad);
            assert!(s.validate().is_err(), "{bad:?}");
        }
        for good in ["/a,b", "/a:b", "/a=b", "/a\\b", "/my data, v2: final"] {
            let mut s = spec();
            s.workspace.host_dir = PathBuf::from(good);
            assert!(s.validate().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn volume_targets() {
        for good in ["/home/agent/.cache", "/tmp/x", "/cache", "/opt/tools"] {
            assert!(volume_target(Path::new(good)).is_ok(), "{good}");
        }
        for bad in [
            "/",
            "/tmp",
            "/home/agent",
            "/home/agent/workspace",
            "/home/agent/workspace/node_modules",
            "/usr/local",
            "/etc/x",
            "/proc/x",
            "/home/other",
            "cache",
        ] {
            assert!(volume_target(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn duplicate_volume_targets_are_refused() {
        let mut s = spec();
        for _ in 0..2 {
            s.volumes.push(VolumeMount {
                target: PathBuf::from("/cache"),
                source: VolumeSource::Tmpfs { size: 1 },
            });
        }
        assert!(s.validate().is_err());
    }
}
