//! Coherence checks beyond validity (`capgate lint`, seed 002's `pack lint`): what a valid
//! kit states that is probably not what its author meant, or that a careful reviewer would
//! not let through. Validity is [`capgate_spec::load`]'s judgement; lint reads only kits
//! that passed it.
//!
//! Each check has a stable code and a severity; `--strict` raises the checks a reviewer
//! would refuse (wildcard hosts, tier mismatches) from warnings to errors. Findings point at
//! the entry (file line and column) that causes them. Entries still holding
//! `${{ kit.args.* }}` references are not judged: their meaning is known only at create.

use std::fmt;

use capgate_spec::caps::network::Method;
use capgate_spec::caps::pack::{Egress, EgressProtocol, Tier};
use capgate_spec::caps::{Capability, KnownType};
use capgate_spec::node::{Node, Path, Pos};
use capgate_spec::{Descriptor, Entry, Kind, Severity};
use serde::Serialize;

use crate::widen::host_covers;

/// The methods that only read (RFC 9110 §9.2.1), all a `read-only` workload may send.
const READING: [Method; 3] = [Method::Get, Method::Head, Method::Options];

/// What a finding is about: a stable code per check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// An allowed host with `*` in it: every host under a name, or every host at all.
    WildcardHost,
    /// An allowed address or network instead of a host name.
    AddressHost,
    /// An allow that never takes effect because a deny of the same kit and phase covers it.
    ShadowedAllow,
    /// What the kit grants contradicts its determinism tier.
    TierMismatch,
    /// Install-phase grants in a workload that runs no install hook.
    UnusedInstallGrant,
    /// A host the gateway cannot judge (`foo..com`): creating a sandbox from the kit fails.
    InvalidHost,
    /// A write place (`dev.capgate/filesystem@1`) beneath no writable mount of the sandbox.
    UnwritablePlace,
    /// A read path (`dev.capgate/filesystem@1`) outside the workspace, or a read list
    /// beside a write place covering the whole workspace: the run is refused.
    InvalidReadPath,
    /// An agent-context@1 `contentFile` that cannot be read from the kit's directory: the
    /// run refuses the kit (or, for an optional entry, goes without the body).
    ContentFile,
    /// An allowed host written with letters beyond ASCII: a name in another script can
    /// pass for a familiar one (`api.gіthub.com`, a Cyrillic `і`).
    NonAsciiHost,
    /// A program (`dev.capgate/exec@1`) beneath a place the workload can write: the run is
    /// refused, as the workload could replace it.
    ExecInWritablePlace,
    /// An exec list entry that is a directory of system programs (`/usr/bin`, or one that
    /// holds it): every program there may run (seed 002: only the pack's own interpreter).
    BroadExec,
    /// A credential inject domain the broker cannot read (a port that is not one, an
    /// address, a host the policy refuses): the secret is added nowhere.
    UnusableInjectDomain,
    /// A path glob the gateway cannot judge (a dot segment, an encoded `/`): creating a
    /// sandbox from the kit fails.
    InvalidPath,
    /// A capability type capgate does not know, often a typo of one it does
    /// (`dev.capgate/exce@1`): a required one refuses the kit at create, an optional one is
    /// skipped and grants nothing, so an exec list or a limit meant for the workload is gone.
    UnknownType,
    /// A well-known type capgate does not honour (`privileged@1`, `kit-registry@1`,
    /// `usb-device@1`): refused when required, skipped when optional. Always a warning:
    /// the kit is right for a runtime that honours the type.
    UnsupportedType,
}

impl Check {
    pub const ALL: [Check; 16] = [
        Check::UnknownType,
        Check::UnsupportedType,
        Check::InvalidHost,
        Check::InvalidPath,
        Check::UnwritablePlace,
        Check::InvalidReadPath,
        Check::ExecInWritablePlace,
        Check::UnusableInjectDomain,
        Check::ContentFile,
        Check::BroadExec,
        Check::WildcardHost,
        Check::NonAsciiHost,
        Check::AddressHost,
        Check::ShadowedAllow,
        Check::TierMismatch,
        Check::UnusedInstallGrant,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Check::WildcardHost => "wildcard-host",
            Check::AddressHost => "address-host",
            Check::ShadowedAllow => "shadowed-allow",
            Check::TierMismatch => "tier-mismatch",
            Check::UnusedInstallGrant => "unused-install-grant",
            Check::InvalidHost => "invalid-host",
            Check::UnwritablePlace => "unwritable-place",
            Check::InvalidReadPath => "invalid-read-path",
            Check::ContentFile => "content-file",
            Check::NonAsciiHost => "non-ascii-host",
            Check::ExecInWritablePlace => "exec-in-writable-place",
            Check::BroadExec => "broad-exec",
            Check::UnusableInjectDomain => "unusable-inject-domain",
            Check::InvalidPath => "invalid-path",
            Check::UnknownType => "unknown-type",
            Check::UnsupportedType => "unsupported-type",
        }
    }

    /// Whether `--strict` makes this check's warnings errors (seed 002: strict lint fails on
    /// wildcard hosts and determinism tier mismatches).
    pub fn strict_refuses(self) -> bool {
        matches!(
            self,
            Check::WildcardHost | Check::TierMismatch | Check::NonAsciiHost | Check::BroadExec
        )
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// One finding: which check, how grave, where, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    pub severity: Severity,
    /// Field path, e.g. `capabilities[0].config.runtime.allow[1]`.
    pub path: Path,
    /// Line and column in the kit file, when known.
    #[serde(skip)]
    pub pos: Pos,
    pub message: String,
}

/// How to lint.
pub struct Options<'a> {
    /// Raise the checks a reviewer would refuse to errors.
    pub strict: bool,
    /// What is wrong with a host as a rule would name it (`example.com`, `*.example.com`,
    /// `example.com:443`, `10.0.0.0/8`, `[::1]:443`), if anything: the policy's own judge,
    /// handed in so that lint says exactly what creating a sandbox would refuse.
    pub host_problem: &'a dyn Fn(&str) -> Option<String>,
    /// What is wrong with a path glob as a rule would hold it (`/repos/**`), if anything:
    /// the policy's own compiler, handed in like `host_problem`.
    pub path_problem: &'a dyn Fn(&str) -> Option<String>,
    /// What is wrong with an agent-context@1 `contentFile` (as written) of the kit being
    /// linted, if anything: read the way `capgate run` reads it, handed in because lint
    /// itself reads no file.
    pub content_problem: &'a dyn Fn(&str) -> Option<String>,
    /// A host as DNS sees it (IDNA's ASCII form), when the policy can read it: handed in
    /// like `host_problem`.
    pub ascii_host: &'a dyn Fn(&str) -> Option<String>,
}

