//! What this host offers the sandbox, and what is missing, in plain words. Reads `/proc`,
//! `/sys` and `/etc` only: it never forks (the caller may be multithreaded).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cgroup::{self, Version};

/// One thing the sandbox uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Feature {
    /// User namespaces (and the other namespaces the sandbox creates).
    UserNamespaces,
    /// Mapping two ids (agent and root inside) for a non-root invoker.
    IdMapping,
    /// Landlock.
    Landlock,
    /// seccomp filters.
    Seccomp,
    /// The pids cgroup controller.
    PidsLimit,
    /// The memory cgroup controller and swap capping.
    MemoryLimit,
    /// The cpu cgroup controller (CPU limits from resources@1 `cpu` or `--cpus`).
    CpuLimit,
    /// overlayfs inside a user namespace (copy-mode workspaces).
    Overlay,
    /// Mounting a fresh `/proc` (refused when the host's `/proc` is partly masked).
    Proc,
    /// seccomp user notifications that let a syscall go on (Linux 5.5): the init's exec
    /// watch, which records the execs a pack's exec allowlist refuses.
    ExecWatch,
}

/// How available a feature is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Availability {
    /// Works as designed.
    Available,
    /// Works with less than the design asks (the detail says what is missing).
    Partial,
    /// Not available: the sandbox (or that part of it) cannot start.
    Missing,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCheck {
    /// What.
    pub feature: Feature,
    /// How available.
    pub availability: Availability,
    /// What was found, and for anything not available, how to fix it.
    pub detail: String,
}

/// What the host offers. `Display` prints one line per feature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// One entry per [`Feature`].
    pub checks: Vec<HostCheck>,
}

impl HostReport {
    /// The entry for a feature.
    pub fn check(&self, feature: Feature) -> Option<&HostCheck> {
        self.checks.iter().find(|c| c.feature == feature)
    }

    /// The entries that are not fully available.
    pub fn problems(&self) -> impl Iterator<Item = &HostCheck> {
        self.checks
            .iter()
            .filter(|c| c.availability != Availability::Available)
    }
}

impl std::fmt::Display for HostReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.checks {
            let mark = match c.availability {
                Availability::Available => "ok     ",
                Availability::Partial => "partial",
                Availability::Missing => "MISSING",
            };
            writeln!(f, "{mark} {:?}: {}", c.feature, c.detail)?;
        }
        Ok(())
    }
}

/// Raw facts read from the host; `assess` turns them into a report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostFacts {
    pub euid: u32,
    pub max_user_namespaces: Option<u64>,
    pub unprivileged_userns_clone: Option<u64>,
    pub apparmor_restrict_userns: Option<u64>,
    pub newuidmap: bool,
    pub subuid_entry: bool,
    pub landlock_abi: i32,
    pub seccomp_actions: Option<String>,
    pub cgroups: cgroup::Layout,
    pub swap_kb: u64,
    pub memsw_file: Option<bool>,
    pub filesystems: String,
    pub kernel_release: String,
    pub proc_overmounted: bool,
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl HostFacts {
    pub(crate) fn read() -> Self {
        let euid = nix::unistd::geteuid().as_raw();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let self_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cgroups = cgroup::Layout::of_host(&mountinfo, &self_cgroup);
        let memsw_file = cgroups
            .memory
            .as_ref()
            .filter(|h| h.version == Version::V1)
            .map(|h| h.base.join("memory.memsw.limit_in_bytes").exists());
        let proc_overmounted = mountinfo.lines().any(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|point| point.starts_with("/proc/"))
        });
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(euid))
            .ok()
            .flatten();
        let subuid = crate::idmap::read_optional(Path::new("/etc/subuid")).unwrap_or_default();
        let subuid_entry =
            crate::idmap::first_subordinate(&subuid, user.as_ref().map(|u| u.name.as_str()), euid)
                .is_some();
        let on_path = |name: &str| {
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
                .unwrap_or(false)
                || Path::new("/usr/bin").join(name).is_file()
        };
        HostFacts {
            euid,
            max_user_namespaces: read_number("/proc/sys/user/max_user_namespaces"),
            unprivileged_userns_clone: read_number("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict_userns: read_number(
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            ),
            newuidmap: on_path("newuidmap") && on_path("newgidmap"),
            subuid_entry,
            landlock_abi: crate::sys::landlock_abi(),
            seccomp_actions: std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").ok(),
            cgroups,
            swap_kb: cgroup::swap_total_kb(
                &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            ),
            memsw_file,
            filesystems: std::fs::read_to_string("/proc/filesystems").unwrap_or_default(),
            kernel_release: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            proc_overmounted,
        }
    }
}

fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release.split(['.', '-']);
    let ma: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let mi: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (ma, mi) >= (major, minor)
}

/// Turns facts into the report (pure, unit-tested).
pub(crate) fn assess(f: &HostFacts) -> HostReport {
    use Availability::{Available, Missing, Partial};
    let mut checks = Vec::new();
    let mut add = |feature, availability, detail: String| {
        checks.push(HostCheck {
            feature,
            availability,
            detail,
        })
    };

    // User namespaces.
    let root = f.euid == 0;
    if f.max_user_namespaces == Some(0) {
        add(Feature::UserNamespaces, Missing, "user namespaces are disabled (user.max_user_namespaces = 0); set it to a positive number (sysctl -w user.max_user_namespaces=15000)".into());
    } else if !root && f.unprivileged_userns_clone == Some(0) {
        add(Feature::UserNamespaces, Missing, "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0); enable them with sysctl -w kernel.unprivileged_userns_clone=1, or run capgate as root".into());
    } else if !root && f.apparmor_restrict_userns == Some(1) {
        add(Feature::UserNamespaces, Missing, "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10+); install an AppArmor profile for capgate that allows `userns,`, or set the sysctl to 0, or run capgate as root".into());
    } else {
        add(
            Feature::UserNamespaces,
            Available,
            format!(
                "user, mount, pid, network, ipc and uts namespaces{}",
                if root { " (running as root)" } else { "" }
            ),
        );
    }

    // Two mapped ids.
    if root {
        add(
            Feature::IdMapping,
            Available,
            "root writes the uid/gid maps itself".into(),
        );
    } else if f.newuidmap && f.subuid_entry {
        add(
            Feature::IdMapping,
            Available,
            "newuidmap/newgidmap and a subordinate id range".into(),
        );
    } else {
        add(
            Feature::IdMapping,
            Missing,
            format!(
                "a non-root user needs newuidmap/newgidmap ({}) and a subordinate range in /etc/subuid and /etc/subgid ({}) to map the agent and root inside",
                if f.newuidmap {
                    "found"
                } else {
                    "missing: install the `uidmap` package"
                },
                if f.subuid_entry {
                    "found"
                } else {
                    "missing: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER"
                }
            ),
        );
    }

    // Landlock.
    let abi = f.landlock_abi;
    match abi {
        a if a <= 0 => add(Feature::Landlock, Missing, "Landlock is not available (kernel older than 5.13, or `landlock` missing from the lsm= boot parameter); the sandbox still starts with its mount walls, and reports Landlock as not enforced".into()),
        a => {
            let mut lacking = Vec::new();
            if a < 2 { lacking.push("cross-directory rename/link control (ABI 2, Linux 5.19)"); }
            if a < 3 { lacking.push("truncate control (ABI 3, Linux 6.2)"); }
            if a < 4 { lacking.push("TCP connect restriction to the gateway ports (ABI 4, Linux 6.7)"); }
            if a < 6 { lacking.push("signal and abstract-socket scoping (ABI 6, Linux 6.12)"); }
            if a < 7 { lacking.push("audit logging of denials (ABI 7, Linux 6.15)"); }
            if lacking.is_empty() {
                add(Feature::Landlock, Available, format!("ABI {a}: filesystem, TCP connect, scoping and audit logging"));
            } else {
                add(Feature::Landlock, Partial, format!("ABI {a}; lacking: {}", lacking.join(", ")));
            }
        }
    }

    // seccomp.
    match &f.seccomp_actions {
        Some(a) if a.split_whitespace().any(|x| x == "errno") => {
            add(
                Feature::Seccomp,
                Available,
                "seccomp filters with errno returns".into(),
            );
        }
        _ => add(
            Feature::Seccomp,
            Missing,
            "seccomp filters are not available (CONFIG_SECCOMP_FILTER)".into(),
        ),
    }
    let user_notif = f
        .seccomp_actions
        .as_deref()
        .is_some_and(|a| a.split_whitespace().any(|x| x == "user_notif"));
    if user_notif && kernel_at_least(&f.kernel_release, 5, 5) {
        add(
            Feature::ExecWatch,
            Available,
            "seccomp user notifications: the execs a pack's exec allowlist refuses are recorded"
                .into(),
        );
    } else {
        add(
            Feature::ExecWatch,
            Partial,
            format!(
                "kernel {} lacks seccomp user notifications that let a syscall go on (Linux 5.5): a pack's exec allowlist (dev.capgate/exec@1) still refuses, but its refusals are not recorded nor counted by --fail-on-violation",
                f.kernel_release
            ),
        );
    }

    // cgroups.
    match &f.cgroups.pids {
        Some(home) => add(Feature::PidsLimit, Available, home.describe()),
        None => add(
            Feature::PidsLimit,
            Missing,
            cgroup::missing_explanation(&f.cgroups, "pids"),
        ),
    }
    match &f.cgroups.memory {
        Some(home) => {
            let swap_capped = match home.version {
                Version::V1 => f.memsw_file.unwrap_or(false),
                Version::V2 => true,
            };
            if swap_capped || f.swap_kb == 0 {
                add(
                    Feature::MemoryLimit,
                    Available,
                    format!(
                        "{}{}",
                        home.describe(),
                        if swap_capped {
                            ", swap capped"
                        } else {
                            " (no swap on this host)"
                        }
                    ),
                );
            } else {
                add(Feature::MemoryLimit, Partial, "the memory controller has no swap accounting (memory.memsw.* missing) and the host has swap: a memory limit cannot cap swap; boot with swapaccount=1".into());
            }
        }
        None => add(
            Feature::MemoryLimit,
            Missing,
            cgroup::missing_explanation(&f.cgroups, "memory"),
        ),
    }
    match &f.cgroups.cpu {
        Some(home) => add(Feature::CpuLimit, Available, home.describe()),
        None => add(
            Feature::CpuLimit,
            Missing,
            format!(
                "needed only by sandboxes that ask for a CPU limit: {}",
                cgroup::missing_explanation(&f.cgroups, "cpu")
            ),
        ),
    }

    // overlayfs in a user namespace.
    let has_overlay = f
        .filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"));
    if !has_overlay {
        add(Feature::Overlay, Missing, "overlayfs is not available (modprobe overlay); copy-mode workspaces cannot start, mount mode still works".into());
    } else if !kernel_at_least(&f.kernel_release, 5, 11) {
        add(
            Feature::Overlay,
            Missing,
            format!(
                "kernel {} is older than 5.11, which first allows overlayfs in user namespaces; copy-mode workspaces cannot start, mount mode still works",
                f.kernel_release
            ),
        );
    } else {
        add(
            Feature::Overlay,
            Available,
            "overlayfs in user namespaces".into(),
        );
    }

    if f.proc_overmounted {
        add(Feature::Proc, Missing, "parts of this host's /proc are covered by other mounts (typical inside a container): the kernel refuses a new /proc for the sandbox; run capgate on the host or in a container started with an unmasked /proc".into());
    } else {
        add(
            Feature::Proc,
            Available,
            "a fresh /proc can be mounted".into(),
        );
    }
    HostReport { checks }
}

