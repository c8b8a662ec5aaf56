//! Capability types: the type grammar, the well-known types of spec §2, and their typed
//! configs.
//!
//! Every well-known type has a module with a typed config struct (as written, serialized
//! back in the published JSON form), a `decode` that reads it strictly from a [`Node`] and
//! records every problem, and `block_keys` naming what one declaration block may hold only
//! once (spec §1.10: arity and duplicates are judged per block).

pub mod agent;
pub mod credential;
pub mod lifecycle;
pub mod network;
pub mod pack;
pub mod ssh_agent;
pub mod storage;

use std::fmt;

use serde::Serialize;

use crate::node::{Node, Path, Value};
use crate::read::Cx;

/// The namespace of the well-known types.
pub const SANDBOX_NAMESPACE: &str = "com.docker.sandbox";

/// The namespace of capgate's own types (the pack model, see [`pack`]).
pub const CAPGATE_NAMESPACE: &str = "dev.capgate";

/// Checks the capability type grammar of spec §1.7:
/// `^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-z0-9]([a-z0-9-]*[a-z0-9])?@[1-9][0-9]*$`.
pub fn is_valid_type(s: &str) -> bool {
    fn edge_ok(part: &str, inner: fn(u8) -> bool) -> bool {
        let b = part.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        match b {
            [] => false,
            [only] => alnum(*only),
            [first, middle @ .., last] => {
                alnum(*first) && alnum(*last) && middle.iter().all(|&c| inner(c))
            }
        }
    }
    let Some((ns, rest)) = s.split_once('/') else {
        return false;
    };
    let Some((name, version)) = rest.split_once('@') else {
        return false;
    };
    let ns_inner = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-';
    let name_inner = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
    let version_ok = version
        .as_bytes()
        .first()
        .is_some_and(|c| (b'1'..=b'9').contains(c))
        && version.bytes().all(|c| c.is_ascii_digit());
    edge_ok(ns, ns_inner) && edge_ok(name, name_inner) && version_ok
}

/// A grant phase (spec §3): `install` while install hooks run, `runtime` afterwards.
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
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Install,
    Runtime,
}

impl Phase {
    pub const ALL: [Phase; 2] = [Phase::Install, Phase::Runtime];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Install => "install",
            Phase::Runtime => "runtime",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "install" => Some(Phase::Install),
            "runtime" => Some(Phase::Runtime),
            _ => None,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The well-known capability types (spec §2), and capgate's own (namespace `dev.capgate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum KnownType {
    NetworkPolicyV1,
    NetworkPolicyV2,
    Credential,
    SshAgent,
    Volume,
    HostMount,
    Port,
    UsbDevice,
    Resources,
    Privileged,
    LongRunning,
    Lifecycle,
    AgentContext,
    AgentSessions,
    AgentInteractiveSessions,
    AgentSkills,
    AgentSkill,
    GitIdentity,
    KitRegistry,
    Sbx,
    Acp,
    Determinism,
    Egress,
    Filesystem,
    Exec,
}

impl KnownType {
    pub const ALL: [KnownType; 25] = [
        KnownType::NetworkPolicyV1,
        KnownType::NetworkPolicyV2,
        KnownType::Credential,
        KnownType::SshAgent,
        KnownType::Volume,
        KnownType::HostMount,
        KnownType::Port,
        KnownType::UsbDevice,
        KnownType::Resources,
        KnownType::Privileged,
        KnownType::LongRunning,
        KnownType::Lifecycle,
        KnownType::AgentContext,
        KnownType::AgentSessions,
        KnownType::AgentInteractiveSessions,
        KnownType::AgentSkills,
        KnownType::AgentSkill,
        KnownType::GitIdentity,
        KnownType::KitRegistry,
        KnownType::Sbx,
        KnownType::Acp,
        KnownType::Determinism,
        KnownType::Egress,
        KnownType::Filesystem,
        KnownType::Exec,
    ];

