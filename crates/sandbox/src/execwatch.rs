//! Under an exec allowlist (a pack's `dev.capgate/exec@1`), the init sees every `execve`
//! and `execveat` of the sandbox's commands and reports the ones the allowlist does not
//! grant, so that a refused exec is a recorded capability violation like a refused request.
//!
//! It observes, with one exception. A seccomp filter installed by the init before its
//! commands exist (inherited by all of them) hands each exec to the init as a user
//! notification; the init reads the program's name from the waiting process, resolves it
//! as that process would, and answers "go on" (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`)
//! whatever it found: Landlock alone refuses, as before. So a name this module resolves
//! otherwise than the kernel (a link swapped in between, a name rewritten by another
//! thread, a path through `/proc/self`, which the init would read as its own) can at worst
//! cost a record, never an exec, and never grant one. Names it cannot resolve (missing
//! files, magic links) are not reported: the kernel answers those with ENOENT or on its
//! own. The exception: a dynamic loader that Landlock grants only so that listed programs
//! can be loaded is refused here (EACCES) when it is run by name, since it would run any
//! readable program; against a workload that races the init, that refusal is best effort.
//!
//! Reading a command's memory and descriptors (`/proc/PID/mem`, `/proc/PID/fd`) needs
//! `CAP_SYS_PTRACE` and, for files of the agent's (0600, 0500), `CAP_DAC_READ_SEARCH`: the
//! commands run as another user than the init, whose seccomp filter refuses
//! `process_vm_readv`. The init keeps both permitted under an allowlist (in the sandbox's
//! user namespace, so over nothing but the sandbox) and raises them only while it reads.

