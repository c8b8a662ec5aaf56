//! Widenings (spec §5.3): what a candidate surface grants beyond a granted one.
//!
//! Movement that stays within the granted surface may apply silently; every widening must
//! stop for approval. Narrowing is never reported. Host, method and path coverage follows
//! spec §4.5: exact strings, `*`/`**` cover every host, a port-less grant covers every port,
//! `ANY` covers every method, and a path pattern covers only what its `/**` prefix names.
//! Anything else (for example what `*.example.com` matches) is not decided here, so it
//! fails safe by prompting.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use capgate_spec::caps::pack::Tier;

use crate::surface::Surface;

/// The kind of a widening. The order of the variants is the order of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    NetworkInstallAllow,
    NetworkRuntimeAllow,
    NetworkInstallDenyRemoved,
    NetworkRuntimeDenyRemoved,
    NetworkInstallHttpAllow,
    NetworkRuntimeHttpAllow,
    NetworkInstallHttpDenyRemoved,
    NetworkRuntimeHttpDenyRemoved,
    CredentialsInstall,
    CredentialsRuntime,
    CredentialsInject,
    SshAgent,
    Storage,
    HostMount,
    Skills,
    SkillsWrite,
    Ports,
    Usb,
    Privileged,
    Services,
    Egress,
    FilesystemWrite,
    FilesystemRead,
    ExecAllow,
    Determinism,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 25] = [
        Category::NetworkInstallAllow,
        Category::NetworkRuntimeAllow,
        Category::NetworkInstallDenyRemoved,
        Category::NetworkRuntimeDenyRemoved,
        Category::NetworkInstallHttpAllow,
        Category::NetworkRuntimeHttpAllow,
        Category::NetworkInstallHttpDenyRemoved,
        Category::NetworkRuntimeHttpDenyRemoved,
        Category::CredentialsInstall,
        Category::CredentialsRuntime,
        Category::CredentialsInject,
        Category::SshAgent,
        Category::Storage,
        Category::HostMount,
        Category::Skills,
        Category::SkillsWrite,
        Category::Ports,
        Category::Usb,
        Category::Privileged,
        Category::Services,
        Category::Egress,
        Category::FilesystemWrite,
        Category::FilesystemRead,
        Category::ExecAllow,
        Category::Determinism,
    ];

    /// The stable name, e.g. `network.runtime.http.deny-removed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::NetworkInstallAllow => "network.install.allow",
            Category::NetworkRuntimeAllow => "network.runtime.allow",
            Category::NetworkInstallDenyRemoved => "network.install.deny-removed",
            Category::NetworkRuntimeDenyRemoved => "network.runtime.deny-removed",
            Category::NetworkInstallHttpAllow => "network.install.http.allow",
            Category::NetworkRuntimeHttpAllow => "network.runtime.http.allow",
            Category::NetworkInstallHttpDenyRemoved => "network.install.http.deny-removed",
            Category::NetworkRuntimeHttpDenyRemoved => "network.runtime.http.deny-removed",
            Category::CredentialsInstall => "credentials.install",
            Category::CredentialsRuntime => "credentials.runtime",
            Category::CredentialsInject => "credentials.inject",
            Category::SshAgent => "ssh-agent",
            Category::Storage => "storage",
            Category::HostMount => "host-mount",
            Category::Skills => "skills",
            Category::SkillsWrite => "skills.write",
            Category::Ports => "ports",
            Category::Usb => "usb",
            Category::Privileged => "privileged",
            Category::Services => "services",
            Category::Egress => "egress",
            Category::FilesystemWrite => "filesystem.write",
            Category::FilesystemRead => "filesystem.read",
            Category::ExecAllow => "exec.allow",
            Category::Determinism => "determinism",
        }
    }

    /// The category named `s`, if any.
    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Category {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Category {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Category::parse(&s)
            .ok_or_else(|| D::Error::custom(format!("`{s}` is not a widening category")))
    }
}

/// One way a candidate widens a granted surface.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Widening {
    pub category: Category,
    /// What is newly granted (or the refusal no longer stated), as it appears on the surface.
    pub detail: String,
}

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.category,
            capgate_spec::text::printable(&self.detail)
        )
    }
}