impl fmt::Debug for Options<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("strict", &self.strict)
            .finish_non_exhaustive()
    }
}

/// Lints one valid descriptor. Findings come in document order.
pub fn lint(descriptor: &Descriptor, options: &Options<'_>) -> Vec<Finding> {
    let entries = descriptor.declared_entries();
    let mut out = Findings {
        strict: options.strict,
        list: Vec::new(),
    };
    let mut grants = Vec::new();
    for (at, entry) in &entries {
        if !entry.parameterized {
            grants.extend(network_grants(at, entry));
        }
        if let Some(Capability::Egress(e)) = &entry.capability {
            grants.push(egress_grant(at, entry, e));
        }
    }
    let tier = entries.iter().find_map(|(_, e)| match &e.capability {
        Some(Capability::Determinism(d)) => Some(d.tier),
        _ => None,
    });
    for g in &grants {
        for &(glob, pos) in &g.paths {
            if let Some(problem) = (options.path_problem)(glob) {
                out.error(
                    Check::InvalidPath,
                    &g.path,
                    pos,
                    format!("{problem}; the gateway cannot judge it, so creating a sandbox from this kit fails"),
                );
            }
        }
        for &(host, pos) in &g.hosts {
            let as_ruled = g.resource.clone().unwrap_or_else(|| host.to_owned());
            if let Some(problem) = (options.host_problem)(&as_ruled) {
                out.error(
                    Check::InvalidHost,
                    &g.path,
                    pos,
                    format!("{problem}; the gateway cannot judge it, so creating a sandbox from this kit fails"),
                );
            }
        }
    }
    // Unbounded denies, the only ones that shadow an allow, gathered once: a kit may list
    // thousands of hosts.
    let denies: Vec<&Grant<'_>> = grants.iter().filter(|d| !d.allow && !d.bounded).collect();
    for g in grants.iter().filter(|g| g.allow) {
        hosts(g, &denies, &mut out);
        for &(host, pos) in &g.hosts {
            if host.is_ascii() {
                continue;
            }
            let dns =
                (options.ascii_host)(host).map_or_else(String::new, |a| format!(" (`{a}` in DNS)"));
            out.warn(
                Check::NonAsciiHost,
                &g.path,
                pos,
                format!(
                    "`{host}`{dns} is written with letters beyond ASCII, and a name in another script can pass for a familiar one; write the ASCII form"
                ),
            );
        }
    }
    if let Some(tier) = tier {
        tier_mismatches(tier, &entries, &grants, &mut out);
    }
    if descriptor.kind == Kind::Workload {
        unused_install_grants(&entries, &grants, &mut out);
    }
    // A group's members state no `optional`: the group's holds for them.
    let optional: Vec<bool> = descriptor
        .capabilities
        .iter()
        .flat_map(|item| match item {
            capgate_spec::Item::Entry(e) => vec![e.optional],
            capgate_spec::Item::Group(g) => vec![g.optional; g.capabilities.len()],
        })
        .collect();
    unknown_types(&entries, &optional, &mut out);
    unwritable_places(&entries, &mut out);
    exec_lists(&entries, &mut out);
    inject_domains(&entries, options, &mut out);
    content_files(&entries, options, &mut out);
    out.list
        .sort_by(|a, b| (a.pos, &a.path).cmp(&(b.pos, &b.path)));
    out.list
}

struct Findings {
    strict: bool,
    list: Vec<Finding>,
}

impl Findings {
    /// A finding that is a warning, or an error under `--strict` when the check says so.
    fn warn(&mut self, check: Check, path: &Path, pos: Pos, message: String) {
        let severity = if self.strict && check.strict_refuses() {
            Severity::Error
        } else {
            Severity::Warning
        };
        self.push(check, severity, path, pos, message);
    }

    fn error(&mut self, check: Check, path: &Path, pos: Pos, message: String) {
        self.push(check, Severity::Error, path, pos, message);
    }

    fn push(&mut self, check: Check, severity: Severity, path: &Path, pos: Pos, message: String) {
        self.list.push(Finding {
            check,
            severity,
            path: path.clone(),
            pos,
            message,
        });
    }
}

/// One network-policy entry as written: a host string or an object with hosts, methods and
/// paths, with where it stands.
struct Grant<'n> {
    phase: &'static str,
    allow: bool,
    hosts: Vec<(&'n str, Pos)>,
    /// `None`: unbounded.
    methods: Option<Vec<Method>>,
    bounded: bool,
    /// Set for an egress triple (which grants only this protocol).
    egress: Option<EgressProtocol>,
    /// For an egress triple, the `host:port` its rule names.
    resource: Option<String>,
    /// Path globs as written, with where they stand.
    paths: Vec<(&'n str, Pos)>,
    path: Path,
    pos: Pos,
}

/// An egress triple as a runtime allow of its `host:port`.
fn egress_grant<'n>(at: &str, entry: &'n Entry, triple: &Egress) -> Grant<'n> {
    let config = entry.config.as_ref();
    let host_node = config.and_then(|c| c.get("host"));
    let pos = config.map_or(Pos::UNKNOWN, |c| c.pos);
    Grant {
        phase: "runtime",
        allow: true,
        // The written host (with the port beside it, as a rule names it).
        hosts: host_node
            .and_then(Node::as_str)
            .map(|h| vec![(h, host_node.map_or(pos, |n| n.pos))])
            .unwrap_or_default(),
        methods: None,
        paths: Vec::new(),
        bounded: false,
        egress: Some(triple.protocol),
        resource: Some(triple.host_port()),
        path: Path::from(at).key("config").key("host"),
        pos,
    }
}

fn network_grants<'n>(at: &str, entry: &'n Entry) -> Vec<Grant<'n>> {
    let is_policy = matches!(
        entry.known,
        Some(KnownType::NetworkPolicyV1 | KnownType::NetworkPolicyV2)
    );
    let Some(config) = entry.config.as_ref().filter(|_| is_policy) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for phase in ["install", "runtime"] {
        for (list, allow) in [("allow", true), ("deny", false)] {
            let Some(items) = config
                .get(phase)
                .and_then(|p| p.get(list))
                .and_then(Node::as_seq)
            else {
                continue;
            };
            let base = Path::from(at).key("config").key(phase).key(list);
            for (i, item) in items.iter().enumerate() {
                let hosts: Vec<(&str, Pos)> = match item.as_str() {
                    Some(h) => vec![(h, item.pos)],
                    None => item
                        .get("hosts")
                        .and_then(Node::as_seq)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|h| Some((h.as_str()?, h.pos)))
                        .collect(),
                };
                let methods = item.get("methods").and_then(Node::as_seq).map(|ms| {
                    ms.iter()
                        .filter_map(|m| m.as_str().and_then(Method::parse))
                        .collect()
                });
                let paths = item
                    .get("paths")
                    .and_then(Node::as_seq)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| Some((p.as_str()?, p.pos)))
                    .collect();
                out.push(Grant {
                    phase,
                    allow,
                    hosts,
                    paths,
                    bounded: item.get("methods").is_some() || item.get("paths").is_some(),
                    methods,
                    egress: None,
                    resource: None,
                    path: base.index(i),
                    pos: item.pos,
                });
            }
        }
    }
    out
}

