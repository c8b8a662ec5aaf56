//! What a started sandbox reports about itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How much of the Landlock ruleset the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum LandlockEnforcement {
    /// Everything requested.
    Fully,
    /// Some rights are unknown to this kernel's ABI (listed in the report's warnings).
    Partially,
    /// Landlock is unavailable: the mount and namespace walls remain.
    #[default]
    NotEnforced,
}

/// The Landlock part of the start report (the crate's `RestrictionStatus`, plus the ABI).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LandlockReport {
    /// The kernel's Landlock ABI (0: none).
    pub abi: i32,
    /// How much is enforced.
    pub enforcement: LandlockEnforcement,
    /// TCP `connect` is limited to the listener ports (ABI ≥ 4).
    pub tcp_connect_restricted: bool,
    /// Signals and abstract Unix sockets are scoped to the sandbox (ABI ≥ 6).
    pub scoped: bool,
    /// Denials of the workload are sent to the kernel audit log (ABI ≥ 7).
    pub audit_logging: bool,
    /// `no_new_privs` was set.
    pub no_new_privs: bool,
}

/// An `execve` the exec allowlist does not grant, seen by the init (Landlock refused it
/// with EACCES, unless the file changed in between).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRefusal {
    /// The program as the workload named it.
    pub program: String,
    /// The file that name led to (canonical, in the sandbox).
    pub resolved: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// What `Sandbox::start` established.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StartReport {
    /// Landlock's status.
    pub landlock: LandlockReport,
    /// The cgroup directories holding the sandbox (removed on stop).
    pub cgroups: Vec<PathBuf>,
    /// Everything that is weaker than asked (a limit not enforced, a Landlock right the
    /// kernel lacks). Empty on a host that offers everything.
    pub warnings: Vec<String>,
}
