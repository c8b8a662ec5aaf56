//! The crate's one error type.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where, in the start or run of a sandbox, something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Reading the request from the caller.
    Request,
    /// Creating the state directories on the host.
    StateDir,
    /// Creating or configuring the cgroup.
    Cgroup,
    /// Creating the namespaces (clone).
    Namespaces,
    /// Writing the uid/gid maps.
    IdMap,
    /// Building the new root (mounts, generated files, pivot_root).
    Filesystem,
    /// Bringing up loopback and creating the listeners.
    Network,
    /// Landlock, capabilities, `no_new_privs`, seccomp.
    Hardening,
    /// Forking and preparing a command.
    Command,
    /// Removing the cgroup and checking that no process is left.
    Cleanup,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Request => "reading the request",
            Step::StateDir => "preparing the state directory",
            Step::Cgroup => "setting up the cgroup",
            Step::Namespaces => "creating the namespaces",
            Step::IdMap => "writing the uid/gid maps",
            Step::Filesystem => "building the sandbox's filesystem",
            Step::Network => "setting up the sandbox's network",
            Step::Hardening => "applying landlock, capabilities and seccomp",
            Step::Command => "starting the command",
            Step::Cleanup => "cleaning up",
        })
    }
}

/// Everything that can go wrong starting, using or stopping a sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The spec or command is malformed.
    #[error("invalid {field} `{value}`: {reason}")]
    InvalidSpec {
        /// Which field.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The host lacks something the sandbox needs (or that the spec asks for).
    #[error("{feature} is not available on this host: {explanation}")]
    Unavailable {
        /// What is missing, e.g. `the memory cgroup controller`.
        feature: String,
        /// Why, and how to fix it.
        explanation: String,
    },
    /// The helper process could not be started.
    #[error("cannot start the sandbox helper `{}`: {source}", exe.display())]
    Spawn {
        /// The helper executable.
        exe: PathBuf,
        /// The OS error (also in the message: callers print errors with `{}`).
        source: std::io::Error,
    },
    /// A step of the sandbox's setup failed (reported by the helper or the sandbox's init).
    #[error("{step} failed: {message}")]
    Setup {
        /// Where it failed.
        step: Step,
        /// What failed, with the OS error.
        message: String,
    },
    /// A system call on the caller's side failed.
    #[error("{action} failed: {source}")]
    Os {
        /// What was being done.
        action: &'static str,
        /// The OS error (also in the message: callers print errors with `{}`).
        source: std::io::Error,
    },
    /// The command could not be started inside (not found, not executable, …).
    #[error("cannot run `{program}` in the sandbox: {message}")]
    Command {
        /// `argv[0]`.
        program: String,
        /// What failed, with the OS error.
        message: String,
    },
    /// The control channel carried something unexpected.
    #[error("sandbox control protocol error: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
    /// The sandbox is gone (its init or helper exited, or was killed).
    #[error("the sandbox `{name}` is no longer running")]
    Gone {
        /// The sandbox's name.
        name: String,
    },
    /// The helper reported a failed cleanup when the sandbox was stopped.
    #[error("stopping the sandbox `{name}` left something behind (helper exit status {status})")]
    Cleanup {
        /// The sandbox's name.
        name: String,
        /// The helper's exit status.
        status: i32,
    },
}

/// The part of an error that crosses the control socket from the helper or init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RemoteError {
    Unavailable {
        feature: String,
        explanation: String,
    },
    Setup {
        step: Step,
        message: String,
    },
}

impl From<RemoteError> for SandboxError {
    fn from(e: RemoteError) -> Self {
        match e {
            RemoteError::Unavailable {
                feature,
                explanation,
            } => SandboxError::Unavailable {
                feature,
                explanation,
            },
            RemoteError::Setup { step, message } => SandboxError::Setup { step, message },
        }
    }
}

impl RemoteError {
    /// A setup failure with its context.
    pub(crate) fn setup(step: Step, message: impl std::fmt::Display) -> Self {
        RemoteError::Setup {
            step,
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&SandboxError::from(self.clone()), f)
    }
}
