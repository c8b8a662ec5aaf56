//! The choreography as data: the ordered kernel effects of the helper, of the sandbox's init
//! and of each command. Pure functions of the spec and of what the host has, so the order is
//! unit-tested with the recording fake.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::cgroup;
use crate::error::Step;
use crate::idmap::IdMaps;
use crate::kernel::{Effect, IdKind, LandlockRules, UserQuota};
use crate::policy::{
    DEV_NODES, DEVICE_WRITE_GRANTS, HOST_ETC, PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY,
    SYSTEM_DIRS, WRITE_ROOTS,
};
use crate::spec::{
    AGENT_HOME, AGENT_ID, ListenerKind, OVERLAY_LOWER, OVERLAY_UPPER, OVERLAY_WORK, SandboxSpec,
    User, VolumeSource, WORKSPACE_DIR, WorkspaceMode,
};

/// A host system directory as the host has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SystemDir {
    Dir,
    Symlink(PathBuf),
    Absent,
}

/// One item of the host's `/etc` to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EtcItem {
    Dir,
    /// A host directory that holds only symbolic links and world-readable regular files:
    /// bound read-only in one mount rather than copied entry by entry (Debian's
    /// `alternatives` holds hundreds of links, and copying them was the largest single cost
    /// of a sandbox's start).
    BoundDir,
    File {
        contents: Vec<u8>,
        mode: u32,
    },
    Symlink(PathBuf),
}

/// What the host has, read by the helper before the namespaces exist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct HostView {
    pub system_dirs: Vec<(&'static str, SystemDir)>,
    /// `(path relative to /etc, item)`, parents before children.
    pub etc: Vec<(PathBuf, EtcItem)>,
    pub dev_nodes: Vec<&'static str>,
    pub proc_read_only: Vec<&'static str>,
    pub proc_masked_files: Vec<&'static str>,
    pub proc_masked_dirs: Vec<&'static str>,
    /// The host's CA bundle ([`SYSTEM_ROOTS`]), empty when it has none.
    pub system_roots: Vec<u8>,
    /// The invoking user's per-user limits of [`USER_NS_LIMITS`] that this kernel has.
    pub user_ns_limits: Vec<(&'static str, u64)>,
}

/// Per-user kernel counts (`/proc/sys/user`) the sandbox's users charge to the invoking
/// user: inotify instances and watches, fanotify groups and marks. Without a bound of its
/// own, a workload could take them all (an editor's file watcher on the host then fails).
pub(crate) const USER_NS_LIMITS: &[&str] = &[
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
];

/// What each user inside (root and the agent) may charge of a per-user count whose host
/// limit is `host`: a quarter, so the sandbox as a whole leaves the invoking user half.
pub(crate) fn user_ns_share(host: u64) -> u64 {
    (host / 4).max(1)
}

/// The sandbox's share of a per-user resource limit whose soft value for the invoking user
/// is `current` (`None`: unlimited): half (rounded down: never above `current`, so never
/// above its hard limit, which only a privileged process may raise), and no more than
/// `cap`. Set before the user namespace exists, it also bounds what the whole namespace
/// may charge to that user.
pub(crate) fn rlimit_share(current: Option<u64>, cap: u64) -> u64 {
    current.map_or(cap, |c| c / 2).min(cap)
}

/// The per-user resource limits lowered for the sandbox, each with its cap when the
/// invoking user has none: queued signals, message-queue bytes, locked memory.
pub(crate) const USER_QUOTAS: &[(UserQuota, u64)] = &[
    (UserQuota::SigPending, 1 << 16),
    (UserQuota::MsgQueue, 819_200),
    (UserQuota::Memlock, 64 << 20),
];

/// The host's bundle of trusted roots (Debian's path, which other distributions also link).
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Largest CA bundle read from the host.
const MAX_SYSTEM_ROOTS: u64 = 16 << 20;

/// Largest `/etc` file copied from the host.
const MAX_ETC_FILE: u64 = 4 << 20;
/// Most entries copied from one `/etc` directory.
const MAX_ETC_DIR_ENTRIES: usize = 4096;

impl HostView {
    /// Reads the host (through `/`).
    pub(crate) fn read() -> Self {
        Self::read_from(Path::new("/"))
    }

    /// Reads a host whose root is `root` (tests use a fake tree).
    pub(crate) fn read_from(root: &Path) -> Self {
        let at = |p: &str| root.join(p.trim_start_matches('/'));
        let system_dirs = SYSTEM_DIRS
            .iter()
            .map(|e| {
                let path = at(e.path);
                let kind = match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&path)
                        .map(SystemDir::Symlink)
                        .unwrap_or(SystemDir::Absent),
                    Ok(m) if m.is_dir() => SystemDir::Dir,
                    _ => SystemDir::Absent,
                };
                (e.path, kind)
            })
            .collect();
        let mut etc = Vec::new();
        for entry in HOST_ETC {
            let rel = PathBuf::from(entry.path);
            let path = at("/etc").join(&rel);
            let Some(item) = etc_item(&path) else {
                continue;
            };
            // Parents of nested entries (ssl/openssl.cnf).
            let mut parent = rel.parent();
            let mut parents = Vec::new();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                parents.push(p.to_path_buf());
                parent = p.parent();
            }
            for p in parents.into_iter().rev() {
                if !etc.iter().any(|(q, _)| q == &p) {
                    etc.push((p, EtcItem::Dir));
                }
            }
            let is_dir = item == EtcItem::Dir;
            if is_dir && bindable_dir(&path) {
                etc.push((rel, EtcItem::BoundDir));
                continue;
            }
            etc.push((rel.clone(), item));
            if is_dir {
                let mut children: Vec<_> = std::fs::read_dir(&path)
                    .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                children.sort();
                for name in children.into_iter().take(MAX_ETC_DIR_ENTRIES) {
                    if let Some(child) = etc_item(&path.join(&name)).filter(|i| *i != EtcItem::Dir)
                    {
                        etc.push((rel.join(name), child));
                    }
                }
            }
        }
        let exists = |dir: &str, name: &str| at(dir).join(name).exists();
        let names = |list: &'static [crate::policy::Entry], dir: &str| -> Vec<&'static str> {
            list.iter()
                .map(|e| e.path)
                .filter(|p| exists(dir, p))
                .collect()
        };
        HostView {
            system_dirs,
            etc,
            dev_nodes: names(DEV_NODES, "/dev"),
            proc_read_only: names(PROC_READ_ONLY, "/proc"),
            proc_masked_files: names(PROC_MASKED_FILES, "/proc"),
            proc_masked_dirs: names(PROC_MASKED_DIRS, "/proc"),
            system_roots: read_bounded(&at(SYSTEM_ROOTS), MAX_SYSTEM_ROOTS),
            user_ns_limits: USER_NS_LIMITS
                .iter()
                .filter_map(|name| {
                    let text = std::fs::read_to_string(at("/proc/sys/user").join(name)).ok()?;
                    Some((*name, text.trim().parse().ok()?))
                })
                .collect(),
        }
    }
}

/// Whether the host directory `path` may be shown as it is: world-readable and
/// world-searchable, at most [`MAX_ETC_DIR_ENTRIES`] entries, each a symbolic link or a
/// world-readable regular file no larger than [`MAX_ETC_FILE`], the same test the copy
/// applies entry by entry. Entry types come from the directory listing itself, so only the
/// regular files cost a `stat`. Anything else (a subdirectory, a device, a private file)
/// and the directory is copied instead, with only what the copy keeps.
fn bindable_dir(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let world = |m: &std::fs::Metadata, bits: u32| m.permissions().mode() & bits == bits;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && world(&m, 0o005) => {}
        _ => return false,
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return false;
    };
    let mut count = 0;
    for entry in entries {
        count += 1;
        let Ok(entry) = entry else { return false };
        let Ok(ft) = entry.file_type() else {
            return false;
        };
        let ok = ft.is_symlink()
            || (ft.is_file()
                && entry
                    .metadata()
                    .is_ok_and(|m| m.len() <= MAX_ETC_FILE && world(&m, 0o004)));
        if !ok || count > MAX_ETC_DIR_ENTRIES {
            return false;
        }
    }
    true
}

/// The file at `path` (symlinks followed), or nothing when it is missing, unreadable or
/// larger than `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Vec<u8> {
    use std::io::Read as _;
    let mut out = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
            match f.take(max + 1).read_to_end(&mut out) {
                Ok(n) if n as u64 <= max => out,
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

fn etc_item(path: &Path) -> Option<EtcItem> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        return std::fs::read_link(path).ok().map(EtcItem::Symlink);
    }
    if ft.is_dir() {
        return Some(EtcItem::Dir);
    }
    if ft.is_file() && meta.len() <= MAX_ETC_FILE {
        let contents = std::fs::read(path).ok()?;
        // World-readable files only: anything narrower may be a secret.
        let mode = meta.permissions().mode() & 0o777;
        return (mode & 0o004 != 0).then_some(EtcItem::File {
            contents,
            mode: 0o644,
        });
    }
    None
}

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