/// Every widening of `candidate` over `granted`, in the spec's category order; within a
/// category, in the order of the list the detail comes from.
pub fn diff_widenings(granted: &Surface, candidate: &Surface) -> Vec<Widening> {
    let (g, c) = (granted, candidate);
    let mut out = Vec::new();
    let mut report = |category: Category, details: Vec<String>| {
        out.extend(
            details
                .into_iter()
                .map(|detail| Widening { category, detail }),
        );
    };

    report(
        Category::NetworkInstallAllow,
        missing_from(&g.network_install_allow, &c.network_install_allow),
    );
    report(
        Category::NetworkRuntimeAllow,
        missing_from(&g.network_runtime_allow, &c.network_runtime_allow),
    );
    report(
        Category::NetworkInstallDenyRemoved,
        missing_from(&c.network_install_deny, &g.network_install_deny),
    );
    report(
        Category::NetworkRuntimeDenyRemoved,
        missing_from(&c.network_runtime_deny, &g.network_runtime_deny),
    );
    report(
        Category::NetworkInstallHttpAllow,
        http_widenings(
            &g.network_install_allow,
            &c.network_install_allow,
            &complete_http_grants(&g.network_install_allow, &g.network_install_http_allow),
            &c.network_install_http_allow,
        ),
    );
    report(
        Category::NetworkRuntimeHttpAllow,
        http_widenings(
            &g.network_runtime_allow,
            &c.network_runtime_allow,
            &complete_http_grants(&g.network_runtime_allow, &g.network_runtime_http_allow),
            &c.network_runtime_http_allow,
        ),
    );
    report(
        Category::NetworkInstallHttpDenyRemoved,
        http_deny_removals(
            &g.network_install_deny,
            &c.network_install_deny,
            &g.network_install_http_deny,
            &c.network_install_http_deny,
        ),
    );
    report(
        Category::NetworkRuntimeHttpDenyRemoved,
        http_deny_removals(
            &g.network_runtime_deny,
            &c.network_runtime_deny,
            &g.network_runtime_http_deny,
            &c.network_runtime_http_deny,
        ),
    );
    report(
        Category::CredentialsInstall,
        missing_from(&g.credentials_install, &c.credentials_install),
    );
    report(
        Category::CredentialsRuntime,
        missing_from(&g.credentials_runtime, &c.credentials_runtime),
    );
    report(
        Category::SshAgent,
        ssh_agent_widenings(&g.ssh_agent, &c.ssh_agent),
    );
    report(
        Category::Storage,
        missing_from(&g.storage_paths, &c.storage_paths),
    );
    report(
        Category::HostMount,
        missing_from(&g.host_mount_paths, &c.host_mount_paths),
    );
    report(
        Category::Skills,
        missing_from(&g.skills_paths, &c.skills_paths),
    );
    report(
        Category::SkillsWrite,
        missing_from(&g.skills_write_paths, &c.skills_write_paths),
    );
    report(Category::Ports, missing_from(&g.ports, &c.ports));
    report(Category::Usb, missing_from(&g.usb, &c.usb));
    if c.privileged && !g.privileged {
        report(
            Category::Privileged,
            vec!["requests privileged execution".to_owned()],
        );
    }
    report(Category::Services, missing_from(&g.services, &c.services));
    report(Category::Egress, egress_widenings(&g.egress, &c.egress));
    report(
        Category::FilesystemWrite,
        place_widenings(
            g.filesystem_write.as_deref(),
            c.filesystem_write.as_deref(),
            "anywhere the sandbox lets a workload write (no list)",
        ),
    );
    report(
        Category::FilesystemRead,
        place_widenings(
            g.filesystem_read.as_deref(),
            c.filesystem_read.as_deref(),
            "the whole workspace (no list)",
        ),
    );
    // Programs are held to their exact paths: a file listed beneath a granted directory
    // brings the interpreter it names (`#!`, an ELF loader) and, a link, its target.
    report(
        Category::ExecAllow,
        match (g.exec_allow.as_deref(), c.exec_allow.as_deref()) {
            (None, _) => Vec::new(),
            (Some(_), None) => vec!["any program (no list)".to_owned()],
            (Some(granted), Some(candidate)) => missing_from(granted, candidate),
        },
    );
    // A tier promises; a less trusting one (or none, which binds like `unrestricted`)
    // takes a promise back.
    let binding = |t: Option<Tier>| t.unwrap_or(Tier::Unrestricted);
    if binding(c.determinism) > binding(g.determinism) {
        report(
            Category::Determinism,
            vec![format!(
                "tier `{}` (was `{}`)",
                binding(c.determinism),
                binding(g.determinism)
            )],
        );
    }
    out
}

