//! Copy-back: the changes a workload made to a copy-mode workspace, carried to the host
//! directory it was copied from (seed 003: "copy-back is a separate host-side boundary").
//!
//! A copy-mode workspace is an overlay whose upper directory holds everything the workload
//! changed: new and modified files, directories, symbolic links, and whiteouts (character
//! devices 0:0) for what it removed; a directory it removed and made again is marked opaque
//! (`user.overlay.opaque`). [`scan`] reads that directory once the sandbox has stopped,
//! without following any link, and lists the changes. [`divert_reason`] names the ones that
//! must not reach the host's working tree: files that programs on the host run or obey
//! without being asked (git hooks and metadata, editor tasks, CI workflows, direnv; the
//! reviewed list is [`RUNNERS`]) and every symbolic link (which could point a host tool
//! outside the tree). The caller diverts those (a git branch, a folder to review).
//! [`apply`] writes the others beneath the host directory, every path resolved beneath it
//! with no symbolic link allowed on the way (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`), each file written to a new temporary file and renamed into place,
//! with no set-id bits. What cannot be applied safely is refused, with the reason.
//!
//! What copy-back does not do: merge. The overlay's lower layer is the host directory
//! itself, so a file changed on the host during the run is overwritten by the workload's
//! version of it, if it has one.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// Bounds on what one copy-back reads from the upper directory.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most entries (files, directories, links, removals).
    pub max_entries: usize,
    /// Largest single file.
    pub max_file_bytes: u64,
    /// Most bytes over all files.
    pub max_total_bytes: u64,
    /// Deepest path, in components.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_file_bytes: 256 << 20,
            max_total_bytes: 4 << 30,
            max_depth: 128,
        }
    }
}

/// One change, at a path relative to the workspace (never absolute, never `..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Where, relative to the workspace.
    pub path: PathBuf,
    /// What the workload left there.
    pub kind: ChangeKind,
}

/// What a [`Change`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// A new or modified regular file.
    File {
        /// Its owner may execute it (written as 0755, else 0644).
        executable: bool,
        /// Its size in bytes when scanned.
        size: u64,
    },
    /// A new or changed symbolic link, and where it points.
    Symlink(PathBuf),
    /// A directory.
    Dir {
        /// Made anew (removed, then made again): nothing the host has beneath it stays.
        opaque: bool,
    },
    /// The workload removed what the host has here.
    Delete,
}

/// An entry left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Where, relative to the workspace.
    pub path: PathBuf,
    /// Why it was left out.
    pub reason: String,
}

/// What [`scan`] found: changes in order, parents before their children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The changes, parents before their children.
    pub changes: Vec<Change>,
    /// Entries that are no change copy-back can carry (a FIFO, a socket, a device).
    pub skipped: Vec<Refusal>,
}

/// A path, or a path's prefix, whose changes are diverted, with why.
#[derive(Debug, Clone, Copy)]
pub struct Runner {
    /// A path relative to the workspace.
    pub path: &'static str,
    /// Also matches the same name in any subdirectory (`a/b/.git`).
    pub anywhere: bool,
    /// What on the host runs or obeys it.
    pub reason: &'static str,
}

const fn runner(path: &'static str, anywhere: bool, reason: &'static str) -> Runner {
    Runner {
        path,
        anywhere,
        reason,
    }
}

/// Files that programs on the host run or obey without the user running them: a change to
/// any of them (or beneath them) is diverted, never written into the working tree.
pub const RUNNERS: &[Runner] = &[
    runner(
        ".git",
        true,
        "the repository's metadata: hooks, config (core.hooksPath, core.fsmonitor, aliases) and refs run or steer git on the host",
    ),
    runner(
        ".githooks",
        true,
        "a usual core.hooksPath: git runs these hooks on the host",
    ),
    runner(".husky", true, "husky's git hooks, run by git on the host"),
    runner(
        ".pre-commit-config.yaml",
        false,
        "pre-commit's configuration names the programs run at every commit",
    ),
    runner(
        ".gitattributes",
        true,
        "filter, diff and merge drivers in it make git run programs",
    ),
    runner(
        ".gitmodules",
        false,
        "submodule URLs and update commands that git follows",
    ),
    runner(
        ".envrc",
        true,
        "direnv runs it in the user's shell on entering the directory",
    ),
    runner(
        ".vscode",
        true,
        "VS Code tasks, launch configurations and settings can run programs when the folder opens",
    ),
    runner(
        ".idea",
        true,
        "JetBrains run configurations and start-up tasks",
    ),
    runner(
        ".devcontainer",
        true,
        "dev container definitions build and run containers with host mounts",
    ),
    runner(
        ".github/workflows",
        false,
        "CI workflows run with the repository's secrets",
    ),
    runner(
        ".gitlab-ci.yml",
        false,
        "CI pipelines run with the repository's secrets",
    ),
];

