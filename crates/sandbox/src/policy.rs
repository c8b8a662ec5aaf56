//! Reviewed security data: which host paths the sandbox sees, what is masked, which ids are
//! used. Every entry says why it is there. Changing a list is a security review.

/// A reviewed entry: a path and the reason it is in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub path: &'static str,
    pub why: &'static str,
}

const fn e(path: &'static str, why: &'static str) -> Entry {
    Entry { path, why }
}

/// Host system directories shown read-only (`ro,nosuid,nodev`, bound non-recursively, so
/// mounts beneath them stay hidden). Where the host has a symlink (`/bin -> usr/bin` on
/// merged-/usr systems) the same symlink is created instead; where it has neither, nothing.
pub(crate) const SYSTEM_DIRS: &[Entry] = &[
    e(
        "/usr",
        "programs, libraries and data of the host's distribution",
    ),
    e(
        "/bin",
        "programs (a symlink into /usr on merged-/usr hosts)",
    ),
    e(
        "/sbin",
        "system programs some tools call by absolute path (ldconfig, …)",
    ),
    e("/lib", "the dynamic loader and libraries"),
    e(
        "/lib64",
        "the x86_64 dynamic loader path (/lib64/ld-linux-x86-64.so.2)",
    ),
    e("/lib32", "32-bit libraries on multilib hosts"),
    e("/libx32", "x32 libraries on multilib hosts"),
];

/// The host directories every sandbox sees (read-only), resolved: `SYSTEM_DIRS` as they
/// exist on this host, symbolic links followed (`/bin` is `/usr/bin` on merged-/usr hosts).
/// Anything of capgate's own kept beneath one (its data directory) is shown to the workload.
pub fn shown_host_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> = SYSTEM_DIRS
        .iter()
        .filter_map(|e| std::fs::canonicalize(e.path).ok())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Host `/etc` entries shown in the sandbox's generated `/etc`. Everything else in the
/// host's `/etc` (shadow, ssh keys, sudoers, machine-id, ld.so.preload, network and service
/// configuration, package manager credentials) does not exist inside. Files are copied.
/// A directory that holds only symlinks and world-readable regular files is bound
/// read-only (one mount instead of hundreds of copies); any other directory is copied one
/// level deep (world-readable regular files and symlinks only).
pub(crate) const HOST_ETC: &[Entry] = &[
    e(
        "ld.so.cache",
        "the dynamic loader's library index; without it non-default library paths fail",
    ),
    e(
        "ld.so.conf",
        "read by ldconfig and some build tools; names only library directories",
    ),
    e("ld.so.conf.d", "the directories ld.so.conf includes"),
    e(
        "alternatives",
        "Debian's symlink farm: /usr/bin/awk, editor, java… point through it",
    ),
    e(
        "localtime",
        "the host's time zone (a symlink into /usr/share/zoneinfo)",
    ),
    e("timezone", "the time zone name some runtimes read"),
    e(
        "protocols",
        "protocol names for getprotobyname (Python's socket module, curl)",
    ),
    e(
        "services",
        "port names for getservbyname (git, ssh, Python)",
    ),
    e(
        "os-release",
        "distribution identification read by package tools (pip, npm's node-gyp)",
    ),
    e("debian_version", "distribution identification on Debian"),
    e("lsb-release", "distribution identification on Ubuntu"),
    e(
        "ssl/openssl.cnf",
        "OpenSSL's default configuration; OpenSSL 3 warns or fails without it",
    ),
    e(
        "mime.types",
        "file type table used by Python's mimetypes and web tools",
    ),
    e(
        "shells",
        "list of valid shells, read by chsh-like checks in tools",
    ),
    e(
        "bash.bashrc",
        "system bash start-up file: prompt and completion only",
    ),
    e("profile", "system login shell start-up file: PATH defaults"),
    e("inputrc", "readline key bindings for interactive shells"),
    e(
        "locale.alias",
        "locale name aliases used by glibc's setlocale",
    ),
    e(
        "gai.conf",
        "address sorting rules for getaddrinfo (no secrets)",
    ),
];

/// `/proc` entries bound read-only over themselves after the new `/proc` is mounted. With
/// the workload mapped to the invoking user (root when capgate runs as root), `/proc/sys`
/// and `/proc/sysrq-trigger` would otherwise be writable by plain ownership checks.
pub(crate) const PROC_READ_ONLY: &[Entry] = &[
    e(
        "sys",
        "kernel tunables: owner-writable by the host's uid 0, which the agent may map to",
    ),
    e(
        "sysrq-trigger",
        "magic SysRq: writable by the host's uid 0 (reboot, crash, OOM kill)",
    ),
    e("irq", "IRQ affinity tunables"),
    e("bus", "PCI/USB device access tunables"),
    e("fs", "filesystem tunables outside /proc/sys (nfsd, xfs)"),
];

