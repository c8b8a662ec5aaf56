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

use std::path::{Path, PathBuf};

use capgate_resolve::plan::Plan;
use capgate_sandbox::{VolumeMount, VolumeSource};
use capgate_spec::caps::Capability;
use capgate_spec::caps::agent::SkillsMode;

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

/// What the run mounts for the kits' agent-skills@1 entries, and what it tells the user
/// about the paths it leaves empty.
#[derive(Debug, Default)]
pub struct Skills {
    pub mounts: Vec<VolumeMount>,
    pub notes: Vec<String>,
}

/// The store's mounts for `plan`, given the host setting, the store's location and the data
/// directory (which a store must never show: it holds the CA key and the secrets). Paths
/// already taken by another mount (`taken`) are left to it.
pub fn mounts(
    plan: &Plan,
    sharing: Sharing,
    store: &Path,
    data: &Path,
    taken: &[PathBuf],
) -> Skills {
    let entries: Vec<_> = crate::sandbox::capabilities(plan)
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
            .map(|e| format!("`{}`", e.path))
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
    let source = match usable_store(store, data) {
        Ok(source) => source,
        Err(why) => {
            out.notes.push(format!(
                "agent-skills@1: {why}; nothing is mounted at {}",
                paths()
            ));
            return out;
        }
    };
    for entry in entries {
        let target = PathBuf::from(&entry.path);
        if let Err(e) = capgate_sandbox::volume_target(&target) {
            out.notes.push(format!(
                "agent-skills@1: the store cannot be mounted at `{}`: {e}",
                entry.path
            ));
            continue;
        }
        if taken.contains(&target) {
            out.notes.push(format!(
                "agent-skills@1: `{}` is a volume of the kits; the store is not mounted there",
                entry.path
            ));
            continue;
        }
        let writable =
            sharing == Sharing::Readwrite && entry.effective_mode() == SkillsMode::Readwrite;
        out.mounts.push(VolumeMount {
            target,
            source: if writable {
                VolumeSource::Dir(source.clone())
            } else {
                VolumeSource::ReadOnlyDir(source.clone())
            },
        });
    }
    out
}

/// The store's real directory, if it can be shown: it exists, holds something, and neither
/// holds the data directory nor lies in it (but for being `DATA/skills` itself).
fn usable_store(store: &Path, data: &Path) -> Result<PathBuf, String> {
    let real = match std::fs::canonicalize(store) {
        Ok(real) if real.is_dir() => real,
        _ => {
            return Err(format!(
                "the skills store `{}` does not exist",
                store.display()
            ));
        }
    };
    let data = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_owned());
    if data.starts_with(&real) || (real.starts_with(&data) && real != data.join("skills")) {
        return Err(format!(
            "the skills store `{}` leads to `{}`, which would show capgate's data directory `{}` (its CA key and secrets)",
            store.display(),
            real.display(),
            data.display()
        ));
    }
    let empty = std::fs::read_dir(&real)
        .map(|mut d| d.next().is_none())
        .map_err(|e| format!("the skills store `{}` cannot be read: {e}", real.display()))?;
    if empty {
        return Err(format!("the skills store `{}` is empty", store.display()));
    }
    Ok(real)
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
        let store = data.join("skills");
        // Missing, then empty: not usable, and said why.
        assert!(
            usable_store(&store, &data)
                .unwrap_err()
                .contains("does not exist")
        );
        std::fs::create_dir(&store).unwrap();
        assert!(
            usable_store(&store, &data)
                .unwrap_err()
                .contains("is empty")
        );
        std::fs::write(store.join("SKILL.md"), "x").unwrap();
        assert_eq!(
            usable_store(&store, &data).unwrap(),
            store.canonicalize().unwrap()
        );
        // A link to a directory elsewhere is followed (the twin)…
        let elsewhere = tmp.path().join("claude-skills");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("SKILL.md"), "x").unwrap();
        std::fs::remove_dir_all(&store).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &store).unwrap();
        assert_eq!(
            usable_store(&store, &data).unwrap(),
            elsewhere.canonicalize().unwrap()
        );
        // …but never to one that holds the data directory, or to a part of it.
        for target in [tmp.path().join("home"), data.clone(), data.join("secrets")] {
            std::fs::remove_file(&store).unwrap();
            std::os::unix::fs::symlink(&target, &store).unwrap();
            let err = usable_store(&store, &data).unwrap_err();
            assert!(err.contains("data directory"), "{target:?}: {err}");
        }
    }
}