/// Why a change must be diverted rather than applied, or `None` when it may be applied.
pub fn divert_reason(change: &Change) -> Option<&'static str> {
    if let ChangeKind::Symlink(_) = change.kind {
        return Some("a symbolic link could point tools on the host outside the workspace");
    }
    RUNNERS
        .iter()
        .find(|r| runner_matches(r, &change.path))
        .map(|r| r.reason)
}

fn runner_matches(r: &Runner, path: &Path) -> bool {
    let pattern = Path::new(r.path);
    if path.starts_with(pattern) {
        return true;
    }
    // `anywhere` patterns are one name: match it as any component of the path.
    r.anywhere
        && path
            .components()
            .any(|c| c.as_os_str() == pattern.as_os_str())
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

const OPAQUE: [&str; 2] = ["user.overlay.opaque", "trusted.overlay.opaque"];
const METACOPY: [&str; 2] = ["user.overlay.metacopy", "trusted.overlay.metacopy"];

fn has_xattr(fd: impl AsFd, names: &[&str], value: Option<&[u8]>) -> bool {
    names.iter().any(|name| {
        let mut buf = [0u8; 8];
        match rustix::fs::fgetxattr(fd.as_fd(), *name, &mut buf[..]) {
            Ok(n) => value.is_none_or(|v| buf.get(..n) == Some(v)),
            // ERANGE: a value longer than any we look for.
            Err(rustix::io::Errno::RANGE) => value.is_none(),
            Err(_) => false,
        }
    })
}

fn open_dir_at(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Lists the changes in the overlay upper directory `upper`. The sandbox must have stopped
/// (nothing may write `upper` meanwhile). Fails, listing nothing, when `upper` holds more
/// than `limits` allow or something copy-back cannot read (then nothing should be applied).
pub fn scan(upper: &Path, limits: &Limits) -> io::Result<Changes> {
    let root = rustix::fs::open(
        upper,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Changes::default();
    let mut total = 0u64;
    scan_dir(&root, Path::new(""), limits, &mut out, &mut total)?;
    Ok(out)
}

fn scan_dir(
    dir: &OwnedFd,
    rel: &Path,
    limits: &Limits,
    out: &mut Changes,
    total: &mut u64,
) -> io::Result<()> {
    let mut names = crate::remove::names_in(dir)?;
    names.sort();
    for name in names {
        let path = rel.join(&name);
        if out.changes.len() + out.skipped.len() >= limits.max_entries {
            return Err(invalid(format!(
                "more than {} changed entries",
                limits.max_entries
            )));
        }
        if path.components().count() > limits.max_depth {
            return Err(invalid(format!(
                "`{}` is deeper than {} directories",
                path.display(),
                limits.max_depth
            )));
        }
        let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let child = open_dir_at(dir, &name)?;
                let opaque = has_xattr(&child, &OPAQUE, Some(b"y"));
                out.changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Dir { opaque },
                });
                scan_dir(&child, &path, limits, out, total)?;
            }
            FileType::RegularFile => {
                let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
                if size > limits.max_file_bytes {
                    return Err(invalid(format!(
                        "`{}` is larger than {} bytes",
                        path.display(),
                        limits.max_file_bytes
                    )));
                }
                *total = total.saturating_add(size);
                if *total > limits.max_total_bytes {
                    return Err(invalid(format!(
                        "the changed files hold more than {} bytes",
                        limits.max_total_bytes
                    )));
                }
                let file = rustix::fs::openat(
                    dir,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                if has_xattr(&file, &METACOPY, None) {
                    // Its data is still the host's: copying it would copy nothing.
                    return Err(invalid(format!(
                        "`{}` is a metadata-only copy (overlay metacopy), which copy-back does not read",
                        path.display()
                    )));
                }
                out.changes.push(Change {
                    path,
                    kind: ChangeKind::File {
                        executable: stat.st_mode & 0o100 != 0,
                        size,
                    },
                });
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, &name, Vec::new())?;
                out.changes.push(Change {
                    path,
                    kind: ChangeKind::Symlink(PathBuf::from(OsStr::from_bytes(target.as_bytes()))),
                });
            }
            FileType::CharacterDevice if stat.st_rdev == 0 => out.changes.push(Change {
                path,
                kind: ChangeKind::Delete,
            }),
            other => out.skipped.push(Refusal {
                path,
                reason: format!(
                    "{} is not carried back (only files, directories and links)",
                    match other {
                        FileType::Fifo => "a FIFO",
                        FileType::Socket => "a socket",
                        FileType::BlockDevice => "a block device",
                        FileType::CharacterDevice => "a character device",
                        _ => "an entry of unknown type",
                    }
                ),
            }),
        }
    }
    Ok(())
}