fn mount_fs(fstype: &'static str, target: PathBuf, flags: MsFlags, data: String) -> Effect {
    Effect::Mount {
        source: Some(PathBuf::from(fstype)),
        target,
        fstype: Some(fstype),
        flags,
        data: Some(data),
    }
}

fn bind(source: PathBuf, target: PathBuf) -> Effect {
    Effect::Mount {
        source: Some(source),
        target,
        fstype: None,
        flags: MsFlags::MS_BIND,
        data: None,
    }
}

fn remount_bind(target: PathBuf, flags: MsFlags) -> Effect {
    Effect::Remount {
        target,
        flags: flags | MsFlags::MS_BIND,
    }
}

fn dir(path: PathBuf, mode: u32) -> Effect {
    Effect::MakeDir {
        path,
        mode,
        owner: None,
    }
}

fn inside(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The generated `/etc` files: `(relative path, contents, mode)`.
pub(crate) fn generated_etc(spec: &SandboxSpec, host: &HostView) -> Vec<(PathBuf, Vec<u8>, u32)> {
    let shell = spec.etc.shell.display();
    let name = &spec.name;
    let mut files = vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/bin/sh\nagent:x:{AGENT_ID}:{AGENT_ID}:agent:{AGENT_HOME}:{shell}\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nagent:x:{AGENT_ID}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            spec.etc.hosts.clone().unwrap_or_else(|| {
                format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{name}\n")
            }),
        ),
        (
            "resolv.conf",
            spec.etc
                .resolv_conf
                .clone()
                .unwrap_or_else(|| "nameserver 127.0.0.1\n".into()),
        ),
        ("hostname", format!("{name}\n")),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
             protocols: files\nservices: files\nethers: files\nrpc: files\n"
                .into(),
        ),
    ]
    .into_iter()
    .map(|(p, c)| (PathBuf::from(p), c.into_bytes(), 0o644))
    .collect::<Vec<_>>();
    if !(host.system_roots.is_empty() && spec.etc.trusted_ca.is_empty()) {
        let mut bundle = host.system_roots.clone();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(spec.etc.trusted_ca.as_bytes());
        files.push((
            PathBuf::from("ssl/certs/ca-certificates.crt"),
            bundle,
            0o644,
        ));
    }
    files
}

/// In-sandbox directories whose mount points the plan creates for the volumes, parents first,
/// with the owner they get (the agent's beneath /home/agent and /tmp, root's elsewhere).
fn volume_dirs(spec: &SandboxSpec) -> Vec<(PathBuf, Option<(u32, u32)>)> {
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut out = Vec::new();
    let mut targets: Vec<&Path> = spec.volumes.iter().map(|v| v.target.as_path()).collect();
    targets.sort_by_key(|t| t.components().count());
    for target in targets {
        let mut chain: Vec<PathBuf> = target.ancestors().map(Path::to_path_buf).collect();
        chain.reverse();
        for p in chain {
            if p == Path::new("/")
                || p == Path::new("/home")
                || p == Path::new(AGENT_HOME)
                || p == Path::new("/tmp")
                || !seen.insert(p.clone())
            {
                continue;
            }
            // Under the agent's home, /tmp, or inside another volume (its point is made in
            // that volume, which is the agent's).
            let agent_owned = p.starts_with(AGENT_HOME)
                || p.starts_with("/tmp")
                || spec
                    .volumes
                    .iter()
                    .any(|v| p != v.target && p.starts_with(&v.target));
            out.push((p, agent_owned.then_some((AGENT_ID, AGENT_ID))));
        }
    }
    out
}