/// Wildcards, addresses, and allows a deny of the same phase overrides.
fn hosts(g: &Grant<'_>, denies: &[&Grant<'_>], out: &mut Findings) {
    for &(host, pos) in &g.hosts {
        if host.contains('*') {
            let name = host.split(':').next().unwrap_or(host);
            let reach = match name {
                "*" | "**" => "every host and every address".to_owned(),
                _ => match (name.strip_prefix("**."), name.strip_prefix("*.")) {
                    (Some(base), _) => format!("every host one or more labels below `{base}`"),
                    (None, Some(base)) => format!("every host one label below `{base}`"),
                    _ => "hosts matching the pattern".to_owned(),
                },
            };
            out.warn(
                Check::WildcardHost,
                &g.path,
                pos,
                format!(
                    "`{host}` allows {reach} in the {} phase; name the hosts the workload needs",
                    g.phase
                ),
            );
        } else if is_address(host) {
            out.warn(
                Check::AddressHost,
                &g.path,
                pos,
                format!(
                    "`{host}` is an address, which does not follow a service that moves, and it opens the address guard for it; name the host"
                ),
            );
        }
        let lower = host.to_ascii_lowercase();
        if let Some((deny, deny_pos)) = denies
            .iter()
            .filter(|d| d.phase == g.phase)
            .flat_map(|d| d.hosts.iter())
            .find(|(d, _)| host_covers(&d.to_ascii_lowercase(), &lower))
        {
            let line = if deny_pos.is_known() {
                format!(" (line {})", deny_pos.line)
            } else {
                String::new()
            };
            out.warn(
                Check::ShadowedAllow,
                &g.path,
                pos,
                format!(
                    "the allow of `{host}` never takes effect: the deny of `{deny}`{line} in the {} phase wins",
                    g.phase
                ),
            );
        }
    }
}

/// An IP address or network, with or without a port (`10.0.0.1:22`, `[::1]:443`,
/// `2001:db8::1`, `10.0.0.0/8`).
fn is_address(host: &str) -> bool {
    let unbracketed = host
        .strip_prefix('[')
        .and_then(|h| h.split_once(']'))
        .map_or(host, |(inner, _)| inner);
    let without_port = if unbracketed.matches(':').count() == 1 {
        unbracketed.split(':').next().unwrap_or(unbracketed)
    } else {
        unbracketed
    };
    let address = without_port.split('/').next().unwrap_or(without_port);
    address.parse::<std::net::IpAddr>().is_ok()
}

/// What contradicts the tier (seed 002: "the tier is enforced on the agent's behavior, not
/// just its declaration").
fn tier_mismatches(
    tier: Tier,
    entries: &[(String, &Entry)],
    grants: &[Grant<'_>],
    out: &mut Findings,
) {
    let runtime_allows = || grants.iter().filter(|g| g.allow && g.phase == "runtime");
    if tier != Tier::Unrestricted {
        for g in runtime_allows() {
            if let Some((host, pos)) = g.hosts.iter().find(|(h, _)| matches!(*h, "*" | "**")) {
                out.warn(
                    Check::TierMismatch,
                    &g.path,
                    *pos,
                    format!(
                        "`{host}` allows an unknown number of hosts, which makes the workload opaque; declare the tier `unrestricted`, or name the hosts"
                    ),
                );
            }
        }
    }
    if tier != Tier::ReadOnly {
        return;
    }
    for g in runtime_allows() {
        if g.egress == Some(EgressProtocol::Tcp) {
            let hosts: Vec<&str> = g.hosts.iter().map(|(h, _)| *h).collect();
            out.warn(
                Check::TierMismatch,
                &g.path,
                g.pos,
                format!(
                    "a tcp stream to `{}` cannot be held to reading, so a read-only workload is refused it at run time; grant `https` or `http`, or declare the tier `side-effect`",
                    hosts.join("`, `")
                ),
            );
        }
    }
    for g in runtime_allows().filter(|g| g.bounded) {
        let Some(methods) = &g.methods else { continue };
        if methods.contains(&Method::Any) {
            continue;
        }
        let changing: Vec<&str> = methods
            .iter()
            .filter(|m| !READING.contains(m))
            .map(|m| m.as_str())
            .collect();
        if changing.is_empty() {
            continue;
        }
        let hosts: Vec<&str> = g.hosts.iter().map(|(h, _)| *h).collect();
        let message = format!(
            "a read-only workload may only read, so {} to `{}` is refused at run time; declare the tier `side-effect` if the workload changes things",
            changing.join(", "),
            hosts.join("`, `")
        );
        if changing.len() == methods.len() {
            // Nothing of the grant is left: the kit asks for what its tier rules out.
            out.error(Check::TierMismatch, &g.path, g.pos, message);
        } else {
            out.warn(Check::TierMismatch, &g.path, g.pos, message);
        }
    }
    for (at, entry) in entries {
        if let Some(Capability::HostMount(m)) = &entry.capability {
            out.error(
                Check::TierMismatch,
                &Path::from(at.as_str()),
                entry.config.as_ref().map_or(Pos::UNKNOWN, |c| c.pos),
                format!(
                    "host mount `{}` lets a read-only workload change the host's files; declare the tier `side-effect`, or drop the mount",
                    m.path
                ),
            );
        }
    }
}

/// A write place must lie beneath a mount the sandbox makes writable: the workspace and
/// home (`/home/agent`), `/tmp`, `/dev/shm`, or a volume (this kit's; another kit of the
/// composition may mount one, so this is a warning).
/// Each agent-context@1 `contentFile` must be readable as the run reads it: a required
/// entry whose file is missing refuses the run, an optional one loses its body.
fn content_files(entries: &[(String, &Entry)], options: &Options<'_>, out: &mut Findings) {
    for (at, entry) in entries {
        let Some(Capability::AgentContext(c)) = &entry.capability else {
            continue;
        };
        let Some(file) = c.content_file.as_deref().filter(|f| !f.is_empty()) else {
            continue;
        };
        if entry.parameterized {
            continue;
        }
        let Some(problem) = (options.content_problem)(file) else {
            continue;
        };
        let path = Path::from(at.as_str()).key("config").key("contentFile");
        let pos = entry.config.as_ref().map_or(Pos::UNKNOWN, |c| {
            c.get("contentFile").map_or(c.pos, |n| n.pos)
        });
        if entry.optional {
            out.push(
                Check::ContentFile,
                Severity::Warning,
                &path,
                pos,
                format!("{problem}; the entry is optional, so `capgate run` goes without it"),
            );
        } else {
            out.error(
                Check::ContentFile,
                &path,
                pos,
                format!("{problem}; `capgate run` refuses this kit"),
            );
        }
    }
}

/// The paths of the kit's volumes (all writable).
fn volume_paths<'e>(entries: &[(String, &'e Entry)]) -> Vec<&'e str> {
    entries
        .iter()
        .filter_map(|(_, e)| match &e.capability {
            Some(Capability::Volume(v)) => Some(v.path.as_str()),
            _ => None,
        })
        .collect()
}

