//! agent-skills@1: the host's shared skills store, shown at each path a kit names
//! (kitspec §2.16).
//!
//! The store is `DATA/skills` (it may be a link to a directory elsewhere, such as the
//! user's `~/.claude/skills`). It is mounted at every declared path when it exists and is
//! not empty, and the host setting (`capgate run --skills`) is not `off`. Access is the
//! narrower of the host setting and the kit's mode: read-only unless both say
//! `readwrite`. A missing, empty or disabled store is never a reason to refuse a run, even
//! for a required entry: the path simply stays empty. The store's content is the user's,
//! and untrusted inside like any other.
//!
//! The store is vetted through one descriptor (its real path, its device and inode, and
//! its ancestors by `..`), never shows the data directory, and the sandbox binds it only if
//! its path still leads to that same directory ([`VolumeSource::HostDir`]).

use std::collections::HashSet;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use capgate_resolve::plan::Plan;
use capgate_sandbox::{VolumeMount, VolumeSource};
use capgate_spec::caps::Capability;
use capgate_spec::caps::agent::SkillsMode;
use rustix::fs::{Mode, OFlags};

/// The host setting for sharing the skills store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sharing {
    /// Nothing is mounted.
    Off,
    /// Mounted read-only, whatever the kit asks.
    Readonly,
    /// Mounted read-write where the kit asks `readwrite` (read-only elsewhere).
    Readwrite,
}

/// What the run mounts for the kits' agent-skills@1 entries, and what it tells the user.
#[derive(Debug, Default)]
pub struct Skills {
    pub mounts: Vec<VolumeMount>,
    pub notes: Vec<String>,
}

/// The places around a run that a writable store must not reach: the workspace, the kits
/// and the lock's directory (a workload writing there could change what the next run
/// approves or runs).
#[derive(Debug, Default)]
pub struct Guarded {
    pub paths: Vec<PathBuf>,
}