/// The candidate's egress triples no granted one covers: the same one, or a `tcp` triple
/// on the same host and port (which carries HTTP and HTTPS too).
fn egress_widenings(granted: &[String], candidate: &[String]) -> Vec<String> {
    // Looked up, not scanned: a kit may list thousands.
    let exact: BTreeSet<&str> = granted.iter().map(String::as_str).collect();
    let tcp: BTreeSet<&str> = granted
        .iter()
        .filter_map(|g| {
            g.rsplit_once('/')
                .filter(|(_, p)| *p == "tcp")
                .map(|(at, _)| at)
        })
        .collect();
    candidate
        .iter()
        .filter(|c| {
            !exact.contains(c.as_str())
                && !c.rsplit_once('/').is_some_and(|(at, _)| tcp.contains(at))
        })
        .cloned()
        .collect()
}

/// Places (write places, read paths) the candidate grants beyond the granted ones: a path
/// beneath no granted path, or (no list at all, said as `unlisted`) everything, which holds
/// every list.
fn place_widenings(
    granted: Option<&[String]>,
    candidate: Option<&[String]>,
    unlisted: &str,
) -> Vec<String> {
    let Some(granted) = granted else {
        return Vec::new(); // no list was granted: nothing is wider
    };
    let Some(candidate) = candidate else {
        return vec![unlisted.to_owned()];
    };
    // A path is beneath a granted one when one of its ancestors (itself included) is
    // granted: looked up, not scanned, as a kit may list thousands.
    let granted: BTreeSet<&std::path::Path> = granted
        .iter()
        .map(|g| std::path::Path::new(g.as_str()))
        .collect();
    candidate
        .iter()
        .filter(|c| {
            !std::path::Path::new(c.as_str())
                .ancestors()
                .any(|a| granted.contains(a))
        })
        .cloned()
        .collect()
}

/// The entries of `candidate` not in `granted` (exact strings), in candidate order.
fn missing_from(granted: &[String], candidate: &[String]) -> Vec<String> {
    let granted: BTreeSet<&str> = granted.iter().map(String::as_str).collect();
    candidate
        .iter()
        .filter(|c| !granted.contains(c.as_str()))
        .cloned()
        .collect()
}

/// An atomic HTTP grant `"<METHOD> <host><path>"`, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HttpGrant<'a> {
    method: &'a str,
    host: &'a str,
    path: &'a str,
}