/// The init's effects, each with the step it belongs to: from `PR_SET_PDEATHSIG` to the
/// seccomp filter. `root` is the host directory the new root is built on.
pub(crate) fn init_effects(
    spec: &SandboxSpec,
    host: &HostView,
    root: &Path,
    (v1_cgroups, shed_groups): (&[PathBuf], bool),
) -> Vec<(Step, Effect)> {
    let mut out: Vec<(Step, Effect)> = Vec::new();
    let r = |p: &str| inside(root, p);
    let size = spec.limits.tmpfs_size;

    // Ids and identity first: nothing is mounted before the maps exist (AwaitRelease).
    out.push((Step::Namespaces, Effect::SetParentDeathSignal));
    out.push((Step::IdMap, Effect::AwaitRelease));
    // A helper that is not root cannot shed its supplementary groups before the clone
    // (they would stay with every process inside, as `nogroup`, still opening whatever
    // those groups may open); the init can, once its gid map is written.
    if shed_groups {
        out.push((Step::IdMap, Effect::ClearSupplementaryGroups));
    }
    // Into the v1 cgroups before anything else: every process of the sandbox descends
    // from the init, after this.
    for dir in v1_cgroups {
        out.push((Step::Cgroup, Effect::CgroupJoinSelf(dir.clone())));
    }
    // In its cgroups now (v2: born there): they become the root of what it shows.
    out.push((Step::Cgroup, Effect::NewCgroupNamespace));
    out.push((Step::IdMap, Effect::SetIds { uid: 0, gid: 0 }));
    // Changing ids resets the parent-death signal: set it again (the lifeline pipe covers
    // the helper dying in between).
    out.push((Step::Namespaces, Effect::SetParentDeathSignal));
    out.push((Step::Namespaces, Effect::SetHostname(spec.name.clone())));

    let fs = Step::Filesystem;
    let mut push = |e: Effect| out.push((fs, e));
    push(Effect::MakeMountsPrivate);
    push(mount_fs(
        "tmpfs",
        root.to_path_buf(),
        NOSUID_NODEV,
        "mode=0755,size=16m".into(),
    ));

    // System directories: read-only binds, or the host's symlinks.
    for (path, kind) in &host.system_dirs {
        match kind {
            SystemDir::Dir => {
                push(dir(r(path), 0o755));
                push(bind(PathBuf::from(path), r(path)));
                push(remount_bind(r(path), MsFlags::MS_RDONLY | NOSUID_NODEV));
            }
            SystemDir::Symlink(target) => push(Effect::Symlink {
                target: target.clone(),
                link: r(path),
            }),
            SystemDir::Absent => {}
        }
    }

    // /etc: generated files plus reviewed copies from the host.
    push(dir(r("/etc"), 0o755));
    let mut made: BTreeSet<PathBuf> = BTreeSet::new();
    for (rel, item) in &host.etc {
        let target = r("/etc").join(rel);
        match item {
            EtcItem::Dir => {
                made.insert(rel.clone());
                push(dir(target, 0o755));
            }
            EtcItem::BoundDir => {
                made.insert(rel.clone());
                push(dir(target.clone(), 0o755));
                push(bind(Path::new("/etc").join(rel), target.clone()));
                push(remount_bind(
                    target,
                    MsFlags::MS_RDONLY | NOSUID_NODEV | MsFlags::MS_NOEXEC,
                ));
            }
            EtcItem::File { contents, mode } => push(Effect::WriteFile {
                path: target,
                contents: contents.clone(),
                mode: *mode,
            }),
            EtcItem::Symlink(to) => push(Effect::Symlink {
                target: to.clone(),
                link: target,
            }),
        }
    }
    for (rel, contents, mode) in generated_etc(spec, host) {
        let mut parents: Vec<PathBuf> = rel
            .ancestors()
            .skip(1)
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .collect();
        parents.reverse();
        for p in parents {
            if made.insert(p.clone()) {
                push(dir(r("/etc").join(&p), 0o755));
            }
        }
        push(Effect::WriteFile {
            path: r("/etc").join(rel),
            contents,
            mode,
        });
    }
    push(Effect::Symlink {
        target: PathBuf::from("../proc/self/mounts"),
        link: r("/etc/mtab"),
    });

    // /dev: a tmpfs with bound nodes, a private devpts and a shm tmpfs.
    push(dir(r("/dev"), 0o755));
    push(mount_fs(
        "tmpfs",
        r("/dev"),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        "mode=0755,size=64k".into(),
    ));
    for node in &host.dev_nodes {
        let target = r("/dev").join(node);
        push(Effect::WriteFile {
            path: target.clone(),
            contents: Vec::new(),
            mode: 0o644,
        });
        push(bind(Path::new("/dev").join(node), target.clone()));
        push(remount_bind(
            target,
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        ));
    }
    push(dir(r("/dev/pts"), 0o755));
    push(mount_fs(
        "devpts",
        r("/dev/pts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620".into(),
    ));
    push(Effect::Symlink {
        target: PathBuf::from("pts/ptmx"),
        link: r("/dev/ptmx"),
    });
    push(dir(r("/dev/shm"), 0o1777));
    push(mount_fs(
        "tmpfs",
        r("/dev/shm"),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        format!("mode=1777,size={size}"),
    ));
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        push(Effect::Symlink {
            target: PathBuf::from(to),
            link: r("/dev").join(name),
        });
    }
    push(Effect::Remount {
        target: r("/dev"),
        flags: MsFlags::MS_RDONLY | NOSUID_NODEV | MsFlags::MS_NOEXEC,
    });

    // /proc: the pid namespace's own, with the reviewed read-only and masked entries.
    push(dir(r("/proc"), 0o555));
    push(mount_fs(
        "proc",
        r("/proc"),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        String::new(),
    ));
    // The per-user counts of the sandbox's user namespace, written while /proc/sys is
    // still writable (and the init still holds CAP_SYS_RESOURCE there).
    for &(name, value) in &host.user_ns_limits {
        push(Effect::UserNamespaceLimit {
            file: r("/proc/sys/user").join(name),
            value: user_ns_share(value),
        });
    }
    for name in &host.proc_read_only {
        let p = r("/proc").join(name);
        push(bind(p.clone(), p.clone()));
        push(remount_bind(
            p,
            MsFlags::MS_RDONLY | NOSUID_NODEV | MsFlags::MS_NOEXEC,
        ));
    }
    for name in &host.proc_masked_files {
        push(bind(r("/dev/null"), r("/proc").join(name)));
    }
    for name in &host.proc_masked_dirs {
        push(mount_fs(
            "tmpfs",
            r("/proc").join(name),
            MsFlags::MS_RDONLY | NOSUID_NODEV | MsFlags::MS_NOEXEC,
            "mode=0555,size=4k".into(),
        ));
    }

    // /tmp, /home/agent (noexec), the workspace. Under an exec allowlist every place the
    // workload can write is noexec too: Landlock refuses an `execve` there, but the dynamic
    // loader (granted with each listed program) maps a file it is handed, which only the
    // mount's noexec refuses, and a program written there must never run.
    let writable_flags = if spec.exec_only.is_some() {
        NOSUID_NODEV | MsFlags::MS_NOEXEC
    } else {
        NOSUID_NODEV
    };
    push(dir(r("/tmp"), 0o1777));
    push(mount_fs(
        "tmpfs",
        r("/tmp"),
        writable_flags,
        format!("mode=1777,size={size}"),
    ));
    push(Effect::MakeDir {
        path: r("/var"),
        mode: 0o755,
        owner: None,
    });
    push(Effect::Symlink {
        target: PathBuf::from("../tmp"),
        link: r("/var/tmp"),
    });
    push(dir(r("/home"), 0o755));
    push(dir(r(AGENT_HOME), 0o755));
    push(mount_fs(
        "tmpfs",
        r(AGENT_HOME),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        format!("mode=0755,uid={AGENT_ID},gid={AGENT_ID},size={size}"),
    ));
    push(Effect::MakeDir {
        path: r(WORKSPACE_DIR),
        mode: 0o755,
        owner: Some((AGENT_ID, AGENT_ID)),
    });
    let host_ws = spec.workspace.host_dir.clone();
    // With a read list, the workspace is mounted outside the new root (in this mount
    // namespace only; gone with the old root at pivot_root) and shown through a view.
    let view = workspace_view(spec);
    let ws_at = match &view {
        // Made by the helper, beside the root (`helper::prepare_state`).
        Some(_) => spec.state_dir.join("view"),
        None => r(WORKSPACE_DIR),
    };
    match spec.workspace.mode {
        WorkspaceMode::Copy => {
            // The overlay's options show in the workload's `/proc/self/mountinfo` as they
            // were given: named relative to the state directory, they tell it neither the
            // host directory's path nor the data directory's. The host directory is bound
            // at `lower` there first, in this mount namespace only (its mounts are private;
            // the bind goes with the old root at pivot_root).
            let lower = spec.state_dir.join(OVERLAY_LOWER);
            push(bind(host_ws, lower.clone()));
            push(remount_bind(lower, NOSUID_NODEV | MsFlags::MS_RDONLY));
            push(Effect::Chdir(spec.state_dir.clone()));
            push(mount_fs(
                "overlay",
                ws_at.clone(),
                writable_flags,
                format!(
                    "lowerdir={OVERLAY_LOWER},upperdir={OVERLAY_UPPER},workdir={OVERLAY_WORK},userxattr"
                ),
            ));
        }
        WorkspaceMode::Mount => {
            push(bind(host_ws, ws_at.clone()));
            push(remount_bind(ws_at.clone(), writable_flags));
        }
    }
    if let Some(view) = &view {
        push(mount_fs(
            "tmpfs",
            r(WORKSPACE_DIR),
            writable_flags,
            format!("mode=0755,uid={AGENT_ID},gid={AGENT_ID},size={size}"),
        ));
        for (path, writable) in view {
            push(Effect::BindView {
                from: ws_at.clone(),
                rel: path
                    .strip_prefix(WORKSPACE_DIR)
                    .unwrap_or(path)
                    .to_path_buf(),
                view: r(WORKSPACE_DIR),
                writable: *writable,
                owner: (AGENT_ID, AGENT_ID),
            });
        }
    }

    // Volumes, parents first. A mount point is made only once the volume holding it is
    // mounted (so a nested volume's point lives in its parent volume), and nothing is made,
    // chmod'ed, chown'ed or mounted through a symbolic link (`Effect::Beneath`: descriptors,
    // component by component): a persistent volume, or a --mount workspace, may hold links
    // a workload left, or swaps in while this runs, to redirect the mounts (onto the
    // sandbox's `/etc`, or out of the root before `pivot_root`).
    let mut volumes: Vec<_> = spec.volumes.iter().collect();
    volumes.sort_by_key(|v| v.target.components().count());
    let dirs = volume_dirs(spec);
    let mut made: BTreeSet<&Path> = BTreeSet::new();
    for v in volumes {
        let chain: Vec<_> = dirs
            .iter()
            .filter(|(p, _)| v.target.starts_with(p) && !made.contains(p.as_path()))
            .collect();
        let beneath = |inner: Effect| Effect::Beneath {
            root: root.to_path_buf(),
            inner: Box::new(inner),
        };
        for (path, owner) in chain {
            made.insert(path);
            push(beneath(Effect::MakeDir {
                path: r(&path.to_string_lossy()),
                mode: 0o755,
                owner: *owner,
            }));
        }
        let target = r(&v.target.to_string_lossy());
        match &v.source {
            VolumeSource::Dir(src) => {
                push(beneath(bind(src.clone(), target.clone())));
                push(beneath(remount_bind(target, writable_flags)));
            }
            VolumeSource::HostDir {
                path,
                identity,
                writable,
            } => {
                push(beneath(Effect::BindVetted {
                    source: path.clone(),
                    identity: *identity,
                    target: target.clone(),
                }));
                let flags = if *writable {
                    writable_flags
                } else {
                    MsFlags::MS_RDONLY | NOSUID_NODEV
                };
                push(beneath(remount_bind(target, flags)));
            }
            VolumeSource::Tmpfs { size } => push(beneath(mount_fs(
                "tmpfs",
                target,
                writable_flags,
                format!("mode=0755,uid={AGENT_ID},gid={AGENT_ID},size={size}"),
            ))),
        }
    }

    // A pack's write-only places: made where missing (the agent's), beneath their writable
    // mount and never through a link; what exists is left alone (a --mount workspace's
    // directories are the host's).
    let in_view = |p: &Path| view.is_some() && p.starts_with(WORKSPACE_DIR);
    for path in spec.write_only.iter().flatten() {
        if in_view(path) {
            continue; // shown, made and bound writable by the view
        }
        let Some(base) = spec.writable_base(path) else {
            continue; // refused by `validate`
        };
        let mut missing: Vec<&Path> = path
            .ancestors()
            .take_while(|p| *p != base.as_path())
            .collect();
        missing.reverse();
        for dir in missing {
            push(Effect::Beneath {
                root: root.to_path_buf(),
                inner: Box::new(Effect::EnsureDir {
                    path: r(&dir.to_string_lossy()),
                    owner: (AGENT_ID, AGENT_ID),
                }),
            });
        }
    }

    // Landlock holds a pack's writes to its places, but not metadata (chmod, utimes,
    // xattrs): the writable mounts themselves turn read-only, each place bound over itself
    // first so that it stays writable (a place that is a mount of its own stays as it is).
    if let Some(places) = &spec.write_only {
        let beneath = |inner: Effect| Effect::Beneath {
            root: root.to_path_buf(),
            inner: Box::new(inner),
        };
        for place in places {
            if !in_view(place) && spec.writable_base(place).as_deref() != Some(place.as_path()) {
                let at = r(&place.to_string_lossy());
                push(beneath(bind(at.clone(), at)));
            }
        }
        for base in spec.writable_mounts() {
            if !places.iter().any(|p| base.starts_with(p)) {
                push(beneath(remount_bind(
                    r(&base.to_string_lossy()),
                    MsFlags::MS_RDONLY | writable_flags,
                )));
            }
        }
    }

    // The root itself becomes read-only; then it becomes `/`.
    push(Effect::Remount {
        target: root.to_path_buf(),
        flags: MsFlags::MS_RDONLY | NOSUID_NODEV,
    });
    push(Effect::PivotRoot(root.to_path_buf()));

    out.push((Step::Network, Effect::LoopbackUp));
    for l in &spec.listeners {
        out.push((Step::Network, Effect::Listen(*l)));
    }

    let h = Step::Hardening;
    out.push((h, Effect::SetDumpable(false)));
    out.push((h, Effect::DropBoundingSet));
    out.push((h, Effect::ClearAmbient));
    out.push((h, Effect::NoNewPrivs));
    out.push((h, Effect::PrepareLandlock(landlock_rules(spec))));
    // Under an exec allowlist the init reads each exec's program name from the command
    // (another user): what that needs stays permitted (`execwatch`).
    let mut permitted = vec![caps::Capability::CAP_SETUID, caps::Capability::CAP_SETGID];
    if spec.exec_only.is_some() {
        permitted.extend(crate::execwatch::READ_CAPS);
    }
    out.push((h, Effect::LimitCapabilities { permitted }));
    if spec.exec_only.is_some() {
        out.push((h, Effect::WatchExecs));
    }
    out.push((h, Effect::Seccomp));
    out
}