/// The store's mounts for `plan`, given the host setting, the store's location and the data
/// directory (which a store must never show: it holds the CA key and the secrets). Paths
/// taken by another mount (`taken`), or nested in one, are left to it.
pub fn mounts(
    plan: &Plan,
    sharing: Sharing,
    store: &Path,
    data: &Path,
    taken: &[PathBuf],
    guarded: &Guarded,
) -> Skills {
    let mut entries: Vec<_> = crate::sandbox::capabilities(plan)
        .filter_map(|c| match c {
            Capability::AgentSkills(s) => Some(s),
            _ => None,
        })
        .collect();
    let mut out = Skills::default();
    if entries.is_empty() {
        return out;
    }
    let paths = || {
        entries
            .iter()
            .map(|e| format!("`{}`", capgate_spec::text::printable(&e.path)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if sharing == Sharing::Off {
        out.notes.push(format!(
            "agent-skills@1: sharing is off (--skills off); nothing is mounted at {}",
            paths()
        ));
        return out;
    }
    let vetted = match vet(store, data) {
        Ok(vetted) => vetted,
        Err(why) => {
            out.notes.push(format!(
                "agent-skills@1: {why}; nothing is mounted at {}",
                paths()
            ));
            return out;
        }
    };
    let wants_writes = sharing == Sharing::Readwrite
        && entries
            .iter()
            .any(|e| e.effective_mode() == SkillsMode::Readwrite);
    let writes = wants_writes
        && match unsafe_to_write(&vetted.path, guarded) {
            Some(why) => {
                out.notes.push(format!(
                    "WARNING: agent-skills@1: the skills store `{}` is shown read-only although --skills readwrite: {why}",
                    vetted.path.display()
                ));
                false
            }
            None => true,
        };
    // Parents first, so that a path nested in another is the one left out.
    entries.sort_by_key(|e| Path::new(&e.path).components().count());
    let mut mounted: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let target = PathBuf::from(&entry.path);
        if let Err(e) = capgate_sandbox::volume_target(&target) {
            out.notes.push(format!(
                "agent-skills@1: the store cannot be mounted at `{}`: {e}",
                entry.path
            ));
            continue;
        }
        let nested = |other: &PathBuf| target.starts_with(other) || other.starts_with(&target);
        if let Some(other) = taken.iter().chain(&mounted).find(|o| nested(o)) {
            out.notes.push(format!(
                "agent-skills@1: `{}` overlaps the mount at `{}`; the store is not mounted there",
                entry.path,
                other.display()
            ));
            continue;
        }
        let writable = writes && entry.effective_mode() == SkillsMode::Readwrite;
        if writable {
            out.notes.push(format!(
                "WARNING: agent-skills@1: the workload may write the host's skills store `{}` (at `{}`): what it writes there, every sandbox and the host's agents read",
                vetted.path.display(),
                entry.path
            ));
        }
        mounted.push(target.clone());
        out.mounts.push(VolumeMount {
            target,
            source: VolumeSource::HostDir {
                path: vetted.path.clone(),
                identity: vetted.identity,
                writable,
            },
        });
    }
    out
}

/// A store that passed [`vet`].
#[derive(Debug, PartialEq, Eq)]
struct Vetted {
    /// Its real path, as the kernel names the directory opened.
    path: PathBuf,
    /// Its device and inode number.
    identity: (u64, u64),
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn identity(fd: &OwnedFd) -> rustix::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The identities of `fd`'s directory and each of its ancestors, by `..` (so a bind mount
/// of a directory counts as that directory).
fn lineage(fd: OwnedFd) -> rustix::io::Result<Vec<(u64, u64)>> {
    let mut ids = vec![identity(&fd)?];
    let mut at = fd;
    for _ in 0..4096 {
        let up = rustix::fs::openat(
            &at,
            "..",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let id = identity(&up)?;
        if ids.last() == Some(&id) {
            break; // `/`
        }
        ids.push(id);
        at = up;
    }
    Ok(ids)
}

/// The store if it can be shown, all from one descriptor: it exists, holds something, and
/// neither holds the data directory nor lies in it (but for being `DATA/skills` itself, a
/// real directory there).
fn vet(store: &Path, data: &Path) -> Result<Vetted, String> {
    let fd = open_dir(store).map_err(|e| match e {
        rustix::io::Errno::NOENT => {
            format!("the skills store `{}` does not exist", store.display())
        }
        e => format!(
            "the skills store `{}` cannot be opened ({e})",
            store.display()
        ),
    })?;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| {
        format!(
            "the skills store `{}` cannot be named ({e})",
            store.display()
        )
    })?;
    let id = identity(&fd).map_err(|e| format!("the skills store cannot be read ({e})"))?;
    let leaks = || {
        format!(
            "the skills store `{}` leads to `{}`, which would show capgate's data directory `{}` (its CA key and secrets)",
            store.display(),
            path.display(),
            data.display()
        )
    };
    let data_fd =
        open_dir(data).map_err(|e| format!("the data directory cannot be opened ({e})"))?;
    let data_id =
        identity(&data_fd).map_err(|e| format!("the data directory cannot be read ({e})"))?;
    let data_line =
        lineage(data_fd).map_err(|e| format!("the data directory cannot be read ({e})"))?;
    if data_line.contains(&id) {
        return Err(leaks());
    }
    let empty = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|mut d| d.next().is_none())
        .map_err(|e| format!("the skills store `{}` cannot be read: {e}", path.display()))?;
    let store_line = lineage(fd).map_err(|e| format!("the skills store cannot be read ({e})"))?;
    if store_line.iter().skip(1).any(|a| *a == data_id) {
        // Inside the data directory: only `DATA/skills` itself, a directory, not a link.
        let own = std::fs::symlink_metadata(data.join("skills"))
            .ok()
            .filter(|m| m.is_dir());
        let is_own = own.is_some_and(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino()) == id
        });
        if !is_own || store_line.get(1) != Some(&data_id) {
            return Err(leaks());
        }
    }
    if empty {
        return Err(format!("the skills store `{}` is empty", store.display()));
    }
    Ok(Vetted { path, identity: id })
}