/// The nodes of the list at `config.KEY` as written, for their positions.
fn config_list<'e>(entry: &'e Entry, key: &str) -> &'e [Node] {
    entry
        .config
        .as_ref()
        .and_then(|c| c.get(key))
        .and_then(Node::as_seq)
        .unwrap_or_default()
}

fn unwritable_places(entries: &[(String, &Entry)], out: &mut Findings) {
    let volumes = volume_paths(entries);
    for (at, entry) in entries {
        let Some(Capability::Filesystem(f)) = &entry.capability else {
            continue;
        };
        let items = config_list(entry, "write");
        const WORKSPACE: &str = "/home/agent/workspace";
        if let Some(read) = &f.read {
            let listed = config_list(entry, "read");
            for (i, path) in read.iter().enumerate() {
                let p = std::path::Path::new(path);
                if p.starts_with(WORKSPACE) && p != std::path::Path::new(WORKSPACE) {
                    continue;
                }
                out.error(
                    Check::InvalidReadPath,
                    &Path::from(at.as_str()).key("config").key("read").index(i),
                    listed.get(i).map_or(Pos::UNKNOWN, |n| n.pos),
                    format!(
                        "`{path}` is not beneath the workspace ({WORKSPACE}): a read list says what of the workspace is shown; the run is refused"
                    ),
                );
            }
            for (i, place) in f.write.iter().enumerate() {
                if std::path::Path::new(WORKSPACE).starts_with(place) {
                    out.error(
                        Check::InvalidReadPath,
                        &Path::from(at.as_str()).key("config").key("write").index(i),
                        items.get(i).map_or(Pos::UNKNOWN, |n| n.pos),
                        format!(
                            "write place `{place}` covers the whole workspace, which leaves the read list nothing to hide; the run is refused"
                        ),
                    );
                }
            }
        }
        for (i, place) in f.write.iter().enumerate() {
            let beneath = |base: &str| std::path::Path::new(place).starts_with(base);
            if ["/home/agent", "/tmp", "/dev/shm"].into_iter().any(beneath)
                || volumes.iter().any(|v| beneath(v))
            {
                continue;
            }
            out.warn(
                Check::UnwritablePlace,
                &Path::from(at.as_str()).key("config").key("write").index(i),
                items.get(i).map_or(Pos::UNKNOWN, |n| n.pos),
                format!(
                    "`{place}` is beneath no writable place of the sandbox (the workspace, /home/agent, /tmp, /dev/shm) nor a volume of this kit; the run is refused unless another kit mounts a volume there"
                ),
            );
        }
    }
}

/// Directories of system programs.
const BIN_DIRS: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/libexec",
];

/// Library directories, which hold the dynamic loader.
const LIB_DIRS: &[&str] = &[
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
];

/// What an exec list entry lets run that a reviewer would not pass, if it is a directory
/// of system programs: the entry is one
/// of [`BIN_DIRS`] or [`LIB_DIRS`], holds one, or is a multiarch library directory
/// (`/usr/lib/x86_64-linux-gnu`, which holds the loader). A program is never one: Landlock
/// checks every `execve`, so a shell or `env` listed still runs only listed programs.
fn program_dir(entry: &str) -> Option<String> {
    let path = std::path::Path::new(entry);
    let holds = |dirs: &'static [&'static str]| {
        dirs.iter()
            .copied()
            .find(|d| std::path::Path::new(d).starts_with(path))
    };
    if let Some(dir) = holds(BIN_DIRS) {
        return Some(format!(
            "every program of `{dir}` run (shells, compilers, network tools)"
        ));
    }
    let loader = "the dynamic loader run, which runs any program of the root";
    if let Some(dir) = holds(LIB_DIRS) {
        return Some(format!("{loader} (it lies in `{dir}`)"));
    }
    let in_lib = path
        .parent()
        .is_some_and(|p| LIB_DIRS.iter().any(|lib| p == std::path::Path::new(lib)));
    let multiarch = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains("-linux-"));
    (in_lib && multiarch).then(|| loader.to_owned())
}

/// Entries of types capgate does not know, with the known type they most likely meant,
/// and of well-known types it does not honour. `optional[i]`: whether `entries[i]` is
/// optional, by its own flag or its group's.
fn unknown_types(entries: &[(String, &Entry)], optional: &[bool], out: &mut Findings) {
    for ((at, entry), &entry_optional) in entries.iter().zip(optional) {
        let written = entry.type_name.as_str();
        let (check, what) = match entry.known {
            None => {
                let meant = likely_meant(written)
                    .map_or_else(String::new, |t| format!(" (did you mean `{t}`?)"));
                (
                    Check::UnknownType,
                    format!("`{written}` is not a type capgate knows{meant}"),
                )
            }
            Some(t) if crate::select::UNSUPPORTED.contains(&t) => (
                Check::UnsupportedType,
                format!("capgate does not honour `{written}`"),
            ),
            Some(_) => continue,
        };
        let path = Path::from(at.as_str()).key("type");
        let pos = entry.type_pos.0;
        if check == Check::UnsupportedType && !entry_optional {
            // The kit is right for a runtime that honours the type; capgate is not one.
            out.warn(
                check,
                &path,
                pos,
                format!("{what}: this required entry makes capgate refuse the kit at create (a runtime that honours it can run it)"),
            );
        } else if entry_optional {
            out.warn(
                check,
                &path,
                pos,
                format!("{what}: this optional entry is skipped and grants nothing"),
            );
        } else {
            out.error(
                check,
                &path,
                pos,
                format!("{what}: this required entry refuses the kit, so creating a sandbox from it fails"),
            );
        }
    }
}

