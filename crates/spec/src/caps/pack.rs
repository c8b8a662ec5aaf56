//! capgate's own capability types (namespace `dev.capgate`), for the pack model of seed 002:
//! what a pack promises about its behaviour, beside what it may reach.
//!
//! The kit format grows through types (spec §7.3), so these are ordinary typed entries: a
//! kit that uses them reads strictly here, and a runtime that does not know them refuses a
//! required one by name instead of ignoring it.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;

use crate::caps::BlockKey;
use crate::node::{Node, Path};
use crate::read::Cx;

/// How reproducible a workload promises to be (seed 002, "Determinism tiers"). The order is
/// the order of trust: each tier promises less than the one before.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    serde::Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The same input gives the same output: the workload reads, never changes anything
    /// outside its sandbox. capgate holds it to that: only `GET`, `HEAD` and `OPTIONS`
    /// requests leave the sandbox, all of them inspected.
    ReadOnly,
    /// The workload makes changes outside the sandbox (posts a message, writes a record).
    SideEffect,
    /// An opaque workload; implies `side-effect`.
    Unrestricted,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::ReadOnly, Tier::SideEffect, Tier::Unrestricted];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::ReadOnly => "read-only",
            Tier::SideEffect => "side-effect",
            Tier::Unrestricted => "unrestricted",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `dev.capgate/determinism@1`: the workload's determinism tier. One per kit; kits of one
/// composition that name different tiers are refused (a workload has one tier).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Determinism {
    /// `read-only`, `side-effect` or `unrestricted`.
    pub tier: Tier,
}

pub(crate) fn decode_determinism(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Determinism> {
    let mut f = cx.fields(node, path)?;
    let tier = f.required_string(cx, "tier").map(|s| (s, f.at("tier")));
    f.finish(cx);
    let (written, at) = tier?;
    if !cx.judgeable(written) {
        return None;
    }
    match Tier::parse(written) {
        Some(tier) => Some(Determinism { tier }),
        None => {
            cx.error(
                &at,
                crate::caps::storage::node_pos(node, "tier"),
                format!(
                    "tier `{written}` is not one of `read-only`, `side-effect`, `unrestricted`"
                ),
            );
            None
        }
    }
}

/// What an egress triple lets through (seed 002: "host + port + protocol — all three must
/// match").
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    serde::Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EgressProtocol {
    /// TLS whose server name is the host: opaque unless other rules need it inspected.
    Https,
    /// Cleartext HTTP requests.
    Http,
    /// Any TCP stream (SOCKS5, or a CONNECT tunnel), HTTP and HTTPS included.
    Tcp,
}

impl EgressProtocol {
    pub const ALL: [EgressProtocol; 3] = [
        EgressProtocol::Https,
        EgressProtocol::Http,
        EgressProtocol::Tcp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EgressProtocol::Https => "https",
            EgressProtocol::Http => "http",
            EgressProtocol::Tcp => "tcp",
        }
    }

    pub fn parse(s: &str) -> Option<EgressProtocol> {
        EgressProtocol::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for EgressProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `dev.capgate/egress@1`: one egress triple of a pack, granted in the runtime phase. The
/// workload may reach `host` on `port` with `protocol`, and nothing else of that host:
/// an `https` triple lets no cleartext through, an `http` one no tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Egress {
    /// A host name (`api.openai.com`), a wildcard (`*.openai.com` one label below,
    /// `**.openai.com` any depth, `*` every host), or an IP address; never a port.
    pub host: String,
    /// 1 to 65535.
    pub port: u16,
    /// `https`, `http` or `tcp`.
    pub protocol: EgressProtocol,
}

impl Egress {
    /// `host:port` as network rules write it (`[2001:db8::1]:443` for IPv6), lowercase.
    pub fn host_port(&self) -> String {
        let host = self.host.to_ascii_lowercase();
        if host.contains(':') {
            format!("[{host}]:{}", self.port)
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The triple as the lock records it: `api.openai.com:443/https`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.host_port(), self.protocol)
    }
}

/// Why `host` cannot be an egress host, if it cannot.
fn host_problem(host: &str) -> Option<&'static str> {
    if host.is_empty() {
        return Some("is empty");
    }
    if host.parse::<std::net::IpAddr>().is_ok() || host == "*" || host == "**" {
        return None;
    }
    if host.contains(':') {
        return Some("holds a `:`; the port is a field of its own");
    }
    let name = host
        .strip_prefix("**.")
        .or_else(|| host.strip_prefix("*."))
        .unwrap_or(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || !c.is_ascii())
            && !l.chars().any(char::is_whitespace)
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Some("is not a host name, a wildcard such as `*.example.com`, or an IP address");
    }
    None
}