/// `/proc` files hidden behind `/dev/null` (reads give nothing).
pub(crate) const PROC_MASKED_FILES: &[Entry] = &[
    e("kcore", "physical memory image"),
    e(
        "keys",
        "lists kernel keys viewable by the caller's host uid, other namespaces' keys included",
    ),
    e("key-users", "per-uid key quotas of the whole host"),
    e(
        "timer_list",
        "every pending timer of the host, with pids and command names",
    ),
    e("sched_debug", "scheduler state of every host task"),
    e("latency_stats", "latency records of host tasks"),
    e("kmsg", "the kernel log"),
    e(
        "slabinfo",
        "kernel allocator state (root-only by mode, which the agent may map to)",
    ),
    e(
        "kpagecount",
        "physical page use of the whole host (root-only by mode, no capability check)",
    ),
    e(
        "kpageflags",
        "physical page flags of the whole host, a rowhammer aid (root-only by mode, no capability check)",
    ),
    e(
        "kpagecgroup",
        "physical page owners of the whole host (root-only by mode, no capability check)",
    ),
    e(
        "vmallocinfo",
        "kernel virtual memory layout (root-only by mode)",
    ),
    e(
        "pagetypeinfo",
        "host memory fragmentation (root-only by mode)",
    ),
    e(
        "mtrr",
        "memory type range registers; root-owned and writable by mode (the write is capability-checked)",
    ),
];

/// `/proc` directories hidden behind an empty read-only tmpfs.
pub(crate) const PROC_MASKED_DIRS: &[Entry] = &[
    e("acpi", "ACPI tables and controls"),
    e("scsi", "SCSI host control (device add/remove)"),
];

/// Host device nodes bound (read-only mount, so the nodes' owner and mode cannot change;
/// the devices themselves stay usable) into the sandbox's tmpfs `/dev`.
pub(crate) const DEV_NODES: &[Entry] = &[
    e("null", "the bit bucket every program expects"),
    e(
        "zero",
        "zero bytes (dd, mmap of anonymous memory by old programs)",
    ),
    e("full", "ENOSPC test device, harmless"),
    e("random", "kernel randomness"),
    e("urandom", "kernel randomness"),
    e(
        "tty",
        "the controlling terminal alias; opens fail (ENXIO) since commands have none",
    ),
];

/// In-sandbox paths beneath which Landlock allows writing files (but not creating or
/// removing entries), besides the granted write roots.
pub(crate) const DEVICE_WRITE_GRANTS: &[Entry] = &[
    e("/dev/null", "discarding output"),
    e("/dev/zero", "writes are discarded"),
    e("/dev/full", "writes fail with ENOSPC by design"),
    e("/dev/tty", "interactive programs write prompts there"),
    e(
        "/dev/pts",
        "the sandbox's own pseudo-terminals (script, expect, terminal UIs)",
    ),
];

/// In-sandbox directories beneath which the workload may create, write and remove entries
/// (the workspace, volumes and `SandboxSpec::writable` are added to these).
pub(crate) const WRITE_ROOTS: &[Entry] = &[
    e("/home/agent", "the agent's home (noexec tmpfs)"),
    e("/tmp", "scratch space (tmpfs)"),
    e(
        "/dev/shm",
        "POSIX shared memory (Python multiprocessing, Chromium)",
    ),
];

/// Outside uid/gid for the sandbox's root when the invoking user has no subordinate ids
/// (`/etc/subuid`): above systemd's container range (0x80000–0x6FFFFFFF), below its
/// "foreign" range (0x7FFE0000–), and far from useradd's and subuid's usual allocations.
/// Files that install hooks create in a mount-mode workspace show this owner on the host.
pub(crate) const FALLBACK_ROOT_OUTSIDE_ID: u32 = 0x7FF0_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_has_a_reason_and_a_plain_path() {
        for list in [
            SYSTEM_DIRS,
            HOST_ETC,
            PROC_READ_ONLY,
            PROC_MASKED_FILES,
            PROC_MASKED_DIRS,
            DEV_NODES,
            DEVICE_WRITE_GRANTS,
            WRITE_ROOTS,
        ] {
            for entry in list {
                assert!(entry.why.len() > 10, "{entry:?}");
                assert!(!entry.path.contains(".."), "{entry:?}");
            }
        }
    }

    #[test]
    fn secrets_never_come_from_the_host_etc() {
        for secret in [
            "shadow",
            "gshadow",
            "sudoers",
            "ssh",
            "machine-id",
            "ld.so.preload",
            "passwd",
            "group",
            "hosts",
            "resolv.conf",
        ] {
            assert!(
                HOST_ETC.iter().all(|e| !e.path.starts_with(secret)),
                "{secret} must not be copied"
            );
        }
    }
}
