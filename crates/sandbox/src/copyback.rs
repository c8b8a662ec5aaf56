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

/// A pattern of paths whose changes are diverted, with why. A pattern is a path of one
/// or more names (`.git`, `.github/workflows`) matched at any depth, the entry itself or
/// anything beneath it, or `*.ext`, a file name ending. Names compare without regard to
/// ASCII case (on a case-insensitive host file system `.Git` is `.git`).
#[derive(Debug, Clone, Copy)]
pub struct Runner {
    /// The pattern.
    pub pattern: &'static str,
    /// What on the host runs or obeys it.
    pub reason: &'static str,
}

const fn runner(pattern: &'static str, reason: &'static str) -> Runner {
    Runner { pattern, reason }
}

/// Why a CI definition is a runner.
const CI: &str = "CI pipelines run with the repository's secrets";

/// Files that programs on the host run or obey without the user running them: a change to
/// any of them (or beneath them) is diverted, never written into the working tree.
pub const RUNNERS: &[Runner] = &[
    runner(
        ".git",
        "the repository's metadata: hooks, config (core.hooksPath, core.fsmonitor, aliases) and refs run or steer git on the host",
    ),
    runner(".githooks", "a usual core.hooksPath: git runs these hooks"),
    runner(".husky", "husky's git hooks, run by git on the host"),
    runner(
        "lefthook.yml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        ".lefthook.yml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        ".pre-commit-config.yaml",
        "pre-commit's configuration names the programs run at every commit",
    ),
    runner(
        ".gitattributes",
        "filter, diff and merge drivers in it make git run programs",
    ),
    runner(
        ".gitmodules",
        "submodule URLs and update commands git follows",
    ),
    runner(
        ".lfsconfig",
        "git-lfs endpoints git on the host sends credentials to",
    ),
    runner(
        ".envrc",
        "direnv runs it in the user's shell on entering the directory",
    ),
    runner(
        ".mise.toml",
        "mise runs its hooks and tasks on entering the directory",
    ),
    runner(
        "mise.toml",
        "mise runs its hooks and tasks on entering the directory",
    ),
    runner(
        ".vscode",
        "VS Code tasks, launch configurations and settings can run programs when the folder opens",
    ),
    runner(
        "*.code-workspace",
        "a VS Code workspace file holds tasks and settings that run programs",
    ),
    runner(".idea", "JetBrains run configurations and start-up tasks"),
    runner(".zed", "Zed tasks and settings can run programs"),
    runner(
        ".devcontainer",
        "dev container definitions build and run containers with host mounts",
    ),
    runner(
        ".claude",
        "agent settings: hooks run programs on the host, permissions widen what an agent may do",
    ),
    runner(
        ".mcp.json",
        "MCP server definitions are programs an agent starts",
    ),
    runner(
        ".cargo",
        "cargo configuration (rustc-wrapper, runners, aliases) runs programs on any cargo call, an editor's included",
    ),
    runner(
        "rust-toolchain.toml",
        "a toolchain path rustup runs on any cargo call",
    ),
    runner(
        "rust-toolchain",
        "a toolchain rustup runs on any cargo call",
    ),
    runner(
        ".npmrc",
        "npm settings such as script-shell and registries with credentials",
    ),
    runner(
        ".yarnrc.yml",
        "yarnPath names the program every yarn call runs",
    ),
    runner(".yarnrc", "yarn settings such as yarn-path"),
    runner(
        "*.pth",
        "Python runs `import` lines of .pth files at every start",
    ),
    runner(
        "sitecustomize.py",
        "Python imports it at every start of an interpreter that finds it",
    ),
    runner(
        "usercustomize.py",
        "Python imports it at every start of an interpreter that finds it",
    ),
    runner(
        ".github",
        "CI workflows and actions run with the repository's secrets",
    ),
    runner(".gitlab", "CI templates run with the repository's secrets"),
    runner(".gitlab-ci.yml", CI),
    runner(".circleci", CI),
    runner("Jenkinsfile", CI),
    runner(
        "mise.local.toml",
        "mise runs its hooks and tasks on entering the directory",
    ),
    runner(
        ".mise",
        "mise runs its hooks and tasks on entering the directory",
    ),
    runner(
        ".config/mise.toml",
        "mise runs its hooks and tasks on entering the directory",
    ),
    runner(
        ".tool-versions",
        "asdf and mise install and run the tools it names",
    ),
    runner(
        "lefthook.yaml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        ".lefthook.yaml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        "lefthook.toml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        "lefthook.json",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        "lefthook-local.yml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        ".config/lefthook.yml",
        "lefthook's configuration names the programs git hooks run",
    ),
    runner(
        ".hg",
        "a Mercurial repository: its hgrc hooks run on hg commands",
    ),
    runner(".jj", "a Jujutsu repository's configuration"),
    runner(
        ".devcontainer.json",
        "dev container definitions build and run containers with host mounts",
    ),
    runner(".helix", "Helix's language servers are programs it starts"),
    runner(
        ".cursor",
        "agent settings, rules and MCP servers of an editor agent",
    ),
    runner(".gemini", "agent settings and MCP servers"),
    runner(".codex", "agent settings and MCP servers"),
    runner(
        ".windsurf",
        "agent settings, rules and MCP servers of an editor agent",
    ),
    runner(".amazonq", "agent settings and MCP servers"),
    runner(".roo", "agent settings and MCP servers"),
    runner(".kiro", "agent settings, hooks and MCP servers"),
    runner(".continue", "agent settings and MCP servers"),
    runner("opencode.json", "agent settings and MCP servers"),
    runner(
        ".opencode",
        "OpenCode loads its plugins and settings from here at start",
    ),
    runner("opencode.jsonc", "agent settings and MCP servers"),
    runner(
        ".aider.conf.yml",
        "aider runs its lint and test commands after every edit",
    ),
    runner(
        ".aider.conf.yaml",
        "aider runs its lint and test commands after every edit",
    ),
    runner("crush.json", "agent settings and MCP servers"),
    runner(".crush.json", "agent settings and MCP servers"),
    runner(".qwen", "agent settings and MCP servers"),
    runner(".kilocode", "agent settings and MCP servers"),
    runner(".junie", "agent settings and MCP servers"),
    runner(".trae", "agent settings and MCP servers"),
    runner(".augment", "agent settings and MCP servers"),
    runner("bunfig.toml", "bun settings such as preload scripts"),
    runner(
        ".bazelversion",
        "bazelisk downloads and runs the Bazel it names",
    ),
    runner(
        "gradle-wrapper.properties",
        "the Gradle distribution the wrapper downloads and runs, an IDE's import included",
    ),
    runner(
        "gradle.properties",
        "org.gradle.jvmargs starts Gradle's JVM with any option (-javaagent), an IDE's import included",
    ),
    runner(
        ".mvn",
        "Maven reads jvm.config (JVM options, -javaagent), maven.config, extensions.xml (plugins it loads) and the wrapper's distribution URL from here",
    ),
    runner(
        ".bazelrc",
        "options of every bazel command: --workspace_status_command and --run_under name programs it runs",
    ),
    runner(
        "tools/bazel",
        "bazelisk and the bazel launcher run this script in place of Bazel",
    ),
    runner(
        "gradle/wrapper",
        "the Gradle wrapper's jar and distribution URL: the wrapper runs them, an IDE's import included",
    ),
    runner(
        ".yarn/plugins",
        "yarn loads every plugin the project's .yarnrc.yml lists from here",
    ),
    runner(
        ".yarn/releases",
        "where .yarnrc.yml's yarnPath usually points: every yarn call runs it",
    ),
    runner(
        ".yarn/sdks",
        "editor integrations an editor's settings run (typescript.tsdk)",
    ),
    runner(".pnpmfile.cjs", "pnpm runs its hooks at every install"),
    runner(
        ".gitpod.yml",
        "Gitpod runs its tasks when a workspace of the repository starts",
    ),
    runner(".travis.yml", CI),
    runner("bitbucket-pipelines.yml", CI),
    runner("azure-pipelines.yml", CI),
    runner(".azure-pipelines", CI),
    runner(".drone.yml", CI),
    runner(".woodpecker.yml", CI),
    runner(".woodpecker.yaml", CI),
    runner(".woodpecker", CI),
    runner("appveyor.yml", CI),
    runner(".appveyor.yml", CI),
    runner(".buildkite", CI),
    runner(".gitea", CI),
    runner(".forgejo", CI),
    runner(".semaphore", CI),
];