/// Why the store must not be written from inside, if it must not: it lies in a git work
/// tree (a workload could plant config the host's git runs), or it holds or lies in the
/// workspace, a kit or the lock's directory.
fn unsafe_to_write(store: &Path, guarded: &Guarded) -> Option<String> {
    if let Some(repo) = store.ancestors().find(|a| a.join(".git").exists()) {
        return Some(format!(
            "it is in the git work tree `{}`, whose config the host's git would run",
            repo.display()
        ));
    }
    let real: HashSet<PathBuf> = guarded
        .paths
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .collect();
    real.iter()
        .find(|g| g.starts_with(store) || store.starts_with(g))
        .map(|g| {
            format!(
                "it overlaps `{}` (the workspace, a kit or the lock), which a workload must not rewrite",
                g.display()
            )
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_store_that_would_show_the_data_directory_is_never_used() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("home/.local/share/capgate");
        std::fs::create_dir_all(data.join("secrets")).unwrap();
        std::fs::write(data.join("secrets/ca.key"), "x").unwrap();
        let store = data.join("skills");
        // Missing, then empty: not usable, and said why.
        assert!(vet(&store, &data).unwrap_err().contains("does not exist"));
        std::fs::create_dir(&store).unwrap();
        assert!(vet(&store, &data).unwrap_err().contains("is empty"));
        std::fs::write(store.join("SKILL.md"), "x").unwrap();
        let vetted = vet(&store, &data).unwrap();
        assert_eq!(vetted.path, store.canonicalize().unwrap());
        // A link to a directory elsewhere is followed (the twin)…
        let elsewhere = tmp.path().join("claude-skills");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("SKILL.md"), "x").unwrap();
        std::fs::remove_dir_all(&store).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &store).unwrap();
        assert_eq!(
            vet(&store, &data).unwrap().path,
            elsewhere.canonicalize().unwrap()
        );
        // …but never to one that holds the data directory, or to a part of it, or to a
        // bind mount of one of those (the same directory under another path).
        let alias = tmp.path().join("alias");
        std::fs::create_dir(&alias).unwrap();
        let bound = rustix::mount::mount_bind(&data, &alias).is_ok();
        let mut targets = vec![tmp.path().join("home"), data.clone(), data.join("secrets")];
        if bound {
            targets.push(alias.clone());
            targets.push(alias.join("secrets"));
        }
        for target in targets {
            std::fs::remove_file(&store).unwrap();
            std::os::unix::fs::symlink(&target, &store).unwrap();
            let err = vet(&store, &data).unwrap_err();
            assert!(err.contains("data directory"), "{target:?}: {err}");
        }
        if bound {
            rustix::mount::unmount(&alias, rustix::mount::UnmountFlags::DETACH).unwrap();
        }
    }

    #[test]
    fn a_store_in_a_git_tree_or_around_the_workspace_is_never_writable() {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("store");
        let workspace = tmp.path().join("store/project");
        std::fs::create_dir_all(&workspace).unwrap();
        let guarded = Guarded {
            paths: vec![workspace.clone()],
        };
        assert!(
            unsafe_to_write(&store, &guarded)
                .unwrap()
                .contains("overlaps")
        );
        let elsewhere = Guarded {
            paths: vec![tmp.path().join("other")],
        };
        assert_eq!(unsafe_to_write(&store, &elsewhere), None);
        std::fs::create_dir(tmp.path().join(".git")).unwrap();
        assert!(
            unsafe_to_write(&store, &elsewhere)
                .unwrap()
                .contains("git work tree")
        );
    }
}
