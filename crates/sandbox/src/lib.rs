//! capgate's Linux runner: a sandbox whose only exit is the host-side gateway.
//!
//! [`Sandbox::prepare`] execs a fresh helper process (never a fork of the caller, which may
//! be a multithreaded tokio program); it reads what it needs of the host while the caller
//! works out the spec, which [`Prepared::start`] sends. The helper then creates the cgroup, clones the sandbox's
//! init into new user, mount, pid, network, ipc and uts namespaces, writes the id maps,
//! puts the init in the cgroup and releases it. The init builds a fresh root, brings up
//! `lo`, creates the gateway's listeners inside the network namespace and passes them out,
//! hardens itself (non-dumpable, empty bounding set, `no_new_privs`, only `CAP_SETUID` and
//! `CAP_SETGID` left permitted and none effective, seccomp), prepares the Landlock ruleset,
//! and runs commands on request. Each command: new session, Landlock, ids (agent 1000 or
//! root 0 inside), every capability cleared, seccomp, `execve`. A caller's terminal is
//! never handed in: the command gets a pty of the sandbox's own as its controlling
//! terminal, which the caller relays (the `terminal` module).
//!
//! The sandbox dies with the caller (its control socket closes, pid 1 exits, the kernel
//! kills the pid namespace), with the helper (`PR_SET_PDEATHSIG` on the init, plus a pipe
//! whose end-of-file the init watches), and on [`Sandbox::stop`] or drop.
//!
//! # uid mapping
//! Inside 1000 (the agent) is the invoking user; inside 0 is the invoker's first subordinate
//! id, or a reserved id when root has none. See the `idmap` module's documentation.
//!
//! # Filesystem
//! `/usr`, `/bin`, `/sbin`, `/lib*` read-only binds (or the host's symlinks); `/etc`
//! generated plus reviewed copies; `/dev` minimal; `/proc` new, with `/proc/sys` read-only;
//! no `/sys`; `/tmp` tmpfs; `/home/agent` noexec tmpfs; `/home/agent/workspace` an overlay
//! (copy mode) or the host directory (mount mode); volumes. Everything else of the host
//! does not exist inside.
//!
//! All `unsafe` code is in the private `sys` module.
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod cgroup;
pub mod copyback;
mod elf;
mod error;
mod execwatch;
mod helper;
mod host;
mod idmap;
mod kernel;
mod linux;
mod plan;
mod policy;
mod probe;
mod proto;
mod remove;
mod report;
mod seccomp;
mod spec;
#[allow(
    unsafe_code,
    reason = "the one module that makes raw system calls (clone, fork, ioctl, fd handover); each block has a SAFETY comment"
)]
mod sys;
mod terminal;

pub use cgroup::remove_leftover as remove_leftover_cgroups;
pub use error::{SandboxError, Step};
pub use helper::helper_main;
pub use host::{Dialer, Prepared, Sandbox, Stopper};
pub use policy::shown_host_dirs;
pub use probe::{Availability, Feature, HostCheck, HostReport, probe_host};
/// Length-prefixed JSON frames with descriptors over a UNIX stream socket (the control
/// protocol's framing, also used by `capgate warm`).
pub use proto::{recv as recv_frame, send as send_frame};
pub use remove::remove_tree;
pub use report::{ExecRefusal, LandlockEnforcement, LandlockReport, StartReport};
pub use spec::{
    AGENT_HOME, AGENT_ID, DEFAULT_PIDS, DEFAULT_TMPFS_SIZE, EtcFiles, HelperCommand, Limits,
    ListenerKind, ListenerSpec, OVERLAY_UPPER, RunCommand, SandboxSpec, User, VolumeMount,
    VolumeSource, WORKSPACE_DIR, Workspace, WorkspaceMode, volume_target,
};
/// Descriptor handover to a spawned program, and its adoption there.
pub use sys::{pass_fd_as, take_inherited_fd};
pub use terminal::{WindowWatch, caller_terminal_is_raw};
