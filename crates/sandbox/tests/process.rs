//! The process walls, read from the kernel's view (`/proc/<pid>/status`) and probed with raw
//! system calls: seccomp, no_new_privs, capabilities, ids, environment.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use capgate_sandbox::{User, WorkspaceMode};
use common::*;

fn status_fields(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            [
                "Seccomp:",
                "NoNewPrivs:",
                "CapEff:",
                "CapInh:",
                "CapAmb:",
                "CapBnd:",
                "CapPrm:",
                "Uid:",
            ]
            .iter()
            .any(|f| l.starts_with(f))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn init_and_workload_are_filtered_unprivileged_and_without_new_privileges() {
    let s = setup("proc-status", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let init = sh(&mut b.sandbox, "cat /proc/1/status");
    let init = status_fields(&init.stdout);
    for want in [
        "Seccomp: 2",
        "NoNewPrivs: 1",
        "CapEff: 0000000000000000",
        "CapBnd: 0000000000000000",
        "CapInh: 0000000000000000",
        "CapAmb: 0000000000000000",
    ] {
        assert!(
            init.iter().any(|l| l == want),
            "pid 1 lacks `{want}`: {init:?}"
        );
    }
    for user in [User::Agent, User::Root] {
        let own = run_as(&mut b.sandbox, user, &["/bin/cat", "/proc/self/status"]);
        let own = status_fields(&own.stdout);
        let uid = if user == User::Agent {
            "Uid: 1000 1000 1000 1000"
        } else {
            "Uid: 0 0 0 0"
        };
        for want in [
            "Seccomp: 2",
            "NoNewPrivs: 1",
            "CapEff: 0000000000000000",
            "CapPrm: 0000000000000000",
            "CapInh: 0000000000000000",
            "CapAmb: 0000000000000000",
            "CapBnd: 0000000000000000",
            uid,
        ] {
            assert!(
                own.iter().any(|l| l == want),
                "{user:?} lacks `{want}`: {own:?}"
            );
        }
    }
    // Every thread of a multithreaded workload is filtered too.
    let threads = py_lines(
        &mut b.sandbox,
        r#"
import threading, time
ev = threading.Event()
ts = [threading.Thread(target=ev.wait) for _ in range(4)]
[t.start() for t in ts]
tids = os.listdir('/proc/self/task')
modes = set(open(f'/proc/self/task/{t}/status').read().split('Seccomp:')[1].split()[0] for t in tids)
print(len(tids), sorted(modes))
ev.set(); [t.join() for t in ts]
"#,
    );
    assert_eq!(threads, ["5 ['2']"]);
    b.sandbox.stop().unwrap();
}

#[test]
fn denied_system_calls_return_eperm_next_to_their_harmless_twins() {
    let s = setup("proc-seccomp", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let code = format!(
        r#"
import subprocess, time
child = subprocess.Popen(['/bin/sleep', '30'])
time.sleep(0.1)
print('ptrace', sc({ptrace}, 16, child.pid, 0, 0))
print('kill-0', err(lambda: os.kill(child.pid, 0)))
print('process_vm_readv', sc({pvr}, child.pid, 0, 0, 0, 0, 0))
child.kill(); child.wait()
os.mkdir('/tmp/m')
print('mount', sc({mount}, b'none', b'/tmp/m', b'tmpfs', 0, None))
print('umount2', sc({umount2}, b'/tmp', 2))
print('fsopen', sc({fsopen}, b'tmpfs', 0))
print('open_tree', sc({open_tree}, 0xffffff9c, b'/tmp', 1))
print('unshare-user', sc({unshare}, 0x10000000))
print('clone-newuser', sc({clone}, 0x10000000 | 17, 0, 0, 0, 0))
print('clone3', sc({clone3}, 0, 0))
print('setns', sc({setns}, 0, 0))
pid = os.fork()
if pid == 0:
    os._exit(0)
print('fork', os.waitpid(pid, 0)[1])
print('tiocsti', sc({ioctl}, 0, {tiocsti}, b'x'))
print('tiocsti-high', sc({ioctl}, 0, (0x123 << 32) | {tiocsti}, b'x'))
print('tiocgwinsz', sc({ioctl}, 0, {tiocgwinsz}, bytes(8)))
print('io_uring_setup', sc({io_uring}, 1, bytes(120)))
print('bpf', sc({bpf}, 0, 0, 0))
print('keyctl', sc({keyctl}, 0, 0, 0))
print('perf_event_open', sc({perf}, 0, 0, 0, 0, 0))
print('userfaultfd', sc({uffd}, 0))
print('vsock', sc({socket}, 40, 1, 0))
print('inet', sc({socket}, 2, 1, 0))
print('personality-aslr-off', sc({personality}, 0x0040000))
print('personality-query', sc({personality}, 0xffffffff))
print('settimeofday', sc({settimeofday}, 0, 0))
print('syslog', sc({syslog}, 3, 0, 0))
open('/tmp/f', 'w').close()
print('chmod-setuid', err(lambda: os.chmod('/tmp/f', 0o4755)))
print('chmod-setgid', err(lambda: os.chmod('/tmp/f', 0o2755)))
print('chmod-plain', err(lambda: os.chmod('/tmp/f', 0o755)))
print('create-setuid', err(lambda: os.close(os.open('/tmp/g', os.O_CREAT | os.O_WRONLY, 0o4755))))
print('create-plain', err(lambda: os.close(os.open('/tmp/h', os.O_CREAT | os.O_WRONLY, 0o755))))
print('openat2', sc({openat2}, 0xffffff9c, b'/tmp/h', bytes(24), 24))
"#,
        ptrace = libc::SYS_ptrace,
        pvr = libc::SYS_process_vm_readv,
        mount = libc::SYS_mount,
        umount2 = libc::SYS_umount2,
        fsopen = libc::SYS_fsopen,
        open_tree = libc::SYS_open_tree,
        unshare = libc::SYS_unshare,
        clone = libc::SYS_clone,
        clone3 = libc::SYS_clone3,
        setns = libc::SYS_setns,
        ioctl = libc::SYS_ioctl,
        tiocsti = libc::TIOCSTI,
        tiocgwinsz = libc::TIOCGWINSZ,
        io_uring = libc::SYS_io_uring_setup,
        bpf = libc::SYS_bpf,
        keyctl = libc::SYS_keyctl,
        perf = libc::SYS_perf_event_open,
        uffd = libc::SYS_userfaultfd,
        socket = libc::SYS_socket,
        personality = libc::SYS_personality,
        settimeofday = libc::SYS_settimeofday,
        syslog = libc::SYS_syslog,
        openat2 = libc::SYS_openat2,
    );
    let lines = py_lines(&mut b.sandbox, &code);
    let expect = [
        "ptrace EPERM",
        "kill-0 OK",
        "process_vm_readv EPERM",
        "mount EPERM",
        "umount2 EPERM",
        "fsopen EPERM",
        "open_tree EPERM",
        "unshare-user EPERM",
        "clone-newuser EPERM",
        "clone3 ENOSYS",
        "setns EPERM",
        "fork 0",
        "tiocsti EPERM",
        "tiocsti-high EPERM",
        "tiocgwinsz ENOTTY",
        "io_uring_setup EPERM",
        "bpf EPERM",
        "keyctl EPERM",
        "perf_event_open EPERM",
        "userfaultfd EPERM",
        "vsock EPERM",
        "inet OK",
        "personality-aslr-off EPERM",
        "personality-query OK",
        "settimeofday EPERM",
        "syslog EPERM",
        "chmod-setuid EPERM",
        "chmod-setgid EPERM",
        "chmod-plain OK",
        "create-setuid EPERM",
        "create-plain OK",
        "openat2 ENOSYS",
    ];
    assert_eq!(lines, expect);
    b.sandbox.stop().unwrap();
}

#[test]
fn commands_see_only_the_sandbox_environment_and_have_no_terminal() {
    let mut s = setup("proc-env", WorkspaceMode::Copy);
    s.spec
        .env
        .push(("CAPGATE_SANDBOX_TEST".into(), "base".into()));
    let mut b = start(&s.spec);
    let mut cmd = capgate_sandbox::RunCommand::agent(["/usr/bin/env"]);
    let out = tempfile::tempfile().unwrap();
    cmd.stdout = Some(out.try_clone().unwrap().into());
    cmd.env.push(("EXTRA".into(), "1".into()));
    cmd.env
        .push(("CAPGATE_SANDBOX_TEST".into(), "override".into()));
    assert!(b.sandbox.run(&cmd).unwrap().success());
    let mut env = String::new();
    use std::io::{Read, Seek};
    let mut out = out;
    out.rewind().unwrap();
    out.read_to_string(&mut env).unwrap();
    let mut keys: Vec<&str> = env.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "CAPGATE_SANDBOX_TEST=override",
            "EXTRA=1",
            "HOME=/home/agent",
            "LANG=C.UTF-8",
            "PATH=/usr/local/bin:/usr/bin:/bin"
        ]
    );
    // A new session without a controlling terminal: /dev/tty cannot be opened.
    let tty = py_lines(
        &mut b.sandbox,
        "print(os.getsid(0) == os.getpid(), err(lambda: open('/dev/tty')))",
    );
    assert_eq!(tty, ["True ENXIO"]);
    b.sandbox.stop().unwrap();
}

#[test]
fn exit_statuses_and_start_failures_are_forwarded() {
    let s = setup("proc-exit", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    assert_eq!(sh(&mut b.sandbox, "exit 7").status.code(), Some(7));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        sh(&mut b.sandbox, "kill -TERM $$").status.signal(),
        Some(15)
    );
    let missing = b
        .sandbox
        .run(&capgate_sandbox::RunCommand::agent(["no-such-program"]));
    let e = missing.unwrap_err().to_string();
    assert!(
        e.contains("no-such-program") && e.contains("No such file"),
        "{e}"
    );
    let mut in_home = capgate_sandbox::RunCommand::agent(["/bin/true"]);
    in_home.cwd = "/nonexistent".into();
    let e = b.sandbox.run(&in_home).unwrap_err().to_string();
    assert!(e.contains("chdir"), "{e}");
    // The sandbox still works afterwards.
    assert!(sh(&mut b.sandbox, "true").ok());
    b.sandbox.stop().unwrap();
}

/// Under an exec allowlist, every exec the list does not grant reaches the caller as it
/// happens (refused by Landlock all the same), named as the workload named it and as the
/// file it led to; execs of listed programs, of missing files and of a directory do not,
/// nor does anything in the twin without a list. The init reads the name from a command
/// of another user (the agent), resolves it in the command's own working directory,
/// through links and `..`, and through `execveat` too; a name through `/proc/self` (which
/// would be the init's own there) is not judged, so python re-running itself is no
/// violation.
#[test]
fn execs_the_allowlist_does_not_grant_are_reported_and_the_granted_ones_are_not() {
    let probe = r#"
import errno, os, subprocess
def run(argv, **kw):
    try:
        subprocess.run(argv, check=True, **kw)
        return "ran"
    except OSError as e:
        return errno.errorcode[e.errno]
print("true", run(["/bin/true"]))
print("python", run(["/usr/bin/python3", "-c", "pass"]))
print("missing", run(["/no/such/program"]))
print("dir", run(["/usr/bin"]))
print("relative", run(["./bin/true"], cwd="/usr"))
os.symlink("/bin/true", "/tmp/link")
print("link", run(["/tmp/link"]))
print("dots", run(["/usr/bin/../bin/python3", "-c", "pass"]))
print("self", run(["/proc/self/exe", "-c", "pass"]))
import glob
loader = sorted(glob.glob("/lib64/ld-linux*") + glob.glob("/lib/ld-linux*"))[0]
print("loader", run([loader, "/usr/bin/true"]))
fd = os.open("/usr/bin", os.O_PATH)
def at():
    try:
        os.execve("env", ["env"], {}, dir_fd=fd) if os.fork() == 0 else os.wait()
    except OSError as e:
        print("at", errno.errorcode[e.errno]); os._exit(0)
try:
    libc = __import__("ctypes").CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        libc.syscall(322, fd, b"env", (__import__("ctypes").c_char_p * 2)(b"env", None), None, 0)
        os._exit(__import__("ctypes").get_errno())
    print("at", errno.errorcode[os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])])