    /// The full type string, e.g. `com.docker.sandbox/network-policy@2`.
    pub fn name(self) -> &'static str {
        match self {
            KnownType::NetworkPolicyV1 => "com.docker.sandbox/network-policy@1",
            KnownType::NetworkPolicyV2 => "com.docker.sandbox/network-policy@2",
            KnownType::Credential => "com.docker.sandbox/credential@1",
            KnownType::SshAgent => "com.docker.sandbox/ssh-agent@1",
            KnownType::Volume => "com.docker.sandbox/volume@1",
            KnownType::HostMount => "com.docker.sandbox/host-mount@1",
            KnownType::Port => "com.docker.sandbox/port@1",
            KnownType::UsbDevice => "com.docker.sandbox/usb-device@1",
            KnownType::Resources => "com.docker.sandbox/resources@1",
            KnownType::Privileged => "com.docker.sandbox/privileged@1",
            KnownType::LongRunning => "com.docker.sandbox/long-running@1",
            KnownType::Lifecycle => "com.docker.sandbox/lifecycle@1",
            KnownType::AgentContext => "com.docker.sandbox/agent-context@1",
            KnownType::AgentSessions => "com.docker.sandbox/agent-sessions@1",
            KnownType::AgentInteractiveSessions => {
                "com.docker.sandbox/agent-interactive-sessions@1"
            }
            KnownType::AgentSkills => "com.docker.sandbox/agent-skills@1",
            KnownType::AgentSkill => "com.docker.sandbox/agent-skill@1",
            KnownType::GitIdentity => "com.docker.sandbox/git-identity@1",
            KnownType::KitRegistry => "com.docker.sandbox/kit-registry@1",
            KnownType::Sbx => "com.docker.sandbox/sbx@1",
            KnownType::Acp => "com.docker.sandbox/acp@1",
            KnownType::Determinism => "dev.capgate/determinism@1",
            KnownType::Egress => "dev.capgate/egress@1",
            KnownType::Filesystem => "dev.capgate/filesystem@1",
            KnownType::Exec => "dev.capgate/exec@1",
        }
    }

    pub fn parse(s: &str) -> Option<KnownType> {
        KnownType::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Types that take no config at all (spec §1.7): stating one, even `{}` or `null`, is
    /// an error.
    pub fn is_config_less(self) -> bool {
        matches!(
            self,
            KnownType::Privileged
                | KnownType::KitRegistry
                | KnownType::Sbx
                | KnownType::LongRunning
                | KnownType::GitIdentity
        )
    }

    /// Types of which a block holds at most one entry.
    pub fn is_singleton(self) -> bool {
        matches!(
            self,
            KnownType::NetworkPolicyV1
                | KnownType::NetworkPolicyV2
                | KnownType::Resources
                | KnownType::Privileged
                | KnownType::LongRunning
                | KnownType::Lifecycle
                | KnownType::AgentSessions
                | KnownType::AgentInteractiveSessions
                | KnownType::GitIdentity
                | KnownType::KitRegistry
                | KnownType::Sbx
                | KnownType::Determinism
                | KnownType::Filesystem
                | KnownType::Exec
        )
    }

    /// Types only a workload may declare (spec §2.20).
    pub fn is_workload_only(self) -> bool {
        self == KnownType::Sbx
    }
}

impl fmt::Display for KnownType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A well-known capability with its typed config.
#[derive(Debug, Clone, PartialEq)]
pub enum Capability {
    /// network-policy@1 or @2, read into the @2 shape (`version` says which was written).
    NetworkPolicy(network::NetworkPolicy),
    Credential(credential::Credential),
    SshAgent(ssh_agent::SshAgent),
    Volume(storage::Volume),
    HostMount(storage::HostMount),
    Port(storage::Port),
    UsbDevice(storage::UsbDevice),
    Resources(storage::Resources),
    Privileged,
    LongRunning,
    Lifecycle(lifecycle::Lifecycle),
    AgentContext(agent::AgentContext),
    AgentSessions(agent::AgentSessions),
    AgentInteractiveSessions(agent::AgentInteractiveSessions),
    AgentSkills(agent::AgentSkills),
    AgentSkill(agent::AgentSkill),
    GitIdentity,
    KitRegistry,
    Sbx,
    Acp(agent::Acp),
    Determinism(pack::Determinism),
    Egress(pack::Egress),
    Filesystem(pack::Filesystem),
    Exec(pack::Exec),
}