/// Probes this host.
pub fn probe_host() -> HostReport {
    assess(&HostFacts::read())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn good() -> HostFacts {
        HostFacts {
            euid: 0,
            max_user_namespaces: Some(1000),
            landlock_abi: 7,
            seccomp_actions: Some(
                "kill_process kill_thread trap errno user_notif trace log allow".into(),
            ),
            cgroups: cgroup::Layout {
                pids: Some(cgroup::Home {
                    version: Version::V2,
                    base: "/sys/fs/cgroup".into(),
                }),
                memory: Some(cgroup::Home {
                    version: Version::V2,
                    base: "/sys/fs/cgroup".into(),
                }),
                cpu: Some(cgroup::Home {
                    version: Version::V2,
                    base: "/sys/fs/cgroup".into(),
                }),
                v2: Some((
                    "/sys/fs/cgroup".into(),
                    vec!["pids".into(), "memory".into(), "cpu".into()],
                )),
                not_writable: Vec::new(),
            },
            filesystems: "nodev\ttmpfs\nnodev\toverlay\n".into(),
            kernel_release: "6.8.0-1-generic".into(),
            ..HostFacts::default()
        }
    }

    #[test]
    fn a_complete_host_has_no_problems() {
        let r = assess(&good());
        assert_eq!(r.problems().count(), 0, "{r}");
    }

    /// The exec watch needs `user_notif` and Linux 5.5 (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`);
    /// without either, exec allowlists still hold and the report says what goes unrecorded.
    #[test]
    fn the_exec_watch_needs_user_notifications_that_continue() {
        let watch = |f: &HostFacts| assess(f).check(Feature::ExecWatch).unwrap().clone();
        assert_eq!(watch(&good()).availability, Availability::Available);
        let old = HostFacts {
            kernel_release: "5.4.0-150-generic".into(),
            ..good()
        };
        let c = watch(&old);
        assert_eq!(c.availability, Availability::Partial);
        assert!(
            c.detail.contains("5.4.0") && c.detail.contains("not recorded"),
            "{}",
            c.detail
        );
        let no_notif = HostFacts {
            seccomp_actions: Some("kill_process kill_thread trap errno trace log allow".into()),
            ..good()
        };
        assert_eq!(watch(&no_notif).availability, Availability::Partial);
    }

    #[test]
    fn apparmor_restriction_is_explained_for_users_not_root() {
        let mut f = good();
        f.apparmor_restrict_userns = Some(1);
        assert_eq!(
            assess(&f)
                .check(Feature::UserNamespaces)
                .unwrap()
                .availability,
            Availability::Available
        );
        f.euid = 1000;
        let r = assess(&f);
        let c = r.check(Feature::UserNamespaces).unwrap();
        assert_eq!(c.availability, Availability::Missing);
        assert!(c.detail.contains("AppArmor"), "{}", c.detail);
        assert_eq!(
            r.check(Feature::IdMapping).unwrap().availability,
            Availability::Missing
        );
    }

    #[test]
    fn older_landlock_abis_list_what_they_lack() {
        let mut f = good();
        f.landlock_abi = 3;
        let c = assess(&f).check(Feature::Landlock).cloned().unwrap();
        assert_eq!(c.availability, Availability::Partial);
        assert!(c.detail.contains("TCP connect"), "{}", c.detail);
        f.landlock_abi = 0;
        assert_eq!(
            assess(&f).check(Feature::Landlock).unwrap().availability,
            Availability::Missing
        );
    }

    #[test]
    fn v2_without_controllers_is_explained() {
        let mut f = good();
        f.cgroups = cgroup::Layout {
            pids: None,
            memory: None,
            cpu: None,
            v2: Some(("/sys/fs/cgroup/unified".into(), vec![])),
            not_writable: Vec::new(),
        };
        let r = assess(&f);
        let c = r.check(Feature::PidsLimit).unwrap();
        assert_eq!(c.availability, Availability::Missing);
        assert!(c.detail.contains("has no controllers"), "{}", c.detail);
    }

    /// A hierarchy this user cannot write (v1 without delegation, as a normal user) is
    /// missing for capgate, and the report says what to do; a writable one stays.
    #[test]
    fn a_cgroup_hierarchy_nobody_delegated_is_missing_with_the_fix() {
        let home = |base: &str| {
            Some(cgroup::Home {
                version: Version::V1,
                base: base.into(),
            })
        };
        let mut layout = cgroup::Layout {
            pids: home("/sys/fs/cgroup/pids"),
            memory: home("/sys/fs/cgroup/memory/user"),
            cpu: home("/sys/fs/cgroup/cpu"),
            v2: None,
            not_writable: Vec::new(),
        };
        layout.keep_writable(|p| p.starts_with("/sys/fs/cgroup/memory"));
        assert_eq!(layout.pids, None);
        assert_eq!(layout.cpu, None);
        assert!(layout.memory.is_some());
        let mut f = good();
        f.cgroups = layout;
        let c = assess(&f).check(Feature::PidsLimit).unwrap().clone();
        assert_eq!(c.availability, Availability::Missing);
        assert!(
            c.detail
                .contains("/sys/fs/cgroup/pids is not writable by this user")
                && c.detail.contains("mkdir /sys/fs/cgroup/pids/capgate")
                && c.detail.contains("--dangerously-skip-limits"),
            "{}",
            c.detail
        );
        // --dangerously-skip-limits then starts without it, loudly.
        let plan = cgroup::plan(&f.cgroups, "box", 1024, (None, None), true).unwrap();
        assert!(plan.dirs.is_empty());
        assert!(
            plan.warnings[0].contains("pids limit NOT enforced"),
            "{:?}",
            plan.warnings
        );
    }

    #[test]
    fn old_kernels_and_masked_proc_are_explained() {
        let mut f = good();
        f.kernel_release = "5.4.0".into();
        f.proc_overmounted = true;
        let r = assess(&f);
        assert_eq!(
            r.check(Feature::Overlay).unwrap().availability,
            Availability::Missing
        );
        assert_eq!(
            r.check(Feature::Proc).unwrap().availability,
            Availability::Missing
        );
        assert!(kernel_at_least("6.18.44-fc", 5, 11));
    }
}