except Exception as e:
    print("at", e)
"#;
    let mut s = setup("exec-watch", WorkspaceMode::Copy);
    s.spec.exec_only = Some(vec!["/usr/bin/python3".into()]);
    let mut b = start(&s.spec);
    let out = py(&mut b.sandbox, probe);
    assert!(out.ok(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "true EACCES",
            "python ran",
            "missing ENOENT",
            "dir EACCES",
            "relative EACCES",
            "link EACCES",
            "dots ran",
            "self ran",
            "loader EACCES",
            "at EACCES"
        ],
        "{out:?}"
    );
    let (refused, dropped) = b.sandbox.take_exec_refusals();
    assert_eq!(dropped, 0);
    let seen: Vec<(&str, &str)> = refused
        .iter()
        .map(|r| (r.program.as_str(), r.resolved.as_str()))
        .collect();
    let true_at = std::fs::canonicalize("/bin/true").unwrap();
    let env_at = std::fs::canonicalize("/usr/bin/env").unwrap();
    let loader = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"]
        .into_iter()
        .find(|l| std::path::Path::new(l).exists())
        .unwrap();
    let loader_at = std::fs::canonicalize(loader).unwrap();
    assert_eq!(
        seen,
        [
            ("/bin/true", true_at.to_str().unwrap()),
            ("./bin/true", true_at.to_str().unwrap()),
            ("/tmp/link", true_at.to_str().unwrap()),
            (loader, loader_at.to_str().unwrap()),
            ("env", env_at.to_str().unwrap())
        ],
        "{refused:?}"
    );
    assert!(refused.iter().all(|r| r.at_unix_ms > 0));
    // Taken once.
    assert_eq!(b.sandbox.take_exec_refusals(), (Vec::new(), 0));
    b.sandbox.stop().unwrap();

    // The twin without an allowlist: everything runs, nothing is reported.
    let s = setup("exec-free", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let out = py(
        &mut b.sandbox,
        "import subprocess; subprocess.run(['/bin/true'], check=True); print('ran')",
    );
    assert_eq!(out.stdout, "ran\n", "{out:?}");
    assert_eq!(b.sandbox.take_exec_refusals(), (Vec::new(), 0));
    b.sandbox.stop().unwrap();
}