pub(crate) fn decode_egress(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Egress> {
    let mut f = cx.fields(node, path)?;
    let host = f.required_string(cx, "host").map(|s| (s, f.at("host")));
    let port = f.require(cx, "port").map(|n| (n, f.at("port")));
    let protocol = f
        .required_string(cx, "protocol")
        .map(|s| (s, f.at("protocol")));
    f.finish(cx);
    let pos = |key: &str| crate::caps::storage::node_pos(node, key);
    let mut ok = true;
    if let Some((h, at)) = &host
        && cx.judgeable(h)
        && let Some(problem) = host_problem(h)
    {
        cx.error(at, pos("host"), format!("egress host `{h}` {problem}"));
        ok = false;
    }
    let port = match port {
        Some((n, at)) => match cx.integer(n, &at) {
            Some(p) => match u16::try_from(p) {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    cx.error(&at, n.pos, format!("port {p} is out of range (1 to 65535)"));
                    None
                }
            },
            None => None,
        },
        None => None,
    };
    let protocol = match protocol {
        Some((p, at)) if cx.judgeable(p) => match EgressProtocol::parse(p) {
            Some(p) => Some(p),
            None => {
                cx.error(
                    &at,
                    pos("protocol"),
                    format!("protocol `{p}` is not one of `https`, `http`, `tcp`"),
                );
                None
            }
        },
        _ => None,
    };
    let (Some((host, _)), Some(port), Some(protocol)) = (host, port, protocol) else {
        return None;
    };
    (ok && cx.judgeable(host)).then(|| Egress {
        host: host.to_owned(),
        port,
        protocol,
    })
}

/// A block states one triple once.
pub(crate) fn egress_block_keys(config: &Node) -> Vec<BlockKey> {
    let (Some(host), Some(port), Some(protocol)) = (
        super::literal_str(config, "host"),
        config.get("port").map(Node::to_json),
        super::literal_str(config, "protocol"),
    ) else {
        return Vec::new();
    };
    let host = host.to_ascii_lowercase();
    vec![BlockKey {
        key: format!("egress:{host}:{port}/{protocol}"),
        what: format!("egress `{host}` port {port} over {protocol}"),
    }]
}

/// `dev.capgate/filesystem@1`: where the workload may write (seed 002's `fs.write`). With
/// it, writes anywhere else fail (EROFS: the sandbox's writable mounts turn read-only
/// around the places, which also holds chmod, utimes and xattrs; EACCES from Landlock
/// where a mount stays writable), the workspace, home and `/tmp` included;
/// without it, those are writable. Paths are inside the sandbox and prefix-matched
/// (`/home/agent/workspace/out` grants `…/out/report.json`); each must lie beneath the
/// workspace, `/home/agent`, `/tmp`, `/dev/shm` or a volume (judged at run). An empty list
/// writes nowhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filesystem {
    /// Absolute, clean paths inside the sandbox.
    pub write: Vec<String>,
    /// Seed 002's `fs.read`: when stated, the workspace shows only these paths (each
    /// beneath `/home/agent/workspace`, read-only) and the write places within it;
    /// everything else in it does not exist (ENOENT). Judged at run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<Vec<String>>,
}

pub(crate) fn decode_filesystem(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Filesystem> {
    let mut f = cx.fields(node, path)?;
    let write = f.require(cx, "write").map(|n| (n, f.at("write")));
    let read = f.take("read").map(|n| (n, f.at("read")));
    f.finish(cx);
    let write = paths(cx, write?, "write path");
    let read = match read {
        Some(list) => Some(paths(cx, list, "read path")?),
        None => None,
    };
    Some(Filesystem {
        write: write?,
        read,
    })
}

/// `dev.capgate/exec@1`: the programs the workload may execute (seed 002: "only the pack's
/// own interpreter; subprocess spawn is denied"). With it, `execve` of anything else fails
/// with EACCES; each entry is a program (`/usr/bin/python3`) or a directory whose programs
/// may all run, and the interpreters they name (an ELF program's loader, a script's `#!`
/// line) are granted with them. It binds everything the sandbox runs, install hooks and
/// the command included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exec {
    /// Absolute, clean paths inside the sandbox; at least one.
    #[schemars(length(min = 1))]
    pub allow: Vec<String>,
}

