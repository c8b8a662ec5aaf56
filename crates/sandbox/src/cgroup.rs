//! pids, memory and CPU limits through cgroup v1 or v2, whichever hierarchy has the
//! controller.
//!
//! Placement:
//! - v1: `<controller mount>/<the caller's own cgroup>/capgate/<name>`, one directory per
//!   controller. Nesting under the caller's cgroup keeps whatever limits the caller already
//!   runs under (a systemd service's, a CI job's) as an outer bound.
//! - v2: `<cgroup2 mount>/capgate/<name>`, with the controllers it needs (`+pids +memory +cpu`) enabled in the root's and
//!   `capgate`'s `cgroup.subtree_control`. (Not under the caller's own cgroup: v2 forbids
//!   enabling controllers for children of a cgroup that has processes.)
//!
//! The helper writes the limits, then puts the sandbox's init in the cgroup before the init
//! does anything, so every process of the sandbox is counted. After the init exits the
//! helper removes the directories.

use std::path::{Path, PathBuf};

/// Which cgroup version provides a controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// Where a controller's cgroups are created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Home {
    pub version: Version,
    /// Parent of `capgate/<name>`.
    pub base: PathBuf,
}

impl Home {
    /// `cgroup v1 at /sys/fs/cgroup/pids`, for reports.
    pub(crate) fn describe(&self) -> String {
        let version = match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        format!("cgroup {version} at {}", self.base.display())
    }
}

/// What the host offers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Layout {
    pub pids: Option<Home>,
    pub memory: Option<Home>,
    pub cpu: Option<Home>,
    /// The cgroup2 mount, if any, and the controllers it offers.
    pub v2: Option<(PathBuf, Vec<String>)>,
    /// Controllers whose hierarchy exists but where this user cannot make cgroups (set by
    /// [`Layout::keep_writable`]), with that hierarchy's base.
    pub not_writable: Vec<(&'static str, PathBuf)>,
}

impl Layout {
    /// What this host offers this user: [`detect`] on the live `cgroup.controllers` files,
    /// then [`Layout::keep_writable`].
    pub(crate) fn of_host(mountinfo: &str, self_cgroup: &str) -> Layout {
        let mut layout = detect(mountinfo, self_cgroup, |p| {
            std::fs::read_to_string(p.join("cgroup.controllers")).ok()
        });
        layout.keep_writable(writable);
        layout
    }

    /// Drops the controllers whose `<base>/capgate` (or, before it exists, `<base>`) this
    /// user cannot write: a hierarchy nobody delegated is as good as missing, and says so.
    pub(crate) fn keep_writable(&mut self, writable: impl Fn(&Path) -> bool) {
        for (controller, home) in [
            ("pids", &mut self.pids),
            ("memory", &mut self.memory),
            ("cpu", &mut self.cpu),
        ] {
            let Some(h) = home.as_ref() else { continue };
            let parent = h.base.join("capgate");
            let target = if parent.exists() {
                parent
            } else {
                h.base.clone()
            };
            if !writable(&target) {
                self.not_writable.push((controller, h.base.clone()));
                *home = None;
            }
        }
    }
}

/// One mount of `/proc/self/mountinfo` that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    root: String,
    point: PathBuf,
    fstype: String,
    options: Vec<String>,
}

pub(crate) fn unescape_mountinfo(field: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = field.get(i + 1..i + 4).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?.to_string();
            let _source = right.next()?;
            let options = right
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_string)
                .collect();
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                root: unescape_mountinfo(left.get(3)?),
                point: PathBuf::from(unescape_mountinfo(left.get(4)?)),
                fstype,
                options,
            })
        })
        .collect()
}