/// The known type a written one is most likely a slip of: the same name in another
/// namespace or version, or one a few letters away.
fn likely_meant(written: &str) -> Option<&'static str> {
    let bare = |t: &str| -> String {
        let name = t.rsplit_once('/').map_or(t, |(_, n)| n);
        name.split_once('@').map_or(name, |(n, _)| n).to_owned()
    };
    let written_bare = bare(written);
    let known = KnownType::ALL.into_iter().map(KnownType::name);
    if let Some(same) = known
        .clone()
        .filter(|k| bare(k) == written_bare)
        // The nearest; of equals, the newest version.
        .min_by_key(|k| (edit_distance(written, k), std::cmp::Reverse(*k)))
    {
        return Some(same);
    }
    known
        .map(|k| (edit_distance(written, k), k))
        .filter(|&(d, _)| d <= 3)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// Levenshtein distance between two short strings, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// `dev.capgate/exec@1` lists: a program the workload could replace (the run is refused),
/// and entries that let every program of a system directory run.
fn exec_lists(entries: &[(String, &Entry)], out: &mut Findings) {
    let volumes = volume_paths(entries);
    for (at, entry) in entries {
        let Some(Capability::Exec(exec)) = &entry.capability else {
            continue;
        };
        let items = config_list(entry, "allow");
        for (i, program) in exec.allow.iter().enumerate() {
            let path = Path::from(at.as_str()).key("config").key("allow").index(i);
            let pos = items.get(i).map_or(Pos::UNKNOWN, |n| n.pos);
            let p = std::path::Path::new(program);
            if let Some(place) = ["/home/agent", "/tmp", "/dev/shm"]
                .into_iter()
                .chain(volumes.iter().copied())
                .find(|base| p.starts_with(base))
            {
                out.error(
                    Check::ExecInWritablePlace,
                    &path,
                    pos,
                    format!(
                        "`{program}` is beneath `{place}`, which the workload can write (and an exec list keeps noexec): it could replace the program; the run is refused. List programs of the read-only system root"
                    ),
                );
                continue;
            }
            if let Some(what) = program_dir(program) {
                out.warn(
                    Check::BroadExec,
                    &path,
                    pos,
                    format!(
                        "`{program}` lets {what}, so the exec list bounds little; name the pack's own interpreter and programs"
                    ),
                );
            }
        }
    }
}

/// What keeps the broker from using an inject domain, if anything: it adds the secret on
/// requests to a named host, on the port given (`host:443`) or any port.
fn inject_problem(domain: &str, options: &Options<'_>) -> Option<String> {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    if let Some(port) = port
        && !(port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|p| p != 0))
    {
        return Some(format!("`{domain}`: `{port}` is not a port (1 to 65535)"));
    }
    if is_address(host) || host.starts_with('[') {
        return Some(format!(
            "`{domain}` is an address: the broker adds secrets only on requests to a named host"
        ));
    }
    (options.host_problem)(host).map(|p| format!("`{domain}`: {p}"))
}

/// credential@1 inject domains the broker cannot use: the secret would be added nowhere,
/// and every request carrying the sentinel refused.
fn inject_domains(entries: &[(String, &Entry)], options: &Options<'_>, out: &mut Findings) {
    for (at, entry) in entries {
        let Some(Capability::Credential(c)) = &entry.capability else {
            continue;
        };
        if entry.parameterized {
            continue;
        }
        let written = entry
            .config
            .as_ref()
            .and_then(|c| c.get("apiKey"))
            .and_then(|k| k.get("inject"))
            .and_then(Node::as_seq)
            .unwrap_or_default();
        for (i, rule) in c.api_key.iter().flat_map(|k| &k.inject).enumerate() {
            let Some(problem) = inject_problem(&rule.domain, options) else {
                continue;
            };
            let node = written.get(i);
            let pos = node
                .and_then(|n| n.get("domain"))
                .or(node)
                .map_or(Pos::UNKNOWN, |n| n.pos);
            out.error(
                Check::UnusableInjectDomain,
                &Path::from(at.as_str())
                    .key("config")
                    .key("apiKey")
                    .key("inject")
                    .index(i)
                    .key("domain"),
                pos,
                format!(
                    "{problem}; the broker adds the `{}` secret nowhere",
                    c.service
                ),
            );
        }
    }
}