pub(crate) fn decode_exec(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Exec> {
    let allow = path_list(cx, node, path, "allow", "program")?;
    if allow.is_empty() {
        cx.error(
            &path.key("allow"),
            crate::caps::storage::node_pos(node, "allow"),
            "`allow` names no program: nothing, not even the command, could run",
        );
        return None;
    }
    Some(Exec { allow })
}

/// The required list of absolute, clean paths (never `/`, none twice) at `key`.
fn path_list(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    key: &str,
    what: &str,
) -> Option<Vec<String>> {
    let mut f = cx.fields(node, path)?;
    let list = f.require(cx, key).map(|n| (n, f.at(key)));
    f.finish(cx);
    paths(cx, list?, what)
}

/// A list of absolute, clean paths (never `/`, none twice).
fn paths(cx: &mut Cx<'_>, (list, at): (&Node, Path), what: &str) -> Option<Vec<String>> {
    let items = cx.string_list(list, &at)?;
    let mut out = Vec::with_capacity(items.len());
    // Looked up, not scanned: a list may be long.
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    let mut ok = true;
    for (item_path, p, pos) in items {
        if !cx.judgeable(p) {
            ok = false;
            continue;
        }
        if p == "/" || !crate::caps::is_canonical_absolute(p) {
            cx.error(
                &item_path,
                pos,
                format!("{what} `{p}` is not an absolute, clean path below `/` (no `.`, `..`, `//`, trailing `/` or control character)"),
            );
            ok = false;
            continue;
        }
        if !seen.insert(p) {
            cx.error(&item_path, pos, format!("{what} `{p}` is listed twice"));
            ok = false;
            continue;
        }
        out.push(p.to_owned());
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn decode_text(text: &str) -> (Option<Determinism>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
        assert!(diags.is_empty(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        let d = decode_determinism(&mut cx, &node, &Path::from(AT));
        (d, diags)
    }

    #[test]
    fn reads_each_tier_strictly() {
        for t in Tier::ALL {
            let (d, diags) = decode_text(&format!("tier: {t}\n"));
            assert!(!diags.has_errors(), "{diags:?}");
            assert_eq!(d, Some(Determinism { tier: t }));
        }
        for (text, path, fragment) in [
            ("{}", AT, "`tier` is required"),
            (
                "tier: readonly\n",
                "capabilities[0].config.tier",
                "not one of",
            ),
            ("tier: 3\n", "capabilities[0].config.tier", "string"),
            (
                "tier: read-only\ncache: true\n",
                "capabilities[0].config.cache",
                "unknown field `cache`",
            ),
            ("[read-only]", AT, "mapping"),
        ] {
            let (d, diags) = decode_text(text);
            assert!(diags.contains(path, fragment), "{text}: {diags:?}");
            if !text.contains("cache") {
                assert_eq!(d, None, "{text}");
            }
        }
    }

    #[test]
    fn tiers_round_trip_and_order_by_trust() {
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.as_str()), Some(t));
        }
        assert!(Tier::ReadOnly < Tier::SideEffect && Tier::SideEffect < Tier::Unrestricted);
        assert_eq!(Tier::parse("readonly"), None);
        assert_eq!(Tier::parse("Read-Only"), None);
    }

    fn egress_text(text: &str) -> (Option<Egress>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
        let mut cx = Cx::new(&mut diags);
        let e = decode_egress(&mut cx, &node, &Path::from(AT));
        (e, diags)
    }

    #[test]
    fn egress_triples_read_strictly() {
        for (text, key) in [
            (
                "{host: api.openai.com, port: 443, protocol: https}",
                "api.openai.com:443/https",
            ),
            (
                "{host: Hooks.Slack.com, port: 443, protocol: https}",
                "hooks.slack.com:443/https",
            ),
            (
                "{host: \"*.example.org\", port: 80, protocol: http}",
                "*.example.org:80/http",
            ),
            (
                "{host: 192.168.1.1, port: 5432, protocol: tcp}",
                "192.168.1.1:5432/tcp",
            ),
            (
                "{host: \"2001:db8::1\", port: 22, protocol: tcp}",
                "[2001:db8::1]:22/tcp",
            ),
            ("{host: \"*\", port: 443, protocol: https}", "*:443/https"),
            (
                "{host: bücher.example, port: 443, protocol: https}",
                "bücher.example:443/https",
            ),
        ] {
            let (e, diags) = egress_text(text);
            assert!(!diags.has_errors(), "{text}: {diags:?}");
            assert_eq!(e.unwrap().key(), key, "{text}");
        }
        for (text, path, fragment) in [
            ("{port: 443, protocol: https}", AT, "`host` is required"),
            (
                "{host: a.example, protocol: https}",
                AT,
                "`port` is required",
            ),
            ("{host: a.example, port: 443}", AT, "`protocol` is required"),
            (
                "{host: \"a.example:443\", port: 443, protocol: https}",
                "capabilities[0].config.host",
                "the port is a field of its own",
            ),
            (
                "{host: \"foo..com\", port: 443, protocol: https}",
                "capabilities[0].config.host",
                "is not a host name",
            ),
            (
                "{host: \"a b.com\", port: 443, protocol: https}",
                "capabilities[0].config.host",
                "is not a host name",
            ),
            (
                "{host: \"\", port: 443, protocol: https}",
                "capabilities[0].config.host",
                "is empty",
            ),
            (
                "{host: a.example, port: 0, protocol: https}",
                "capabilities[0].config.port",
                "out of range",
            ),
            (
                "{host: a.example, port: 65536, protocol: https}",
                "capabilities[0].config.port",
                "out of range",
            ),
            (
                "{host: a.example, port: \"443\", protocol: https}",
                "capabilities[0].config.port",
                "expected a number",
            ),
            (
                "{host: a.example, port: 443, protocol: HTTPS}",
                "capabilities[0].config.protocol",
                "not one of",
            ),
            (
                "{host: a.example, port: 443, protocol: udp}",
                "capabilities[0].config.protocol",
                "not one of",
            ),
            (
                "{host: a.example, port: 443, protocol: https, methods: [GET]}",
                "capabilities[0].config.methods",
                "unknown field",
            ),
        ] {
            let (e, diags) = egress_text(text);
            assert!(diags.contains(path, fragment), "{text}: {diags:?}");
            if !fragment.contains("unknown") {
                assert_eq!(e, None, "{text}");
            }
        }
    }

    #[test]
    fn write_paths_read_strictly() {
        let read = |text: &str| {
            let mut diags = Diagnostics::new();
            let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
            let mut cx = Cx::new(&mut diags);
            let f = decode_filesystem(&mut cx, &node, &Path::from(AT));
            (f, diags)
        };
        let (f, d) = read("write: [/home/agent/workspace/out, /tmp]");
        assert!(!d.has_errors(), "{d:?}");
        assert_eq!(f.unwrap().write, ["/home/agent/workspace/out", "/tmp"]);
        let (f, d) = read("write: []");
        assert!(!d.has_errors(), "{d:?}");
        assert_eq!(f.unwrap().write, Vec::<String>::new());
        let (f, d) = read("write: []\nread: [/home/agent/workspace/inputs]");
        assert!(!d.has_errors(), "{d:?}");
        assert_eq!(
            f.unwrap().read,
            Some(vec!["/home/agent/workspace/inputs".to_owned()])
        );
        for (text, fragment) in [
            ("{}", "`write` is required"),
            ("write: [relative/out]", "not an absolute, clean path"),
            ("write: [/home/agent/../etc]", "not an absolute, clean path"),
            ("write: [/out/]", "not an absolute, clean path"),
            ("write: [/]", "not an absolute, clean path"),
            ("write: [/tmp, /tmp]", "listed twice"),
            ("write: /tmp", "list"),
            ("write: [/tmp]\nreads: [/x]", "unknown field `reads`"),
            (
                "write: [/tmp]\nread: [x]",
                "read path `x` is not an absolute",
            ),
        ] {
            let (_, d) = read(text);
            assert!(
                d.errors().any(|e| e.message.contains(fragment)),
                "{text}: {d:?}"
            );
        }
    }

    #[test]
    fn exec_allowlists_read_strictly() {
        let read = |text: &str| {
            let mut diags = Diagnostics::new();
            let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
            let mut cx = Cx::new(&mut diags);
            let e = decode_exec(&mut cx, &node, &Path::from(AT));
            (e, diags)
        };
        let (e, d) = read("allow: [/usr/bin/python3, /opt/pack/bin]");
        assert!(!d.has_errors(), "{d:?}");
        assert_eq!(e.unwrap().allow, ["/usr/bin/python3", "/opt/pack/bin"]);
        for (text, fragment) in [
            ("allow: []", "names no program"),
            ("{}", "`allow` is required"),
            ("allow: [python3]", "not an absolute, clean path"),
            ("allow: [/usr/bin/../bin/sh]", "not an absolute, clean path"),
            ("allow: [/bin/sh, /bin/sh]", "listed twice"),
            ("allow: [/bin/sh]\ndeny: [/bin/rm]", "unknown field `deny`"),
        ] {
            let (_, d) = read(text);
            assert!(
                d.errors().any(|e| e.message.contains(fragment)),
                "{text}: {d:?}"
            );
        }
    }
}