impl Capability {
    /// The type this capability is. A network policy answers with the version it was
    /// written in.
    pub fn known_type(&self) -> KnownType {
        match self {
            Capability::NetworkPolicy(np) => match np.version {
                network::PolicyVersion::V1 => KnownType::NetworkPolicyV1,
                network::PolicyVersion::V2 => KnownType::NetworkPolicyV2,
            },
            Capability::Credential(_) => KnownType::Credential,
            Capability::SshAgent(_) => KnownType::SshAgent,
            Capability::Volume(_) => KnownType::Volume,
            Capability::HostMount(_) => KnownType::HostMount,
            Capability::Port(_) => KnownType::Port,
            Capability::UsbDevice(_) => KnownType::UsbDevice,
            Capability::Resources(_) => KnownType::Resources,
            Capability::Privileged => KnownType::Privileged,
            Capability::LongRunning => KnownType::LongRunning,
            Capability::Lifecycle(_) => KnownType::Lifecycle,
            Capability::AgentContext(_) => KnownType::AgentContext,
            Capability::AgentSessions(_) => KnownType::AgentSessions,
            Capability::AgentInteractiveSessions(_) => KnownType::AgentInteractiveSessions,
            Capability::AgentSkills(_) => KnownType::AgentSkills,
            Capability::AgentSkill(_) => KnownType::AgentSkill,
            Capability::GitIdentity => KnownType::GitIdentity,
            Capability::KitRegistry => KnownType::KitRegistry,
            Capability::Sbx => KnownType::Sbx,
            Capability::Acp(_) => KnownType::Acp,
            Capability::Determinism(_) => KnownType::Determinism,
            Capability::Egress(_) => KnownType::Egress,
            Capability::Filesystem(_) => KnownType::Filesystem,
            Capability::Exec(_) => KnownType::Exec,
        }
    }

    /// The config in its written form (what `config:` would hold), or `None` for the
    /// config-less types. Used to write merged descriptors back out.
    pub fn config_json(&self) -> Result<Option<serde_json::Value>, serde_json::Error> {
        let v = match self {
            Capability::NetworkPolicy(c) => serde_json::to_value(c)?,
            Capability::Credential(c) => serde_json::to_value(c)?,
            Capability::SshAgent(c) => serde_json::to_value(c)?,
            Capability::Volume(c) => serde_json::to_value(c)?,
            Capability::HostMount(c) => serde_json::to_value(c)?,
            Capability::Port(c) => serde_json::to_value(c)?,
            Capability::UsbDevice(c) => serde_json::to_value(c)?,
            Capability::Resources(c) => serde_json::to_value(c)?,
            Capability::Lifecycle(c) => serde_json::to_value(c)?,
            Capability::AgentContext(c) => serde_json::to_value(c)?,
            Capability::AgentSessions(c) => serde_json::to_value(c)?,
            Capability::AgentInteractiveSessions(c) => serde_json::to_value(c)?,
            Capability::AgentSkills(c) => serde_json::to_value(c)?,
            Capability::AgentSkill(c) => serde_json::to_value(c)?,
            Capability::Acp(c) => serde_json::to_value(c)?,
            Capability::Determinism(c) => serde_json::to_value(c)?,
            Capability::Egress(c) => serde_json::to_value(c)?,
            Capability::Filesystem(c) => serde_json::to_value(c)?,
            Capability::Exec(c) => serde_json::to_value(c)?,
            Capability::Privileged
            | Capability::LongRunning
            | Capability::GitIdentity
            | Capability::KitRegistry
            | Capability::Sbx => return Ok(None),
        };
        Ok(Some(v))
    }
}

/// Something a declaration block may hold only once, with the words for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKey {
    /// Identity, e.g. `port:18993/tcp`. Keys of different types may collide on purpose
    /// (volume@1 and host-mount@1 share the path key).
    pub key: String,
    /// How the message names it, e.g. "port 18993".
    pub what: String,
}

/// Reads the config of a well-known type. `config` is `None` when the entry states no
/// `config` key; `path` is the path of the `config` field. Config-less types are judged
/// by the caller (any stated config is an error there).
pub(crate) fn decode(
    cx: &mut Cx<'_>,
    ty: KnownType,
    config: Option<&Node>,
    path: &Path,
) -> Option<Capability> {
    // An absent or null config reads as an empty mapping (as the reference decoder does);
    // each type's own rules then say what is missing.
    let empty = Node::detached(Value::Map(Vec::new()));
    let node = match config {
        Some(n) if !n.is_null() => n,
        Some(n) => {
            let mut e = empty.clone();
            e.pos = n.pos;
            return decode_node(cx, ty, &e, path);
        }
        None => &empty,
    };
    decode_node(cx, ty, node, path)
}