/// A workload's install-phase grants serve its install hooks; without any, they are unused
/// (mixins are not judged: their install grants may serve the workload's hooks).
fn unused_install_grants(entries: &[(String, &Entry)], grants: &[Grant<'_>], out: &mut Findings) {
    let has_install_hooks = entries.iter().any(|(_, e)| match &e.capability {
        Some(Capability::Lifecycle(l)) => !l.install.is_empty(),
        // A lifecycle still holding references may well have hooks.
        _ => e.known == Some(KnownType::Lifecycle) && e.parameterized,
    });
    if has_install_hooks {
        return;
    }
    for g in grants.iter().filter(|g| g.allow && g.phase == "install") {
        out.warn(
            Check::UnusedInstallGrant,
            &g.path,
            g.pos,
            "install-phase grants are open only while install hooks run, and this workload runs none; move the hosts to `runtime`, or add the hook".to_owned(),
        );
    }
    for (at, entry) in entries {
        if let Some(Capability::Credential(c)) = &entry.capability
            && c.phases.contains(&capgate_spec::caps::Phase::Install)
        {
            out.warn(
                Check::UnusedInstallGrant,
                &Path::from(at.as_str()),
                entry.config.as_ref().map_or(Pos::UNKNOWN, |n| n.pos),
                format!(
                    "credential `{}` is granted in the install phase, and this workload runs no install hook",
                    c.service
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn kit(kind: &str, caps: &str) -> Descriptor {
        let text = format!("schemaVersion: \"3\"\nkind: {kind}\ncapabilities:\n{caps}");
        let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
        assert!(
            loaded.is_valid(),
            "{text}\n{:?}",
            loaded.diagnostics.errors().collect::<Vec<_>>()
        );
        loaded.descriptor.unwrap()
    }

    /// A stand-in for the policy's judge: refuses empty labels, as it does.
    fn opts(strict: bool) -> Options<'static> {
        Options {
            strict,
            host_problem: &|h: &str| {
                h.contains("..")
                    .then(|| format!("`{h}` has an empty label"))
            },
            ascii_host: &|h: &str| Some(format!("ascii-of-{}", h.len())),
            // A stand-in for the policy's compiler: refuses dot segments, as it does.
            path_problem: &|p: &str| p.contains("..").then(|| format!("`{p}` has a dot segment")),
            // A stand-in for the kit directory: only `present.md` is there.
            content_problem: &|f: &str| (f != "present.md").then(|| format!("`{f}`: not found")),
        }
    }

    fn codes(findings: &[Finding]) -> Vec<(String, Severity, u32)> {
        findings
            .iter()
            .map(|f| (f.check.code().to_owned(), f.severity, f.pos.line))
            .collect()
    }

    const NP2: &str = "com.docker.sandbox/network-policy@2";
    const TIER: &str = "dev.capgate/determinism@1";

    #[test]
    fn a_named_host_gives_nothing_to_say() {
        let d = kit(
            "workload",
            &format!(
                "  - type: {NP2}\n    config: {{runtime: {{allow: [api.example.com, {{hosts: [git.example.com], methods: [GET]}}], deny: [telemetry.example.com]}}}}\n"
            ),
        );
        assert_eq!(lint(&d, &opts(true)), vec![]);
    }

    #[test]
    fn a_content_file_the_run_cannot_read_is_an_error_or_for_an_optional_entry_a_warning() {
        const CTX: &str = "com.docker.sandbox/agent-context@1";
        let one = |entry: &str| {
            lint(
                &kit("workload", &format!("  - type: {CTX}\n{entry}")),
                &opts(false),
            )
        };
        // Present, and an inline body: nothing to say.
        assert_eq!(
            one("    config: {filename: AGENTS.md, contentFile: present.md}\n"),
            vec![]
        );
        assert_eq!(
            one("    config: {filename: AGENTS.md, content: inline}\n"),
            vec![]
        );
        let required = one("    config:\n      filename: A.md\n      contentFile: ./gone.md\n");
        assert_eq!(
            codes(&required),
            [("content-file".to_owned(), Severity::Error, 7)]
        );
        assert_eq!(
            required[0].path.to_string(),
            "capabilities[0].config.contentFile"
        );
        assert!(required[0].message.starts_with("`./gone.md`: not found; "));
        assert!(
            required[0]
                .message
                .ends_with("`capgate run` refuses this kit")
        );
        let optional =
            one("    optional: true\n    config: {filename: B.md, contentFile: gone.md}\n");
        assert_eq!(
            codes(&optional),
            [("content-file".to_owned(), Severity::Warning, 6)]
        );
        assert!(optional[0].message.contains("optional"));
    }

    #[test]
    fn wildcards_warn_and_strict_refuses_them() {
        let caps = format!(
            "  - type: {NP2}\n    config:\n      runtime:\n        allow:\n          - \"*.openai.com\"\n          - \"**.example.com\"\n          - \"*\"\n"
        );
        let d = kit("workload", &caps);
        let found = lint(&d, &opts(false));
        assert_eq!(
            codes(&found),
            [
                ("wildcard-host".to_owned(), Severity::Warning, 8),
                ("wildcard-host".to_owned(), Severity::Warning, 9),
                ("wildcard-host".to_owned(), Severity::Warning, 10),
            ]
        );
        assert!(found[0].message.contains("one label below `openai.com`"));
        assert!(found[1].message.contains("one or more labels below"));
        assert!(found[2].message.contains("every host and every address"));
        assert_eq!(
            found[0].path.as_str(),
            "capabilities[0].config.runtime.allow[0]"
        );
        assert!(
            lint(&d, &opts(true))
                .iter()
                .all(|f| f.severity == Severity::Error)
        );
    }

    #[test]
    fn addresses_and_shadowed_allows_warn_even_under_strict() {
        let caps = format!(
            "  - type: {NP2}\n    config:\n      runtime:\n        allow: [10.1.2.3, \"[2001:db8::1]:443\", 192.168.0.0/16, Api.Example.com, \"svc.example.com:8443\", 1.example.com]\n        deny: [api.example.com, \"svc.example.com\"]\n"
        );
        let found = lint(&kit("workload", &caps), &opts(true));
        let summary: Vec<(&str, Severity)> =
            found.iter().map(|f| (f.check.code(), f.severity)).collect();
        assert_eq!(
            summary,
            [
                ("address-host", Severity::Warning),
                ("address-host", Severity::Warning),
                ("address-host", Severity::Warning),
                ("shadowed-allow", Severity::Warning),
                ("shadowed-allow", Severity::Warning),
            ]
        );
        assert!(
            found[3]
                .message
                .contains("deny of `api.example.com` (line 8)")
        );
        assert!(found[4].message.contains("`svc.example.com:8443`"));
    }

    #[test]
    fn a_deny_of_the_other_phase_or_a_bounded_deny_shadows_nothing() {
        let caps = format!(
            "  - type: {NP2}\n    config:\n      install: {{deny: [api.example.com]}}\n      runtime:\n        allow: [api.example.com]\n        deny: [{{hosts: [api.example.com], methods: [DELETE]}}]\n"
        );
        assert_eq!(lint(&kit("mixin", &caps), &opts(true)), vec![]);
    }

    #[test]
    fn read_only_workloads_may_only_read() {
        let caps = format!(
            "  - type: {TIER}\n    config: {{tier: read-only}}\n  - type: {NP2}\n    config:\n      runtime:\n        allow:\n          - api.example.com\n          - {{hosts: [git.example.com], methods: [GET, POST]}}\n          - {{hosts: [hooks.example.com], methods: [POST]}}\n          - {{hosts: [any.example.com], methods: [ANY]}}\n  - type: com.docker.sandbox/host-mount@1\n    config: {{path: /data}}\n"
        );
        let found = lint(&kit("workload", &caps), &opts(false));
        assert_eq!(
            codes(&found),
            [
                ("tier-mismatch".to_owned(), Severity::Warning, 11),
                ("tier-mismatch".to_owned(), Severity::Error, 12),
                ("tier-mismatch".to_owned(), Severity::Error, 15),
            ]
        );
        assert!(found[0].message.contains("POST to `git.example.com`"));
        assert!(found[2].message.contains("host mount `/data`"));
        // The same grants under side-effect are coherent.
        let side = caps.replace("read-only", "side-effect");
        assert_eq!(lint(&kit("workload", &side), &opts(true)), vec![]);
    }

    #[test]
    fn every_host_needs_the_unrestricted_tier() {
        let caps = |tier: &str| {
            format!(
                "  - type: {TIER}\n    config: {{tier: {tier}}}\n  - type: {NP2}\n    config: {{runtime: {{allow: [\"**\"]}}}}\n"
            )
        };
        let side = lint(&kit("workload", &caps("side-effect")), &opts(true));
        assert_eq!(
            side.iter().map(|f| f.check).collect::<Vec<_>>(),
            [Check::WildcardHost, Check::TierMismatch]
        );
        assert!(side.iter().all(|f| f.severity == Severity::Error));
        let open = lint(&kit("workload", &caps("unrestricted")), &opts(false));
        assert_eq!(
            open.iter().map(|f| f.check).collect::<Vec<_>>(),
            [Check::WildcardHost]
        );
    }

    #[test]
    fn install_grants_of_a_workload_without_install_hooks_are_unused() {
        let grants = format!(
            "  - type: {NP2}\n    config: {{install: {{allow: [registry.npmjs.org]}}}}\n  - type: com.docker.sandbox/credential@1\n    config: {{service: npm, phase: install, apiKey: {{name: NPM_TOKEN, inject: [{{domain: registry.npmjs.org}}]}}}}\n"
        );
        let found = lint(&kit("workload", &grants), &opts(true));
        assert_eq!(
            found.iter().map(|f| f.check).collect::<Vec<_>>(),
            [Check::UnusedInstallGrant, Check::UnusedInstallGrant]
        );
        assert!(found[1].message.contains("credential `npm`"));
        // A mixin's install grants may serve the workload's hooks.
        assert_eq!(lint(&kit("mixin", &grants), &opts(true)), vec![]);
        // With a hook, they are used.
        let hooked = format!(
            "{grants}  - type: com.docker.sandbox/lifecycle@1\n    config: {{install: [{{command: [npm, ci]}}]}}\n"
        );
        assert_eq!(lint(&kit("workload", &hooked), &opts(true)), vec![]);
    }

    #[test]
    fn egress_triples_are_judged_like_allows() {
        let caps = format!(
            "  - type: {TIER}\n    config: {{tier: read-only}}\n  - type: dev.capgate/egress@1\n    config: {{host: api.openai.com, port: 443, protocol: https}}\n  - type: dev.capgate/egress@1\n    config: {{host: \"*.example.org\", port: 443, protocol: https}}\n  - type: dev.capgate/egress@1\n    config: {{host: 10.0.0.7, port: 5432, protocol: tcp}}\n  - type: {NP2}\n    config: {{runtime: {{deny: [api.openai.com]}}}}\n"
        );
        let found = lint(&kit("workload", &caps), &opts(false));
        let summary: Vec<(&str, u32, &str)> = found
            .iter()
            .map(|f| (f.check.code(), f.pos.line, f.path.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("shadowed-allow", 7, "capabilities[1].config.host"),
                ("wildcard-host", 9, "capabilities[2].config.host"),
                ("tier-mismatch", 11, "capabilities[3].config.host"),
                ("address-host", 11, "capabilities[3].config.host"),
            ]
        );
        assert!(
            found[2].message.contains("tcp stream to `10.0.0.7`"),
            "{}",
            found[2].message
        );
    }

    #[test]
    fn hosts_the_gateway_cannot_judge_are_errors() {
        let caps = format!(
            "  - type: {NP2}\n    config: {{runtime: {{allow: [\"foo..com\"], deny: [\"bar..com\"]}}}}\n"
        );
        let found = lint(&kit("mixin", &caps), &opts(false));
        assert_eq!(
            found
                .iter()
                .map(|f| (f.check, f.severity))
                .collect::<Vec<_>>(),
            [
                (Check::InvalidHost, Severity::Error),
                (Check::InvalidHost, Severity::Error)
            ]
        );
        assert_eq!(
            found[0].message,
            "`foo..com` has an empty label; the gateway cannot judge it, so creating a sandbox from this kit fails"
        );
    }

    #[test]
    fn write_places_beneath_no_writable_mount_are_named() {
        let caps = "  - type: dev.capgate/filesystem@1\n    config: {write: [/home/agent/workspace/out, /srv/data, /cache/x, /usr/local]}\n  - type: com.docker.sandbox/volume@1\n    config: {path: /cache}\n";
        let found = lint(&kit("workload", caps), &opts(true));
        let named: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.check.code(), f.path.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("unwritable-place", "capabilities[0].config.write[1]"),
                ("unwritable-place", "capabilities[0].config.write[3]"),
            ]
        );
        assert!(found.iter().all(|f| f.severity == Severity::Warning));
    }

    #[test]
    fn read_paths_must_lie_in_the_workspace() {
        let caps = "  - type: dev.capgate/filesystem@1\n    config:\n      write: [/home/agent]\n      read: [/home/agent/workspace/inputs, /etc, /home/agent/workspace]\n";
        let found = lint(&kit("workload", caps), &opts(false));
        let named: Vec<(&str, &str, Severity)> = found
            .iter()
            .map(|f| (f.check.code(), f.path.as_str(), f.severity))
            .collect();
        assert_eq!(
            named,
            [
                (
                    "invalid-read-path",
                    "capabilities[0].config.write[0]",
                    Severity::Error
                ),
                (
                    "invalid-read-path",
                    "capabilities[0].config.read[1]",
                    Severity::Error
                ),
                (
                    "invalid-read-path",
                    "capabilities[0].config.read[2]",
                    Severity::Error
                ),
            ]
        );
        // Its twin: read paths in the workspace, a write place within it.
        let ok = "  - type: dev.capgate/filesystem@1\n    config:\n      write: [/home/agent/workspace/out]\n      read: [/home/agent/workspace/inputs]\n";
        assert_eq!(lint(&kit("workload", ok), &opts(true)), vec![]);
    }

    /// A typo of a known type is named, with what it most likely meant: an error when the
    /// entry is required (create refuses the kit), a warning when optional (skipped, so
    /// its exec list is silently gone). So is a well-known type capgate does not honour.
    /// Twins: the known type itself, and another tool's type, which gets no guess.
    #[test]
    fn unknown_types_are_named_with_what_they_likely_meant() {
        let caps = "  - type: dev.capgate/exce@1\n    optional: true\n    config:\n      allow: [/usr/bin/python3]\n  - type: com.docker.sandbox/network-policy@3\n    config: {}\n  - type: com.docker.sandbox/exec@1\n    optional: true\n  - type: org.example/thing@1\n    optional: true\n  - type: dev.capgate/exec@1\n    config:\n      allow: [/usr/bin/python3]\n  - type: com.docker.sandbox/privileged@1\n  - type: com.docker.sandbox/kit-registry@1\n    optional: true\n";
        let found = lint(&kit("workload", caps), &opts(false));
        let said: Vec<String> = found
            .iter()
            .map(|f| format!("{} {} {:?}", f.check, f.path.as_str(), f.severity))
            .collect();
        assert_eq!(
            said,
            [
                "unknown-type capabilities[0].type Warning",
                "unknown-type capabilities[1].type Error",
                "unknown-type capabilities[2].type Warning",
                "unknown-type capabilities[3].type Warning",
                "unsupported-type capabilities[5].type Warning",
                "unsupported-type capabilities[6].type Warning",
            ],
        );
        assert!(
            found[0]
                .message
                .contains("did you mean `dev.capgate/exec@1`?")
        );
        assert!(found[0].message.contains("skipped and grants nothing"));
        assert!(
            found[1]
                .message
                .contains("did you mean `com.docker.sandbox/network-policy@2`?"),
            "{}",
            found[1].message
        );
        assert!(found[1].message.contains("refuses the kit"));
        assert!(
            found[2]
                .message
                .contains("did you mean `dev.capgate/exec@1`?")
        );
        assert!(
            !found[3].message.contains("did you mean"),
            "{}",
            found[3].message
        );
        // Each points at the line of its `type`.
        let lines: Vec<u32> = found.iter().map(|f| f.pos.line).collect();
        assert_eq!(lines, [4, 8, 10, 12, 17, 18], "{found:#?}");
    }

    /// A group's members take the group's `optional` (they cannot state their own): a
    /// typo in an optional group is skipped with the group, so a warning; in a required
    /// group it refuses the kit, so an error.
    #[test]
    fn an_unknown_type_in_a_group_takes_the_groups_optional() {
        let group = |optional: bool| {
            format!(
                "  - group:\n      optional: {optional}\n      capabilities:\n        - type: dev.capgate/exce@1\n          config: {{allow: [/usr/bin/python3]}}\n        - type: com.docker.sandbox/usb-device@1\n          config: {{vendorId: \"0x1234\", productId: \"0x5678\"}}\n"
            )
        };
        for (optional, unknown, unsupported) in [
            (true, Severity::Warning, Severity::Warning),
            (false, Severity::Error, Severity::Warning),
        ] {
            let found = lint(&kit("workload", &group(optional)), &opts(false));
            let said: Vec<(&str, Severity, bool)> = found
                .iter()
                .map(|f| {
                    (
                        f.check.code(),
                        f.severity,
                        f.message.contains("optional entry"),
                    )
                })
                .collect();
            assert_eq!(
                said,
                [
                    ("unknown-type", unknown, optional),
                    ("unsupported-type", unsupported, optional),
                ],
                "{found:#?}"
            );
        }
    }

    #[test]
    fn exec_lists_that_bound_little_or_are_refused_are_named() {
        let caps = "  - type: dev.capgate/exec@1\n    config:\n      allow:\n        - /usr/bin/python3\n        - /usr/bin\n        - /usr\n        - /usr/lib/x86_64-linux-gnu\n        - /usr/lib/arm-linux-gnueabihf\n        - /lib32\n        - /home/agent/workspace/run.py\n        - /cache/tool\n        - /bin/sh\n        - /usr/bin/env\n        - /opt/pack/bin/script\n        - /usr/lib/python3.11\n  - type: com.docker.sandbox/volume@1\n    config: {path: /cache}\n";
        let found = lint(&kit("workload", caps), &opts(false));
        let named: Vec<(&str, String, Severity)> = found
            .iter()
            .map(|f| (f.check.code(), f.path.as_str().to_owned(), f.severity))
            .collect();
        let at = |i: usize| format!("capabilities[0].config.allow[{i}]");
        assert_eq!(
            named,
            [
                ("broad-exec", at(1), Severity::Warning),
                ("broad-exec", at(2), Severity::Warning),
                ("broad-exec", at(3), Severity::Warning),
                ("broad-exec", at(4), Severity::Warning),
                ("broad-exec", at(5), Severity::Warning),
                ("exec-in-writable-place", at(6), Severity::Error),
                ("exec-in-writable-place", at(7), Severity::Error),
            ]
        );
        assert_eq!(found[0].pos.line, 8, "{:?}", found[0]);
        assert!(
            found[1].message.contains("every program of `/usr/bin`"),
            "{:?}",
            found[1]
        );
        // Strict refuses a directory of system programs.
        let strict = lint(&kit("workload", caps), &opts(true));
        assert!(
            strict.iter().all(|f| f.severity == Severity::Error),
            "{strict:?}"
        );
        // The twin: the pack's own interpreter and programs (a shell or `env` among them
        // still runs only listed programs), and a directory of its own.
        let ok = "  - type: dev.capgate/exec@1\n    config: {allow: [/usr/bin/python3, /usr/bin/git, /bin/sh, /usr/bin/env, /opt/pack/bin]}\n";
        assert_eq!(lint(&kit("workload", ok), &opts(true)), vec![]);
    }

    #[test]
    fn inject_domains_the_broker_cannot_use_are_errors() {
        let caps = "  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [\"*\"]}}\n  - type: com.docker.sandbox/credential@1\n    config:\n      service: gh\n      phase: runtime\n      apiKey:\n        inject:\n          - {domain: api.example.com}\n          - {domain: \"api.example.com:8443\"}\n          - {domain: \"api.example.com:https\"}\n          - {domain: \"api.example.com:0\"}\n          - {domain: 10.0.0.5}\n          - {domain: \"bad..example.com\"}\n";
        let found = lint(&kit("workload", caps), &opts(false));
        let named: Vec<(&str, String, Severity, u32)> = found
            .iter()
            .filter(|f| f.check == Check::UnusableInjectDomain)
            .map(|f| {
                (
                    f.check.code(),
                    f.path.as_str().to_owned(),
                    f.severity,
                    f.pos.line,
                )
            })
            .collect();
        let at = |i: usize| format!("capabilities[1].config.apiKey.inject[{i}].domain");
        assert_eq!(
            named,
            [
                ("unusable-inject-domain", at(2), Severity::Error, 14),
                ("unusable-inject-domain", at(3), Severity::Error, 15),
                ("unusable-inject-domain", at(4), Severity::Error, 16),
                ("unusable-inject-domain", at(5), Severity::Error, 17),
            ]
        );
        assert!(
            found
                .iter()
                .any(|f| f.message.contains("`https` is not a port")),
            "{found:?}"
        );
    }

    /// A path glob the gateway cannot judge is an error at its line (creating a sandbox
    /// would fail); its twin, a clean glob beside it, passes.
    #[test]
    fn path_globs_the_gateway_cannot_judge_are_errors() {
        let caps = format!(
            "  - type: {NP2}\n    config:\n      runtime:\n        allow:\n          - {{hosts: [api.example.com], methods: [GET], paths: [/repos/**, /repos/x/../admin]}}\n"
        );
        let found = lint(&kit("workload", &caps), &opts(false));
        let named: Vec<(&str, Severity, u32)> = found
            .iter()
            .map(|f| (f.check.code(), f.severity, f.pos.line))
            .collect();
        assert_eq!(named, [("invalid-path", Severity::Error, 8)]);
        assert!(found[0].message.contains("/repos/x/../admin"), "{found:?}");
    }
}