impl<'a> HttpGrant<'a> {
    /// Method = text before the first space; host = the rest up to its first `/`; path =
    /// from that slash on (`/` alone when there is none).
    fn parse(s: &'a str) -> HttpGrant<'a> {
        let (method, rest) = s.split_once(' ').unwrap_or((s, ""));
        let (host, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        HttpGrant { method, host, path }
    }

    /// Whether this grant (or refusal) covers `other`: host, method and path all covered.
    fn covers(&self, other: &HttpGrant<'_>) -> bool {
        host_covers(self.host, other.host)
            && (self.method == other.method || self.method == ANY)
            && path_pattern_covers(self.path, other.path)
    }
}

const ANY: &str = "ANY";

/// Whether granted host `g` covers candidate host `c`: `*` and `**` cover every host;
/// otherwise the names (see [`split_port`]) must be equal and a port-less grant covers
/// every port while `host:port` covers only that port. Globs are never expanded.
pub(crate) fn host_covers(g: &str, c: &str) -> bool {
    if g == "*" || g == "**" {
        return true;
    }
    let (g_name, g_port) = split_port(g);
    let (c_name, c_port) = split_port(c);
    g_name == c_name && (g_port.is_none() || g_port == c_port)
}

/// `host:port` → (`host`, `Some(port)`). An IPv6 address has no port unless bracketed
/// (`[2001:db8::1]:443` → `[2001:db8::1]`, `443`); a bare one (more than one `:`) is all
/// name, so that `2001` never passes for the name of `2001:db8::1`. Spellings of one
/// address that differ (bracketed or not) compare unequal: the gate then asks, never
/// lets through.
fn split_port(host: &str) -> (&str, Option<&str>) {
    if host.starts_with('[')
        && let Some(end) = host.find(']')
    {
        let (name, rest) = host.split_at(end + 1);
        return (name, rest.strip_prefix(':'));
    }
    if host.matches(':').count() > 1 {
        return (host, None);
    }
    match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    }
}

fn host_name(host: &str) -> &str {
    split_port(host).0
}

/// Whether path pattern `g` covers candidate path (or pattern) `c`: equal, or `g` is
/// `<prefix>/**` and `c` starts with `<prefix>/` or is `<prefix>` itself.
fn path_pattern_covers(g: &str, c: &str) -> bool {
    if g == c {
        return true;
    }
    match g.strip_suffix("**") {
        Some(prefix) if prefix.ends_with('/') => {
            c.starts_with(prefix) || prefix.strip_suffix('/') == Some(c)
        }
        _ => false,
    }
}

/// For locks that recorded only host lists: every granted host whose name (port stripped)
/// has no HTTP grant at all gets the implicit `ANY <host>/**` an unbounded host implies.
fn complete_http_grants(hosts: &[String], grants: &[String]) -> Vec<String> {
    let named: BTreeSet<&str> = grants
        .iter()
        .map(|g| host_name(HttpGrant::parse(g).host))
        .collect();
    let mut out: Vec<String> = grants.to_vec();
    out.extend(
        hosts
            .iter()
            .filter(|h| !named.contains(host_name(h)))
            .map(|h| format!("{ANY} {h}/**")),
    );
    out.sort_unstable();
    out.dedup();
    out
}

/// Candidate HTTP grants no granted one covers, except those whose host a newly listed host
/// covers (the host-level widening already says them, once).
fn http_widenings(
    granted_hosts: &[String],
    candidate_hosts: &[String],
    granted: &[String],
    candidate: &[String],
) -> Vec<String> {
    let granted_hosts: BTreeSet<&str> = granted_hosts.iter().map(String::as_str).collect();
    let fresh = Covering::hosts(
        candidate_hosts
            .iter()
            .map(String::as_str)
            .filter(|h| !granted_hosts.contains(h)),
    );
    let granted = Covering::new(granted.iter().map(|g| HttpGrant::parse(g)));
    candidate
        .iter()
        .filter(|c| {
            let parsed = HttpGrant::parse(c);
            !granted.covers(&parsed) && !suppressed(parsed.host, &fresh)
        })
        .cloned()
        .collect()
}

/// Whether an HTTP widening on `host` is already said by a fresh host-list entry: one that
/// covers it (`name` or `name:port` for `name:port`; only `name` for a bare `name`, which
/// means every port). The spec digest's rule also let every fresh `name:port` stand for a
/// bare `name`, but the prompt then named one port while the grant opened all of them.
fn suppressed(host: &str, fresh: &Covering<'_>) -> bool {
    fresh.covers_host(host)
}

/// Grants held for coverage questions, looked up instead of scanned (a kit may state
/// thousands, all on one host): the ones on every host (`*`, `**`), scanned; the rest by
/// host as written and method, each with its exact paths and the
/// prefixes of its `<prefix>/**` globs. A lookup asks exactly what [`HttpGrant::covers`]
/// asks of each held grant.
struct Covering<'a> {
    everywhere: Vec<HttpGrant<'a>>,
    /// Host strings held (`name` or `name:port`), for host-level questions.
    hosts: HashSet<&'a str>,
    /// (host as written, method) → the paths held there.
    paths: HashMap<(&'a str, &'a str), HeldPaths<'a>>,
}

/// Paths held for one host and method: exact ones, and the prefixes (ending in `/`) of
/// `<prefix>/**` globs.
#[derive(Default)]
struct HeldPaths<'a> {
    exact: HashSet<&'a str>,
    globs: HashSet<&'a str>,
}