/// The caller's cgroup path for a v1 controller (`4:memory:/a/b` → `/a/b`).
fn own_v1_path(self_cgroup: &str, controller: &str) -> Option<String> {
    self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// `point` + (`own` relative to the mount's `root`).
fn join_own(mount: &CgroupMount, own: &str) -> PathBuf {
    let rel = own
        .strip_prefix(mount.root.as_str())
        .unwrap_or(own)
        .trim_start_matches('/');
    if rel.is_empty() {
        mount.point.clone()
    } else {
        mount.point.join(rel)
    }
}

/// Finds the homes of `pids`, `memory` and `cpu`. `v2_controllers` reads a cgroup2 mount's
/// `cgroup.controllers`.
pub(crate) fn detect(
    mountinfo: &str,
    self_cgroup: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Layout {
    let mounts = cgroup_mounts(mountinfo);
    let v2 = mounts.iter().find(|m| m.fstype == "cgroup2").map(|m| {
        let list = v2_controllers(&m.point)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>();
        (m.point.clone(), list)
    });
    let home = |controller: &str| -> Option<Home> {
        if let Some(mount) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == controller))
        {
            let own = own_v1_path(self_cgroup, controller).unwrap_or_else(|| "/".into());
            return Some(Home {
                version: Version::V1,
                base: join_own(mount, &own),
            });
        }
        let (point, list) = v2.as_ref()?;
        list.iter().any(|c| c == controller).then(|| Home {
            version: Version::V2,
            base: point.clone(),
        })
    };
    Layout {
        pids: home("pids"),
        memory: home("memory"),
        cpu: home("cpu"),
        v2,
        not_writable: Vec::new(),
    }
}

/// Why a controller is missing, and how to get it.
pub(crate) fn missing_explanation(layout: &Layout, controller: &str) -> String {
    if let Some((_, base)) = layout.not_writable.iter().find(|(c, _)| *c == controller) {
        return format!(
            "the `{controller}` cgroup hierarchy at {} is not writable by this user (uid {}); \
             have an administrator delegate a subtree (`mkdir {}/capgate && chown $USER {}/capgate`; \
             on systemd hosts, cgroup v2 with a delegated user slice), or pass --dangerously-skip-limits",
            base.display(),
            nix::unistd::geteuid(),
            base.display(),
            base.display()
        );
    }
    match &layout.v2 {
        Some((point, list)) if !list.is_empty() => format!(
            "no cgroup v1 hierarchy has `{controller}`, and the cgroup v2 hierarchy at {} offers only `{}`; \
             enable it (on systemd hosts it is on by default; otherwise add it to the parent's \
             cgroup.subtree_control), or pass --dangerously-skip-limits",
            point.display(),
            list.join(" ")
        ),
        Some((point, _)) => format!(
            "no cgroup v1 hierarchy has `{controller}`, and the cgroup v2 hierarchy at {} has no controllers \
             (a hybrid host whose controllers are all bound to v1, or a container without delegation); \
             mount the `{controller}` controller (v1) or boot with systemd.unified_cgroup_hierarchy=1, \
             or pass --dangerously-skip-limits",
            point.display()
        ),
        None => format!(
            "no cgroup filesystem with `{controller}` is mounted (is /sys/fs/cgroup mounted?); \
             mount cgroup2 on /sys/fs/cgroup, or pass --dangerously-skip-limits"
        ),
    }
}

/// Whether this process may create entries in `dir` (`access(W_OK)`).
fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// Removes the cgroups of sandbox `name` that a run killed together with its helper left
/// behind (the helper removes them otherwise). Only empty ones go: the kernel refuses to
/// remove a cgroup that still has processes. A helper that outlived its run is stopping
/// the sandbox and removes the cgroups itself within moments, so a busy one is waited for,
/// up to [`LEFTOVER_WAIT`]; then the refusal is returned, naming the directory, so that the
/// caller can leave the rest of the run for later. Found where this
/// process would make them: the v1 hierarchies nest under the caller's own cgroup, so a
/// run started from another cgroup is not found from here.
pub fn remove_leftover(name: &str) -> Result<(), String> {
    let layout = Layout::of_host(
        &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
        &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
    );
    for home in [&layout.pids, &layout.memory, &layout.cpu]
        .into_iter()
        .flatten()
    {
        let dir = sandbox_dir(home, name);
        let deadline = std::time::Instant::now() + LEFTOVER_WAIT;
        loop {
            match std::fs::remove_dir(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(format!("cannot remove the cgroup `{}`: {e}", dir.display()));
                }
            }
        }
    }
    Ok(())
}

