//! network-policy@1 and network-policy@2 (spec §2.1, §2.2, §4.5, §4.6).
//!
//! Both versions are read into one shape, the @2 one: an @1 host is an unbounded entry
//! naming that host ("lifted"), and [`NetworkPolicy::version`] says which was written so
//! the policy serializes back in its own form.
//!
//! Hosts are kept exactly as written: the library compares them byte for byte (spec §4.5,
//! §9 item 18); what a pattern such as `*.example.com` covers is the enforcement matcher's
//! business, never decided here.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::ser::Error as _;
use serde::{Serialize, Serializer};

use super::Phase;
use crate::node::{Node, Path, Pos, Value};
use crate::read::{Cx, Fields};
use crate::refs;

/// Which network-policy version a policy was written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyVersion {
    /// `com.docker.sandbox/network-policy@1`: host strings only.
    V1,
    /// `com.docker.sandbox/network-policy@2`: host strings or bounded entries.
    V2,
}

/// A network policy, in the @2 shape whichever version was written. Deny by default: an
/// absent phase grants nothing in that phase, and deny beats allow.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicy {
    /// The version written; decides the serialized form.
    #[serde(skip)]
    pub version: PolicyVersion,
    /// Egress while install hooks run; closed before the workload starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PhaseRules")]
    pub install: Option<PhaseRules>,
    /// Egress of the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PhaseRules")]
    pub runtime: Option<PhaseRules>,
}

impl NetworkPolicy {
    /// The rules of phase `p`, if the policy states that phase.
    pub fn phase(&self, p: Phase) -> Option<&PhaseRules> {
        match p {
            Phase::Install => self.install.as_ref(),
            Phase::Runtime => self.runtime.as_ref(),
        }
    }
}

/// One phase's egress: what is allowed and what is denied (deny wins).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhaseRules {
    /// Grants: host strings, or entries bounded to methods and paths.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<HostEntry>,
    /// Refusals: an unbounded entry refuses the connection, a bounded one matching requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<HostEntry>,
}

/// One entry: the hosts it names and, when bounded, the HTTP requests it covers. Written as
/// a plain host string when it is unbounded and names one host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostEntry {
    /// Host patterns as written (no case folding). A bounded allow entry names them literally.
    pub hosts: Vec<String>,
    /// HTTP methods the entry is bounded to; `None` means every method.
    pub methods: Option<Vec<Method>>,
    /// Path globs the entry is bounded to (each starting with `/`); `None` means every path.
    pub paths: Option<Vec<String>>,
}

impl HostEntry {
    /// An unbounded entry naming one host (what an @1 host lifts to).
    pub fn host(host: impl Into<String>) -> Self {
        HostEntry {
            hosts: vec![host.into()],
            methods: None,
            paths: None,
        }
    }

    /// Whether the entry states methods or paths, so that it covers only matching HTTP
    /// requests instead of the whole connection. A stated list counts even when empty
    /// (which validation refuses): an entry is never read wider than it was written.
    pub fn is_bounded(&self) -> bool {
        self.methods.is_some() || self.paths.is_some()
    }

    /// The methods covered: `[ANY]` when none are stated, and `ANY` alone when it is among
    /// them (it is never expanded into the known methods).
    pub fn methods_or_any(&self) -> Vec<Method> {
        match &self.methods {
            None => vec![Method::Any],
            Some(m) if m.contains(&Method::Any) => vec![Method::Any],
            Some(m) => m.clone(),
        }
    }

    /// The path globs covered: `["/**"]` when none are stated.
    pub fn paths_or_all(&self) -> Vec<String> {
        self.paths.clone().unwrap_or_else(|| vec!["/**".to_owned()])
    }
}

/// An HTTP method token of a bounded entry, or `ANY` for every method.
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
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
    Trace,
    Connect,
    /// Every method, extension methods included.
    Any,
}

