//! The uid/gid mapping between the sandbox's user namespace and the host.
//!
//! | inside | outside (host) | why |
//! |---|---|---|
//! | 1000 (agent) | the invoking user's uid/gid | files the agent writes in a mount-mode workspace or a volume belong to the user who ran capgate, and the user's files are the agent's, so the workspace is writable |
//! | 0 (root) | the invoker's first subordinate id (`/etc/subuid`), else [`FALLBACK_ROOT_OUTSIDE_ID`] | install hooks run as root inside without being anyone on the host |
//!
//! Nothing else is mapped: other host owners show as `nobody` (65534) inside and no
//! capability applies to their files. `setgroups` is denied before the gid map is written.
//!
//! When the invoker is root, the agent is the host's uid 0 (without any capability in the
//! host's namespaces). Ownership checks then pass on host root's files, so every host path
//! visible inside is a read-only mount (`chmod` gives `EROFS`), `/proc/sys` and
//! `/proc/sysrq-trigger` are read-only, and `/proc/keys` is masked; the pid namespace hides
//! host processes, and seccomp denies `keyctl`.
//!
//! A non-root invoker needs `newuidmap`/`newgidmap` (package `uidmap`) and a subordinate
//! range to map two ids; the helper runs them.

use std::path::Path;

use crate::policy::FALLBACK_ROOT_OUTSIDE_ID;
use crate::spec::AGENT_ID;

/// One line of a `uid_map`/`gid_map`: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// The maps for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdMaps {
    pub uid: Vec<IdRange>,
    pub gid: Vec<IdRange>,
    /// `true` when the maps must be written by `newuidmap`/`newgidmap`.
    pub via_setuid_helpers: bool,
}

impl IdMaps {
    /// Renders a map the way `/proc/<pid>/uid_map` takes it.
    pub(crate) fn render(ranges: &[IdRange]) -> String {
        ranges
            .iter()
            .map(|r| format!("{} {} {}\n", r.inside, r.outside, r.count))
            .collect()
    }
}

/// The first subordinate id of `user` (by name or numeric id) in an `/etc/subuid`-style text.
pub(crate) fn first_subordinate(text: &str, user_name: Option<&str>, id: u32) -> Option<u32> {
    let id_text = id.to_string();
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(':');
        let owner = parts.next()?;
        let start: u32 = parts.next()?.parse().ok()?;
        let count: u32 = parts.next()?.parse().ok()?;
        let matches = owner == id_text || user_name.is_some_and(|n| n == owner);
        (matches && count >= 1).then_some(start)
    })
}

/// Chooses the maps for an invoker with `uid`/`gid`, given the subordinate-id files' text.
pub(crate) fn choose(
    uid: u32,
    gid: u32,
    user_name: Option<&str>,
    subuid: Option<&str>,
    subgid: Option<&str>,
) -> Result<IdMaps, String> {
    let sub_u = subuid.and_then(|t| first_subordinate(t, user_name, uid));
    let sub_g = subgid.and_then(|t| first_subordinate(t, user_name, gid));
    let root = uid == 0;
    let (root_uid, root_gid) = match (sub_u, sub_g) {
        (Some(u), Some(g)) => (u, g),
        _ if root => (FALLBACK_ROOT_OUTSIDE_ID, FALLBACK_ROOT_OUTSIDE_ID),
        _ => {
            return Err(format!(
                "the user {uid} has no subordinate uid/gid range; add one \
                 (`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {}`) \
                 and install `newuidmap`/`newgidmap` (Debian/Ubuntu package `uidmap`)",
                user_name.unwrap_or("USER")
            ));
        }
    };
    let pair = |root_outside, agent_outside| {
        vec![
            IdRange {
                inside: 0,
                outside: root_outside,
                count: 1,
            },
            IdRange {
                inside: AGENT_ID,
                outside: agent_outside,
                count: 1,
            },
        ]
    };
    Ok(IdMaps {
        uid: pair(root_uid, uid),
        gid: pair(root_gid, gid),
        via_setuid_helpers: !root,
    })
}

/// Reads `/etc/subuid`-style files if present.
pub(crate) fn read_optional(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn root_maps_the_agent_to_root_and_root_to_a_fallback() {
        let maps = choose(0, 0, Some("root"), None, None).unwrap();
        assert_eq!(
            IdMaps::render(&maps.uid),
            format!("0 {FALLBACK_ROOT_OUTSIDE_ID} 1\n1000 0 1\n")
        );
        assert!(!maps.via_setuid_helpers);
    }

    #[test]
    fn subordinate_ids_are_used_when_present() {
        let sub = "alice:100000:65536\nroot:200000:65536\n";
        let maps = choose(0, 0, Some("root"), Some(sub), Some(sub)).unwrap();
        assert_eq!(maps.uid[0].outside, 200000);
        let maps = choose(1001, 1001, Some("alice"), Some(sub), Some(sub)).unwrap();
        assert_eq!(maps.uid[0].outside, 100000);
        assert_eq!(
            maps.uid[1],
            IdRange {
                inside: 1000,
                outside: 1001,
                count: 1
            }
        );
        assert!(maps.via_setuid_helpers);
    }

    #[test]
    fn a_user_without_subordinate_ids_is_told_how_to_fix_it() {
        let err = choose(1001, 1001, Some("bob"), Some("alice:1:2\n"), None).unwrap_err();
        assert!(err.contains("usermod --add-subuids"), "{err}");
        assert!(err.contains("uidmap"), "{err}");
    }
}