fn decode_node(cx: &mut Cx<'_>, ty: KnownType, node: &Node, path: &Path) -> Option<Capability> {
    Some(match ty {
        KnownType::NetworkPolicyV1 => {
            Capability::NetworkPolicy(network::decode_v1(cx, node, path)?)
        }
        KnownType::NetworkPolicyV2 => {
            Capability::NetworkPolicy(network::decode_v2(cx, node, path)?)
        }
        KnownType::Credential => Capability::Credential(credential::decode(cx, node, path)?),
        KnownType::SshAgent => Capability::SshAgent(ssh_agent::decode(cx, node, path)?),
        KnownType::Volume => Capability::Volume(storage::decode_volume(cx, node, path)?),
        KnownType::HostMount => Capability::HostMount(storage::decode_host_mount(cx, node, path)?),
        KnownType::Port => Capability::Port(storage::decode_port(cx, node, path)?),
        KnownType::UsbDevice => Capability::UsbDevice(storage::decode_usb(cx, node, path)?),
        KnownType::Resources => Capability::Resources(storage::decode_resources(cx, node, path)?),
        KnownType::Lifecycle => Capability::Lifecycle(lifecycle::decode(cx, node, path)?),
        KnownType::AgentContext => Capability::AgentContext(agent::decode_context(cx, node, path)?),
        KnownType::AgentSessions => {
            Capability::AgentSessions(agent::decode_sessions(cx, node, path)?)
        }
        KnownType::AgentInteractiveSessions => {
            Capability::AgentInteractiveSessions(agent::decode_interactive(cx, node, path)?)
        }
        KnownType::AgentSkills => Capability::AgentSkills(agent::decode_skills(cx, node, path)?),
        KnownType::AgentSkill => Capability::AgentSkill(agent::decode_skill(cx, node, path)?),
        KnownType::Acp => Capability::Acp(agent::decode_acp(cx, node, path)?),
        KnownType::Determinism => {
            Capability::Determinism(pack::decode_determinism(cx, node, path)?)
        }
        KnownType::Egress => Capability::Egress(pack::decode_egress(cx, node, path)?),
        KnownType::Filesystem => Capability::Filesystem(pack::decode_filesystem(cx, node, path)?),
        KnownType::Exec => Capability::Exec(pack::decode_exec(cx, node, path)?),
        KnownType::Privileged => Capability::Privileged,
        KnownType::LongRunning => Capability::LongRunning,
        KnownType::GitIdentity => Capability::GitIdentity,
        KnownType::KitRegistry => Capability::KitRegistry,
        KnownType::Sbx => Capability::Sbx,
    })
}

/// What a block may hold once, read from the raw config so that literal fields of a
/// parameterized entry are still judged (spec §2.5: "literal paths are checked even when
/// another field is parameterized"). Singletons are handled by the caller.
pub(crate) fn block_keys(ty: KnownType, config: Option<&Node>) -> Vec<BlockKey> {
    let Some(config) = config else {
        return Vec::new();
    };
    match ty {
        KnownType::Credential => credential::block_keys(config),
        KnownType::SshAgent => ssh_agent::block_keys(config),
        KnownType::Volume | KnownType::HostMount => storage::path_block_keys(ty, config),
        KnownType::Port => storage::port_block_keys(config),
        KnownType::AgentContext => agent::context_block_keys(config),
        KnownType::AgentSkills => agent::skills_block_keys(config),
        KnownType::AgentSkill => agent::skill_block_keys(config),
        KnownType::Acp => agent::acp_block_keys(config),
        KnownType::Egress => pack::egress_block_keys(config),
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Small grammar helpers shared by the type modules.

/// The literal string at `key`, when the config is a mapping holding a reference-free string.
pub(crate) fn literal_str<'n>(config: &'n Node, key: &str) -> Option<&'n str> {
    config
        .get(key)?
        .as_str()
        .filter(|s| !crate::refs::has_any_ref(s))
}