/// How long [`remove_leftover`] waits for a cgroup to empty.
const LEFTOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The directory of sandbox `name` under a home.
pub(crate) fn sandbox_dir(home: &Home, name: &str) -> PathBuf {
    home.base.join("capgate").join(name)
}

/// One cgroup step, in order; the helper turns these into kernel effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Enable controllers for children of a v2 cgroup (`+pids +memory`).
    EnableControllers { dir: PathBuf, controllers: String },
    /// Create the sandbox's cgroup directory (and missing parents).
    Create(PathBuf),
    /// Write a limit.
    Write { file: PathBuf, value: String },
    /// Write the swap cap, if the file exists (it does not when swap accounting is off).
    WriteSwap { file: PathBuf, value: String },
}

/// The ops for a sandbox, and the directories to put the init into.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub ops: Vec<Op>,
    /// Every cgroup of the sandbox.
    pub dirs: Vec<PathBuf>,
    /// Those in v1 hierarchies: the init joins them itself, writing `0` to `tasks`. A
    /// single thread moving itself skips the kernel's global threadgroup lock, whose RCU
    /// grace period made the helper's `cgroup.procs` write take ~10 ms per start. The
    /// others (v2) get the init added by pid through `cgroup.procs`.
    pub v1: Vec<PathBuf>,
    /// Limits that could not be applied (only with `skip_unavailable`).
    pub warnings: Vec<String>,
}

/// A limit the host cannot apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missing {
    pub feature: String,
    pub explanation: String,
}

/// A controller to set up: its name, home and `(file, value)` limits.
type Wanted<'a> = (&'a str, &'a Home, Vec<(String, String)>);

/// The CFS period capgate uses for CPU limits: 100 ms, the kernel's default.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// The CFS quota per period for `millicpus` thousandths of a CPU (1500 = one and a half
/// CPUs' time per period), never below the kernel's minimum of 1 ms.
pub(crate) fn cpu_quota_us(millicpus: u32) -> u64 {
    (u64::from(millicpus) * (CPU_PERIOD_US / 1000)).max(1_000)
}

