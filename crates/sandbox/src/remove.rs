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

/// `rm -r name` in the open directory `dir`, following no symbolic link.
pub(crate) fn remove_beneath(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?);
    }
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(child) => {
            // Never into another mount (a file system mounted inside the tree): its files
            // are not the tree's.
            if mount_id(&child)? != mount_id(dir)? {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "`{}` is a mount point; nothing beneath it is removed",
                        Path::new(name).display()
                    ),
                ));
            }
            for child_name in &names_in(&child, usize::MAX)? {
                remove_beneath(&child, child_name)?;
            }
        }
        // Removable only if empty; otherwise the unlinkat below says why.
        Err(rustix::io::Errno::ACCESS) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
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