impl<'a> Covering<'a> {
    fn new(grants: impl Iterator<Item = HttpGrant<'a>>) -> Self {
        let mut out = Covering {
            everywhere: Vec::new(),
            hosts: HashSet::new(),
            paths: HashMap::new(),
        };
        for g in grants {
            if g.host == "*" || g.host == "**" {
                out.everywhere.push(g);
                continue;
            }
            out.hosts.insert(g.host);
            let held = out.paths.entry((g.host, g.method)).or_default();
            held.exact.insert(g.path);
            if let Some(prefix) = g.path.strip_suffix("**").filter(|p| p.ends_with('/')) {
                held.globs.insert(prefix);
            }
        }
        out
    }

    /// Host-list entries, held as the grants they make (`ANY host/**`).
    fn hosts(hosts: impl Iterator<Item = &'a str>) -> Self {
        Covering::new(hosts.map(|host| HttpGrant {
            method: ANY,
            host,
            path: "/**",
        }))
    }

    /// The held host strings that can cover `host` ([`host_covers`]): its name, which
    /// covers every port, and, for `name:port`, itself.
    fn host_keys(host: &str) -> impl Iterator<Item = &str> {
        let (name, port) = split_port(host);
        std::iter::once(name).chain(port.map(|_| host))
    }

    /// Whether a held grant covers `c`.
    fn covers(&self, c: &HttpGrant<'_>) -> bool {
        if self.everywhere.iter().any(|g| g.covers(c)) {
            return true;
        }
        Self::host_keys(c.host).any(|host| {
            [c.method, ANY].into_iter().any(|method| {
                self.paths
                    .get(&(host, method))
                    .is_some_and(|held| held.covers(c.path))
            })
        })
    }

    /// Whether a held grant's host covers `host`.
    fn covers_host(&self, host: &str) -> bool {
        !self.everywhere.is_empty() || Self::host_keys(host).any(|h| self.hosts.contains(h))
    }
}

impl HeldPaths<'_> {
    /// Whether a held path covers path (or pattern) `c`, as [`path_pattern_covers`]
    /// judges: equal, or a glob's prefix begins `c`, or `c` is a prefix without its `/`.
    fn covers(&self, c: &str) -> bool {
        if self.exact.contains(c) {
            return true;
        }
        if self.globs.is_empty() {
            return false;
        }
        c.match_indices('/')
            .any(|(i, _)| self.globs.contains(&c[..=i]))
            || self.globs.contains(format!("{c}/").as_str())
    }
}

/// Granted HTTP refusals the candidate no longer states (nor covers), except those on a
/// host whose whole-host deny was dropped (already reported once as `deny-removed`).
fn http_deny_removals(
    granted_hosts: &[String],
    candidate_hosts: &[String],
    granted: &[String],
    candidate: &[String],
) -> Vec<String> {
    let candidate_hosts: BTreeSet<&str> = candidate_hosts.iter().map(String::as_str).collect();
    let dropped: BTreeSet<&str> = granted_hosts
        .iter()
        .map(String::as_str)
        .filter(|h| !candidate_hosts.contains(h))
        .collect();
    let candidate = Covering::new(candidate.iter().map(|c| HttpGrant::parse(c)));
    granted
        .iter()
        .filter(|g| {
            let parsed = HttpGrant::parse(g);
            !dropped.contains(parsed.host) && !candidate.covers(&parsed)
        })
        .cloned()
        .collect()
}