/// Beneath `root`, never through a symbolic link or out of it.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens `rel` (a file of [`Changes`]) in the upper directory for reading.
pub fn open_changed_file(upper: &Path, rel: &Path) -> io::Result<File> {
    let root = rustix::fs::open(
        upper,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Err(invalid(format!(
            "`{}` is not a regular file",
            rel.display()
        )));
    }
    Ok(File::from(fd))
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written.
    pub written: Vec<PathBuf>,
    /// Directories made.
    pub made: Vec<PathBuf>,
    /// Entries removed (a directory counts once).
    pub removed: Vec<PathBuf>,
    /// Changes not applied, and why.
    pub refused: Vec<Refusal>,
}

/// Applies `changes` (read from `upper`) beneath the host directory `host`. Symbolic links
/// are never written (divert them). Each change either applies whole or is refused with its
/// reason; a refused directory refuses what lies beneath it.
pub fn apply(upper: &Path, host: &Path, changes: &[Change]) -> io::Result<Applied> {
    let root = rustix::fs::open(
        host,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut applied = Applied::default();
    let mut refused_dirs: Vec<PathBuf> = Vec::new();
    for change in changes {
        if let Some(dir) = refused_dirs.iter().find(|d| change.path.starts_with(d)) {
            applied.refused.push(Refusal {
                path: change.path.clone(),
                reason: format!("its directory `{}` was not applied", dir.display()),
            });
            continue;
        }
        if let Err(reason) = apply_one(upper, &root, change, &mut applied) {
            if let ChangeKind::Dir { .. } = change.kind {
                refused_dirs.push(change.path.clone());
            }
            applied.refused.push(Refusal {
                path: change.path.clone(),
                reason,
            });
        }
    }
    Ok(applied)
}

fn explain(e: io::Error) -> String {
    match rustix::io::Errno::from_io_error(&e) {
        Some(rustix::io::Errno::LOOP) => {
            "a directory on its path is a symbolic link on the host".into()
        }
        Some(rustix::io::Errno::XDEV) => "its path leaves the workspace on the host".into(),
        _ => e.to_string(),
    }
}

/// The parent directory of `rel` beneath `root`, opened without following a link, and the
/// last component.
fn parent_of<'a>(root: &OwnedFd, rel: &'a Path) -> Result<(OwnedFd, &'a OsStr), String> {
    let ok = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let (Some(name), true) = (rel.file_name(), ok) else {
        return Err(format!("`{}` is not a plain relative path", rel.display()));
    };
    let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
    let fd = rustix::fs::openat2(
        root,
        parent.unwrap_or(Path::new(".")),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|e| explain(e.into()))?;
    Ok((fd, name))
}

/// What the host has at `name` in `dir`, without following a link.
fn existing(dir: &OwnedFd, name: &OsStr) -> Result<Option<FileType>, String> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(explain(e.into())),
    }
}

fn remove(dir: &OwnedFd, name: &OsStr, kind: FileType) -> Result<(), String> {
    if kind == FileType::Directory {
        crate::remove::remove_beneath(dir, name).map_err(explain)
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(|e| explain(e.into()))
    }
}