/// Plans the cgroup of sandbox `name`: `pids` processes, and `memory` bytes and
/// `millicpus` thousandths of a CPU when given.
pub(crate) fn plan(
    layout: &Layout,
    name: &str,
    pids: u32,
    (memory, millicpus): (Option<u64>, Option<u32>),
    skip_unavailable: bool,
) -> Result<Plan, Missing> {
    let mut out = Plan::default();
    let mut wanted: Vec<Wanted<'_>> = Vec::new();
    let mut missing = |controller: &str| -> Result<(), Missing> {
        let explanation = missing_explanation(layout, controller);
        let feature = format!("the `{controller}` cgroup controller");
        if skip_unavailable {
            out.warnings.push(format!(
                "WARNING: {controller} limit NOT enforced (--dangerously-skip-limits): {explanation}"
            ));
            Ok(())
        } else {
            Err(Missing {
                feature,
                explanation,
            })
        }
    };
    match &layout.pids {
        Some(home) => wanted.push(("pids", home, vec![("pids.max".into(), pids.to_string())])),
        None => missing("pids")?,
    }
    if let Some(limit) = memory {
        match &layout.memory {
            Some(home) => {
                let files = match home.version {
                    Version::V1 => vec![
                        ("memory.limit_in_bytes".into(), limit.to_string()),
                        ("memory.memsw.limit_in_bytes".into(), limit.to_string()),
                    ],
                    Version::V2 => vec![
                        ("memory.max".into(), limit.to_string()),
                        ("memory.swap.max".into(), "0".into()),
                    ],
                };
                wanted.push(("memory", home, files));
            }
            None => missing("memory")?,
        }
    }
    if let Some(millicpus) = millicpus {
        match &layout.cpu {
            Some(home) => {
                let quota = cpu_quota_us(millicpus);
                let files = match home.version {
                    Version::V1 => vec![
                        ("cpu.cfs_period_us".into(), CPU_PERIOD_US.to_string()),
                        ("cpu.cfs_quota_us".into(), quota.to_string()),
                    ],
                    Version::V2 => vec![("cpu.max".into(), format!("{quota} {CPU_PERIOD_US}"))],
                };
                wanted.push(("cpu", home, files));
            }
            None => missing("cpu")?,
        }
    }
    let v2_controllers: Vec<&str> = wanted
        .iter()
        .filter(|(_, home, _)| home.version == Version::V2)
        .map(|(c, _, _)| *c)
        .collect();
    if let (Some((point, _)), false) = (&layout.v2, v2_controllers.is_empty()) {
        let controllers = v2_controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        out.ops.push(Op::EnableControllers {
            dir: point.clone(),
            controllers: controllers.clone(),
        });
        out.ops.push(Op::Create(point.join("capgate")));
        out.ops.push(Op::EnableControllers {
            dir: point.join("capgate"),
            controllers,
        });
    }
    for (_, home, files) in &wanted {
        let dir = sandbox_dir(home, name);
        if !out.dirs.contains(&dir) {
            out.ops.push(Op::Create(dir.clone()));
            out.dirs.push(dir.clone());
            if home.version == Version::V1 {
                out.v1.push(dir.clone());
            }
        }
        for (file, value) in files {
            let path = dir.join(file);
            if file.contains("swap") || file.contains("memsw") {
                out.ops.push(Op::WriteSwap {
                    file: path,
                    value: value.clone(),
                });
            } else {
                out.ops.push(Op::Write {
                    file: path,
                    value: value.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// Swap from `/proc/meminfo` (`SwapTotal`), in kB.
pub(crate) fn swap_total_kb(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 30 0:28 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "8:pids:/\n4:memory:/process_api/abc\n0::/\n";
    const V2_ONLY: &str = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn hybrid_v1_nests_under_the_callers_cgroup() {
        let layout = detect(HYBRID, HYBRID_SELF, |_| Some(String::new()));
        assert_eq!(
            layout.memory,
            Some(Home {
                version: Version::V1,
                base: "/sys/fs/cgroup/memory/process_api/abc".into()
            })
        );
        let p = plan(&layout, "box", 1024, (Some(64 << 20), None), false).unwrap();
        assert_eq!(
            p.dirs,
            vec![
                PathBuf::from("/sys/fs/cgroup/pids/capgate/box"),
                PathBuf::from("/sys/fs/cgroup/memory/process_api/abc/capgate/box"),
            ]
        );
        assert!(
            p.ops.contains(&Op::WriteSwap {
                file:
                    "/sys/fs/cgroup/memory/process_api/abc/capgate/box/memory.memsw.limit_in_bytes"
                        .into(),
                value: (64u64 << 20).to_string(),
            })
        );
        // The limit is written before the swap cap (memsw must stay >= limit).
        let limit = p
            .ops
            .iter()
            .position(
                |o| matches!(o, Op::Write { file, .. } if file.ends_with("memory.limit_in_bytes")),
            )
            .unwrap();
        let swap = p
            .ops
            .iter()
            .position(|o| matches!(o, Op::WriteSwap { .. }))
            .unwrap();
        assert!(limit < swap);
    }

    #[test]
    fn v2_enables_controllers_and_caps_swap_to_zero() {
        let layout = detect(V2_ONLY, "0::/user.slice/x.scope\n", |_| {
            Some("cpu memory pids io\n".into())
        });
        let p = plan(&layout, "box", 100, (Some(1 << 30), None), false).unwrap();
        assert_eq!(p.dirs, vec![PathBuf::from("/sys/fs/cgroup/capgate/box")]);
        assert_eq!(
            p.ops[0],
            Op::EnableControllers {
                dir: "/sys/fs/cgroup".into(),
                controllers: "+pids +memory".into()
            }
        );
        assert!(p.ops.contains(&Op::WriteSwap {
            file: "/sys/fs/cgroup/capgate/box/memory.swap.max".into(),
            value: "0".into()
        }));
    }

    #[test]
    fn a_missing_controller_fails_with_an_explanation_unless_skipped() {
        let layout = detect(V2_ONLY, "0::/\n", |_| Some(String::new()));
        let err = plan(&layout, "box", 1024, (None, None), false).unwrap_err();
        assert!(
            err.explanation.contains("has no controllers"),
            "{}",
            err.explanation
        );
        assert!(err.explanation.contains("--dangerously-skip-limits"));
        let p = plan(&layout, "box", 1024, (Some(1), None), true).unwrap();
        assert_eq!(p.warnings.len(), 2);
        assert!(p.warnings[0].contains("NOT enforced"));
        assert!(p.dirs.is_empty());
    }

    #[test]
    fn memory_is_only_required_when_asked() {
        let layout = detect(
            "32 30 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n",
            "8:pids:/\n",
            |_| None,
        );
        assert!(plan(&layout, "b", 10, (None, None), false).is_ok());
        let err = plan(&layout, "b", 10, (Some(1), None), false).unwrap_err();
        assert!(
            err.explanation
                .contains("no cgroup filesystem with `memory`"),
            "{}",
            err.explanation
        );
    }

    const HYBRID_CPU: &str = "\
34 30 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn a_cpu_limit_is_a_cfs_quota_in_v1_and_cpu_max_in_v2() {
        let mounts = format!("{HYBRID}{HYBRID_CPU}");
        let layout = detect(&mounts, "2:cpu,cpuacct:/job\n8:pids:/\n", |_| None);
        let p = plan(&layout, "box", 64, (None, Some(1500)), false).unwrap();
        let dir = PathBuf::from("/sys/fs/cgroup/cpu/job/capgate/box");
        assert!(p.dirs.contains(&dir) && p.v1.contains(&dir), "{:?}", p.dirs);
        assert!(p.ops.contains(&Op::Write {
            file: dir.join("cpu.cfs_period_us"),
            value: "100000".into()
        }));
        assert!(p.ops.contains(&Op::Write {
            file: dir.join("cpu.cfs_quota_us"),
            value: "150000".into()
        }));

        let v2 = detect(V2_ONLY, "0::/\n", |_| Some("cpu memory pids\n".into()));
        let p = plan(&v2, "box", 64, (None, Some(250)), false).unwrap();
        assert_eq!(
            p.ops[0],
            Op::EnableControllers {
                dir: "/sys/fs/cgroup".into(),
                controllers: "+pids +cpu".into()
            }
        );
        assert!(p.ops.contains(&Op::Write {
            file: "/sys/fs/cgroup/capgate/box/cpu.max".into(),
            value: "25000 100000".into()
        }));
    }

    #[test]
    fn no_cpu_limit_asked_means_no_cpu_cgroup_and_no_cpu_requirement() {
        // A host without the cpu controller still runs sandboxes that ask for no CPU limit.
        let layout = detect(HYBRID, HYBRID_SELF, |_| None);
        assert_eq!(layout.cpu, None);
        let p = plan(&layout, "box", 64, (None, None), false).unwrap();
        assert!(
            !p.ops.iter().any(|o| format!("{o:?}").contains("cpu")),
            "{:?}",
            p.ops
        );
        // Asked for, it is refused with the reason, or skipped with a warning.
        let err = plan(&layout, "box", 64, (None, Some(1000)), false).unwrap_err();
        assert_eq!(err.feature, "the `cpu` cgroup controller");
        assert!(err.explanation.contains("`cpu`"), "{}", err.explanation);
        let p = plan(&layout, "box", 64, (None, Some(1000)), true).unwrap();
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("cpu limit NOT enforced")),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn cpu_quotas_round_and_respect_the_kernel_minimum() {
        assert_eq!(cpu_quota_us(1000), 100_000);
        assert_eq!(cpu_quota_us(333), 33_300);
        assert_eq!(cpu_quota_us(1), 1_000);
        assert_eq!(cpu_quota_us(u32::MAX), 429_496_729_500);
    }

    #[test]
    fn swap_total_is_read_from_meminfo() {
        assert_eq!(
            swap_total_kb("MemTotal: 10 kB\nSwapTotal:       2048 kB\n"),
            2048
        );
        assert_eq!(swap_total_kb(""), 0);
    }
}