/// What the workspace view shows, parents first: each read path (read-only) and each write
/// place within the workspace (writable); `None` without a read list (all of it).
fn workspace_view(spec: &SandboxSpec) -> Option<Vec<(PathBuf, bool)>> {
    let read = spec.workspace_read.as_ref()?;
    let places: Vec<&PathBuf> = spec
        .write_only
        .iter()
        .flatten()
        .filter(|p| p.starts_with(WORKSPACE_DIR) && p.as_path() != Path::new(WORKSPACE_DIR))
        .collect();
    let mut view: Vec<(PathBuf, bool)> = read
        .iter()
        .filter(|r| !places.iter().any(|p| p == r))
        .map(|r| (r.clone(), false))
        .chain(places.iter().map(|p| ((*p).clone(), true)))
        .collect();
    view.sort_by_key(|(p, _)| p.components().count());
    Some(view)
}

/// The Landlock grants (sandbox paths).
pub(crate) fn landlock_rules(spec: &SandboxSpec) -> LandlockRules {
    let write_roots: Vec<PathBuf> = match &spec.write_only {
        Some(only) => only.clone(),
        None => {
            let mut roots: Vec<PathBuf> =
                WRITE_ROOTS.iter().map(|e| PathBuf::from(e.path)).collect();
            roots.push(PathBuf::from(WORKSPACE_DIR));
            roots.extend(
                spec.volumes
                    .iter()
                    .filter(|v| v.is_writable())
                    .map(|v| v.target.clone()),
            );
            roots.extend(spec.writable.iter().cloned());
            roots
        }
    };
    let mut tcp_connect_ports: Vec<u16> = spec
        .listeners
        .iter()
        .filter(|l| l.kind == ListenerKind::Tcp)
        .map(|l| l.addr.port())
        .collect();
    tcp_connect_ports.sort_unstable();
    tcp_connect_ports.dedup();
    LandlockRules {
        write_roots,
        write_files: DEVICE_WRITE_GRANTS
            .iter()
            .map(|e| PathBuf::from(e.path))
            .collect(),
        tcp_connect_ports,
        exec_roots: spec.exec_only.clone(),
    }
}

/// The helper's effects around the creation of the init (`pid`): what comes before is the
/// cgroup (`before`), then the maps and cgroup membership, then the release.
pub(crate) fn helper_effects_after_clone(
    pid: i32,
    maps: &IdMaps,
    cgroups: &cgroup::Plan,
    born_in_v2: bool,
) -> Vec<(Step, Effect)> {
    // Writing the gid map directly (as root) needs no `deny`, but it is kept there as a
    // second wall. newgidmap writes the policy itself, and the init must still call
    // setgroups to shed the invoker's supplementary groups (see `init_effects`).
    let mut out = Vec::new();
    if !maps.via_setuid_helpers {
        out.push((Step::IdMap, Effect::DenySetgroups { pid }));
    }
    for (kind, ranges) in [(IdKind::Uid, &maps.uid), (IdKind::Gid, &maps.gid)] {
        out.push((
            Step::IdMap,
            Effect::WriteIdMap {
                pid,
                kind,
                ranges: ranges.clone(),
                via_setuid_helper: maps.via_setuid_helpers,
            },
        ));
    }
    // v2: added by pid, unless the clone already put the init there (CLONE_INTO_CGROUP).
    let v2 = cgroups.dirs.iter().filter(|d| !cgroups.v1.contains(d));
    for dir in v2.filter(|_| !born_in_v2) {
        out.push((
            Step::Cgroup,
            Effect::CgroupAddProcess {
                dir: dir.clone(),
                pid,
            },
        ));
    }
    out
}

/// The helper's effects before the init exists: cgroup creation and limits, and dropping
/// supplementary groups (when it can).
pub(crate) fn helper_effects_before_clone(
    cgroup_plan: &cgroup::Plan,
    is_root: bool,
    rlimits: &[(UserQuota, Option<u64>)],
) -> Vec<(Step, Effect)> {
    let mut out = Vec::new();
    for &(quota, current) in rlimits {
        let cap = USER_QUOTAS
            .iter()
            .find(|(q, _)| *q == quota)
            .map_or(u64::MAX, |(_, cap)| *cap);
        out.push((
            Step::Namespaces,
            Effect::LowerRlimit {
                quota,
                limit: rlimit_share(current, cap),
            },
        ));
    }
    for op in &cgroup_plan.ops {
        let effect = match op {
            cgroup::Op::EnableControllers { dir, controllers } => Effect::CgroupEnableControllers {
                dir: dir.clone(),
                controllers: controllers.clone(),
            },
            cgroup::Op::Create(dir) => Effect::CgroupCreate(dir.clone()),
            cgroup::Op::Write { file, value } | cgroup::Op::WriteSwap { file, value } => {
                Effect::CgroupWrite {
                    file: file.clone(),
                    value: value.clone(),
                }
            }
        };
        out.push((Step::Cgroup, effect));
    }
    if is_root {
        out.push((Step::Namespaces, Effect::ClearSupplementaryGroups));
    }
    out
}

/// The environment of a command: the sandbox's, then the command's overrides.
pub(crate) fn command_env(
    base: &[(String, String)],
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for (k, v) in base.iter().chain(overrides) {
        if let Some(slot) = env.iter_mut().find(|(key, _)| key == k) {
            slot.1 = v.clone();
        } else {
            env.push((k.clone(), v.clone()));
        }
    }
    env
}

/// Where `program` may be: itself if it has a `/`, else each `PATH` entry.
pub(crate) fn exec_candidates(program: &str, env: &[(String, String)]) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(program))
        .collect()
}

/// A command's effects in the forked child of the init, ending with `execve`.
/// The `oom_score_adj` of every command run inside (the init keeps 0): half of the memory
/// limit's worth of badness, so any command is killed before the init.
pub(crate) const COMMAND_OOM_SCORE_ADJ: i32 = 500;