fn apply_one(
    upper: &Path,
    root: &OwnedFd,
    change: &Change,
    applied: &mut Applied,
) -> Result<(), String> {
    let (dir, name) = parent_of(root, &change.path)?;
    let have = existing(&dir, name)?;
    match &change.kind {
        ChangeKind::Delete => {
            if let Some(kind) = have {
                remove(&dir, name, kind)?;
                applied.removed.push(change.path.clone());
            }
        }
        ChangeKind::Dir { opaque } => {
            match have {
                Some(FileType::Directory) if !opaque => return Ok(()),
                Some(kind) => {
                    remove(&dir, name, kind)?;
                    applied.removed.push(change.path.clone());
                }
                None => {}
            }
            rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))
                .map_err(|e| explain(e.into()))?;
            applied.made.push(change.path.clone());
        }
        ChangeKind::File { executable, .. } => {
            let mut from = open_changed_file(upper, &change.path).map_err(explain)?;
            let mode = if *executable { 0o755 } else { 0o644 };
            let tmp = temporary_name(name);
            let fd = rustix::fs::openat(
                &dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            )
            .map_err(|e| explain(e.into()))?;
            let mut to = File::from(fd);
            let copied = io::copy(&mut from, &mut to);
            let placed = copied.map_err(explain).and_then(|_| {
                if let Some(FileType::Directory) = have {
                    remove(&dir, name, FileType::Directory)?;
                }
                rustix::fs::renameat(&dir, &tmp, &dir, name).map_err(|e| explain(e.into()))
            });
            if placed.is_err() {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
            }
            placed?;
            applied.written.push(change.path.clone());
        }
        ChangeKind::Symlink(_) => {
            return Err("symbolic links are never written to the host (divert them)".into());
        }
    }
    Ok(())
}