use std::io::{self, Read as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::report::ExecRefusal;
use crate::sys::{self, Notice};

/// The longest program name read from a process (`PATH_MAX`).
const MAX_NAME: usize = 4096;

/// The init's side of the notifier.
#[derive(Debug)]
pub(crate) struct ExecWatch {
    listener: OwnedFd,
    /// What the allowlist grants, as canonical sandbox paths: files, and directories
    /// granting everything beneath them.
    granted: Vec<PathBuf>,
    /// The granted files' device and inode numbers: Landlock grants a file as its inode,
    /// so a hard link to it elsewhere runs too.
    granted_files: Vec<(u64, u64)>,
    /// The dynamic loaders Landlock grants for loading listed programs only (their device
    /// and inode numbers): an exec of one by name is refused here.
    loaders: Vec<(u64, u64)>,
}

/// What the init makes of one exec.
enum Judged {
    /// Nothing to say: the kernel decides.
    Pass,
    /// Not granted: the kernel refuses it (Landlock); reported.
    Report(ExecRefusal),
    /// A dynamic loader run by name: refused here (EACCES), and reported.
    Refuse(ExecRefusal),
}

impl ExecWatch {
    pub(crate) fn new(
        listener: OwnedFd,
        granted: Vec<PathBuf>,
        loaders: Vec<PathBuf>,
    ) -> ExecWatch {
        let ids = |paths: &[PathBuf]| -> Vec<(u64, u64)> {
            use std::os::unix::fs::MetadataExt as _;
            paths
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .filter(std::fs::Metadata::is_file)
                .map(|m| (m.dev(), m.ino()))
                .collect()
        };
        ExecWatch {
            listener,
            granted_files: ids(&granted),
            loaders: ids(&loaders),
            granted,
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Takes one pending notification and answers it: the exec goes on (the kernel
    /// decides), unless it runs a dynamic loader by name, which fails with EACCES. Returns
    /// the refusal to report: a program that exists and is not granted, or such a loader.
    /// Call when the listener is readable.
    pub(crate) fn answer(&self) -> Option<ExecRefusal> {
        let notice = sys::receive_notice(self.fd()).ok()?;
        let judged = with_ptrace(|| self.judge(&notice)).unwrap_or(Judged::Pass);
        // An error answering (the process is gone) needs nothing more.
        match judged {
            Judged::Pass => {
                let _ = sys::continue_notice(self.fd(), notice.id);
                None
            }
            Judged::Report(refusal) => {
                let _ = sys::continue_notice(self.fd(), notice.id);
                Some(refusal)
            }
            Judged::Refuse(refusal) => {
                let _ = sys::fail_notice(self.fd(), notice.id, libc::EACCES);
                Some(refusal)
            }
        }
    }

    /// `None` when the exec cannot be judged (see the module's text).
    fn judge(&self, notice: &Notice) -> Option<Judged> {
        let (dirfd, name_at, flags) = match notice.nr {
            nr if nr == libc::SYS_execve => (libc::AT_FDCWD, notice.args[0], 0),
            nr if nr == libc::SYS_execveat => (
                // The kernel reads these as int: compared on the low 32 bits.
                notice.args[0] as u32 as i32,
                notice.args[1],
                notice.args[4] as u32 as i32,
            ),
            _ => return None,
        };
        // The process's directory, opened before the notice is checked: if the notice is
        // still pending then, the directory is that process's, not one of a process that
        // reused its pid, and whatever is opened beneath it is its.
        let proc_dir = process_dir(&notice.pid.to_string()).ok()?;
        if !sys::notice_pending(self.fd(), notice.id) {
            return None;
        }
        let name = read_name(&proc_dir, name_at).ok()?;
        // A name ending in `/` names a directory: a file there fails with ENOTDIR.
        if name.last() == Some(&b'/') {
            return None;
        }
        match resolve(&proc_dir, dirfd, &name, flags) {
            Ok((resolved, id)) => Some(self.classify(&name, resolved, id)),
            // Through procfs where the walk cannot follow the kernel (`..`, `task/TID`, a
            // directory in procfs as the start): it could lead to the loader, so it is
            // refused rather than passed unjudged.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                let shown = String::from_utf8_lossy(&name).into_owned();
                Some(Judged::Refuse(refusal_of(shown.clone(), shown)))
            }
            Err(_) => None,
        }
    }

    /// What an exec of the file `resolved` (device and inode `id`), named `name`, is.
    fn classify(&self, name: &[u8], resolved: PathBuf, id: (u64, u64)) -> Judged {
        let refusal = || {
            refusal_of(
                String::from_utf8_lossy(name).into_owned(),
                resolved.to_string_lossy().into_owned(),
            )
        };
        if self.loaders.contains(&id) {
            Judged::Refuse(refusal())
        } else if is_granted(&resolved, &self.granted) || self.granted_files.contains(&id) {
            Judged::Pass
        } else {
            Judged::Report(refusal())
        }
    }

    /// Judges a command's own first exec, which the init starts and the notifications
    /// cannot read when the command runs as another user (it is not dumpable yet): the
    /// program as the init will run it, in the init's view (the sandbox's), with the
    /// rights it reads commands with. The candidates are taken in order as `execvp`
    /// does: each that is a file is tried until one is granted. `Err` with the refusal
    /// when one tried is a dynamic loader (the command must not start); `Ok(Some)` with
    /// the first tried that the list does not grant, when `report` (Landlock refuses it),
    /// `Ok(None)` otherwise.
    pub(crate) fn judge_first(
        &self,
        candidates: &[PathBuf],
        report: bool,
    ) -> Result<Option<ExecRefusal>, ExecRefusal> {
        use std::os::unix::fs::MetadataExt as _;
        let judged = with_ptrace(|| {
            let mut refused = None;
            for name in candidates {
                let Some(meta) = std::fs::metadata(name).ok().filter(|m| m.is_file()) else {
                    continue;
                };
                let resolved = std::fs::canonicalize(name).unwrap_or_else(|_| name.clone());
                match self.classify(
                    name.as_os_str().as_bytes(),
                    resolved,
                    (meta.dev(), meta.ino()),
                ) {
                    Judged::Pass => break,
                    Judged::Report(refusal) => {
                        refused.get_or_insert(refusal);
                    }
                    Judged::Refuse(refusal) => return Some(Err(refusal)),
                }
            }
            Some(Ok(refused.filter(|_| report)))
        });
        judged.unwrap_or(Ok(None))
    }
}

/// A refusal of an exec of `program`, which led to `resolved`, now.
fn refusal_of(program: String, resolved: String) -> ExecRefusal {
    ExecRefusal {
        program,
        resolved,
        at_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0),
    }
}

/// The capabilities the init raises while it reads a command (see the module's text).
pub(crate) const READ_CAPS: [caps::Capability; 2] = [
    caps::Capability::CAP_SYS_PTRACE,
    caps::Capability::CAP_DAC_READ_SEARCH,
];

/// `f` with [`READ_CAPS`] effective (from the init's permitted set), lowered after.
fn with_ptrace<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    use caps::CapSet;
    let lower = || {
        for cap in READ_CAPS {
            let _ = caps::drop(None, CapSet::Effective, cap);
        }
    };
    for cap in READ_CAPS {
        if caps::raise(None, CapSet::Effective, cap).is_err() {
            lower();
            return None;
        }
    }
    let out = f();
    lower();
    out
}

/// Opens `what` beneath a process's `/proc/PID` directory.
fn open_in(proc_dir: &OwnedFd, what: &str, flags: OFlags) -> io::Result<OwnedFd> {
    rustix::fs::openat(proc_dir, what, flags | OFlags::CLOEXEC, Mode::empty())
        .map_err(io::Error::from)
}

/// The NUL-terminated name at `addr` in the process of `proc_dir`, read page by page (a
/// name that ends before an unmapped page is whole).
fn read_name(proc_dir: &OwnedFd, addr: u64) -> io::Result<Vec<u8>> {
    let mut mem = std::fs::File::from(open_in(proc_dir, "mem", OFlags::RDONLY)?);
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < MAX_NAME {
        let to_page_end = 4096 - (at % 4096) as usize;
        let mut buf = vec![0u8; to_page_end.min(MAX_NAME - out.len())];
        std::io::Seek::seek(&mut mem, std::io::SeekFrom::Start(at))?;
        let n = mem.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Err(io::Error::other("program name unterminated"))
}

/// Most symbolic links followed in one name (the kernel's own bound).
const MAX_LINKS: usize = 40;

/// The canonical path, device and inode of the file the process of `proc_dir` names for
/// exec: resolved from its root, its working directory or `dirfd`, one component at a
/// time, each link followed here. Nothing resolves through procfs (`/proc/self` there
/// would be the init's): such a name, like a missing file or one that is not a regular
/// file, is not judged.
fn resolve(
    proc_dir: &OwnedFd,
    dirfd: i32,
    name: &[u8],
    flags: i32,
) -> io::Result<(PathBuf, (u64, u64))> {
    let not_judged = || io::Error::from(io::ErrorKind::Unsupported);
    let file = if name.is_empty() {
        // execveat(fd, "", AT_EMPTY_PATH): the descriptor itself.
        if flags & libc::AT_EMPTY_PATH == 0 {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        open_in(proc_dir, &format!("fd/{dirfd}"), OFlags::PATH)?
    } else {
        let root = open_in(proc_dir, "root", OFlags::PATH)?;
        let base = if name.first() == Some(&b'/') {
            root.try_clone()?
        } else if dirfd == libc::AT_FDCWD {
            open_in(proc_dir, "cwd", OFlags::PATH)?
        } else {
            open_in(proc_dir, &format!("fd/{dirfd}"), OFlags::PATH)?
        };
        walk(
            (&root, proc_dir),
            base,
            name,
            flags & libc::AT_SYMLINK_NOFOLLOW == 0,
        )?
    };
    if is_proc(&file)? {
        return Err(not_judged());
    }
    let stat = rustix::fs::fstat(&file)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        // A directory or a device: the kernel refuses it (EACCES) whatever is granted.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let path = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&file)
    ))?;
    Ok((path, (stat.st_dev, stat.st_ino)))
}

fn is_proc(fd: &OwnedFd) -> io::Result<bool> {
    Ok(rustix::fs::fstatfs(fd)?.f_type == rustix::fs::PROC_SUPER_MAGIC)
}

/// Opens `name` (`O_PATH`) beneath `base`, `/` being `root`, following links itself (the
/// last one only if `follow_last`). Into procfs only through the links to a process's
/// files (see [`through_proc`]), `self` being the process of `proc_dir`.
fn walk(
    (root, proc_dir): (&OwnedFd, &OwnedFd),
    base: OwnedFd,
    name: &[u8],
    follow_last: bool,
) -> io::Result<OwnedFd> {
    // A directory's filesystem is looked at (`fstatfs`) only where the device changes.
    let device = |fd: &OwnedFd| -> io::Result<u64> {
        if is_proc(fd)? {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        Ok(rustix::fs::fstat(fd)?.st_dev)
    };
    let root_dev = device(root)?;
    let mut todo: std::collections::VecDeque<Vec<u8>> = split(name);
    let (mut cur, mut cur_dev) = if name.first() == Some(&b'/') {
        (root.try_clone()?, root_dev)
    } else {
        let dev = device(&base)?;
        (base, dev)
    };
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part.is_empty() || part == b"." {
            continue;
        }
        let next = rustix::fs::openat(
            &cur,
            std::ffi::OsStr::from_bytes(&part),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut stat = rustix::fs::fstat(&next)?;
        let next = if stat.st_dev != cur_dev && is_proc(&next)? {
            // The exec is judged as the kernel runs it: through `/proc/self/root/…`,
            // `/proc/self/fd/N`, `/dev/fd/N` as the file they lead to.
            let file = through_proc(proc_dir, &mut todo)?;
            stat = rustix::fs::fstat(&file)?;
            file
        } else {
            next
        };
        let is_link =
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Symlink;
        if is_link && (follow_last || !todo.is_empty()) {
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = rustix::fs::readlinkat(&next, "", Vec::new())?.into_bytes();
            if target.first() == Some(&b'/') {
                (cur, cur_dev) = (root.try_clone()?, root_dev);
            }
            for p in split(&target).into_iter().rev() {
                todo.push_front(p);
            }
            continue;
        }
        (cur, cur_dev) = (next, stat.st_dev);
    }
    Ok(cur)
}

/// Follows, from procfs's root, the next components of a name (taken from `todo`) to
/// the file they lead to: `self`, `thread-self` or a process id, then `root`, `cwd`,
/// `exe` or `fd/N`, the process's own links, which the kernel follows to the file (as the
/// init opens them here: `self` is the process of `proc_dir`, not the init). Anything
/// else in procfs is not judged.
fn through_proc(
    proc_dir: &OwnedFd,
    todo: &mut std::collections::VecDeque<Vec<u8>>,
) -> io::Result<OwnedFd> {
    let unsupported = || io::Error::from(io::ErrorKind::Unsupported);
    let mut next = || loop {
        match todo.pop_front() {
            Some(part) if part.is_empty() || part == b"." => {}
            other => return other,
        }
    };
    let process = next().ok_or_else(unsupported)?;
    let other;
    let dir = match process.as_slice() {
        // `self` is the whole process (its thread group's leader), whose working
        // directory a thread made without CLONE_FS need not share; `thread-self` the
        // thread that execs.
        b"self" => {
            other = process_dir(&thread_group_of(proc_dir)?.to_string())?;
            &other
        }
        b"thread-self" => proc_dir,
        digits if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) => {
            // The init's /proc is the sandbox's: the same process ids.
            other = process_dir(&String::from_utf8_lossy(digits))?;
            &other
        }
        _ => return Err(unsupported()),
    };
    let link = match next().ok_or_else(unsupported)?.as_slice() {
        b"root" => "root".to_owned(),
        b"cwd" => "cwd".to_owned(),
        b"exe" => "exe".to_owned(),
        b"fd" => {
            let n = next().ok_or_else(unsupported)?;
            if n.is_empty() || !n.iter().all(u8::is_ascii_digit) {
                return Err(unsupported());
            }
            format!("fd/{}", String::from_utf8_lossy(&n))
        }
        _ => return Err(unsupported()),
    };
    let file = open_in(dir, &link, OFlags::PATH)?;
    if is_proc(&file)? {
        return Err(unsupported());
    }
    Ok(file)
}

/// `/proc/ID`, opened as a path.
fn process_dir(id: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        format!("/proc/{id}").as_str(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The thread group (process) id of the thread of `proc_dir`, from its `status`.
fn thread_group_of(proc_dir: &OwnedFd) -> io::Result<u32> {
    let mut status = String::new();
    std::fs::File::from(open_in(proc_dir, "status", OFlags::RDONLY)?)
        .read_to_string(&mut status)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))
}

/// The components of a name (empty ones and `.` included; the walk skips them).
fn split(name: &[u8]) -> std::collections::VecDeque<Vec<u8>> {
    name.split(|&b| b == b'/').map(<[u8]>::to_vec).collect()
}

/// Whether `path` (canonical) is a granted file or lies beneath a granted directory.
pub(crate) fn is_granted(path: &Path, granted: &[PathBuf]) -> bool {
    granted.iter().any(|g| path.starts_with(g))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_program_is_granted_as_itself_or_beneath_a_granted_directory_only() {
        let granted = [
            PathBuf::from("/usr/bin/python3.11"),
            PathBuf::from("/opt/tool"),
        ];
        for ok in ["/usr/bin/python3.11", "/opt/tool/bin/run", "/opt/tool"] {
            assert!(is_granted(Path::new(ok), &granted), "{ok}");
        }
        for refused in [
            "/usr/bin/python3",
            "/usr/bin/python3.11x",
            "/usr/bin/sh",
            "/opt/toolbox/run",
            "/opt",
            "/tmp/python3.11",
        ] {
            assert!(!is_granted(Path::new(refused), &granted), "{refused}");
        }
    }
}