/// Why a change must be diverted rather than applied (it is a symbolic link, or matches
/// [`RUNNERS`], or lies at or beneath one of `also`, host paths found to be runners too,
/// or removes or replaces what leads to one), or `None` when it may be applied.
pub fn divert_reason<'a>(change: &Change, also: &'a [(PathBuf, &'a str)]) -> Option<&'a str> {
    if let ChangeKind::Symlink(_) = change.kind {
        return Some("a symbolic link could point tools on the host outside the workspace");
    }
    // At or beneath one of `also`, or above it when the change removes or replaces what
    // leads to it (a directory merely holding changes is not such a change).
    let replaces = !matches!(change.kind, ChangeKind::Dir { opaque: false });
    if let Some((_, reason)) = also
        .iter()
        .find(|(p, _)| change.path.starts_with(p) || (replaces && p.starts_with(&change.path)))
    {
        return Some(reason);
    }
    if change.path.file_name().is_some_and(is_head) {
        return Some(GIT_DIR_REASON);
    }
    runner_reason(&change.path)
}

/// Whether `name` is `HEAD` in any letter case: on a case-insensitive file system (ext4
/// casefold, or a tree later synced to macOS or Windows) `head` is git's `HEAD`.
fn is_head(name: &OsStr) -> bool {
    name.as_bytes().eq_ignore_ascii_case(b"HEAD")
}

/// Git takes a directory holding a `HEAD` file (with `objects` and `refs`) for a
/// repository, and obeys its `config` when run there.
const GIT_DIR_REASON: &str =
    "a HEAD file makes its directory a git repository, whose config git on the host obeys";

/// The reason of the first [`RUNNERS`] pattern `path` matches.
pub fn runner_reason(path: &Path) -> Option<&'static str> {
    RUNNERS
        .iter()
        .find(|r| runner_matches(r.pattern, path))
        .map(|r| r.reason)
}

fn runner_matches(pattern: &str, path: &Path) -> bool {
    let names: Vec<&[u8]> = path
        .components()
        .map(|c| c.as_os_str().as_bytes())
        .collect();
    if let Some(ext) = pattern.strip_prefix('*') {
        let ext = ext.as_bytes();
        return names.last().is_some_and(|n| {
            n.len() >= ext.len() && n[n.len() - ext.len()..].eq_ignore_ascii_case(ext)
        });
    }
    let want: Vec<&[u8]> = pattern.split('/').map(str::as_bytes).collect();
    names
        .windows(want.len())
        .any(|w| w.iter().zip(&want).all(|(a, b)| a.eq_ignore_ascii_case(b)))
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
    let Upper(root) = Upper::open(upper)?;
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
    let seen = out.changes.len() + out.skipped.len();
    let mut names = crate::remove::names_in(
        dir,
        limits.max_entries.saturating_sub(seen).saturating_add(1),
    )?;
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

/// Beneath `root`, never through a symbolic link, out of it, or into another mount (a
/// file system mounted inside the host directory during the run).
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// The upper directory, opened once for reading the changed files out of it.
#[derive(Debug)]
pub struct Upper(OwnedFd);

impl Upper {
    /// Opens the upper directory at `path`.
    pub fn open(path: &Path) -> io::Result<Upper> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Upper(root))
    }

    /// Opens `rel`, a file of [`Changes`] scanned at `size` bytes, for reading: at most
    /// `size` bytes are read from it, and a file whose size changed since the scan is
    /// refused (nothing may write the upper directory once the sandbox stopped; this holds
    /// the bounds even if something did).
    pub fn file(&self, rel: &Path, size: u64) -> io::Result<io::Take<File>> {
        let fd = rustix::fs::openat2(
            &self.0,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(invalid(format!(
                "`{}` is not a regular file",
                rel.display()
            )));
        }
        if u64::try_from(st.st_size).ok() != Some(size) {
            return Err(invalid(format!(
                "`{}` changed after it was read",
                rel.display()
            )));
        }
        Ok(io::Read::take(File::from(fd), size))
    }
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
/// reason; a refused directory refuses what lies beneath it. Also refused: changes inside a
/// host directory that holds a `HEAD` file (a git directory: its config runs programs), and
/// removals of host trees that hold a git repository or a runner file.
pub fn apply(upper: &Path, host: &Path, changes: &[Change]) -> io::Result<Applied> {
    let root = rustix::fs::open(
        host,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let upper = Upper::open(upper)?;
    let mut applied = Applied::default();
    let mut refused_dirs: Vec<PathBuf> = Vec::new();
    let mut git_dirs = GitDirs::default();
    for change in changes {
        if let Some(dir) = refused_dirs.iter().find(|d| change.path.starts_with(d)) {
            applied.refused.push(Refusal {
                path: change.path.clone(),
                reason: format!("its directory `{}` was not applied", dir.display()),
            });
            continue;
        }
        let outcome = match git_dirs.around(&root, &change.path) {
            Some(dir) => Err(format!(
                "the host's `{}` holds a HEAD file: {GIT_DIR_REASON}",
                dir.display()
            )),
            None => apply_one(&upper, &root, change, &mut applied),
        };
        if let Err(reason) = outcome {
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

/// Which host directories hold a `HEAD` file, asked once each.
#[derive(Debug, Default)]
struct GitDirs(std::collections::HashMap<PathBuf, bool>);

impl GitDirs {
    /// The nearest directory at or above the parent of `rel` (the host directory itself
    /// included) that holds a `HEAD` file.
    fn around(&mut self, root: &OwnedFd, rel: &Path) -> Option<PathBuf> {
        let mut dirs: Vec<&Path> = rel.ancestors().skip(1).collect();
        dirs.reverse();
        dirs.into_iter()
            .find(|dir| {
                *self.0.entry(dir.to_path_buf()).or_insert_with(|| {
                    let dir = if dir.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        dir
                    };
                    rustix::fs::openat2(
                        root,
                        dir.join("HEAD"),
                        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                        BENEATH,
                    )
                    .is_ok()
                })
            })
            .map(Path::to_path_buf)
    }
}

fn explain(e: io::Error) -> String {
    match rustix::io::Errno::from_io_error(&e) {
        Some(rustix::io::Errno::LOOP) => {
            "a directory on its path is a symbolic link on the host".into()
        }
        Some(rustix::io::Errno::XDEV) => {
            "its path leaves the workspace, or crosses a mount, on the host".into()
        }
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

/// What the host has at `name` in `dir`, without following a link: its type and mode.
fn existing(dir: &OwnedFd, name: &OsStr) -> Result<Option<(FileType, u32)>, String> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some((
            FileType::from_raw_mode(st.st_mode),
            st.st_mode & 0o777,
        ))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(explain(e.into())),
    }
}

/// Removes the host's `name` in `dir`. A directory holding a git repository or a runner
/// file anywhere beneath it is kept: its removal is refused (`rm -r vendor` must not take
/// an unpushed `vendor/lib/.git` or a CI workflow with it).
fn remove(dir: &OwnedFd, rel: &Path, name: &OsStr, kind: FileType) -> Result<(), String> {
    if kind != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(|e| explain(e.into()));
    }
    if let Some(found) = guarded_beneath(dir, name, rel).map_err(explain)? {
        return Err(format!(
            "the host's `{}` beneath it is kept: {}",
            found.display(),
            runner_reason(&found).unwrap_or(GIT_DIR_REASON)
        ));
    }
    crate::remove::remove_beneath(dir, name).map_err(explain)
}

/// The first path beneath the host's directory `name` (at `rel`) that is a runner or a
/// `HEAD` file, looking at most [`GUARD_LIMIT`] entries deep into it (past that, the
/// directory counts as guarded). One directory is open at a time, each opened from `dir`
/// beneath it, never through a link.
fn guarded_beneath(dir: &OwnedFd, name: &OsStr, rel: &Path) -> io::Result<Option<PathBuf>> {
    let mut budget = GUARD_LIMIT;
    let mut stack = vec![PathBuf::from(name)];
    while let Some(at) = stack.pop() {
        let fd = rustix::fs::openat2(
            dir,
            &at,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )?;
        for child in crate::remove::names_in(&fd, budget)? {
            budget = budget.saturating_sub(1);
            let shown = rel.join(at.strip_prefix(name).unwrap_or(&at)).join(&child);
            if budget == 0 || runner_reason(&shown).is_some() || is_head(&child) {
                return Ok(Some(shown));
            }
            let st = rustix::fs::statat(&fd, &child, AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                stack.push(at.join(&child));
            }
        }
    }
    Ok(None)
}

/// Most entries [`guarded_beneath`] looks at.
const GUARD_LIMIT: usize = 200_000;

fn apply_one(
    upper: &Upper,
    root: &OwnedFd,
    change: &Change,
    applied: &mut Applied,
) -> Result<(), String> {
    let (dir, name) = parent_of(root, &change.path)?;
    let have = existing(&dir, name)?;
    let rel = change.path.as_path();
    match &change.kind {
        ChangeKind::Delete => {
            if let Some((kind, _)) = have {
                remove(&dir, rel, name, kind)?;
                applied.removed.push(change.path.clone());
            }
        }
        ChangeKind::Dir { opaque } => {
            match have {
                Some((FileType::Directory, _)) if !opaque => return Ok(()),
                Some((kind, _)) => {
                    remove(&dir, rel, name, kind)?;
                    applied.removed.push(change.path.clone());
                }
                None => {}
            }
            rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))
                .map_err(|e| explain(e.into()))?;
            applied.made.push(change.path.clone());
        }
        ChangeKind::File { executable, size } => {
            let mut from = upper.file(rel, *size).map_err(explain)?;
            // A file the host has keeps its permissions (a 0600 file stays private); a new
            // one is 0644, or 0755 when the workload made it executable. No set-id bits.
            let mode = match have {
                Some((FileType::RegularFile, mode)) => mode,
                _ if *executable => 0o755,
                _ => 0o644,
            };
            place_file(&dir, name, mode, &mut from, || match have {
                Some((FileType::Directory, _)) => remove(&dir, rel, name, FileType::Directory),
                _ => Ok(()),
            })?;
            applied.written.push(change.path.clone());
        }
        ChangeKind::Symlink(_) => {
            return Err("symbolic links are never written to the host (divert them)".into());
        }
    }
    Ok(())
}

/// Writes `from` as `name` in `dir` with `mode`, replacing what is there in one rename
/// (after `clear`, which removes a directory in the way). The content goes into an unnamed
/// file (`O_TMPFILE`), which a capgate killed during the copy leaves nowhere; it gets a
/// name beside its place only once complete, for the rename. Where the file system has no
/// unnamed files, it is written under that temporary name from the start.
fn place_file(
    dir: &OwnedFd,
    name: &OsStr,
    mode: u32,
    from: &mut impl io::Read,
    clear: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    place_file_as(dir, (name, mode), from, clear, true)
}

/// [`place_file`]; `try_unnamed: false` writes under the temporary name from the start, as
/// on a file system without unnamed files.
fn place_file_as(
    dir: &OwnedFd,
    (name, mode): (&OsStr, u32),
    from: &mut impl io::Read,
    clear: impl FnOnce() -> Result<(), String>,
    try_unnamed: bool,
) -> Result<(), String> {
    let tmp = temporary_name();
    let unnamed = if try_unnamed {
        rustix::fs::openat(
            dir,
            ".",
            OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
    } else {
        Err(rustix::io::Errno::OPNOTSUPP)
    };
    let (fd, named) = match unnamed {
        Ok(fd) => (fd, false),
        // No unnamed files here (EOPNOTSUPP; EISDIR or EINVAL from kernels without them).
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => {
            let fd = rustix::fs::openat(
                dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            )
            .map_err(|e| explain(e.into()))?;
            (fd, true)
        }
        Err(e) => return Err(explain(e.into())),
    };
    let mut to = File::from(fd);
    let placed = io::copy(from, &mut to)
        .map_err(explain)
        .and_then(|_| {
            // The umask narrowed the mode at creation; set it as chosen.
            rustix::fs::fchmod(&to, Mode::from_raw_mode(mode)).map_err(|e| explain(e.into()))
        })
        .and_then(|()| {
            if named {
                Ok(())
            } else {
                link_unnamed(&to, dir, &tmp)
            }
        });
    let placed = placed
        .and_then(|()| clear())
        .and_then(|()| rustix::fs::renameat(dir, &tmp, dir, name).map_err(|e| explain(e.into())));
    if placed.is_err() {
        let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
    }
    placed
}

/// Gives the unnamed file `file` the name `tmp` in `dir`: through its descriptor where this
/// process may (`AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH), else through `/proc/self/fd`.
fn link_unnamed(file: &File, dir: &OwnedFd, tmp: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd as _;
    if rustix::fs::linkat(file, "", dir, tmp, AtFlags::EMPTY_PATH).is_ok() {
        return Ok(());
    }
    let by_proc = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        by_proc.as_str(),
        dir,
        tmp,
        AtFlags::SYMLINK_FOLLOW,
    )
    .map_err(|e| explain(e.into()))
}

/// A short name for the file being written beside its place (created with `O_EXCL`, so an
/// existing entry is never reused; short, so any name that fits can be written).
fn temporary_name() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".capgate-{}-{n}.tmp", std::process::id())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    /// A reader that, when first read, lists the directory the file is written into: what
    /// a capgate killed in the middle of the copy would leave there.
    struct Watching<'a> {
        dir: &'a Path,
        seen: Option<Vec<String>>,
        data: &'a [u8],
    }

    impl io::Read for Watching<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.seen.is_none() {
                let names = std::fs::read_dir(self.dir)?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<io::Result<Vec<_>>>()?;
                self.seen = Some(names);
            }
            let n = buf.len().min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// During the copy the file has no name (a killed capgate leaves nothing in the host
    /// directory); the twin without unnamed files shows its temporary name meanwhile. Both
    /// end with the file in place, in its mode, replacing the old one, and nothing else.
    #[test]
    fn a_file_being_copied_back_has_no_name_until_complete() {
        for try_unnamed in [true, false] {
            let host = tempfile::tempdir().unwrap();
            std::fs::write(host.path().join("out.txt"), "old").unwrap();
            let dir = rustix::fs::open(
                host.path(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            let probe = rustix::fs::openat(
                &dir,
                ".",
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            );
            if try_unnamed && probe.is_err() {
                eprintln!("skipped: the temporary directory's file system has no O_TMPFILE");
                continue;
            }
            drop(probe);
            let mut from = Watching {
                dir: host.path(),
                seen: None,
                data: b"new content",
            };
            place_file_as(
                &dir,
                (OsStr::new("out.txt"), 0o640),
                &mut from,
                || Ok(()),
                try_unnamed,
            )
            .unwrap();
            let during = from.seen.unwrap();
            let temporary = during.iter().any(|n| n.starts_with(".capgate-"));
            assert_eq!(temporary, !try_unnamed, "{during:?}");
            let names: Vec<String> = std::fs::read_dir(host.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names, ["out.txt"]);
            let path = host.path().join("out.txt");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "new content");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o640);
        }
    }

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
            // at any depth (nested repositories), in any ASCII case
            "vendor/lib/.pre-commit-config.yaml",
            "sub/.github/workflows/ci.yml",
            ".github/actions/setup/action.yml",
            ".Git/config",
            ".VSCode/tasks.json",
            ".ENVRC",
            // a planted git directory, tool configurations that run programs
            "docs/HEAD",
            ".cargo/config.toml",
            "rust-toolchain.toml",
            ".venv/lib/python3.11/site-packages/zz.pth",
            "sitecustomize.py",
            "proj.code-workspace",
            ".claude/settings.json",
            ".mcp.json",
            ".npmrc",
            "lefthook.yml",
            // a planted repository's HEAD in another case (case-insensitive file systems),
            // build tools' JVM options and command hooks
            "bare/head",
            "gradle.properties",
            "sub/gradle.properties",
            ".mvn/jvm.config",
            ".mvn/extensions.xml",
            ".mvn/wrapper/maven-wrapper.properties",
            ".bazelrc",
            // more programs build tools run in place of their own, and more CI
            "tools/bazel",
            "gradle/wrapper/gradle-wrapper.jar",
            ".yarn/plugins/@yarnpkg/plugin-x.cjs",
            ".pnpmfile.cjs",
            ".gitpod.yml",
            ".travis.yml",
            "bitbucket-pipelines.yml",
            "azure-pipelines.yml",
            ".drone.yml",
            ".woodpecker.yml",
            ".woodpecker/build.yaml",
            "appveyor.yml",
            ".buildkite/pipeline.yml",
            ".gitea/workflows/ci.yml",
            ".forgejo/workflows/ci.yml",
        ] {
            assert!(divert_reason(&file(path), &[]).is_some(), "{path}");
        }
        for path in [
            "src/git.rs",
            ".gitignore",
            "docs/github.md",
            "my.envrc",
            "husky/notes.md",
            "README.md",
            "src/head.rs",
            "head/notes.md",
            "docs/mvn.md",
            "gradle.properties.md",
            "bazelrc.txt",
            "config/app.toml",
            "pth.txt",
            "cargo/notes.md",
            "tools/build.sh",
            "bazel/notes.md",
            "gradle/libs.versions.toml",
            ".yarn/cache/left-pad.zip",
            "docs/travis.yml.md",
            "pipelines.yml",
        ] {
            assert_eq!(divert_reason(&file(path), &[]), None, "{path}");
        }
        let link = change("docs/latest", ChangeKind::Symlink("v2".into()));
        assert!(divert_reason(&link, &[]).is_some());
        // Host paths found to be runners (a core.hooksPath inside the tree).
        let also = [(
            PathBuf::from("scripts/hooks"),
            "the repository's core.hooksPath",
        )];
        assert_eq!(
            divert_reason(&file("scripts/hooks/pre-commit"), &also),
            Some("the repository's core.hooksPath")
        );
        assert_eq!(divert_reason(&file("scripts/build.sh"), &also), None);
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
        let f = |p: &str| {
            let meta = std::fs::metadata(upper.join(p));
            change(
                p,
                ChangeKind::File {
                    executable: meta
                        .as_ref()
                        .is_ok_and(|m| m.permissions().mode() & 0o100 != 0),
                    size: meta.map_or(0, |m| m.len()),
                },
            )
        };
        let changes = vec![
            f("README.md"),
            change("build", ChangeKind::Delete),
            change("old.txt", ChangeKind::Delete),
            change("out", ChangeKind::Dir { opaque: true }),
            f("out/x"),
            // As if the host had made `lib` a link after the scan: its file is refused.
            f("lib/y"),
            f("run.sh"),
            change("ln", ChangeKind::Symlink("/etc".into())),
            f("../escape"),
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

    /// What the host keeps: a private file stays private when rewritten; a tree holding a
    /// git repository or a runner file is not removed with its parent; nothing is written
    /// into a directory that holds a HEAD file (a planted or real git directory); a file
    /// that grew after the scan is refused; a name of 255 bytes is written.
    #[test]
    fn apply_keeps_modes_repositories_and_git_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, host) = (tmp.path().join("upper"), tmp.path().join("host"));
        std::fs::create_dir(&upper).unwrap();
        std::fs::create_dir_all(host.join("vendor/lib/.git")).unwrap();
        std::fs::create_dir_all(host.join("build/out")).unwrap();
        std::fs::create_dir_all(host.join("fixtures/repo")).unwrap();
        std::fs::write(host.join("fixtures/repo/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(host.join(".env.local"), "TOKEN=1").unwrap();
        std::fs::set_permissions(
            host.join(".env.local"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let long = "n".repeat(255);
        for (name, body) in [
            (".env.local", "TOKEN=2"),
            ("config", "[core]\n\tfsmonitor = evil\n"),
            (long.as_str(), "long"),
            ("grown", "1234"),
        ] {
            std::fs::write(upper.join(name), body).unwrap();
        }
        let sized = |p: &str, size: u64| {
            change(
                p,
                ChangeKind::File {
                    executable: false,
                    size,
                },
            )
        };
        let changes = vec![
            sized(".env.local", 7),
            change("vendor", ChangeKind::Delete),
            change("build", ChangeKind::Delete),
            sized("fixtures/repo/config", 25),
            sized(&long, 4),
            sized("grown", 2),
        ];
        let done = apply(&upper, &host, &changes).unwrap();
        let meta = std::fs::metadata(host.join(".env.local")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(host.join(".env.local")).unwrap(),
            "TOKEN=2"
        );
        assert!(
            host.join("vendor/lib/.git").is_dir(),
            "the nested repository stays"
        );
        assert!(!host.join("build").exists(), "its harmless twin is removed");
        assert!(!host.join("fixtures/repo/config").exists());
        assert_eq!(std::fs::read_to_string(host.join(&long)).unwrap(), "long");
        assert!(!host.join("grown").exists());
        let refused: Vec<_> = done.refused.iter().map(|r| r.path.clone()).collect();
        assert_eq!(
            refused,
            ["vendor", "fixtures/repo/config", "grown"].map(PathBuf::from),
            "{:?}",
            done.refused
        );
        assert!(
            done.refused[0].reason.contains("vendor/lib/.git"),
            "{:?}",
            done.refused
        );
        assert!(
            done.refused[1].reason.contains("HEAD"),
            "{:?}",
            done.refused
        );
    }
}