impl Method {
    pub const ALL: [Method; 10] = [
        Method::Get,
        Method::Head,
        Method::Post,
        Method::Put,
        Method::Patch,
        Method::Delete,
        Method::Options,
        Method::Trace,
        Method::Connect,
        Method::Any,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
            Method::Connect => "CONNECT",
            Method::Any => "ANY",
        }
    }

    /// The token, uppercase only (`get` is not a method here: it is refused, not folded).
    pub fn parse(s: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------
// Written forms.

/// An entry as written: a host string, or an object.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
enum HostEntryForm<'a> {
    /// Shorthand for an unbounded entry naming one host.
    Host(#[schemars(length(min = 1))] &'a str),
    Entry(HostEntryObject<'a>),
}

/// The object form of an entry.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("dependentRequired" = {"paths": ["methods"]}))]
struct HostEntryObject<'a> {
    /// Host patterns (at least one, none empty). A bounded allow entry names hosts
    /// literally, with no `*`.
    #[schemars(length(min = 1), inner(length(min = 1)))]
    hosts: &'a [String],
    /// Uppercase HTTP methods, or `ANY` alone. Stating methods bounds the entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<Method>", length(min = 1))]
    methods: Option<&'a [Method]>,
    /// Path globs starting with `/`; needs `methods`. Omitted means every path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(min = 1), inner(pattern(r"^/")))]
    paths: Option<&'a [String]>,
}

impl Serialize for HostEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A stated-but-empty list has no written form that is not wider than it: refuse it
        // rather than launder it into "every method" or "every path".
        for (name, list_empty) in [
            ("methods", self.methods.as_ref().is_some_and(Vec::is_empty)),
            ("paths", self.paths.as_ref().is_some_and(Vec::is_empty)),
        ] {
            if list_empty {
                return Err(S::Error::custom(format!(
                    "network entry states an empty {name} list; omit the field or give it a value"
                )));
            }
        }
        match self.hosts.as_slice() {
            [host] if !self.is_bounded() => HostEntryForm::Host(host).serialize(serializer),
            hosts => HostEntryForm::Entry(HostEntryObject {
                hosts,
                methods: self.methods.as_deref(),
                paths: self.paths.as_deref(),
            })
            .serialize(serializer),
        }
    }
}

impl JsonSchema for HostEntry {
    fn schema_name() -> Cow<'static, str> {
        "HostEntry".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        HostEntryForm::json_schema(generator)
    }
}

/// The written form of network-policy@1 (used to serialize an @1 policy, and for its JSON
/// Schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyV1Form {
    /// Egress while install hooks run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PhaseRulesV1Form")]
    pub install: Option<PhaseRulesV1Form>,
    /// Egress of the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PhaseRulesV1Form")]
    pub runtime: Option<PhaseRulesV1Form>,
}

/// One phase of network-policy@1: host patterns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhaseRulesV1Form {
    /// Hosts allowed: `host`, `host:port`, `*.example.com`, `*` or `**`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub allow: Vec<String>,
    /// Hosts denied (deny wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub deny: Vec<String>,
}

impl PhaseRulesV1Form {
    /// The @1 form of a phase: the hosts of each list, flattened. `None` when an entry is
    /// bounded, which @1 cannot say.
    fn of(rules: &PhaseRules) -> Option<PhaseRulesV1Form> {
        let flat = |entries: &[HostEntry]| -> Option<Vec<String>> {
            let mut out = Vec::new();
            for e in entries {
                if e.is_bounded() {
                    return None;
                }
                out.extend(e.hosts.iter().cloned());
            }
            Some(out)
        };
        Some(PhaseRulesV1Form {
            allow: flat(&rules.allow)?,
            deny: flat(&rules.deny)?,
        })
    }
}

impl NetworkPolicy {
    /// The @1 written form; `None` when an entry is bounded.
    pub fn v1_form(&self) -> Option<NetworkPolicyV1Form> {
        let phase = |p: &Option<PhaseRules>| match p {
            None => Some(None),
            Some(r) => PhaseRulesV1Form::of(r).map(Some),
        };
        Some(NetworkPolicyV1Form {
            install: phase(&self.install)?,
            runtime: phase(&self.runtime)?,
        })
    }
}

/// Borrowed @2 written form.
#[derive(Serialize)]
struct NetworkPolicyV2Form<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    install: Option<&'a PhaseRules>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime: Option<&'a PhaseRules>,
}

impl Serialize for NetworkPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.version {
            PolicyVersion::V1 => self
                .v1_form()
                .ok_or_else(|| {
                    S::Error::custom(
                        "network-policy@1 cannot state a bounded entry; write network-policy@2",
                    )
                })?
                .serialize(serializer),
            PolicyVersion::V2 => NetworkPolicyV2Form {
                install: self.install.as_ref(),
                runtime: self.runtime.as_ref(),
            }
            .serialize(serializer),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading.

pub(crate) fn decode_v1(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<NetworkPolicy> {
    decode(cx, node, path, PolicyVersion::V1)
}

pub(crate) fn decode_v2(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<NetworkPolicy> {
    decode(cx, node, path, PolicyVersion::V2)
}

fn decode(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    version: PolicyVersion,
) -> Option<NetworkPolicy> {
    let before = cx.diags.errors().count();
    let mut f = cx.fields(node, path)?;
    let install = decode_phase(cx, &mut f, Phase::Install, version);
    let runtime = decode_phase(cx, &mut f, Phase::Runtime, version);
    f.finish(cx);
    if cx.diags.errors().count() > before {
        return None;
    }
    Some(NetworkPolicy {
        version,
        install: install?,
        runtime: runtime?,
    })
}

/// Which list of a phase an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Allow,
    Deny,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Allow => "allow",
            List::Deny => "deny",
        }
    }
}

