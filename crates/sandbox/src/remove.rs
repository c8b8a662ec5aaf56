//! Removing a directory tree that a workload could write while it goes (a volume of a named
//! sandbox, its copy-mode upper directory), without following any symbolic link: every step
//! is relative to an open directory, opened with `O_NOFOLLOW`, so a directory swapped for a
//! link mid-way (`renameat2(RENAME_EXCHANGE)` in a loop) makes the removal fail, never
//! reach outside the tree.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// `rm -r path`, following no symbolic link below `path`'s parent (which must be
/// trustworthy: capgate's own directory). A directory that may be removed but not listed
/// (overlayfs leaves its `work/work` empty, mode 000 and owned by the sandbox's root) is
/// removed if empty. A missing `path` is `NotFound`.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` has no parent to remove it from", path.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    remove_beneath(&dir, name)
}

/// `rm -r name` in the open directory `dir`, following no symbolic link, however deep the
/// tree: it walks down and up again with one directory open at a time (no recursion, so
/// neither the stack nor the descriptor limit bounds the depth). Going up opens `..` and
/// checks that it is the directory it came from (device and inode): a directory moved
/// away meanwhile ends the removal with an error, never one of another tree. A directory
/// that cannot be listed is given mode 0700 (when this process may) and listed again;
/// otherwise it is removed only if empty.
pub(crate) fn remove_beneath(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?);
    }
    let mount = mount_id(dir)?;
    let Some((mut cur, first)) = enter(dir, name, mount)? else {
        return Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?);
    };
    let mut levels = vec![first];
    loop {
        let Some(level) = levels.last_mut() else {
            return Ok(());
        };
        if let Some(child) = level.pending.pop() {
            let stat = match rustix::fs::statat(&cur, &child, AtFlags::SYMLINK_NOFOLLOW) {
                Err(rustix::io::Errno::NOENT) => continue,
                other => other?,
            };
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                match rustix::fs::unlinkat(&cur, &child, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
                continue;
            }
            match enter(&cur, &child, mount)? {
                Some((fd, level)) => {
                    cur = fd;
                    levels.push(level);
                }
                None => rustix::fs::unlinkat(&cur, &child, AtFlags::REMOVEDIR)?,
            }
            continue;
        }
        // This level is empty: remove it from its parent.
        let Some(done) = levels.pop() else {
            return Ok(());
        };
        let Some(parent) = levels.last() else {
            return Ok(rustix::fs::unlinkat(dir, &done.name, AtFlags::REMOVEDIR)?);
        };
        let up = rustix::fs::openat(
            &cur,
            "..",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        if file_id(&up)? != parent.id {
            return Err(io::Error::other(format!(
                "`{}` was moved while it was being removed",
                Path::new(&done.name).display()
            )));
        }
        cur = up;
        rustix::fs::unlinkat(&cur, &done.name, AtFlags::REMOVEDIR)?;
    }
}

/// One directory on the way down: its name in its parent, its device and inode, and the
/// names in it not removed yet.
struct Level {
    name: std::ffi::OsString,
    id: (u64, u64),
    pending: Vec<std::ffi::OsString>,
}

/// Opens the directory `name` in `parent` (never through a link, never onto another
/// mount than `mount`) and lists it; `None` when it cannot be listed even after being
/// given mode 0700.
fn enter(parent: &OwnedFd, name: &OsStr, mount: u64) -> io::Result<Option<(OwnedFd, Level)>> {
    let open = || {
        rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let fd = match open() {
        Ok(fd) => fd,
        Err(rustix::io::Errno::ACCESS) => {
            // Not listable (mode 000, say): made ours to list, through a descriptor of the
            // directory itself, so a link put in its place is never what changes mode.
            let path = rustix::fs::openat(
                parent,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let through = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&path));
            if rustix::fs::chmod(through.as_str(), Mode::from_raw_mode(0o700)).is_err() {
                return Ok(None);
            }
            match open() {
                Ok(fd) => fd,
                Err(rustix::io::Errno::ACCESS) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // Never into another mount (a file system mounted inside the tree): its files are not
    // the tree's.
    if mount_id(&fd)? != mount {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "`{}` is a mount point; nothing beneath it is removed",
                Path::new(name).display()
            ),
        ));
    }
    let id = file_id(&fd)?;
    let pending = names_in(&fd, usize::MAX)?;
    Ok(Some((
        fd,
        Level {
            name: name.to_owned(),
            id,
            pending,
        },
    )))
}

