//! Shared harness of the integration tests: a sandbox per test, on the real kernel.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    reason = "test harness"
)]

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};

use capgate_sandbox::{
    HelperCommand, ListenerKind, ListenerSpec, RunCommand, Sandbox, SandboxSpec, User, Workspace,
    WorkspaceMode,
};

pub fn helper() -> HelperCommand {
    HelperCommand {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_capgate-sandbox-helper")),
        args: Vec::new(),
    }
}

/// A name no other test (or concurrent test run) uses.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A test's host side: its temporary directories and the spec.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub spec: SandboxSpec,
}

pub fn setup(prefix: &str, mode: WorkspaceMode) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("README.md"), "hello from the host\n").unwrap();
    let mut spec = SandboxSpec::new(
        unique_name(prefix),
        dir.path().join("state"),
        Workspace {
            host_dir: workspace.clone(),
            mode,
        },
    );
    spec.env = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), "/home/agent".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    spec.limits.tmpfs_size = 256 << 20;
    spec.listeners.push(ListenerSpec {
        addr: "127.0.0.1:3128".parse().unwrap(),
        kind: ListenerKind::Tcp,
    });
    Setup {
        dir,
        workspace,
        spec,
    }
}

pub struct Started {
    pub sandbox: Sandbox,
    pub listeners: Vec<OwnedFd>,
}

pub fn start(spec: &SandboxSpec) -> Started {
    match Sandbox::start(spec, &helper()) {
        Ok((sandbox, listeners)) => Started { sandbox, listeners },
        Err(e) => panic!(
            "the sandbox did not start on this host: {e}\n{}",
            capgate_sandbox::probe_host()
        ),
    }
}

/// What a command printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
}

fn capture_file() -> (std::fs::File, OwnedFd) {
    let file = tempfile::tempfile().unwrap();
    let fd = OwnedFd::from(file.try_clone().unwrap());
    (file, fd)
}

pub fn run_as(sandbox: &mut Sandbox, user: User, argv: &[&str]) -> Output {
    let (mut out, out_fd) = capture_file();
    let (mut err, err_fd) = capture_file();
    let devnull = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    let mut cmd = RunCommand::agent(argv.iter().copied());
    cmd.user = user;
    cmd.stdin = Some(devnull);
    cmd.stdout = Some(out_fd);
    cmd.stderr = Some(err_fd);
    let status = sandbox.run(&cmd).unwrap();
    let read = |f: &mut std::fs::File| {
        use std::io::Seek;
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Output {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
    }
}

/// Runs a command as the agent.
pub fn run(sandbox: &mut Sandbox, argv: &[&str]) -> Output {
    run_as(sandbox, User::Agent, argv)
}

/// Runs `sh -c script` as the agent.
pub fn sh(sandbox: &mut Sandbox, script: &str) -> Output {
    run(sandbox, &["/bin/sh", "-c", script])
}

/// Runs a Python 3 snippet as the agent.
pub fn py(sandbox: &mut Sandbox, code: &str) -> Output {
    run(sandbox, &["/usr/bin/python3", "-c", code])
}

/// Python prelude: `sc(nr, *args)` makes a raw syscall and returns "OK" or the errno's name;
/// `err(f)` runs `f` and returns "OK" or the errno's name of the OSError it raised.
pub const PY_PRELUDE: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[a_ if isinstance(a_, (bytes, type(None))) else ctypes.c_ulong(a_) for a_ in a])
    return "OK" if r >= 0 else errno.errorcode[ctypes.get_errno()]
def err(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return errno.errorcode[e.errno]
"#;

/// Runs Python code after the prelude; returns its stdout lines.
pub fn py_lines(sandbox: &mut Sandbox, code: &str) -> Vec<String> {
    let out = py(sandbox, &format!("{PY_PRELUDE}\n{code}"));
    assert!(out.ok(), "python failed: {out:?}");
    out.stdout.lines().map(str::to_string).collect()
}

/// Host processes whose command line contains `marker`.
pub fn host_processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// Waits up to `secs` for `cond`.
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cond()
}