/// A name beside `name` for the file being written (created with `O_EXCL`, so an existing
/// entry of that name is never reused).
fn temporary_name(name: &OsStr) -> std::ffi::OsString {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".capgate-{}-{n}", std::process::id()));
    tmp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn change(path: &str, kind: ChangeKind) -> Change {
        Change {
            path: PathBuf::from(path),
            kind,
        }
    }

    fn file(path: &str) -> Change {
        change(
            path,
            ChangeKind::File {
                executable: false,
                size: 0,
            },
        )
    }

    /// An upper directory as an overlay leaves it, built by hand: a modified file, a new
    /// executable in a new directory, a link, a FIFO, and (as root, which may make the
    /// device) a whiteout.
    #[test]
    fn scan_lists_changes_parents_first_and_skips_what_it_cannot_carry() {
        let upper = tempfile::tempdir().unwrap();
        let u = upper.path();
        std::fs::write(u.join("README.md"), "changed").unwrap();
        std::fs::create_dir(u.join("bin")).unwrap();
        std::fs::write(u.join("bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(u.join("bin/tool"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        symlink("/etc/passwd", u.join("link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            u.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let root = rustix::process::geteuid().is_root();
        if root {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                u.join("gone.txt"),
                FileType::CharacterDevice,
                Mode::from_raw_mode(0o000),
                0,
            )
            .unwrap();
        }
        let found = scan(u, &Limits::default()).unwrap();
        let mut expect = vec![
            change(
                "README.md",
                ChangeKind::File {
                    executable: false,
                    size: 7,
                },
            ),
            change("bin", ChangeKind::Dir { opaque: false }),
            change(
                "bin/tool",
                ChangeKind::File {
                    executable: true,
                    size: 10,
                },
            ),
        ];
        if root {
            expect.push(change("gone.txt", ChangeKind::Delete));
        }
        expect.push(change("link", ChangeKind::Symlink("/etc/passwd".into())));
        assert_eq!(found.changes, expect);
        assert_eq!(found.skipped.len(), 1);
        assert_eq!(found.skipped[0].path, Path::new("fifo"));

        // Past a limit, nothing is listed at all.
        let tight = Limits {
            max_entries: 2,
            ..Limits::default()
        };
        assert!(scan(u, &tight).is_err());
        let small = Limits {
            max_file_bytes: 8,
            ..Limits::default()
        };
        assert!(scan(u, &small).is_err());
    }

    #[test]
    fn hooks_runner_files_and_links_are_diverted_and_their_harmless_twins_are_not() {
        for path in [
            ".git/hooks/pre-commit",
            ".git/config",
            "sub/.git/hooks/post-checkout",
            ".husky/pre-commit",
            ".githooks/pre-push",
            ".pre-commit-config.yaml",
            ".vscode/tasks.json",
            "pkg/.vscode/settings.json",
            ".idea/workspace.xml",
            ".envrc",
            "sub/.envrc",
            ".gitattributes",
            ".gitmodules",
            ".github/workflows/ci.yml",
            ".gitlab-ci.yml",
            ".devcontainer/devcontainer.json",
        ] {
            assert!(divert_reason(&file(path)).is_some(), "{path}");
        }
        for path in [
            "src/git.rs",
            ".gitignore",
            ".github/CODEOWNERS",
            "docs/.github/workflows/ci.yml",
            "my.envrc",
            "husky/notes.md",
            "README.md",
        ] {
            assert_eq!(divert_reason(&file(path)), None, "{path}");
        }
        let link = change("docs/latest", ChangeKind::Symlink("v2".into()));
        assert!(divert_reason(&link).is_some());
    }

    /// The host directory's own links are never followed: a link the host has where the
    /// workload made a directory is replaced, not written through; a path whose host
    /// directory is a link is refused. Outside stays untouched.
    #[test]
    fn apply_writes_beneath_the_host_directory_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, host, outside) = (
            tmp.path().join("upper"),
            tmp.path().join("host"),
            tmp.path().join("outside"),
        );
        for d in [&upper, &host, &outside] {
            std::fs::create_dir(d).unwrap();
        }
        // The host: a file to change, one to remove, a tree to remove, and two links out.
        std::fs::write(host.join("README.md"), "old").unwrap();
        std::fs::write(host.join("old.txt"), "old").unwrap();
        std::fs::create_dir_all(host.join("build/deep")).unwrap();
        std::fs::write(host.join("build/deep/x"), "x").unwrap();
        symlink(&outside, host.join("out")).unwrap();
        symlink(&outside, host.join("lib")).unwrap();
        // The workload's changes.
        std::fs::write(upper.join("README.md"), "new").unwrap();
        std::fs::create_dir_all(upper.join("out")).unwrap();
        std::fs::write(upper.join("out/x"), "inside").unwrap();
        std::fs::create_dir_all(upper.join("lib")).unwrap();
        std::fs::write(upper.join("lib/y"), "y").unwrap();
        std::fs::write(upper.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            upper.join("run.sh"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        let changes = vec![
            file("README.md"),
            change("build", ChangeKind::Delete),
            change("old.txt", ChangeKind::Delete),
            change("out", ChangeKind::Dir { opaque: true }),
            file("out/x"),
            // As if the host had made `lib` a link after the scan: its file is refused.
            file("lib/y"),
            change(
                "run.sh",
                ChangeKind::File {
                    executable: true,
                    size: 10,
                },
            ),
            change("ln", ChangeKind::Symlink("/etc".into())),
            file("../escape"),
        ];
        let done = apply(&upper, &host, &changes).unwrap();
        assert_eq!(
            std::fs::read_to_string(host.join("README.md")).unwrap(),
            "new"
        );
        assert!(!host.join("old.txt").exists() && !host.join("build").exists());
        let out = std::fs::symlink_metadata(host.join("out")).unwrap();
        assert!(out.is_dir(), "the link was replaced by a directory");
        assert_eq!(
            std::fs::read_to_string(host.join("out/x")).unwrap(),
            "inside"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "outside untouched"
        );
        let mode = std::fs::metadata(host.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "no set-id bits");
        assert!(std::fs::symlink_metadata(host.join("ln")).is_err());
        assert_eq!(
            done.written,
            ["README.md", "out/x", "run.sh"].map(PathBuf::from)
        );
        assert_eq!(done.removed, ["build", "old.txt", "out"].map(PathBuf::from));
        let refused: Vec<_> = done.refused.iter().map(|r| r.path.clone()).collect();
        assert_eq!(refused, ["lib/y", "ln", "../escape"].map(PathBuf::from));
        assert!(
            done.refused[0].reason.contains("symbolic link"),
            "{:?}",
            done.refused
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&host)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".capgate-")), "{names:?}");
    }
}