/// The exec watch against the ways a workload could blur it: a hard link to a listed
/// program runs (Landlock grants the inode) and is no violation; a name ending in `/`
/// (ENOTDIR) is none either; secret memory, which the init could not read a name from, is
/// refused under a list; and an exec by a process the command left behind, after the
/// command's own end, is still reported when the sandbox stops.
#[test]
fn the_exec_watch_counts_hard_links_late_execs_and_refuses_secret_memory() {
    // A listed program with a hard link of its own (Debian's perl and perl5.x.y).
    let twin = std::fs::read_dir("/usr/bin").ok().and_then(|dir| {
        use std::os::unix::fs::MetadataExt as _;
        let perl = std::fs::metadata("/usr/bin/perl")
            .ok()
            .filter(|m| m.nlink() > 1)?;
        dir.flatten().map(|e| e.path()).find(|p| {
            p != std::path::Path::new("/usr/bin/perl")
                && std::fs::symlink_metadata(p)
                    .is_ok_and(|m| m.is_file() && m.ino() == perl.ino() && m.dev() == perl.dev())
        })
    });
    // Mount mode: the host and the process left behind signal each other through files.
    let mut s = setup("exec-watch-edges", WorkspaceMode::Mount);
    let mut listed = vec![std::path::PathBuf::from("/usr/bin/python3")];
    if twin.is_some() {
        listed.push("/usr/bin/perl".into());
    }
    s.spec.exec_only = Some(listed);
    let mut b = start(&s.spec);
    let twin_name = twin
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let probe = format!(
        r#"
import ctypes, errno, os, subprocess, sys
def run(argv):
    try:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        return "ran"
    except OSError as e:
        return errno.errorcode[e.errno]
print("slash", run(["/bin/true/"]))
twin = "{twin_name}"
print("twin", run([twin, "-e", "1"]) if twin else "ran")
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(447, 0)
print("secret", "OK" if r >= 0 else errno.errorcode[ctypes.get_errno()])
# Left behind: execs once the command has exited (when the host says so), then says so.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import time
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while not os.path.exists("/home/agent/workspace/go"):
            time.sleep(0.02)
        try:
            os.execv("/bin/true", ["true"])
        except OSError:
            open("/home/agent/workspace/done", "w").close()
            os._exit(0)
    os._exit(0)
os.wait()
"#
    );
    let out = py(&mut b.sandbox, &probe);
    assert!(out.ok(), "{out:?}");
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        ["slash ENOTDIR", "twin ran", "secret EACCES"],
        "{out:?}"
    );
    if twin.is_none() {
        eprintln!("no hard-linked perl here: the hard-link case was not exercised");
    }
    // Nothing refused while the command ran.
    assert_eq!(b.sandbox.take_exec_refusals(), (Vec::new(), 0));
    std::fs::write(s.workspace.join("go"), "").unwrap();
    assert!(
        eventually(20, || s.workspace.join("done").exists()),
        "the process left behind never tried its exec"
    );
    let (stopped, refused, dropped) = b.sandbox.stop_taking_exec_refusals();
    stopped.unwrap();
    let true_at = std::fs::canonicalize("/bin/true").unwrap();
    assert_eq!(dropped, 0);
    assert_eq!(
        refused
            .iter()
            .map(|r| (r.program.as_str(), r.resolved.as_str()))
            .collect::<Vec<_>>(),
        [("/bin/true", true_at.to_str().unwrap())],
        "{refused:?}"
    );
}