/// Absolute and canonical: starts with `/`, no `.`/`..` segment, no `//`, no trailing `/`,
/// no NUL or backslash, and no control or invisible character (a path is shown to people,
/// and one that acts on their terminal could hide what it grants).
pub(crate) fn is_canonical_absolute(path: &str) -> bool {
    path.starts_with('/')
        && (path == "/" || !path.ends_with('/'))
        && !path.contains("//")
        && !path.contains(['\0', '\\'])
        && !path.chars().any(crate::text::acts)
        && path.split('/').skip(1).all(|seg| seg != "." && seg != "..")
}

/// Lexical cleaning as Go's `path.Clean`: collapse `//`, drop `.`, resolve `..`.
pub fn clean_path(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|s| *s != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`
pub(crate) fn is_env_name(s: &str) -> bool {
    crate::refs::is_identifier(s)
}

/// The volume@1 / resources@1 size grammar:
/// `^([0-9]+(\.[0-9]+)?\s*([kKmMgGtT]i?[bB]?)?)?$` ("" means unspecified).
pub fn is_size(s: &str) -> bool {
    parse_size_parts(s).is_some()
}

/// Splits a size into (integer digits, fraction digits, unit exponent); `None` when it does
/// not fit the grammar. The empty string yields `Some(("", "", 0))`.
pub(crate) fn parse_size_parts(s: &str) -> Option<(&str, &str, u32)> {
    if s.is_empty() {
        return Some(("", "", 0));
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let int = &s[..digits_end];
    if int.is_empty() {
        return None;
    }
    let mut rest = &s[digits_end..];
    let mut frac = "";
    if let Some(r) = rest.strip_prefix('.') {
        let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        if end == 0 {
            return None;
        }
        frac = &r[..end];
        rest = &r[end..];
    }
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let mut chars = rest.chars();
    let exponent = match chars.next() {
        None => return Some((int, frac, 0)),
        Some('k' | 'K') => 1,
        Some('m' | 'M') => 2,
        Some('g' | 'G') => 3,
        Some('t' | 'T') => 4,
        Some(_) => return None,
    };
    let mut tail = chars.as_str();
    tail = tail.strip_prefix('i').unwrap_or(tail);
    tail = tail.strip_prefix(['b', 'B']).unwrap_or(tail);
    tail.is_empty().then_some((int, frac, exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_grammar() {
        for ok in [
            "com.docker.sandbox/kit-registry@1",
            "com.example.host/gpu-transcoder@2",
            "x/y@10",
        ] {
            assert!(is_valid_type(ok), "{ok}");
        }
        for bad in [
            "kit-registry",
            "com.docker.sandbox/kit-registry",
            "com.docker.sandbox/kit-registry@0",
            "com.docker.sandbox/KitRegistry@1",
            "@1",
            "com.docker.sandbox/kit.registry@1",
            "-a/b@1",
            "a/b-@1",
            "a/b@01",
            "a/b/c@1",
        ] {
            assert!(!is_valid_type(bad), "{bad}");
        }
    }

    #[test]
    fn every_known_type_round_trips_its_name() {
        for t in KnownType::ALL {
            assert_eq!(KnownType::parse(t.name()), Some(t));
            assert!(is_valid_type(t.name()));
        }
    }

    #[test]
    fn clean_path_is_go_path_clean() {
        for (i, o) in [
            ("/data/./cache", "/data/cache"),
            ("/data/other/../cache", "/data/cache"),
            ("/data/cache/", "/data/cache"),
            ("//a//b", "/a/b"),
            ("/..", "/"),
            ("a/../..", ".."),
        ] {
            assert_eq!(clean_path(i), o, "{i}");
        }
    }

    #[test]
    fn canonical_paths() {
        assert!(is_canonical_absolute("/home/agent/.claude/skills"));
        for bad in [
            "relative/skills",
            "/x/../skills",
            "/skills/",
            "/skills/./sub",
            "//skills",
            "/tmp\r\u{1b}[4A\u{1b}[J\nNo grants",
            "/home/agent/s\u{202e}kcab",
            "/home/agent/x\u{ad}",
        ] {
            assert!(!is_canonical_absolute(bad), "{bad}");
        }
    }

    #[test]
    fn size_grammar() {
        for ok in [
            "", "1", "1g", "1.5g", "1024mib", "001.0k", "20 GiB", "512m", "3Tb",
        ] {
            assert!(is_size(ok), "{ok}");
        }
        for bad in ["g", "1.g", "1x", "1gg", "-1", "1e3", " 1g"] {
            assert!(!is_size(bad), "{bad}");
        }
    }
}