/// A phase block: `Some(None)` when absent, `None` when it could not be read.
fn decode_phase(
    cx: &mut Cx<'_>,
    f: &mut Fields<'_>,
    phase: Phase,
    version: PolicyVersion,
) -> Option<Option<PhaseRules>> {
    let path = f.at(phase.as_str());
    let Some(node) = f.take(phase.as_str()) else {
        return Some(None);
    };
    if node.is_null() {
        cx.error(
            &path,
            node.pos,
            format!("{phase} is null; omit the phase to grant nothing in it, or state its allow and deny lists"),
        );
        return None;
    }
    let mut pf = cx.fields(node, &path)?;
    let allow = decode_list(cx, &mut pf, phase, List::Allow, version);
    let deny = decode_list(cx, &mut pf, phase, List::Deny, version);
    pf.finish(cx);
    Some(Some(PhaseRules {
        allow: allow?,
        deny: deny?,
    }))
}

fn decode_list(
    cx: &mut Cx<'_>,
    f: &mut Fields<'_>,
    phase: Phase,
    list: List,
    version: PolicyVersion,
) -> Option<Vec<HostEntry>> {
    let path = f.at(list.key());
    let Some(node) = f.take(list.key()) else {
        return Some(Vec::new());
    };
    if node.is_null() {
        cx.error(
            &path,
            node.pos,
            format!(
                "{phase} {} is null; omit the field or list entries",
                list.key()
            ),
        );
        return None;
    }
    let items = cx.list(node, &path)?;
    let mut out = Some(Vec::with_capacity(items.len()));
    for (p, n) in items {
        let entry = match version {
            PolicyVersion::V1 => decode_v1_entry(cx, n, &p, phase),
            PolicyVersion::V2 => decode_v2_entry(cx, n, &p, phase, list),
        };
        match entry {
            Some(e) => {
                if let Some(v) = out.as_mut() {
                    v.push(e);
                }
            }
            None => out = None,
        }
    }
    out
}

/// A host string standing as an entry of its own.
fn host_string(cx: &mut Cx<'_>, s: &str, path: &Path, pos: Pos, phase: Phase) -> Option<HostEntry> {
    if s.is_empty() {
        cx.error(path, pos, format!("{phase} entry has an empty host"));
        return None;
    }
    Some(HostEntry::host(s))
}

fn decode_v1_entry(cx: &mut Cx<'_>, node: &Node, path: &Path, phase: Phase) -> Option<HostEntry> {
    match &node.value {
        Value::Str(s) => host_string(cx, s, path, node.pos, phase),
        Value::Map(_) => {
            cx.error(
                path,
                node.pos,
                "cannot unmarshal object into a host string: entries are host strings under network-policy@1; bounding a host to methods or paths needs network-policy@2",
            );
            None
        }
        _ => {
            cx.error(
                path,
                node.pos,
                format!("expected a host string, found {}", node.kind_name()),
            );
            None
        }
    }
}

fn decode_v2_entry(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    phase: Phase,
    list: List,
) -> Option<HostEntry> {
    match &node.value {
        Value::Str(s) => host_string(cx, s, path, node.pos, phase),
        Value::Map(_) => decode_v2_object(cx, node, path, phase, list),
        _ => {
            cx.error(
                path,
                node.pos,
                format!(
                    "expected a host string or an entry mapping, found {}",
                    node.kind_name()
                ),
            );
            None
        }
    }
}

/// The strings of a list, each with its path and position.
type Strings<'n> = Vec<(Path, &'n str, Pos)>;

/// A stated list field of an entry. `Some(None)` when absent; `Some(Some(empty))` when stated
/// as `[]` or `null` (null is never read as omitted: omission is what carries the wildcard).
fn entry_list<'n>(cx: &mut Cx<'_>, f: &mut Fields<'n>, key: &str) -> Option<Option<Strings<'n>>> {
    match f.take(key) {
        None => Some(None),
        Some(n) if n.is_null() => Some(Some(Vec::new())),
        Some(n) => {
            let p = f.at(key);
            let len = n.as_seq().map(<[Node]>::len);
            let items = cx.string_list(n, &p)?;
            // An element of the wrong kind was reported and left out; do not mistake the
            // remainder for the whole list.
            (Some(items.len()) == len).then_some(Some(items))
        }
    }
}

/// Most host, method and path combinations one descriptor's network-policy@2 entries may
/// state together.
pub const MAX_HTTP_GRANTS: usize = 10_000;