pub(crate) fn command_effects(
    argv: &[String],
    env: &[(String, String)],
    user: User,
    cwd: &Path,
    stdio: [i32; 3],
    terminal: Option<i32>,
) -> Vec<Effect> {
    let id = user.id();
    let program = argv.first().cloned().unwrap_or_default();
    let mut effects = vec![
        Effect::NewSession,
        // Under memory pressure the kernel kills a command before the init: tmpfs pages
        // belong to no process, so by size alone the init could be chosen, ending the run.
        // The init is not dumpable, which leaves its /proc files to the host's root; the
        // command becomes dumpable at exec anyway, so it is made so first, to own them.
        Effect::SetDumpable(true),
        Effect::OomScoreAdj(COMMAND_OOM_SCORE_ADJ),
        Effect::ResetSignals,
        Effect::Stdio(stdio),
    ];
    // Its own session's controlling terminal: job control and Ctrl-C act inside.
    effects.extend(terminal.map(Effect::ControllingTerminal));
    effects.extend([
        Effect::CloseOnExecFrom3,
        Effect::EnterLandlock,
        Effect::RaiseSetIdCapabilities,
        Effect::SetIds { uid: id, gid: id },
        Effect::ClearCapabilities,
        Effect::Chdir(cwd.to_path_buf()),
        Effect::Seccomp,
        Effect::Exec {
            candidates: exec_candidates(&program, env),
            argv: argv.to_vec(),
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        },
    ]);
    effects
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use crate::idmap;
    use crate::kernel::{Kernel, Recorder};
    use crate::spec::{ListenerSpec, VolumeMount, Workspace};

    fn spec(mode: WorkspaceMode) -> SandboxSpec {
        let mut s = SandboxSpec::new(
            "box",
            PathBuf::from("/state/box"),
            Workspace {
                host_dir: PathBuf::from("/src/proj"),
                mode,
            },
        );
        s.listeners.push(ListenerSpec {
            addr: "127.0.0.1:3128".parse().unwrap(),
            kind: ListenerKind::Tcp,
        });
        s.listeners.push(ListenerSpec {
            addr: "127.0.0.1:53".parse().unwrap(),
            kind: ListenerKind::Udp,
        });
        s.volumes.push(VolumeMount {
            target: PathBuf::from("/home/agent/.cache/tools"),
            source: VolumeSource::Dir("/state/cache".into()),
        });
        s.volumes.push(VolumeMount {
            target: PathBuf::from("/cache"),
            source: VolumeSource::Tmpfs { size: 1 << 20 },
        });
        s
    }

    fn host() -> HostView {
        HostView {
            system_dirs: vec![
                ("/usr", SystemDir::Dir),
                ("/bin", SystemDir::Symlink("usr/bin".into())),
                ("/lib32", SystemDir::Absent),
            ],
            etc: vec![
                (
                    PathBuf::from("ld.so.cache"),
                    EtcItem::File {
                        contents: b"x".to_vec(),
                        mode: 0o644,
                    },
                ),
                (PathBuf::from("alternatives"), EtcItem::BoundDir),
            ],
            dev_nodes: vec!["null", "zero"],
            proc_read_only: vec!["sys", "sysrq-trigger"],
            proc_masked_files: vec!["kcore"],
            proc_masked_dirs: vec!["acpi"],
            system_roots: Vec::new(),
            user_ns_limits: vec![
                ("max_inotify_instances", 128),
                ("max_inotify_watches", 65536),
            ],
        }
    }

    /// The invoking user's limits the tests start from (message queues unlimited).
    const RLIMITS: &[(UserQuota, Option<u64>)] = &[
        (UserQuota::SigPending, Some(96_551)),
        (UserQuota::MsgQueue, None),
        (UserQuota::Memlock, Some(8 << 20)),
    ];

    /// Runs the whole start choreography (helper, then init) against the recorder.
    fn recorded(mode: WorkspaceMode) -> Vec<Effect> {
        recorded_with(mode, cgroup::Version::V1, false)
    }

    fn recorded_with(
        mode: WorkspaceMode,
        version: cgroup::Version,
        born_in_v2: bool,
    ) -> Vec<Effect> {
        let maps = idmap::choose(0, 0, Some("root"), None, None).unwrap();
        recorded_as(mode, (version, born_in_v2), &maps, true)
    }

    /// The choreography for an invoker with `maps` (`is_root`: the helper runs as root).
    fn recorded_as(
        mode: WorkspaceMode,
        (version, born_in_v2): (cgroup::Version, bool),
        maps: &idmap::IdMaps,
        is_root: bool,
    ) -> Vec<Effect> {
        let s = spec(mode);
        let base = match version {
            cgroup::Version::V1 => "/sys/fs/cgroup/pids",
            cgroup::Version::V2 => "/sys/fs/cgroup",
        };
        let layout = cgroup::Layout {
            pids: Some(cgroup::Home {
                version,
                base: base.into(),
            }),
            memory: None,
            cpu: None,
            v2: (version == cgroup::Version::V2).then(|| (PathBuf::from(base), Vec::new())),
            not_writable: Vec::new(),
        };
        let cg = cgroup::plan(&layout, &s.name, 1024, (None, None), false).unwrap();
        let mut k = Recorder::default();
        for (_, e) in helper_effects_before_clone(&cg, is_root, RLIMITS)
            .into_iter()
            .chain(helper_effects_after_clone(42, maps, &cg, born_in_v2))
            .chain(init_effects(
                &s,
                &host(),
                Path::new("/state/box/root"),
                (&cg.v1, maps.via_setuid_helpers),
            ))
        {
            k.apply(&e).unwrap();
        }
        k.effects
    }

    fn position(effects: &[Effect], f: impl Fn(&Effect) -> bool) -> usize {
        effects
            .iter()
            .position(f)
            .unwrap_or_else(|| panic!("effect not found"))
    }

    fn is_mount(e: &Effect) -> bool {
        matches!(
            e,
            Effect::Mount { .. }
                | Effect::Remount { .. }
                | Effect::MakeMountsPrivate
                | Effect::PivotRoot(_)
        )
    }

    /// An invoker who is not root cannot shed its groups before the clone: newgidmap writes
    /// the maps (no `deny` first, or setgroups could never be called), and the init sheds
    /// them once released, before anything else.
    #[test]
    fn an_unprivileged_invoker_s_groups_are_shed_by_the_init() {
        let maps = idmap::choose(
            1001,
            1002,
            Some("dev"),
            Some("dev:300000:65536\n"),
            Some("dev:300000:65536\n"),
        )
        .unwrap();
        assert!(maps.via_setuid_helpers);
        let fx = recorded_as(
            WorkspaceMode::Copy,
            (cgroup::Version::V1, false),
            &maps,
            false,
        );
        assert!(!fx.iter().any(|e| matches!(e, Effect::DenySetgroups { .. })));
        let release = position(&fx, |e| matches!(e, Effect::AwaitRelease));
        assert_eq!(fx[release + 1], Effect::ClearSupplementaryGroups);
        assert_eq!(
            fx.iter()
                .filter(|e| matches!(e, Effect::ClearSupplementaryGroups))
                .count(),
            1
        );
        // As root, the helper sheds them before the clone and `deny` stays.
        let fx = recorded(WorkspaceMode::Copy);
        let shed = position(&fx, |e| matches!(e, Effect::ClearSupplementaryGroups));
        assert!(shed < position(&fx, |e| matches!(e, Effect::DenySetgroups { .. })));
        assert!(shed < position(&fx, |e| matches!(e, Effect::AwaitRelease)));
    }

    #[test]
    fn uid_and_gid_maps_are_written_before_any_mount_and_setgroups_is_denied_first() {
        let fx = recorded(WorkspaceMode::Copy);
        let deny = position(&fx, |e| matches!(e, Effect::DenySetgroups { .. }));
        let uid = position(&fx, |e| {
            matches!(
                e,
                Effect::WriteIdMap {
                    kind: IdKind::Uid,
                    ..
                }
            )
        });
        let gid = position(&fx, |e| {
            matches!(
                e,
                Effect::WriteIdMap {
                    kind: IdKind::Gid,
                    ..
                }
            )
        });
        let release = position(&fx, |e| matches!(e, Effect::AwaitRelease));
        let first_mount = position(&fx, is_mount);
        assert!(deny < gid && uid < release && gid < release && release < first_mount);
    }

    #[test]
    fn the_parent_death_signal_is_set_again_after_every_id_change_of_the_init() {
        let fx = recorded(WorkspaceMode::Copy);
        let last_ids = fx
            .iter()
            .rposition(|e| matches!(e, Effect::SetIds { .. }))
            .unwrap();
        let last_pdeath = fx
            .iter()
            .rposition(|e| matches!(e, Effect::SetParentDeathSignal))
            .unwrap();
        assert!(last_ids < last_pdeath);
        assert_eq!(
            fx[0..]
                .iter()
                .position(|e| matches!(e, Effect::SetParentDeathSignal))
                .unwrap(),
            position(&fx, |e| matches!(e, Effect::AwaitRelease)) - 1
        );
    }

    #[test]
    fn the_init_joins_a_v1_cgroup_itself_before_anything_else() {
        let fx = recorded(WorkspaceMode::Copy);
        let create = position(&fx, |e| matches!(e, Effect::CgroupCreate(_)));
        let limit = position(&fx, |e| matches!(e, Effect::CgroupWrite { .. }));
        let release = position(&fx, |e| matches!(e, Effect::AwaitRelease));
        let join = position(&fx, |e| {
            *e == Effect::CgroupJoinSelf("/sys/fs/cgroup/pids/capgate/box".into())
        });
        assert!(
            create < limit && limit < release && join == release + 1,
            "{fx:?}"
        );
        assert!(
            !fx.iter()
                .any(|e| matches!(e, Effect::CgroupAddProcess { .. }))
        );
    }

    #[test]
    fn an_init_born_into_its_v2_cgroup_is_not_moved_again() {
        let fx = recorded_with(WorkspaceMode::Copy, cgroup::Version::V2, true);
        assert!(fx.iter().any(|e| matches!(e, Effect::CgroupWrite { .. })));
        assert!(!fx.iter().any(|e| matches!(
            e,
            Effect::CgroupAddProcess { .. } | Effect::CgroupJoinSelf(_)
        )));
    }

    #[test]
    fn the_helper_adds_the_init_to_a_v2_cgroup_before_it_is_released() {
        let fx = recorded_with(WorkspaceMode::Copy, cgroup::Version::V2, false);
        let limit = position(&fx, |e| matches!(e, Effect::CgroupWrite { .. }));
        let join = position(&fx, |e| {
            matches!(e, Effect::CgroupAddProcess { pid: 42, .. })
        });
        let release = position(&fx, |e| matches!(e, Effect::AwaitRelease));
        assert!(limit < join && join < release, "{fx:?}");
        assert!(!fx.iter().any(|e| matches!(e, Effect::CgroupJoinSelf(_))));
    }

    #[test]
    fn mounts_are_private_before_anything_is_mounted_and_pivot_comes_after_all_mounts() {
        let fx = recorded(WorkspaceMode::Copy);
        let private = position(&fx, |e| matches!(e, Effect::MakeMountsPrivate));
        assert_eq!(private, position(&fx, is_mount));
        let pivot = position(&fx, |e| matches!(e, Effect::PivotRoot(_)));
        let last_mount = fx
            .iter()
            .rposition(|e| matches!(e, Effect::Mount { .. } | Effect::Remount { .. }))
            .unwrap();
        assert!(last_mount < pivot);
        // The last remount before pivot makes the root read-only.
        assert_eq!(
            fx[last_mount],
            Effect::Remount {
                target: "/state/box/root".into(),
                flags: MsFlags::MS_RDONLY | NOSUID_NODEV
            }
        );
    }

    #[test]
    fn listeners_exist_before_any_hardening_and_seccomp_is_last_with_nnp_before_it() {
        let fx = recorded(WorkspaceMode::Copy);
        let lo = position(&fx, |e| matches!(e, Effect::LoopbackUp));
        let last_listen = fx
            .iter()
            .rposition(|e| matches!(e, Effect::Listen(_)))
            .unwrap();
        let pivot = position(&fx, |e| matches!(e, Effect::PivotRoot(_)));
        let nnp = position(&fx, |e| matches!(e, Effect::NoNewPrivs));
        let landlock = position(&fx, |e| matches!(e, Effect::PrepareLandlock(_)));
        let bounding = position(&fx, |e| matches!(e, Effect::DropBoundingSet));
        let limit = position(&fx, |e| matches!(e, Effect::LimitCapabilities { .. }));
        let seccomp = position(&fx, |e| matches!(e, Effect::Seccomp));
        assert!(pivot < lo && lo < last_listen && last_listen < bounding);
        assert!(nnp < landlock && landlock < limit && nnp < seccomp);
        assert_eq!(seccomp, fx.len() - 1, "seccomp is the init's last effect");
    }

    #[test]
    fn a_command_drops_everything_and_seccomp_is_the_last_effect_before_exec() {
        let fx = command_effects(
            &["true".into()],
            &[],
            User::Agent,
            Path::new("/"),
            [5, 6, 7],
            None,
        );
        let n = fx.len();
        assert!(matches!(fx[n - 1], Effect::Exec { .. }));
        assert_eq!(fx[n - 2], Effect::Seccomp);
        let ids = position(&fx, |e| {
            matches!(
                e,
                Effect::SetIds {
                    uid: 1000,
                    gid: 1000
                }
            )
        });
        let raise = position(&fx, |e| matches!(e, Effect::RaiseSetIdCapabilities));
        let clear = position(&fx, |e| matches!(e, Effect::ClearCapabilities));
        let stdio = position(&fx, |e| matches!(e, Effect::Stdio(_)));
        let landlock = position(&fx, |e| matches!(e, Effect::EnterLandlock));
        assert!(landlock < ids);
        let cloexec = position(&fx, |e| matches!(e, Effect::CloseOnExecFrom3));
        assert!(raise < ids && ids < clear && clear < n - 2);
        assert!(stdio < cloexec && fx[0] == Effect::NewSession);
        assert!(
            !fx.iter()
                .any(|e| matches!(e, Effect::ControllingTerminal(_)))
        );
        let root = command_effects(
            &["true".into()],
            &[],
            User::Root,
            Path::new("/"),
            [0, 1, 2],
            None,
        );
        assert!(root.contains(&Effect::SetIds { uid: 0, gid: 0 }));
        assert!(
            root.contains(&Effect::ClearCapabilities),
            "root inside keeps no capability either"
        );
    }

    /// A command given a terminal makes it its session's controlling terminal once it is
    /// on its stdio: after `setsid` and `dup2`, before it drops its identity.
    #[test]
    fn a_command_with_a_terminal_takes_it_as_controlling_terminal_of_its_new_session() {
        let fx = command_effects(
            &["sh".into()],
            &[],
            User::Agent,
            Path::new("/"),
            [5, 6, 7],
            Some(0),
        );
        let session = position(&fx, |e| matches!(e, Effect::NewSession));
        let stdio = position(&fx, |e| matches!(e, Effect::Stdio(_)));
        let ctty = position(&fx, |e| *e == Effect::ControllingTerminal(0));
        let ids = position(&fx, |e| matches!(e, Effect::SetIds { .. }));
        assert!(session < stdio && stdio < ctty && ctty < ids, "{fx:?}");
    }

    #[test]
    fn every_bind_of_a_host_path_is_read_only_except_the_granted_writable_ones() {
        for mode in [WorkspaceMode::Copy, WorkspaceMode::Mount] {
            let fx = recorded(mode);
            let root = Path::new("/state/box/root");
            for (i, e) in fx.iter().enumerate() {
                let Effect::Mount {
                    source: Some(src),
                    target,
                    fstype: None,
                    ..
                } = e
                else {
                    continue;
                };
                if src.starts_with(root) {
                    continue; // binds within the new root (/proc masks) are not host paths
                }
                let Effect::Remount { target: t, flags } = &fx[i + 1] else {
                    panic!("bind of {} is not followed by its remount", src.display())
                };
                assert_eq!(t, target);
                assert!(flags.contains(MsFlags::MS_NOSUID), "{}", src.display());
                // A copy workspace's host directory is bound only as the overlay's lower
                // layer, which nothing writes.
                let writable = match mode {
                    WorkspaceMode::Copy => vec![Path::new("/state/cache")],
                    WorkspaceMode::Mount => vec![Path::new("/src/proj"), Path::new("/state/cache")],
                };
                assert_eq!(
                    flags.contains(MsFlags::MS_RDONLY),
                    !writable.contains(&src.as_path()),
                    "{}",
                    src.display()
                );
                if !src.starts_with("/dev") {
                    assert!(flags.contains(MsFlags::MS_NODEV), "{}", src.display());
                }
            }
        }
    }

    #[test]
    fn only_reviewed_host_paths_are_bound() {
        let fx = recorded(WorkspaceMode::Mount);
        let root = Path::new("/state/box/root");
        let allowed: Vec<PathBuf> = SYSTEM_DIRS
            .iter()
            .map(|e| PathBuf::from(e.path))
            .chain(DEV_NODES.iter().map(|e| Path::new("/dev").join(e.path)))
            .chain(HOST_ETC.iter().map(|e| Path::new("/etc").join(e.path)))
            .chain([PathBuf::from("/src/proj"), PathBuf::from("/state/cache")])
            .collect();
        for e in &fx {
            if let Effect::Mount {
                source: Some(src),
                fstype: None,
                ..
            } = e
            {
                assert!(
                    src.starts_with(root) || allowed.contains(src),
                    "unreviewed bind of {}",
                    src.display()
                );
            }
        }
    }

    /// Under an exec allowlist the init watches execs: it keeps what reading a command
    /// needs permitted (not effective: `LimitCapabilities` empties that set) and installs
    /// the notifier after that and before its own seccomp programs, so every command it
    /// forks inherits both filters. Without a list, neither.
    #[test]
    fn the_init_watches_execs_under_an_exec_allowlist_only() {
        let effects = |s: &SandboxSpec| -> Vec<Effect> {
            init_effects(s, &host(), Path::new("/state/box/root"), (&[], false))
                .into_iter()
                .map(|(_, e)| e)
                .collect()
        };
        let permitted = |fx: &[Effect]| {
            fx.iter()
                .find_map(|e| match e {
                    Effect::LimitCapabilities { permitted } => Some(permitted.clone()),
                    _ => None,
                })
                .unwrap()
        };
        let mut s = spec(WorkspaceMode::Copy);
        let fx = effects(&s);
        assert!(!fx.contains(&Effect::WatchExecs));
        assert_eq!(
            permitted(&fx),
            [caps::Capability::CAP_SETUID, caps::Capability::CAP_SETGID]
        );
        s.exec_only = Some(vec!["/usr/bin/python3".into()]);
        let fx = effects(&s);
        let limit = position(&fx, |e| matches!(e, Effect::LimitCapabilities { .. }));
        let watch = position(&fx, |e| *e == Effect::WatchExecs);
        let seccomp = position(&fx, |e| *e == Effect::Seccomp);
        assert!(limit < watch && watch < seccomp, "{fx:#?}");
        let p = permitted(&fx);
        assert!(
            crate::execwatch::READ_CAPS.iter().all(|c| p.contains(c)),
            "{p:?}"
        );
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn home_is_noexec_and_the_copy_workspace_is_an_overlay_on_the_state_dir() {
        let fx = recorded(WorkspaceMode::Copy);
        let home = fx.iter().find_map(|e| match e {
            Effect::Mount {
                target,
                flags,
                data,
                ..
            } if target.ends_with("home/agent") => Some((*flags, data.clone())),
            _ => None,
        });
        let (flags, data) = home.unwrap();
        assert!(flags.contains(MsFlags::MS_NOEXEC));
        assert!(data.unwrap().contains("uid=1000"));
        // The overlay's options name no host path (the workload reads them in its
        // mountinfo): the host directory is bound into the state directory, which becomes
        // the current directory, and the layers are named relative to it.
        let overlay = position(&fx, |e| {
            matches!(e,
                Effect::Mount { fstype: Some("overlay"), data: Some(d), .. }
                    if d == "lowerdir=lower,upperdir=upper,workdir=work,userxattr")
        });
        let lower = position(&fx, |e| {
            matches!(e,
                Effect::Mount { source: Some(s), target, fstype: None, .. }
                    if s == Path::new("/src/proj") && target == Path::new("/state/box/lower"))
        });
        let cwd = position(
            &fx,
            |e| matches!(e, Effect::Chdir(d) if d == Path::new("/state/box")),
        );
        assert!(lower < cwd && cwd < overlay, "{fx:#?}");
        assert!(
            !fx[cwd + 1..overlay]
                .iter()
                .any(|e| matches!(e, Effect::Chdir(_) | Effect::PivotRoot(_))),
            "{fx:#?}"
        );
    }

    #[test]
    fn volume_mount_points_are_created_parents_first_and_owned_by_the_agent_in_home() {
        let fx = recorded(WorkspaceMode::Copy);
        // Every volume step goes through descriptors beneath the root.
        let beneath = |e: &Effect| match e {
            Effect::Beneath { root, inner } => {
                assert_eq!(root, Path::new("/state/box/root"));
                Some(inner.as_ref().clone())
            }
            _ => None,
        };
        let cache = position(
            &fx,
            |e| matches!(beneath(e), Some(Effect::MakeDir { path, owner: Some((1000, 1000)), .. }) if path.ends_with("home/agent/.cache")),
        );
        let tools = position(
            &fx,
            |e| matches!(beneath(e), Some(Effect::MakeDir { path, .. }) if path.ends_with("home/agent/.cache/tools")),
        );
        let tools_mount = position(
            &fx,
            |e| matches!(beneath(e), Some(Effect::Mount { target, .. }) if target.ends_with("home/agent/.cache/tools")),
        );
        let home_mount = position(
            &fx,
            |e| matches!(e, Effect::Mount { target, .. } if target.ends_with("home/agent")),
        );
        assert!(home_mount < cache && cache < tools && tools < tools_mount);
        assert!(fx.iter().any(|e| matches!(beneath(e), Some(Effect::MakeDir { path, owner: None, .. }) if path.ends_with("root/cache"))));
        // No volume step is applied by plain path.
        assert!(!fx.iter().any(|e| matches!(e, Effect::MakeDir { path, .. } if path.ends_with("home/agent/.cache/tools"))));
    }

    #[test]
    fn landlock_grants_writes_only_beneath_the_writable_places_and_connect_only_to_tcp_listeners() {
        let mut s = spec(WorkspaceMode::Copy);
        s.writable.push(PathBuf::from("/opt/extra"));
        // A read-only volume is no write grant.
        s.volumes.push(VolumeMount {
            target: PathBuf::from("/home/agent/.skills"),
            source: VolumeSource::HostDir {
                path: "/store".into(),
                identity: (1, 2),
                writable: false,
            },
        });
        let rules = landlock_rules(&s);
        let roots: Vec<&str> = rules
            .write_roots
            .iter()
            .map(|p| p.to_str().unwrap())
            .collect();
        assert_eq!(
            roots,
            [
                "/home/agent",
                "/tmp",
                "/dev/shm",
                "/home/agent/workspace",
                "/home/agent/.cache/tools",
                "/cache",
                "/opt/extra"
            ]
        );
        assert_eq!(rules.tcp_connect_ports, vec![3128]);
        assert!(rules.write_files.contains(&PathBuf::from("/dev/null")));
    }

    /// A pack's write-only places replace every other write grant; the missing parts of
    /// each are made beneath their writable mount, after it is mounted and before the root
    /// turns read-only; validation refuses a place beneath no writable mount.
    #[test]
    fn write_only_places_are_made_and_are_the_only_write_grants() {
        let mut s = spec(WorkspaceMode::Copy);
        s.write_only = Some(vec![
            PathBuf::from("/home/agent/workspace/out/reports"),
            PathBuf::from("/tmp"),
        ]);
        s.validate().unwrap();
        let rules = landlock_rules(&s);
        assert_eq!(
            rules.write_roots,
            [
                PathBuf::from("/home/agent/workspace/out/reports"),
                PathBuf::from("/tmp")
            ]
        );
        let fx: Vec<Effect> = init_effects(&s, &host(), Path::new("/state/box/root"), (&[], false))
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        let ensured: Vec<(usize, PathBuf)> = fx
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Effect::Beneath { inner, .. } => match inner.as_ref() {
                    Effect::EnsureDir { path, owner } => {
                        assert_eq!(*owner, (1000, 1000));
                        Some((i, path.clone()))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert_eq!(
            ensured.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
            [
                PathBuf::from("/state/box/root/home/agent/workspace/out"),
                PathBuf::from("/state/box/root/home/agent/workspace/out/reports"),
            ],
            "parents first, nothing for /tmp (a mount of its own)"
        );
        // The place is bound over itself; the mounts it does not cover turn read-only.
        let inner = |e: &Effect| match e {
            Effect::Beneath { inner, .. } => Some(inner.as_ref().clone()),
            _ => None,
        };
        let place = PathBuf::from("/state/box/root/home/agent/workspace/out/reports");
        let bound = position(&fx, |e| {
            matches!(inner(e), Some(Effect::Mount { source: Some(s), target, flags, .. })
                if s == place && target == place && flags.contains(MsFlags::MS_BIND))
        });
        let read_only: Vec<PathBuf> = fx
            .iter()
            .filter_map(|e| match inner(e) {
                Some(Effect::Remount { target, flags }) if flags.contains(MsFlags::MS_RDONLY) => {
                    Some(target)
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            read_only,
            [
                PathBuf::from("/state/box/root/home/agent/workspace"),
                PathBuf::from("/state/box/root/home/agent"),
                PathBuf::from("/state/box/root/dev/shm"),
                PathBuf::from("/state/box/root/home/agent/.cache/tools"),
                PathBuf::from("/state/box/root/cache"),
            ],
            "/tmp is a place: it stays writable"
        );
        let first_read_only = position(
            &fx,
            |e| matches!(inner(e), Some(Effect::Remount { flags, .. }) if flags.contains(MsFlags::MS_RDONLY)),
        );
        assert!(
            bound < first_read_only,
            "bound while its mount is still writable"
        );
        let overlay = position(&fx, |e| {
            matches!(
                e,
                Effect::Mount {
                    fstype: Some("overlay"),
                    ..
                }
            )
        });
        let read_only_root = position(
            &fx,
            |e| matches!(e, Effect::Remount { target, flags } if target == Path::new("/state/box/root") && flags.contains(MsFlags::MS_RDONLY)),
        );
        assert!(
            ensured
                .iter()
                .all(|(i, _)| overlay < *i && *i < read_only_root)
        );

        for bad in ["/usr/local/out", "/etc/x", "/home/other"] {
            let mut s = spec(WorkspaceMode::Copy);
            s.write_only = Some(vec![PathBuf::from(bad)]);
            assert!(s.validate().is_err(), "{bad}");
        }
        let mut s = spec(WorkspaceMode::Copy);
        s.write_only = Some(vec![PathBuf::from("/home/agent/workspace/../x")]);
        assert!(s.validate().is_err());
    }

    /// A read list mounts the workspace outside the new root and shows it through a
    /// tmpfs view: each read path bound read-only, each write place within the workspace
    /// bound writable (and not made or bound again by the write-place steps); validation
    /// keeps read paths inside the workspace.
    #[test]
    fn a_read_list_shows_the_workspace_through_a_view() {
        let mut s = spec(WorkspaceMode::Copy);
        s.workspace_read = Some(vec![
            PathBuf::from("/home/agent/workspace/inputs/raw"),
            PathBuf::from("/home/agent/workspace/README.md"),
        ]);
        s.write_only = Some(vec![
            PathBuf::from("/home/agent/workspace/out"),
            PathBuf::from("/tmp"),
        ]);
        s.validate().unwrap();
        let fx: Vec<Effect> = init_effects(&s, &host(), Path::new("/state/box/root"), (&[], false))
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        let overlay = position(
            &fx,
            |e| matches!(e, Effect::Mount { fstype: Some("overlay"), target, .. } if target == Path::new("/state/box/view")),
        );
        let view = position(
            &fx,
            |e| matches!(e, Effect::Mount { fstype: Some("tmpfs"), target, .. } if target == Path::new("/state/box/root/home/agent/workspace")),
        );
        let shown: Vec<(PathBuf, bool)> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::BindView {
                    from,
                    rel,
                    view,
                    writable,
                    owner,
                } => {
                    assert_eq!(from, Path::new("/state/box/view"));
                    assert_eq!(view, Path::new("/state/box/root/home/agent/workspace"));
                    assert_eq!(*owner, (1000, 1000));
                    Some((rel.clone(), *writable))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            shown,
            [
                (PathBuf::from("README.md"), false),
                (PathBuf::from("out"), true),
                (PathBuf::from("inputs/raw"), false),
            ]
        );
        let first_bind = position(&fx, |e| matches!(e, Effect::BindView { .. }));
        assert!(overlay < view && view < first_bind);
        // The write place in the view is neither made nor bound by the write-place steps.
        assert!(!fx.iter().any(|e| matches!(e, Effect::Beneath { inner, .. }
            if matches!(inner.as_ref(), Effect::EnsureDir { path, .. } if path.ends_with("out")))));
        let mut outside = spec(WorkspaceMode::Copy);
        outside.workspace_read = Some(vec![PathBuf::from("/etc")]);
        assert!(outside.validate().is_err());
        outside.workspace_read = Some(vec![PathBuf::from("/home/agent/workspace")]);
        assert!(outside.validate().is_err());
    }

    #[test]
    fn commands_get_only_the_sandbox_environment() {
        let env = command_env(
            &[("A".into(), "1".into()), ("PATH".into(), "/x".into())],
            &[("A".into(), "2".into())],
        );
        assert_eq!(
            env,
            vec![
                ("A".to_string(), "2".to_string()),
                ("PATH".to_string(), "/x".to_string())
            ]
        );
        assert_eq!(exec_candidates("sh", &env), vec![PathBuf::from("/x/sh")]);
        assert_eq!(exec_candidates("./a", &env), vec![PathBuf::from("./a")]);
        assert_eq!(exec_candidates("sh", &[]).len(), 3);
    }

    #[test]
    fn generated_etc_has_the_agent_and_the_gateway_resolver() {
        let mut s = spec(WorkspaceMode::Copy);
        s.etc.trusted_ca = "CAPGATE PEM\n".into();
        s.etc.shell = PathBuf::from("/bin/bash");
        let mut h = host();
        h.system_roots = b"SYSTEM PEM".to_vec();
        let files = generated_etc(&s, &h);
        let get = |name: &str| {
            files
                .iter()
                .find(|(p, _, _)| p == Path::new(name))
                .map(|(_, c, _)| String::from_utf8_lossy(c).into_owned())
                .unwrap()
        };
        assert!(get("passwd").contains("agent:x:1000:1000:agent:/home/agent:/bin/bash"));
        assert_eq!(get("resolv.conf"), "nameserver 127.0.0.1\n");
        assert_eq!(
            get("ssl/certs/ca-certificates.crt"),
            "SYSTEM PEM\nCAPGATE PEM\n"
        );
        // Neither roots nor a CA of capgate's: no bundle at all.
        s.etc.trusted_ca.clear();
        assert!(
            !generated_etc(&s, &host())
                .iter()
                .any(|(p, _, _)| p.starts_with("ssl"))
        );
        assert!(get("hosts").contains("127.0.1.1\tbox"));
    }

    #[test]
    fn host_view_copies_only_world_readable_reviewed_etc_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir_all(etc.join("ssl")).unwrap();
        std::fs::create_dir_all(etc.join("alternatives")).unwrap();
        std::fs::write(etc.join("ld.so.cache"), "cache").unwrap();
        std::fs::write(etc.join("shadow"), "secret").unwrap();
        std::fs::write(etc.join("services"), "private").unwrap();
        std::fs::set_permissions(etc.join("services"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::write(etc.join("ssl/openssl.cnf"), "cnf").unwrap();
        std::os::unix::fs::symlink("/usr/bin/mawk", etc.join("alternatives/awk")).unwrap();
        std::fs::write(etc.join("alternatives/README"), "public").unwrap();
        std::fs::create_dir_all(etc.join("ld.so.conf.d")).unwrap();
        std::fs::write(etc.join("ld.so.conf.d/public.conf"), "/opt/lib").unwrap();
        std::fs::write(etc.join("ld.so.conf.d/private.conf"), "/secret").unwrap();
        std::fs::set_permissions(
            etc.join("ld.so.conf.d/private.conf"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("usr/bin", dir.path().join("bin")).unwrap();
        std::fs::create_dir(dir.path().join("usr")).unwrap();
        let view = HostView::read_from(dir.path());
        let names: Vec<String> = view
            .etc
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "ld.so.cache",
                "ld.so.conf.d",
                "ld.so.conf.d/public.conf",
                "alternatives",
                "ssl",
                "ssl/openssl.cnf"
            ]
        );
        // A directory of links and public files is bound whole; one holding a private file
        // is copied, without it.
        let kind = |name: &str| view.etc.iter().find(|(p, _)| p == Path::new(name)).unwrap();
        assert_eq!(kind("alternatives").1, EtcItem::BoundDir);
        assert_eq!(kind("ld.so.conf.d").1, EtcItem::Dir);
        assert!(
            view.system_dirs
                .contains(&("/bin", SystemDir::Symlink("usr/bin".into())))
        );
        assert!(view.system_dirs.contains(&("/usr", SystemDir::Dir)));
        assert!(view.system_dirs.contains(&("/lib32", SystemDir::Absent)));
    }

    /// The sandbox's users share the invoking user's per-user quotas: the rlimits are
    /// lowered to half before the user namespace exists (which keeps them as its bound),
    /// and the namespace's own counts are set to a quarter per user while /proc/sys is
    /// writable and the init still holds its capabilities.
    #[test]
    fn per_user_quotas_are_shared_not_handed_over() {
        let fx = recorded(WorkspaceMode::Copy);
        let lowered: Vec<(UserQuota, u64)> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::LowerRlimit { quota, limit } => Some((*quota, *limit)),
                _ => None,
            })
            .collect();
        assert_eq!(
            lowered,
            [
                (UserQuota::SigPending, 48_275),
                (UserQuota::MsgQueue, 819_200),
                (UserQuota::Memlock, 4 << 20),
            ]
        );
        let last_rlimit = fx
            .iter()
            .rposition(|e| matches!(e, Effect::LowerRlimit { .. }))
            .unwrap();
        let first_init = position(&fx, |e| matches!(e, Effect::SetParentDeathSignal));
        assert!(last_rlimit < first_init, "before the clone");
        let limit = |name: &str| {
            position(&fx, |e| {
                matches!(e, Effect::UserNamespaceLimit { file, value }
                    if *file == Path::new("/state/box/root/proc/sys/user").join(name)
                        && *value == if name == "max_inotify_instances" { 32 } else { 16384 })
            })
        };
        let proc_mount = position(&fx, |e| {
            matches!(
                e,
                Effect::Mount {
                    fstype: Some("proc"),
                    ..
                }
            )
        });
        let proc_sys_read_only = position(
            &fx,
            |e| matches!(e, Effect::Remount { target, .. } if target.ends_with("proc/sys")),
        );
        let caps_dropped = position(&fx, |e| matches!(e, Effect::DropBoundingSet));
        for name in ["max_inotify_instances", "max_inotify_watches"] {
            let at = limit(name);
            assert!(
                proc_mount < at && at < proc_sys_read_only && at < caps_dropped,
                "{name}"
            );
        }
        // A limit of 0 or 1 (a user allowed no locked memory) stays at or below itself.
        assert_eq!(rlimit_share(Some(0), 10), 0);
        assert_eq!(rlimit_share(Some(1), 10), 0);
        assert_eq!(rlimit_share(Some(100), 10), 10);
        assert_eq!(rlimit_share(None, 10), 10);
        assert_eq!(user_ns_share(3), 1);
    }

    /// The init makes its cgroup namespace once it is in its cgroups (v1: joined; v2: born
    /// there), so /proc/self/cgroup inside shows `/`, never a host path.
    #[test]
    fn the_cgroup_namespace_is_made_inside_the_sandboxs_cgroups() {
        let fx = recorded(WorkspaceMode::Copy);
        // The cgroup namespace is made once the init is in its cgroups.
        let joined = fx
            .iter()
            .rposition(|e| matches!(e, Effect::CgroupJoinSelf(_)))
            .unwrap();
        let cgroup_ns = position(&fx, |e| matches!(e, Effect::NewCgroupNamespace));
        assert!(
            joined < cgroup_ns && cgroup_ns < position(&fx, |e| matches!(e, Effect::PivotRoot(_)))
        );
    }
}