/// Candidate SSH-agent entries the granted ones do not cover. Per phase: `"<phase>"`
/// (unrestricted) is covered only by itself; `"<phase> sign <ns>"` by `"<phase>"` or
/// itself; `"<phase> authenticate <dest>"` by `"<phase>"`, itself, or (for `user@host`)
/// `"<phase> authenticate <host>"`.
fn ssh_agent_widenings(granted: &[String], candidate: &[String]) -> Vec<String> {
    let granted: BTreeSet<&str> = granted.iter().map(String::as_str).collect();
    candidate
        .iter()
        .filter(|c| {
            if granted.contains(c.as_str()) {
                return false;
            }
            let Some((phase, rest)) = c.split_once(' ') else {
                return true;
            };
            if granted.contains(phase) {
                return false;
            }
            let host_grant = rest
                .strip_prefix("authenticate ")
                .and_then(|dest| dest.split_once('@'))
                .map(|(_, host)| format!("{phase} authenticate {host}"));
            !host_grant.is_some_and(|h| granted.contains(h.as_str()))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        reason = "tests"
    )]

    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn category_names_round_trip() {
        for c in Category::ALL {
            assert_eq!(Category::parse(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<Category>(&json).unwrap(), c);
        }
        assert!(serde_json::from_str::<Category>("\"network\"").is_err());
        let mut sorted = Category::ALL;
        sorted.sort();
        assert_eq!(sorted, Category::ALL, "variant order is report order");
    }

    #[test]
    fn widening_display_and_json() {
        let w = Widening {
            category: Category::Privileged,
            detail: "requests privileged execution".into(),
        };
        assert_eq!(w.to_string(), "privileged: requests privileged execution");
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"category":"privileged","detail":"requests privileged execution"}"#
        );
    }

    #[test]
    fn grant_parsing() {
        let g = HttpGrant::parse("GET api.example.com/repos/**");
        assert_eq!(
            (g.method, g.host, g.path),
            ("GET", "api.example.com", "/repos/**")
        );
        let g = HttpGrant::parse("ANY **/**");
        assert_eq!((g.host, g.path), ("**", "/**"));
        let g = HttpGrant::parse("ANY host:8443");
        assert_eq!((g.host, g.path), ("host:8443", "/"));
    }

    #[test]
    fn host_coverage() {
        assert!(host_covers("*", "anything.example.com:1"));
        assert!(host_covers("**", "api.example.com"));
        assert!(host_covers("api.example.com", "api.example.com"));
        assert!(host_covers("api.example.com", "api.example.com:8443"));
        assert!(host_covers("api.example.com:8443", "api.example.com:8443"));
        assert!(!host_covers("api.example.com:8443", "api.example.com"));
        assert!(!host_covers("api.example.com:8443", "api.example.com:443"));
        assert!(!host_covers("*.example.com", "api.example.com"));
        assert!(!host_covers("API.example.com", "api.example.com"));
        assert!(!host_covers("api.example.com", "**"));
    }

    #[test]
    fn path_coverage() {
        assert!(path_pattern_covers("/x", "/x"));
        assert!(path_pattern_covers("/**", "/"));
        assert!(path_pattern_covers("/**", "/anything/at/all"));
        assert!(path_pattern_covers("/repos/**", "/repos/a/b"));
        assert!(path_pattern_covers("/repos/**", "/repos/"));
        assert!(path_pattern_covers("/repos/**", "/repos"));
        assert!(path_pattern_covers("/repos/**", "/repos/x/**"));
        assert!(!path_pattern_covers("/repos/**", "/reposx"));
        assert!(!path_pattern_covers("/repos/**", "/user"));
        assert!(!path_pattern_covers("/repos*", "/repos"));
        assert!(!path_pattern_covers("/repos/*", "/repos/a"));
        assert!(!path_pattern_covers("/a**", "/a/b"));
        assert!(!path_pattern_covers("/repos", "/repos/**"));
        assert!(!path_pattern_covers("/x/**", "/**"));
    }

    #[test]
    fn completion_adds_implicit_any_for_hosts_without_grants() {
        let done = complete_http_grants(
            &strings(&["a.example.com", "b.example.com:8443", "c.example.com"]),
            &strings(&["GET b.example.com/x", "GET c.example.com:9000/y"]),
        );
        assert_eq!(
            done,
            strings(&[
                "ANY a.example.com/**",
                "GET b.example.com/x",
                "GET c.example.com:9000/y",
            ])
        );
        assert_eq!(
            complete_http_grants(&strings(&["h"]), &[]),
            strings(&["ANY h/**"])
        );
        assert!(complete_http_grants(&[], &[]).is_empty());
    }

    #[test]
    fn suppression_rules() {
        let fresh = Covering::hosts(
            [
                "new.example.com",
                "mixed.example.com:8443",
                "p.example.com:9000",
            ]
            .into_iter(),
        );
        // A bare host (every port) is said by a fresh bare entry of that name only.
        assert!(suppressed("new.example.com", &fresh));
        assert!(!suppressed("other.example.com", &fresh));
        // A fresh `name:port` does not say a grant on every port of the name: that grant
        // is reported on its own, or the prompt would name one port while all were opened.
        assert!(!suppressed("p.example.com", &fresh));
        assert!(!suppressed("mixed.example.com", &fresh));
        // A ported host: itself fresh, or its bare name fresh.
        assert!(suppressed("p.example.com:9000", &fresh));
        assert!(suppressed("new.example.com:1", &fresh));
        assert!(suppressed("mixed.example.com:8443", &fresh));
        assert!(!suppressed("mixed.example.com:1", &fresh));
        // A fresh allow-everything says everything.
        let star = Covering::hosts(["**"].into_iter());
        assert!(suppressed("any.example.com", &star));
    }

    #[test]
    fn ipv6_addresses_are_names_not_name_and_port() {
        assert_eq!(
            split_port("2a00:1450:4001:81c::200e"),
            ("2a00:1450:4001:81c::200e", None)
        );
        assert_eq!(
            split_port("[2001:db8::1]:443"),
            ("[2001:db8::1]", Some("443"))
        );
        assert_eq!(split_port("[2001:db8::1]"), ("[2001:db8::1]", None));
        assert_eq!(
            split_port("example.com:8443"),
            ("example.com", Some("8443"))
        );
        // A host named like an address's first group never covers the address.
        assert!(!host_covers("2a00", "2a00:1450:4001:81c::200e"));
        assert!(host_covers("[2001:db8::1]", "[2001:db8::1]:443"));
        assert!(!host_covers("[2001:db8::1]:80", "[2001:db8::1]:443"));
    }

    #[test]
    fn http_widenings_respect_coverage_and_suppression() {
        // A new unbounded host: its implicit ANY grant is said once, by the host list.
        assert!(http_widenings(&[], &strings(&["a"]), &[], &strings(&["ANY a/**"])).is_empty());
        // A bounded grant on a host nobody granted is reported.
        assert_eq!(
            http_widenings(&[], &[], &[], &strings(&["GET a/x"])),
            strings(&["GET a/x"])
        );
        // Covered by ANY and a `/**` prefix.
        assert!(
            http_widenings(
                &[],
                &[],
                &strings(&["ANY a/x/**"]),
                &strings(&["GET a/x/y", "POST a/x"])
            )
            .is_empty()
        );
        // A specific method covers only itself.
        assert_eq!(
            http_widenings(&[], &[], &strings(&["GET a/**"]), &strings(&["HEAD a/**"])),
            strings(&["HEAD a/**"])
        );
    }

    #[test]
    fn http_deny_removals_skip_dropped_hosts_and_covered_refusals() {
        // The whole-host deny was dropped: reported once, by the host list.
        assert!(http_deny_removals(&strings(&["t"]), &[], &strings(&["ANY t/**"]), &[]).is_empty());
        // A bounded refusal dropped.
        assert_eq!(
            http_deny_removals(&[], &[], &strings(&["DELETE a/**"]), &[]),
            strings(&["DELETE a/**"])
        );
        // Replaced by a wider refusal: not a widening.
        assert!(
            http_deny_removals(&[], &[], &strings(&["DELETE a/x"]), &strings(&["ANY a/**"]))
                .is_empty()
        );
        // Replaced by a narrower refusal: a widening.
        assert_eq!(
            http_deny_removals(
                &[],
                &[],
                &strings(&["ANY a/**"]),
                &strings(&["DELETE a/**"])
            ),
            strings(&["ANY a/**"])
        );
    }

    #[test]
    fn ssh_agent_coverage() {
        let granted = strings(&["install sign git", "runtime"]);
        assert!(
            ssh_agent_widenings(
                &granted,
                &strings(&["runtime sign x", "runtime authenticate u@h"])
            )
            .is_empty()
        );
        assert_eq!(
            ssh_agent_widenings(
                &granted,
                &strings(&["install", "install sign git", "install sign other"])
            ),
            strings(&["install", "install sign other"])
        );
        let bounded = strings(&[
            "runtime authenticate github.com",
            "runtime authenticate git@gitlab.com",
        ]);
        assert!(
            ssh_agent_widenings(&bounded, &strings(&["runtime authenticate git@github.com"]))
                .is_empty()
        );
        assert_eq!(
            ssh_agent_widenings(
                &bounded,
                &strings(&["runtime authenticate gitlab.com", "runtime sign git"])
            ),
            strings(&["runtime authenticate gitlab.com", "runtime sign git"])
        );
        // install → runtime is a new phase.
        assert_eq!(
            ssh_agent_widenings(&strings(&["install"]), &strings(&["runtime"])),
            strings(&["runtime"])
        );
    }

    #[test]
    fn privileged_and_order() {
        let granted = Surface::default();
        let candidate = Surface {
            network_runtime_allow: strings(&["t.example.com"]),
            credentials_runtime: strings(&["github"]),
            storage_paths: strings(&["/data"]),
            host_mount_paths: strings(&["/data"]),
            privileged: true,
            services: strings(&["com.docker.sandbox/kit-registry@1"]),
            ..Surface::default()
        };
        let got: Vec<String> = diff_widenings(&granted, &candidate)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            strings(&[
                "network.runtime.allow: t.example.com",
                "credentials.runtime: github",
                "storage: /data",
                "host-mount: /data",
                "privileged: requests privileged execution",
                "services: com.docker.sandbox/kit-registry@1",
            ])
        );
        assert!(diff_widenings(&candidate, &granted).is_empty());
    }

    /// A write place beneath a granted one widens nothing; a program does, even beneath a
    /// granted directory: a listed file brings the interpreter its `#!` line or ELF header
    /// names, and a link its target.
    #[test]
    fn programs_are_held_to_their_exact_paths_and_places_to_their_ancestors() {
        let granted = Surface {
            filesystem_write: Some(strings(&["/home/agent/out"])),
            exec_allow: Some(strings(&["/usr/lib/git-core"])),
            ..Surface::default()
        };
        let candidate = Surface {
            filesystem_write: Some(strings(&["/home/agent/out", "/home/agent/out/sub"])),
            exec_allow: Some(strings(&[
                "/usr/lib/git-core",
                "/usr/lib/git-core/git-bisect",
            ])),
            ..Surface::default()
        };
        let got: Vec<String> = diff_widenings(&granted, &candidate)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, strings(&["exec.allow: /usr/lib/git-core/git-bisect"]));
        // No list at all grants any program; no list before, nothing is wider.
        let unlisted = Surface::default();
        let got: Vec<String> = diff_widenings(&granted, &unlisted)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            got.contains(&"exec.allow: any program (no list)".to_owned()),
            "{got:?}"
        );
        assert!(diff_widenings(&unlisted, &candidate).is_empty());
    }

    /// The indexed lookup answers exactly what asking every held grant would: checked over
    /// every pairing of hosts (ports, wildcards, IPv6), methods and paths (exact, globs, a
    /// glob's own prefix).
    #[test]
    fn the_indexed_lookup_equals_asking_every_grant() {
        let hosts = [
            "a.com",
            "a.com:443",
            "a.com:8443",
            "b.com",
            "**",
            "[::1]:443",
            "[::1]",
        ];
        let methods = ["GET", "POST", "ANY"];
        let paths = [
            "/", "/x", "/x/", "/x/y", "/x/**", "/x/y/**", "/**", "/xy", "/x**",
        ];
        let mut all: Vec<String> = Vec::new();
        for h in hosts {
            for m in methods {
                for p in paths {
                    all.push(format!("{m} {h}{p}"));
                }
            }
        }
        // Held sets of a few shapes: every third grant, then one of each kind alone.
        let sets: Vec<Vec<&String>> = std::iter::once(all.iter().step_by(3).collect())
            .chain(all.iter().step_by(7).map(|g| vec![g]))
            .collect();
        for held in &sets {
            let parsed: Vec<HttpGrant<'_>> = held.iter().map(|g| HttpGrant::parse(g)).collect();
            let index = Covering::new(parsed.iter().copied());
            for c in &all {
                let cp = HttpGrant::parse(c);
                let naive = parsed.iter().any(|g| g.covers(&cp));
                assert_eq!(index.covers(&cp), naive, "{c} against {held:?}");
            }
        }
    }
}