fn decode_v2_object(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    phase: Phase,
    list: List,
) -> Option<HostEntry> {
    let mut f = cx.fields(node, path)?;
    let hosts = entry_list(cx, &mut f, "hosts");
    let methods = entry_list(cx, &mut f, "methods");
    let paths = entry_list(cx, &mut f, "paths");
    f.finish(cx);
    let pos_of = |key: &str| node.get(key).map_or(node.pos, |n| n.pos);
    let (hosts_path, methods_path, paths_path) =
        (path.key("hosts"), path.key("methods"), path.key("paths"));
    let mut ok = true;
    let mut deferred = false;

    // Shape: what is stated and how many things it holds. These rules hold whatever a
    // reference would expand to.
    // Missing, null and `[]` alike (a list that could not be read is already reported).
    if hosts
        .as_ref()
        .is_some_and(|h| h.as_ref().is_none_or(Vec::is_empty))
    {
        cx.error(
            &hosts_path,
            pos_of("hosts"),
            format!("{phase} entry declares no hosts"),
        );
        ok = false;
    }
    if let Some(Some(hs)) = &hosts {
        for (_, h, pos) in hs {
            if h.is_empty() {
                cx.error(
                    &hosts_path,
                    *pos,
                    format!("{phase} entry has an empty host"),
                );
                ok = false;
            }
        }
    }
    // Each host, method and path combination is a grant of its own (judged, locked,
    // compared with the last approval): a few lists must not make millions.
    if let Some(Some(hs)) = &hosts {
        let m = methods
            .as_ref()
            .and_then(Option::as_ref)
            .map_or(1, |v| v.len().max(1));
        let p = paths
            .as_ref()
            .and_then(Option::as_ref)
            .map_or(1, |v| v.len().max(1));
        let combinations = hs.len().saturating_mul(m).saturating_mul(p);
        let before = cx.http_grants;
        cx.http_grants = before.saturating_add(combinations);
        if before <= MAX_HTTP_GRANTS && cx.http_grants > MAX_HTTP_GRANTS {
            cx.error(
                &hosts_path,
                pos_of("hosts"),
                format!(
                    "with this {phase} entry ({} hosts × {m} methods × {p} paths) the kit's network-policy@2 entries name {} host, method and path combinations, over the {MAX_HTTP_GRANTS} a kit may state: each is a grant judged and locked on its own; bound fewer hosts together, or use a path glob",
                    hs.len(),
                    cx.http_grants
                ),
            );
            ok = false;
        }
    }
    let paths_stated = matches!(&paths, Some(Some(p)) if !p.is_empty());
    if let Some(Some(ms)) = &methods
        && ms.is_empty()
    {
        let remedy = if paths_stated {
            "name the methods the paths bound, or omit paths too to leave the entry unbounded"
        } else {
            "omit the field to leave the entry unbounded, or name the methods"
        };
        cx.error(
            &methods_path,
            pos_of("methods"),
            format!("{phase} entry states an empty methods list; {remedy}"),
        );
        ok = false;
    }
    if let Some(Some(ps)) = &paths
        && ps.is_empty()
    {
        cx.error(
            &paths_path,
            pos_of("paths"),
            format!("{phase} entry states an empty paths list; omit the field for every path, or name the paths"),
        );
        ok = false;
    }
    if paths_stated && matches!(methods, Some(None)) {
        cx.error(
            &paths_path,
            pos_of("paths"),
            format!("{phase} entry states paths without methods; name the methods the paths bound, or methods: [ANY] for every method"),
        );
        ok = false;
    }

    // Values: judged only where no reference stands in for them.
    let mut typed_methods: Option<Vec<Method>> = None;
    if let Some(Some(ms)) = &methods {
        let mut seen: Vec<&str> = Vec::new();
        let mut out = Vec::with_capacity(ms.len());
        for (_, m, pos) in ms {
            if !cx.judgeable(m) {
                deferred = true;
                continue;
            }
            match Method::parse(m) {
                Some(method) => out.push(method),
                None => {
                    cx.error(
                        &methods_path,
                        *pos,
                        format!(
                            "{phase} entry method `{m}` is not an uppercase HTTP method or ANY"
                        ),
                    );
                    ok = false;
                }
            }
            if seen.contains(m) {
                cx.error(
                    &methods_path,
                    *pos,
                    format!("{phase} entry repeats method `{m}`"),
                );
                ok = false;
            }
            seen.push(m);
        }
        if seen.contains(&"ANY") && ms.len() > 1 {
            cx.error(
                &methods_path,
                pos_of("methods"),
                format!("{phase} entry names ANY beside a specific method; ANY already covers every method"),
            );
            ok = false;
        }
        typed_methods = Some(out);
    }
    if let Some(Some(ps)) = &paths {
        for (_, p, pos) in ps {
            if cx.judgeable(p) && !p.starts_with('/') {
                cx.error(
                    &paths_path,
                    *pos,
                    format!("{phase} entry path `{p}` must start with \"/\""),
                );
                ok = false;
            }
        }
    }
    let bounded = matches!(methods, Some(Some(_))) || matches!(paths, Some(Some(_)));
    if list == List::Allow
        && bounded
        && let Some(Some(hs)) = &hosts
    {
        for (_, h, pos) in hs {
            // A `*` in the literal text survives any expansion, so it is judged now.
            if literal_text_has_star(h) {
                cx.error(
                    &hosts_path,
                    *pos,
                    format!("{phase} allow entry bounds the pattern \"{h}\"; an entry stating methods or paths names its hosts exactly, or the pattern would be bounded and unbounded at once"),
                );
                ok = false;
            }
        }
    }
    // A bounded entry is gated and matched per host, method and path; an address range
    // (`8.8.8.0/24`) there would read as a host and a path.
    if bounded && let Some(Some(hs)) = &hosts {
        for (_, h, pos) in hs {
            if cx.judgeable(h) && h.contains('/') {
                cx.error(
                    &hosts_path,
                    *pos,
                    format!("{phase} {list} entry bounds the address range \"{h}\"; an entry stating methods or paths names hosts, not ranges (a range may stand as a host string of its own)", list = list.key()),
                );
                ok = false;
            }
        }
    }
    // Something unreadable (reported above) must not leave a field looking omitted, which
    // would read wider than what was written.
    if !ok || deferred || methods.is_none() {
        return None;
    }
    let strings = |v: Strings<'_>| {
        v.into_iter()
            .map(|(_, s, _)| s.to_owned())
            .collect::<Vec<_>>()
    };
    Some(HostEntry {
        hosts: strings(hosts??),
        methods: typed_methods,
        paths: paths?.map(strings),
    })
}

