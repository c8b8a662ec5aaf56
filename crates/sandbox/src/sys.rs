//! Every `unsafe` block of the crate, each with its reasoning. Everything else goes through
//! the safe APIs of `nix`, `rustix`, `landlock`, `seccompiler` and `caps`.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::CloneFlags;
use nix::unistd::Pid;

/// Which side of a fork we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forked {
    Child,
    Parent(Pid),
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `clone(2)` with namespace flags and no new stack: like `fork`, the child continues on a
/// copy of this stack. Callers must be single-threaded (the helper is a fresh process).
pub(crate) fn clone_into_namespaces(flags: CloneFlags) -> io::Result<Forked> {
    let flags = flags.bits() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: the raw clone syscall without CLONE_VM and with a NULL stack duplicates the
    // address space like fork(2); no pointer arguments are passed (parent/child tid and tls
    // are 0, which the kernel ignores without the matching CLONE_* flags). The caller is
    // single-threaded, so no lock (malloc's included) can be held by another thread in the
    // child's copy.
    let ret =
        check(unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) })?;
    Ok(if ret == 0 {
        Forked::Child
    } else {
        Forked::Parent(Pid::from_raw(ret as i32))
    })
}

/// `struct clone_args` of `clone3(2)`, up to `cgroup` (Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (Linux 5.7): the child starts as a member of the cgroup v2 directory
/// `clone_args.cgroup` names, with no migration afterwards.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Like [`clone_into_namespaces`], but the child is born into the cgroup v2 directory open
/// as `cgroup` (`clone3` with `CLONE_INTO_CGROUP`). Moving a process into a cgroup later
/// takes the kernel's global threadgroup lock and waits out an RCU grace period (~7–10 ms
/// here); being born there does not. Fails with `ENOSYS`, `E2BIG` or `EINVAL` where the
/// kernel (or a seccomp filter around capgate) lacks `clone3` or the flag: callers fall back
/// to [`clone_into_namespaces`] and a `cgroup.procs` write.
pub(crate) fn clone_into_namespaces_and_cgroup(
    flags: CloneFlags,
    cgroup: BorrowedFd<'_>,
) -> io::Result<Forked> {
    let args = CloneArgs {
        flags: flags.bits() as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid, initialized `struct clone_args` that lives across the call,
    // and its size is passed with it. No CLONE_VM and a zero stack make the child continue
    // on a copy of this address space and stack, like fork(2); no pointer fields are set
    // (pidfd, tids, tls and set_tid are 0 and their flags absent). The caller is
    // single-threaded, so no lock can be held by another thread in the child's copy.
    let ret = check(unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    })?;
    Ok(if ret == 0 {
        Forked::Child
    } else {
        Forked::Parent(Pid::from_raw(ret as i32))
    })
}

/// `fork(2)` of the single-threaded init.
pub(crate) fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the sandbox's init is single-threaded (it never spawns threads), so the child
    // may run any code, allocation included, after the fork.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child)),
    }
}

/// `_exit(2)`: ends a forked child without running the parent's exit handlers.
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it never returns.
    unsafe { libc::_exit(code) }
}

/// Sets `IFF_UP` on `lo` in the current network namespace.
pub(crate) fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: ifreq is plain old data; all-zero is a valid value (empty name, zero union).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `fd` is a valid socket owned by `sock` for the duration of the call and `req`
    // is a valid, writable ifreq that SIOCGIFFLAGS fills in.
    check(unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) }.into())?;
    // SAFETY: reading the `ifru_flags` member that SIOCGIFFLAGS just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    check(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) }.into())?;
    Ok(())
}

/// Makes the spawned program find `fd` at descriptor `target` (all other descriptors of the
/// caller stay close-on-exec).
pub fn pass_fd_as(cmd: &mut Command, fd: RawFd, target: RawFd) {
    let hook = move || -> io::Result<()> {
        if fd == target {
            // SAFETY: fcntl on a descriptor number; F_SETFD with 0 only clears FD_CLOEXEC.
            check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }.into())?;
        } else {
            // SAFETY: dup2 on descriptor numbers; it is async-signal-safe and the new
            // descriptor does not have FD_CLOEXEC.
            check(unsafe { libc::dup2(fd, target) }.into())?;
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec; it calls only dup2/fcntl
    // (async-signal-safe), allocates nothing and touches no state shared with the parent.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Takes ownership of a descriptor this process inherited (`--ctl-fd 3`), after checking that
/// it is open, and marks it close-on-exec.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor number has no memory effects; it fails with EBADF when
    // the descriptor is not open.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }.into())?;
    // SAFETY: the descriptor is open (checked above) and was handed to this process for its
    // exclusive use by `pass_fd_as` in the caller; nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ignores SIGINT and SIGQUIT: the terminal's Ctrl-C is the caller's to handle.
pub(crate) fn ignore_terminal_signals() {
    for sig in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: installing SIG_IGN involves no handler code and no memory.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// Default dispositions for every signal (ignored ones, like Rust's SIGPIPE, would
/// otherwise survive `execve`), and an empty signal mask.
pub(crate) fn reset_signals() -> io::Result<()> {
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL involves no handler code and no memory.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )
    .map_err(io::Error::from)
}

/// Marks every descriptor ≥ 3 close-on-exec (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`,
/// Linux 5.11; older kernels: each descriptor listed in `/proc/self/fd`).
pub(crate) fn cloexec_from_3() -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on descriptors.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= 3)
        .collect();
    for fd in fds {
        // SAFETY: fcntl F_SETFD on a descriptor number only sets FD_CLOEXEC; a descriptor
        // closed meanwhile (the read_dir's own) gives EBADF, which is ignored.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// The kernel's Landlock ABI version (0 when Landlock is missing or disabled).
pub(crate) fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the kernel reads no
    // memory and returns the ABI version or an error.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(ret).unwrap_or(0).max(0)
}

