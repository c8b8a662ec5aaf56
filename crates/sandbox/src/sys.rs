//! Every `unsafe` block of the crate, each with its reasoning. Everything else goes through
//! the safe APIs of `nix`, `rustix`, `landlock`, `seccompiler` and `caps`.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
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
pub(crate) fn pass_fd_as(cmd: &mut Command, fd: RawFd, target: RawFd) {
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
pub(crate) fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
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