/// Whether `s` holds a `*` outside its `${{ … }}` references.
fn literal_text_has_star(s: &str) -> bool {
    let mut from = 0;
    for r in refs::find(s) {
        if s.get(from..r.start).is_some_and(|t| t.contains('*')) {
            return true;
        }
        from = r.end;
    }
    s.get(from..).is_some_and(|t| t.contains('*'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn decode_text(
        text: &str,
        version: PolicyVersion,
        lenient: bool,
    ) -> (Option<NetworkPolicy>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        assert!(diags.is_empty(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        cx.lenient = lenient;
        let p = decode(&mut cx, &node, &Path::from(AT), version);
        (p, diags)
    }

    fn v2_ok(text: &str) -> NetworkPolicy {
        let (p, d) = decode_text(text, PolicyVersion::V2, false);
        assert!(!d.has_errors(), "{text}\n{d:?}");
        p.expect("typed value")
    }

    fn runtime_allow(text: &str) -> Vec<HostEntry> {
        v2_ok(text).runtime.unwrap().allow
    }

    /// Host, method and path lists multiply into grants: a kit may state 10,000
    /// combinations, not one more (a few KB of lists would otherwise make millions, each
    /// judged and locked). Counted across entries.
    #[test]
    fn host_method_path_combinations_are_bounded_per_kit() {
        let kit = |hosts: usize| {
            let names: Vec<String> = (0..hosts).map(|i| format!("h{i}.example.com")).collect();
            let paths: Vec<String> = (0..10).map(|i| format!("/p{i}")).collect();
            format!(
                "runtime:\n  allow:\n    - {{hosts: [{}], methods: [GET, POST], paths: [{}]}}\n    - {{hosts: [x.example.com], methods: [GET]}}\n",
                names.join(", "),
                paths.join(", ")
            )
        };
        // 499 × 2 × 10 + 1 = 9,981: within.
        v2_ok(&kit(499));
        // 500 × 2 × 10 + 1 = 10,001: the second entry crosses the bound, and is named.
        let (_, d) = decode_text(&kit(500), PolicyVersion::V2, false);
        let said: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("runtime.allow[1].hosts")
                && said[0].contains("10001 host, method and path combinations"),
            "{said:?}"
        );
    }

    #[test]
    fn v1_lifts_hosts_to_unbounded_entries() {
        let text = "install: {allow: [registry.npmjs.org, deb.debian.org]}\nruntime: {allow: ['*.example.com', 'api.example.com:443'], deny: [evil.example.com]}\n";
        let (p, d) = decode_text(text, PolicyVersion::V1, false);
        assert!(!d.has_errors(), "{d:?}");
        let p = p.unwrap();
        assert_eq!(p.version, PolicyVersion::V1);
        let install = p.phase(Phase::Install).unwrap();
        assert_eq!(
            install.allow,
            vec![
                HostEntry::host("registry.npmjs.org"),
                HostEntry::host("deb.debian.org")
            ]
        );
        assert!(install.allow.iter().all(|e| !e.is_bounded()));
        assert_eq!(
            p.phase(Phase::Runtime).unwrap().deny,
            vec![HostEntry::host("evil.example.com")]
        );
        // Serialized back in the @1 shape, hosts as written.
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"install":{"allow":["registry.npmjs.org","deb.debian.org"]},"runtime":{"allow":["*.example.com","api.example.com:443"],"deny":["evil.example.com"]}}"#
        );
        // An absent phase is absent; an empty block is a phase granting nothing.
        let (p, _) = decode_text("runtime: {}\n", PolicyVersion::V1, false);
        let p = p.unwrap();
        assert!(p.install.is_none());
        assert_eq!(p.runtime, Some(PhaseRules::default()));
    }

    #[test]
    fn v1_rejects_objects_and_bad_shapes() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "runtime: {allow: [{hosts: [api.example.com], methods: [GET]}]}",
                "capabilities[0].config.runtime.allow[0]",
                "cannot unmarshal object",
            ),
            (
                "runtime: {allow: [{hosts: [api.example.com]}]}",
                "capabilities[0].config.runtime.allow[0]",
                "network-policy@2",
            ),
            (
                "runtime: {allow: ['']}",
                "capabilities[0].config.runtime.allow[0]",
                "has an empty host",
            ),
            (
                "runtime: {allow: [1]}",
                "capabilities[0].config.runtime.allow[0]",
                "expected a host string",
            ),
            (
                "runtime: {allow: api.example.com}",
                "capabilities[0].config.runtime.allow",
                "expected a list",
            ),
            (
                "runtime: {allow: null}",
                "capabilities[0].config.runtime.allow",
                "is null",
            ),
            (
                "runtime: null",
                "capabilities[0].config.runtime",
                "runtime is null",
            ),
            (
                "runtime: [a]",
                "capabilities[0].config.runtime",
                "expected a mapping",
            ),
            (
                "runtime: {alow: [a]}",
                "capabilities[0].config.runtime.alow",
                "unknown field `alow`",
            ),
            (
                "build: {allow: [a]}",
                "capabilities[0].config.build",
                "unknown field `build`",
            ),
        ];
        for (text, path, fragment) in cases {
            let (p, d) = decode_text(text, PolicyVersion::V1, false);
            assert!(
                d.contains(path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
            assert!(p.is_none(), "{text}");
        }
    }

    #[test]
    fn v2_bare_entries_are_unbounded() {
        let allow = runtime_allow("runtime: {allow: [api.example.com]}");
        let e = &allow[0];
        assert_eq!(e.hosts, ["api.example.com"]);
        assert!(!e.is_bounded());
        assert_eq!(e.methods_or_any(), [Method::Any]);
        assert_eq!(e.paths_or_all(), ["/**"]);
        assert_eq!(serde_json::to_string(e).unwrap(), r#""api.example.com""#);
        // The object spelling of one unbounded host is the same entry.
        assert_eq!(
            runtime_allow("runtime: {allow: [{hosts: [api.example.com]}]}")[0],
            *e
        );
    }

    #[test]
    fn v2_entries_serialize_in_their_shortest_faithful_form() {
        let allow = runtime_allow(
            "runtime: {allow: [{hosts: [a.example.com, b.example.com]}, {hosts: [api.example.com], methods: [GET, HEAD], paths: ['/repos/**']}, {hosts: [x.example.com], methods: [ANY], paths: ['/v1/**']}]}",
        );
        let json: Vec<String> = allow
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        assert_eq!(json[0], r#"{"hosts":["a.example.com","b.example.com"]}"#);
        assert_eq!(
            json[1],
            r#"{"hosts":["api.example.com"],"methods":["GET","HEAD"],"paths":["/repos/**"]}"#
        );
        assert_eq!(
            json[2],
            r#"{"hosts":["x.example.com"],"methods":["ANY"],"paths":["/v1/**"]}"#
        );
        assert!(allow[1].is_bounded());
        assert_eq!(allow[1].methods_or_any(), [Method::Get, Method::Head]);
        assert_eq!(allow[1].paths_or_all(), ["/repos/**"]);
        // Stated-but-empty lists cannot be written back without widening.
        for e in [
            HostEntry {
                hosts: vec!["a".into()],
                methods: Some(vec![]),
                paths: None,
            },
            HostEntry {
                hosts: vec!["a".into()],
                methods: Some(vec![Method::Get]),
                paths: Some(vec![]),
            },
        ] {
            assert!(serde_json::to_string(&e).is_err(), "{e:?}");
        }
        // A whole @2 policy round-trips through its JSON form.
        let text = "install: {allow: [registry.npmjs.org]}\nruntime: {allow: [plain.example.com, {hosts: [api.example.com], methods: [GET, HEAD], paths: ['/repos/**']}], deny: [{hosts: [api.example.com], methods: [DELETE]}]}\n";
        let p = v2_ok(text);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"install":{"allow":["registry.npmjs.org"]},"runtime":{"allow":["plain.example.com",{"hosts":["api.example.com"],"methods":["GET","HEAD"],"paths":["/repos/**"]}],"deny":[{"hosts":["api.example.com"],"methods":["DELETE"]}]}}"#
        );
        assert_eq!(v2_ok(&json), p);
        // An @1 policy holding a bounded entry has no @1 form.
        let mut v1 = p.clone();
        v1.version = PolicyVersion::V1;
        assert!(serde_json::to_string(&v1).is_err());
    }

    #[test]
    fn v2_accepts_the_documented_entries() {
        for text in [
            "runtime: {allow: [{hosts: [api.example.com], methods: [GET, HEAD]}]}",
            "runtime: {allow: [{hosts: [api.example.com], methods: [ANY]}]}",
            "runtime: {allow: [{hosts: [api.example.com], methods: [ANY], paths: ['/v1/**']}]}",
            "runtime: {allow: ['**', {hosts: [api.example.com], methods: [GET]}]}",
            "runtime: {allow: ['*.example.com']}",
            "runtime: {deny: [{hosts: ['*.example.com'], methods: [DELETE]}]}",
            "install: {allow: [{hosts: [a.example.com], methods: [GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, CONNECT]}]}",
            "runtime: {allow: [API.Example.com]}",
        ] {
            v2_ok(text);
        }
        // Hosts are kept as written.
        assert_eq!(
            runtime_allow("runtime: {allow: [API.Example.com]}")[0].hosts,
            ["API.Example.com"]
        );
    }

    const ENTRY: &str = "capabilities[0].config.runtime.allow[0]";

    /// The §6.5 network-policy@2 rejection cases, as (entry, field path, message fragment).
    fn v2_rejections() -> Vec<(&'static str, String, &'static str)> {
        let at = |field: &str| {
            if field.is_empty() {
                ENTRY.to_owned()
            } else {
                format!("{ENTRY}.{field}")
            }
        };
        vec![
            (
                "{hosts: [a.example.com], verbs: [GET]}",
                at("verbs"),
                "unknown field `verbs`",
            ),
            (
                "{hosts: [a.example.com], paths: ['/v1/**']}",
                at("paths"),
                "states paths without methods",
            ),
            (
                "{hosts: [a.example.com], methods: [get]}",
                at("methods"),
                "is not an uppercase HTTP method",
            ),
            (
                "{hosts: [a.example.com], methods: [FETCH]}",
                at("methods"),
                "is not an uppercase HTTP method",
            ),
            (
                "{hosts: [a.example.com], methods: [ANY, GET]}",
                at("methods"),
                "names ANY beside a specific method",
            ),
            (
                "{hosts: [a.example.com], methods: [GET, GET]}",
                at("methods"),
                "repeats method",
            ),
            (
                "{hosts: [a.example.com], methods: []}",
                at("methods"),
                "empty methods list",
            ),
            (
                "{hosts: [a.example.com], methods: [GET], paths: []}",
                at("paths"),
                "empty paths list",
            ),
            (
                "{hosts: [a.example.com], methods: [], paths: ['/v1/**']}",
                at("methods"),
                "omit paths too",
            ),
            (
                "{hosts: [a.example.com], methods: null}",
                at("methods"),
                "empty methods list",
            ),
            (
                "{hosts: [a.example.com], methods: [GET], paths: null}",
                at("paths"),
                "empty paths list",
            ),
            ("{hosts: null}", at("hosts"), "declares no hosts"),
            ("{methods: [GET]}", at("hosts"), "declares no hosts"),
            ("{hosts: []}", at("hosts"), "declares no hosts"),
            ("{hosts: ['']}", at("hosts"), "has an empty host"),
            ("''", at(""), "has an empty host"),
            (
                "{hosts: [a.example.com], methods: [GET], paths: ['v1/**']}",
                at("paths"),
                "must start with \"/\"",
            ),
            (
                "{hosts: ['*.example.com'], methods: [GET]}",
                at("hosts"),
                "bounds the pattern \"*.example.com\"",
            ),
            (
                "{hosts: ['**'], paths: ['/x'], methods: [GET]}",
                at("hosts"),
                "bounds the pattern \"**\"",
            ),
            ("{hosts: a.example.com}", at("hosts"), "expected a list"),
            (
                "{hosts: [a.example.com], methods: GET}",
                at("methods"),
                "expected a list",
            ),
            (
                "{hosts: [a.example.com], methods: [1]}",
                format!("{ENTRY}.methods[0]"),
                "expected a string",
            ),
            (
                "[a.example.com]",
                at(""),
                "expected a host string or an entry mapping",
            ),
        ]
    }

    #[test]
    fn v2_rejects_per_the_acceptance_cases() {
        for (entry, path, fragment) in v2_rejections() {
            let text = format!("runtime: {{allow: [{entry}]}}");
            let (p, d) = decode_text(&text, PolicyVersion::V2, false);
            assert!(
                d.contains(&path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
            assert!(p.is_none(), "{text}");
        }
    }

    #[test]
    fn shape_errors_fire_in_deny_lists_and_install_too() {
        let (_, d) = decode_text(
            "install: {deny: [{hosts: [], methods: []}]}",
            PolicyVersion::V2,
            false,
        );
        assert!(
            d.contains(
                "capabilities[0].config.install.deny[0].hosts",
                "install entry declares no hosts"
            ),
            "{d:?}"
        );
        assert!(
            d.contains(
                "capabilities[0].config.install.deny[0].methods",
                "empty methods list"
            ),
            "{d:?}"
        );
    }

    #[test]
    fn parameterized_entries_keep_shape_rules_and_defer_values() {
        // Shape errors fire even when the entry is parameterized.
        let shape: &[(&str, &str, &str)] = &[
            (
                "{hosts: ['${{ kit.args.h }}'], methods: []}",
                "methods",
                "empty methods list",
            ),
            (
                "{hosts: ['${{ kit.args.h }}'], methods: [GET], paths: []}",
                "paths",
                "empty paths list",
            ),
            (
                "{hosts: ['${{ kit.args.h }}'], methods: [], paths: ['${{ kit.args.p }}']}",
                "methods",
                "omit paths too",
            ),
            (
                "{hosts: ['${{ kit.args.h }}'], paths: ['/v1/**']}",
                "paths",
                "states paths without methods",
            ),
            (
                "{hosts: [], methods: ['${{ kit.args.m }}']}",
                "hosts",
                "declares no hosts",
            ),
            (
                "{hosts: null, methods: ['${{ kit.args.m }}']}",
                "hosts",
                "declares no hosts",
            ),
            (
                "{hosts: [''], methods: ['${{ kit.args.m }}']}",
                "hosts",
                "has an empty host",
            ),
            (
                "{hosts: ['${{ kit.args.h }}'], verbs: [GET]}",
                "verbs",
                "unknown field `verbs`",
            ),
            (
                "{hosts: ['*.${{ kit.args.domain }}'], methods: [GET]}",
                "hosts",
                "bounds the pattern",
            ),
        ];
        for (entry, field, fragment) in shape {
            let text = format!("runtime: {{allow: [{entry}]}}");
            let (_, d) = decode_text(&text, PolicyVersion::V2, true);
            let path = format!("{ENTRY}.{field}");
            assert!(
                d.contains(&path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
        }
        // Value rules wait for expansion.
        for entry in [
            "{hosts: ['${{ kit.args.h }}'], methods: ['${{ kit.args.m }}']}",
            "{hosts: [api.example.com], methods: [GET], paths: ['${{ kit.args.prefix }}/**']}",
            "{hosts: ['${{ kit.args.h }}'], methods: ['${{ kit.args.m }}', '${{ kit.args.m }}']}",
            "'${{ kit.env.HOST }}'",
        ] {
            let text = format!("runtime: {{allow: [{entry}]}}");
            let (_, d) = decode_text(&text, PolicyVersion::V2, true);
            assert!(!d.has_errors(), "{text}\n{d:?}");
        }
        let (p, _) = decode_text(
            "runtime: {allow: [{hosts: [a], methods: ['${{ kit.args.m }}']}]}",
            PolicyVersion::V2,
            true,
        );
        assert!(p.is_none(), "a deferred method cannot be typed");
        // Once expanded, the same values are judged strictly.
        for (entry, field, fragment) in [
            (
                "{hosts: [a.example.com], methods: [get]}",
                "methods",
                "is not an uppercase HTTP method",
            ),
            (
                "{hosts: [a.example.com], methods: [GET], paths: ['v1/**']}",
                "paths",
                "must start with \"/\"",
            ),
            (
                "{hosts: ['*.example.com'], methods: [GET]}",
                "hosts",
                "bounds the pattern",
            ),
        ] {
            let text = format!("runtime: {{allow: [{entry}]}}");
            let (_, d) = decode_text(&text, PolicyVersion::V2, false);
            assert!(
                d.contains(&format!("{ENTRY}.{field}"), fragment),
                "{text}\n{d:?}"
            );
        }
    }

    #[test]
    fn methods_parse_uppercase_only() {
        for m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(m));
            assert_eq!(
                serde_json::to_string(&m).unwrap(),
                format!("\"{}\"", m.as_str())
            );
        }
        for bad in ["get", "Get", "FETCH", "", "any"] {
            assert_eq!(Method::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn stars_inside_references_do_not_count() {
        assert!(literal_text_has_star("*.example.com"));
        assert!(literal_text_has_star("*.${{ kit.args.d }}"));
        assert!(!literal_text_has_star("${{ kit.args.d }}.example.com"));
        assert!(!literal_text_has_star("api.example.com"));
    }

    #[test]
    fn schema_describes_string_or_object_entries() {
        let schema = schemars::schema_for!(NetworkPolicy);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("HostEntry"), "{text}");
        assert!(text.contains("\"hosts\""), "{text}");
        assert!(!text.contains("\"version\""), "{text}");
        assert!(
            !text.contains("\"null\""),
            "the reader admits no null: {text}"
        );
        assert!(text.contains("dependentRequired"), "{text}");
        let v1 = serde_json::to_string(&schemars::schema_for!(NetworkPolicyV1Form)).unwrap();
        assert!(v1.contains("\"allow\""), "{v1}");
        assert!(!v1.contains("\"null\""), "{v1}");
    }
}