/// Installs `program` as a seccomp filter of this process (and of every child it forks
/// from now on) with `SECCOMP_FILTER_FLAG_NEW_LISTENER`: its user notifications arrive on
/// the returned descriptor (close-on-exec). `no_new_privs` must be set.
pub(crate) fn install_listener(program: &[seccompiler::sock_filter]) -> io::Result<OwnedFd> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    let prog = libc::sock_fprog {
        len,
        // seccompiler's `sock_filter` is the kernel's `struct sock_filter` (`repr(C)`: u16,
        // u8, u8, u32), like libc's.
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: `prog` points at `len` instructions of the kernel's layout that outlive the
    // call (the kernel copies them); no other memory is read. The returned descriptor is new and owned by no one
    // else.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &raw const prog,
        )
    })?;
    let fd =
        RawFd::try_from(fd).map_err(|_| io::Error::other("seccomp: descriptor out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One user notification: a process of the sandbox waits in this syscall.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Notice {
    pub id: u64,
    /// The waiting thread, in the listener's pid namespace.
    pub pid: u32,
    pub nr: i64,
    pub args: [u64; 6],
}

/// Takes the next notification (`SECCOMP_IOCTL_NOTIF_RECV`); blocks when none is pending.
/// `ENOENT`: the process it was for is gone.
pub(crate) fn receive_notice(listener: BorrowedFd<'_>) -> io::Result<Notice> {
    // SAFETY: all-zero is a valid `seccomp_notif` (plain integers), and the kernel requires
    // the structure zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one `seccomp_notif` into `n`, which lives across the call.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &raw mut n,
        )
    };
    check(libc::c_long::from(ret))?;
    Ok(Notice {
        id: n.id,
        pid: n.pid,
        nr: i64::from(n.data.nr),
        args: n.data.args,
    })
}

/// Whether the notification `id` still waits (`SECCOMP_IOCTL_NOTIF_ID_VALID`): checked after
/// reading the process's memory, so a pid reused meanwhile is never mistaken for it.
pub(crate) fn notice_pending(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the ioctl reads one u64 from `id`, which lives across the call.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &raw const id,
        )
    };
    ret == 0
}

/// Lets the waiting syscall go on as if no filter had noticed it
/// (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`, Linux 5.5): the kernel, Landlock included, decides.
pub(crate) fn continue_notice(listener: BorrowedFd<'_>, id: u64) -> io::Result<()> {
    answer_notice(
        listener,
        libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        },
    )
}

/// Fails the waiting syscall with `errno`, without running it.
pub(crate) fn fail_notice(listener: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    answer_notice(
        listener,
        libc::seccomp_notif_resp {
            id,
            val: 0,
            error: -errno,
            flags: 0,
        },
    )
}

fn answer_notice(listener: BorrowedFd<'_>, mut resp: libc::seccomp_notif_resp) -> io::Result<()> {
    // SAFETY: the ioctl reads one `seccomp_notif_resp` from `resp`, which lives across it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &raw mut resp,
        )
    };
    check(libc::c_long::from(ret)).map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use std::os::fd::AsFd as _;

    /// The kernel places a child cloned with `CLONE_INTO_CGROUP` in the cgroup v2
    /// directory named by the fd, with no write to `cgroup.procs`. Runs where a writable
    /// cgroup2 mount exists (here `/sys/fs/cgroup/unified`, without controllers); says so
    /// and passes elsewhere, since this host property is not the code under test.
    #[test]
    fn a_child_cloned_into_a_cgroup_is_born_there() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let Some(mount) = mountinfo.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split(' ').next() == Some("cgroup2")).then(|| left.split(' ').nth(4))?
        }) else {
            eprintln!("no cgroup2 mount here: CLONE_INTO_CGROUP not exercised");
            return;
        };
        let name = format!("capgate-clone3-test-{}", std::process::id());
        let dir = std::path::Path::new(mount).join(&name);
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!(
                "cannot create {} ({e}): CLONE_INTO_CGROUP not exercised",
                dir.display()
            );
            return;
        }
        let fd = std::fs::File::open(&dir).unwrap();
        let expected = format!("0::/{name}\n");
        // Other tests run on other threads: the child allocates nothing (a short path is
        // converted on the stack), reads into a stack buffer and exits.
        let result = clone_into_namespaces_and_cgroup(CloneFlags::empty(), fd.as_fd());
        match result {
            Ok(Forked::Child) => {
                use std::io::Read as _;
                let mut buf = [0u8; 512];
                let n = std::fs::File::open("/proc/self/cgroup")
                    .and_then(|mut f| f.read(&mut buf))
                    .unwrap_or(0);
                let placed = buf[..n]
                    .windows(expected.len())
                    .any(|w| w == expected.as_bytes());
                exit_immediately(if placed { 0 } else { 1 });
            }
            Ok(Forked::Parent(pid)) => {
                let status = nix::sys::wait::waitpid(pid, None).unwrap();
                let _ = std::fs::remove_dir(&dir);
                assert_eq!(
                    status,
                    nix::sys::wait::WaitStatus::Exited(pid, 0),
                    "the child was not in {}",
                    dir.display()
                );
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                panic!("clone3 into {}: {e}", dir.display());
            }
        }
    }
}