/// The device and inode of the open `fd`.
fn file_id(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The id of the mount `fd` lies on.
fn mount_id(fd: &OwnedFd) -> io::Result<u64> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID)?;
    Ok(st.stx_mnt_id)
}

/// The names in the open directory `dir`, without `.` and `..`; at most `max` of them.
pub(crate) fn names_in(dir: &OwnedFd, max: usize) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir.as_fd())? {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            if names.len() == max {
                break;
            }
            names.push(OsStr::from_bytes(bytes).to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn removes_a_tree_and_never_what_its_links_point_at() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host file").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link-to-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep"), tree.join("link-to-file")).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host file"
        );
        assert_eq!(
            remove_tree(&tree).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    /// A workload can nest directories far deeper than a recursive walk's stack (or the
    /// descriptor limit) holds: 50,000 levels, each with a file, are removed whole.
    #[test]
    fn removes_a_tree_deeper_than_any_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        let mut cur =
            rustix::fs::open(&tree, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..50_000 {
            rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o755)).unwrap();
            let f = rustix::fs::openat(
                &cur,
                "f",
                OFlags::WRONLY | OFlags::CREATE,
                Mode::from_raw_mode(0o644),
            )
            .unwrap();
            drop(f);
            cur = rustix::fs::openat(&cur, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .unwrap();
        }
        drop(cur);
        // On a thread with a small stack, where a recursive walk would overflow early.
        let handle = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || remove_tree(&tree).map(|()| tree))
            .unwrap();
        let tree = handle.join().unwrap().unwrap();
        assert!(!tree.exists());
    }

    /// A directory the workload left without permissions (mode 000, files inside) is
    /// removed by the user who owns it, not left behind: run as another user (nobody,
    /// via setpriv: only root can), the removal lists it after giving it mode 0700.
    #[test]
    fn removes_a_directory_left_without_permissions_as_its_owner() {
        if let Some(path) = std::env::var_os("CAPGATE_TEST_REMOVE_AS_OWNER") {
            // The second half, in the process of the owner.
            remove_tree(Path::new(&path)).unwrap();
            return;
        }
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: only root can run the removal as another user");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("x/y")).unwrap();
        std::fs::write(tree.join("x/y/f"), "z").unwrap();
        for p in [
            &tree,
            &tree.join("x"),
            &tree.join("x/y"),
            &tree.join("x/y/f"),
        ] {
            rustix::fs::chown(
                p.as_path(),
                Some(rustix::fs::Uid::from_raw(65534)),
                Some(rustix::fs::Gid::from_raw(65534)),
            )
            .unwrap();
        }
        // The tree's parent must be writable by its owner too.
        let parent = tmp.path().join("owned");
        std::fs::create_dir(&parent).unwrap();
        std::fs::rename(&tree, parent.join("tree")).unwrap();
        let tree = parent.join("tree");
        rustix::fs::chown(
            parent.as_path(),
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .unwrap();
        std::fs::set_permissions(
            tree.join("x"),
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "remove::tests::removes_a_directory_left_without_permissions_as_its_owner",
                "--nocapture",
            ])
            .env("CAPGATE_TEST_REMOVE_AS_OWNER", &tree)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!tree.exists());
    }

    /// The attack a workload can run on a volume while `capgate rm` removes it: swap a
    /// full directory with a link to a host directory, over and over. The removal may fail;
    /// the host directory keeps every file. (A path-based removal loses host files in about
    /// one round of four here, so eight rounds.)
    #[test]
    fn a_directory_swapped_for_a_link_mid_removal_redirects_nothing() {
        for _ in 0..8 {
            swap_during_removal();
        }
    }

    fn swap_during_removal() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        for i in 0..300 {
            std::fs::write(outside.join(format!("f{i}")), "host").unwrap();
        }
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("d")).unwrap();
        for i in 0..800 {
            std::fs::write(tree.join(format!("d/f{i}")), "x").unwrap();
        }
        // The link lives beside the tree, so the removal cannot take it away first.
        let link = tmp.path().join("s");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let swapper = {
            let (stop, swaps, tree, link) = (
                Arc::clone(&stop),
                Arc::clone(&swaps),
                tree.clone(),
                link.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        tree.join("d"),
                        rustix::fs::CWD,
                        &link,
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .is_ok()
                    {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        // The removal starts once the swapping has.
        while swaps.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let _ = remove_tree(&tree);
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let swaps = swaps.load(Ordering::Relaxed);
        let left = std::fs::read_dir(&outside).unwrap().count();
        assert_eq!(
            left, 300,
            "removal reached through the link ({swaps} swaps)"
        );
    }
}
