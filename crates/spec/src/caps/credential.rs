//! credential@1 (spec §2.3), the phase grammar it shares with ssh-agent@1, and the
//! cross-entry rule that every inject domain is reachable in each phase it is declared for
//! (spec §2.1).
//!
//! No null stands anywhere in a credential config: a stated null would otherwise read as an
//! omitted field. The one subtree where null is legal is `oauth.credentialFile.structure`
//! under the json encoding; under toml a null there cannot be written out at all.

use schemars::JsonSchema;
use serde::{Serialize, Serializer};

use super::network::NetworkPolicy;
use super::{BlockKey, Phase, is_env_name};
use crate::node::{Node, Path, Pos, Value};
use crate::read::{Cx, Fields};

/// credential@1: one service the workload authenticates to, and how the boundary presents
/// proof. Never where the secret lives: the runtime resolves `service` in its own store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credential {
    /// Key in the host credential store: lowercase letters, digits and inner hyphens,
    /// 1 to 64 characters.
    #[schemars(pattern(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$"))]
    pub service: String,
    /// The phases the credential is available in: `install`, `runtime`, or a non-empty list
    /// of distinct phases. Written back as a string when there is one.
    #[serde(rename = "phase", serialize_with = "serialize_phases")]
    #[schemars(with = "PhaseForm")]
    pub phases: Vec<Phase>,
    /// An API key presented on outbound requests (at least one of `apiKey` and `oauth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ApiKey")]
    pub api_key: Option<ApiKey>,
    /// OAuth token interception (at least one of `apiKey` and `oauth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "OAuth")]
    pub oauth: Option<Box<OAuth>>,
}

/// How an API key reaches the workload and the services it calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKey {
    /// In-container environment variable (`^[A-Za-z_][A-Za-z0-9_]*$`), set to a sentinel
    /// when proxy-managed. Omitted or empty declares an inject-only key: no variable at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", pattern(r"^([A-Za-z_][A-Za-z0-9_]*)?$"))]
    pub name: Option<String>,
    /// Keep the real value on the host; the boundary presents it on outbound requests.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxy_managed: bool,
    /// Outbound requests the boundary adds the key to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<InjectRule>,
}

impl ApiKey {
    /// The environment variable to set, or `None` for an inject-only key.
    pub fn env_name(&self) -> Option<&str> {
        self.name.as_deref().filter(|n| !n.is_empty())
    }
}

/// One outbound rewrite: requests to `domain` carry the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectRule {
    /// Host the rule applies to (a `:port` suffix is ignored when checking it against the
    /// network policy).
    #[schemars(length(min = 1))]
    pub domain: String,
    /// Header to set; `Authorization` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub header: Option<String>,
    /// Header value with `%s` standing for the key; `Bearer %s` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub format: Option<String>,
    /// A non-header presentation, such as `basic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub scheme: Option<String>,
    /// Basic-auth user name when `scheme` is `basic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub username: Option<String>,
}

impl InjectRule {
    pub const DEFAULT_HEADER: &'static str = "Authorization";
    pub const DEFAULT_FORMAT: &'static str = "Bearer %s";

    /// The header to set (an empty `header` reads as omitted, as in the published form).
    pub fn header_or_default(&self) -> &str {
        self.header
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(Self::DEFAULT_HEADER)
    }

    /// Whether the key goes as HTTP basic credentials (`scheme: basic`, any case); any
    /// other scheme presents it through `header` and `format`.
    pub fn is_basic(&self) -> bool {
        self.scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("basic"))
    }

    /// The value template (an empty `format` reads as omitted, as in the published form).
    pub fn format_or_default(&self) -> &str {
        self.format
            .as_deref()
            .filter(|f| !f.is_empty())
            .unwrap_or(Self::DEFAULT_FORMAT)
    }
}

/// Proxy-managed OAuth: the boundary intercepts the token endpoint, hands the workload
/// sentinels, and swaps real tokens in on the way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OAuth {
    /// The token endpoint the boundary intercepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "TokenEndpoint")]
    pub token_endpoint: Option<TokenEndpoint>,
    /// Hosts whose requests get the real access token in place of the sentinel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub resource_hosts: Vec<String>,
    /// Placeholder tokens the workload sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Sentinels")]
    pub sentinels: Option<Sentinels>,
    /// A file the sentinels are rendered into for the agent to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CredentialFile")]
    pub credential_file: Option<CredentialFile>,
    /// The provider's names for the token-response fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ResponseFields")]
    pub response_fields: Option<ResponseFields>,
    /// Hand the real token to the workload: a downgrade a runtime may refuse.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough: bool,
}

/// Where the token endpoint is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenEndpoint {
    /// Host of the endpoint (required, non-empty).
    #[schemars(length(min = 1))]
    pub host: String,
    /// Path of the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub path: Option<String>,
}

/// Placeholder tokens rendered in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sentinels {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub refresh_token: Option<String>,
}

/// A credential file rendered from a declarative structure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialFile {
    /// Where the file is written (required, non-empty).
    #[schemars(length(min = 1))]
    pub path: String,
    /// Nested mapping encoded in `format` after placeholder substitution. Leaf strings may
    /// name `{{.AccessToken}}`, `{{.RefreshToken}}`, `{{.ExpiresAt}}`, `{{.Scopes}}` and
    /// `{{.PrimaryApiKey}}`; unknown placeholders are refused when the file is rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub structure: Option<serde_json::Value>,
    /// `json` (the default) or `toml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CredentialFileFormat")]
    pub format: Option<String>,
}

/// The encodings a credential file may be written in (schema only).
#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(
    dead_code,
    reason = "describes the written form for the JSON Schema only"
)]
enum CredentialFileFormat {
    Json,
    Toml,
}

/// The provider's token-response field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResponseFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub refresh_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub expires_in: Option<String>,
}

// ---------------------------------------------------------------------------------------
// The phase grammar shared with ssh-agent@1.

/// The written form of `phase`: one phase, or a non-empty list of distinct phases (schema
/// only; the typed value is always a list).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(
    dead_code,
    reason = "describes the written form for the JSON Schema only"
)]
pub(crate) enum PhaseForm {
    One(Phase),
    Many(#[schemars(length(min = 1))] Vec<Phase>),
}

/// Writes one phase as a string and several as a list, as the author wrote them.
pub(crate) fn serialize_phases<S: Serializer>(
    phases: &[Phase],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match phases {
        [one] => one.serialize(serializer),
        many => many.serialize(serializer),
    }
}

/// Reads the required `phase` field of `f`: a phase or a non-empty list of distinct phases.
/// `None` when it is missing, invalid, or still holds a reference.
pub(crate) fn read_phases(cx: &mut Cx<'_>, f: &mut Fields<'_>) -> Option<Vec<Phase>> {
    let path = f.at("phase");
    let Some(node) = f.take("phase") else {
        cx.error(
            &f.path,
            f.pos,
            "`phase` is required: install, runtime, or a list of both",
        );
        return None;
    };
    let items: Vec<(Path, &Node)> = match &node.value {
        Value::Null => {
            cx.error(
                &path,
                node.pos,
                "phase is null; declare install, runtime, or a list of both",
            );
            return None;
        }
        Value::Str(_) => vec![(path.clone(), node)],
        Value::Seq(items) if items.is_empty() => {
            cx.error(
                &path,
                node.pos,
                "phase list is empty; name install, runtime, or both",
            );
            return None;
        }
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, n)| (path.index(i), n))
            .collect(),
        _ => {
            cx.error(
                &path,
                node.pos,
                format!(
                    "phase must be install, runtime, or a list of them, found {}",
                    node.kind_name()
                ),
            );
            return None;
        }
    };
    let mut phases = Some(Vec::with_capacity(items.len()));
    let mut seen: Vec<&str> = Vec::new();
    for (p, n) in items {
        let Some(s) = cx.string(n, &p) else {
            phases = None;
            continue;
        };
        // Two spellings of one reference expand to one phase, so repeats are judged now.
        if seen.contains(&s) {
            cx.error(&p, n.pos, format!("phase `{s}` is listed twice"));
            phases = None;
            continue;
        }
        seen.push(s);
        match Phase::parse(s) {
            Some(phase) => {
                if let Some(v) = phases.as_mut() {
                    v.push(phase);
                }
            }
            None if !cx.judgeable(s) => phases = None,
            None => {
                cx.error(&p, n.pos, format!("phase `{s}` must be install or runtime"));
                phases = None;
            }
        }
    }
    phases
}

/// The literal phases a raw config names (scalar or list), each once, in order.
pub(crate) fn literal_phases(config: &Node) -> Vec<Phase> {
    let mut out = Vec::new();
    let Some(node) = config.get("phase") else {
        return out;
    };
    let items = match &node.value {
        Value::Seq(items) => items.as_slice(),
        Value::Str(_) => std::slice::from_ref(node),
        _ => return out,
    };
    for phase in items
        .iter()
        .filter_map(|n| n.as_str())
        .filter_map(Phase::parse)
    {
        if !out.contains(&phase) {
            out.push(phase);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Reading.

/// A place in the config: its full path, and the path relative to `config` that messages
/// name (`oauth.responseFields.refreshToken`).
#[derive(Debug, Clone)]
struct At {
    path: Path,
    rel: String,
}

impl At {
    fn key(&self, key: &str) -> At {
        At {
            path: self.path.key(key),
            rel: if self.rel.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", self.rel)
            },
        }
    }

    fn index(&self, i: usize) -> At {
        At {
            path: self.path.index(i),
            rel: format!("{}[{i}]", self.rel),
        }
    }
}

fn error_count(cx: &Cx<'_>) -> usize {
    cx.diags.errors().count()
}

fn null_error(cx: &mut Cx<'_>, at: &At, pos: Pos) {
    cx.error(
        &at.path,
        pos,
        format!("{} is null; omit the field or declare a value", at.rel),
    );
}

/// An optional field: `Some(None)` when absent, `None` when stated as null (reported).
fn optional<'n>(
    cx: &mut Cx<'_>,
    f: &mut Fields<'n>,
    at: &At,
    key: &str,
) -> Option<Option<&'n Node>> {
    match f.take(key) {
        None => Some(None),
        Some(n) if n.is_null() => {
            null_error(cx, &at.key(key), n.pos);
            None
        }
        Some(n) => Some(Some(n)),
    }
}

/// A required field, its absence or null reported.
fn required<'n>(cx: &mut Cx<'_>, f: &mut Fields<'n>, at: &At, key: &str) -> Option<&'n Node> {
    match f.take(key) {
        None => {
            cx.error(&at.path, f.pos, format!("`{key}` is required"));
            None
        }
        Some(n) if n.is_null() => {
            cx.error(
                &at.key(key).path,
                n.pos,
                format!("{} is null; declare a value", at.key(key).rel),
            );
            None
        }
        Some(n) => Some(n),
    }
}

/// An optional string field: `Some(None)` when absent, `None` when null or not a string.
fn opt_str<'n>(cx: &mut Cx<'_>, f: &mut Fields<'n>, at: &At, key: &str) -> Option<Option<&'n str>> {
    match optional(cx, f, at, key)? {
        None => Some(None),
        Some(n) => cx.string(n, &at.key(key).path).map(Some),
    }
}

/// A required string field that must not be empty.
fn req_str<'n>(cx: &mut Cx<'_>, f: &mut Fields<'n>, at: &At, key: &str) -> Option<&'n str> {
    let n = required(cx, f, at, key)?;
    let s = cx.string(n, &at.key(key).path)?;
    if s.is_empty() {
        cx.error(
            &at.key(key).path,
            n.pos,
            format!("{} is empty", at.key(key).rel),
        );
        return None;
    }
    Some(s)
}

/// An optional boolean field, `false` when absent; `None` when null, invalid or deferred.
fn opt_bool(cx: &mut Cx<'_>, f: &mut Fields<'_>, at: &At, key: &str) -> Option<bool> {
    match optional(cx, f, at, key)? {
        None => Some(false),
        Some(n) => cx.boolean(n, &at.key(key).path),
    }
}

/// A mapping at `at` (a null one reported in the credential's words).
fn mapping<'n>(cx: &mut Cx<'_>, node: &'n Node, at: &At) -> Option<Fields<'n>> {
    if node.is_null() {
        null_error(cx, at, node.pos);
        return None;
    }
    cx.fields(node, &at.path)
}

/// An optional nested object read by `read`: `Some(None)` when absent.
fn nested<'n, T>(
    cx: &mut Cx<'_>,
    f: &mut Fields<'n>,
    at: &At,
    key: &str,
    read: fn(&mut Cx<'_>, &'n Node, &At) -> Option<T>,
) -> Option<Option<T>> {
    match optional(cx, f, at, key)? {
        None => Some(None),
        Some(n) => read(cx, n, &at.key(key)).map(Some),
    }
}

/// `^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`
fn is_service_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=64).contains(&b.len())
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}

pub(crate) fn decode(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Credential> {
    let before = error_count(cx);
    let at = At {
        path: path.clone(),
        rel: String::new(),
    };
    let mut f = cx.fields(node, path)?;
    let service = required(cx, &mut f, &at, "service").and_then(|n| {
        let p = at.key("service").path;
        let s = cx.string(n, &p)?;
        if s.is_empty() {
            cx.error(&p, n.pos, "service is empty; name the entry in the host credential store");
            return None;
        }
        if cx.judgeable(s) && !is_service_name(s) {
            cx.error(
                &p,
                n.pos,
                format!("service `{s}` is not a service name (lowercase letters, digits and inner hyphens, 1 to 64 characters)"),
            );
            return None;
        }
        Some(s)
    });
    let phases = read_phases(cx, &mut f);
    let api_key = nested(cx, &mut f, &at, "apiKey", decode_api_key);
    let oauth = nested(cx, &mut f, &at, "oauth", decode_oauth);
    if !f.has("apiKey") && !f.has("oauth") {
        cx.error(path, node.pos, "declare apiKey, oauth, or both");
    }
    f.finish(cx);
    if error_count(cx) > before {
        return None;
    }
    Some(Credential {
        service: service?.to_owned(),
        phases: phases?,
        api_key: api_key?,
        oauth: oauth?.map(Box::new),
    })
}

fn decode_api_key(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<ApiKey> {
    let mut f = mapping(cx, node, at)?;
    let name = opt_str(cx, &mut f, at, "name");
    if let Some(Some(n)) = name
        && !n.is_empty()
        && cx.judgeable(n)
        && !is_env_name(n)
    {
        let p = at.key("name");
        cx.error(
            &p.path,
            node.get("name").map_or(node.pos, |n| n.pos),
            format!("{} `{n}` is not an environment variable name", p.rel),
        );
    }
    let proxy_managed = opt_bool(cx, &mut f, at, "proxyManaged");
    let inject = match optional(cx, &mut f, at, "inject") {
        None => None,
        Some(None) => Some(Vec::new()),
        Some(Some(list)) => decode_inject_list(cx, list, &at.key("inject")),
    };
    // Presence, read from the raw node: a null or mistyped field is already reported.
    let no_name = node.get("name").is_none_or(|n| n.as_str() == Some(""));
    let no_inject = node
        .get("inject")
        .is_none_or(|n| n.as_seq().is_some_and(<[Node]>::is_empty));
    if no_name && no_inject {
        cx.error(
            &at.path,
            node.pos,
            "apiKey needs a name, inject rules, or both",
        );
    }
    f.finish(cx);
    Some(ApiKey {
        name: name?.map(str::to_owned),
        proxy_managed: proxy_managed?,
        inject: inject?,
    })
}

fn decode_inject_list(cx: &mut Cx<'_>, list: &Node, at: &At) -> Option<Vec<InjectRule>> {
    let items = cx.list(list, &at.path)?;
    let mut out = Some(Vec::with_capacity(items.len()));
    for (i, (_, n)) in items.into_iter().enumerate() {
        match decode_inject_rule(cx, n, &at.index(i)) {
            Some(rule) => {
                if let Some(v) = out.as_mut() {
                    v.push(rule);
                }
            }
            None => out = None,
        }
    }
    out
}

fn decode_inject_rule(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<InjectRule> {
    let mut f = mapping(cx, node, at)?;
    let domain = req_str(cx, &mut f, at, "domain");
    let header = opt_str(cx, &mut f, at, "header");
    let format = opt_str(cx, &mut f, at, "format");
    let scheme = opt_str(cx, &mut f, at, "scheme");
    let username = opt_str(cx, &mut f, at, "username");
    f.finish(cx);
    Some(InjectRule {
        domain: domain?.to_owned(),
        header: header?.map(str::to_owned),
        format: format?.map(str::to_owned),
        scheme: scheme?.map(str::to_owned),
        username: username?.map(str::to_owned),
    })
}

fn decode_oauth(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<OAuth> {
    let mut f = mapping(cx, node, at)?;
    let token_endpoint = nested(cx, &mut f, at, "tokenEndpoint", decode_token_endpoint);
    let resource_hosts = match optional(cx, &mut f, at, "resourceHosts") {
        None => None,
        Some(None) => Some(Vec::new()),
        Some(Some(list)) => decode_host_list(cx, list, &at.key("resourceHosts")),
    };
    let sentinels = nested(cx, &mut f, at, "sentinels", decode_sentinels);
    let credential_file = nested(cx, &mut f, at, "credentialFile", decode_credential_file);
    let response_fields = nested(cx, &mut f, at, "responseFields", decode_response_fields);
    let passthrough = opt_bool(cx, &mut f, at, "passthrough");
    f.finish(cx);
    Some(OAuth {
        token_endpoint: token_endpoint?,
        resource_hosts: resource_hosts?,
        sentinels: sentinels?,
        credential_file: credential_file?,
        response_fields: response_fields?,
        passthrough: passthrough?,
    })
}

fn decode_host_list(cx: &mut Cx<'_>, list: &Node, at: &At) -> Option<Vec<String>> {
    let items = cx.list(list, &at.path)?;
    let mut out = Some(Vec::with_capacity(items.len()));
    for (i, (p, n)) in items.into_iter().enumerate() {
        let host = if n.is_null() {
            null_error(cx, &at.index(i), n.pos);
            None
        } else {
            cx.string(n, &p)
        };
        match host {
            Some("") => {
                cx.error(&p, n.pos, format!("{} is empty", at.index(i).rel));
                out = None;
            }
            Some(h) => {
                if let Some(v) = out.as_mut() {
                    v.push(h.to_owned());
                }
            }
            None => out = None,
        }
    }
    out
}

fn decode_token_endpoint(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<TokenEndpoint> {
    let mut f = mapping(cx, node, at)?;
    let host = req_str(cx, &mut f, at, "host");
    let path = opt_str(cx, &mut f, at, "path");
    f.finish(cx);
    Some(TokenEndpoint {
        host: host?.to_owned(),
        path: path?.map(str::to_owned),
    })
}

fn decode_sentinels(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<Sentinels> {
    let mut f = mapping(cx, node, at)?;
    let access_token = opt_str(cx, &mut f, at, "accessToken");
    let refresh_token = opt_str(cx, &mut f, at, "refreshToken");
    f.finish(cx);
    Some(Sentinels {
        access_token: access_token?.map(str::to_owned),
        refresh_token: refresh_token?.map(str::to_owned),
    })
}

fn decode_response_fields(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<ResponseFields> {
    let mut f = mapping(cx, node, at)?;
    let access_token = opt_str(cx, &mut f, at, "accessToken");
    let refresh_token = opt_str(cx, &mut f, at, "refreshToken");
    let expires_in = opt_str(cx, &mut f, at, "expiresIn");
    f.finish(cx);
    Some(ResponseFields {
        access_token: access_token?.map(str::to_owned),
        refresh_token: refresh_token?.map(str::to_owned),
        expires_in: expires_in?.map(str::to_owned),
    })
}

fn decode_credential_file(cx: &mut Cx<'_>, node: &Node, at: &At) -> Option<CredentialFile> {
    let mut f = mapping(cx, node, at)?;
    let path = req_str(cx, &mut f, at, "path");
    let structure = match optional(cx, &mut f, at, "structure") {
        None => None,
        Some(None) => Some(None),
        Some(Some(n)) => match n.value {
            Value::Map(_) => Some(Some(n)),
            _ => {
                cx.error(
                    &at.key("structure").path,
                    n.pos,
                    format!(
                        "credentialFile.structure must be a mapping, found {}",
                        n.kind_name()
                    ),
                );
                None
            }
        },
    };
    let format = opt_str(cx, &mut f, at, "format");
    f.finish(cx);
    let format_pos = node.get("format").map_or(node.pos, |n| n.pos);
    let format_path = at.key("format").path;
    let mut format_ok = true;
    match format {
        Some(Some("")) => {
            cx.error(
                &format_path,
                format_pos,
                "credentialFile.format is empty; omit the field for json or name an encoding",
            );
            format_ok = false;
        }
        Some(Some(v)) if cx.judgeable(v) && v != "json" && v != "toml" => {
            cx.error(
                &format_path,
                format_pos,
                format!("credentialFile.format \"{v}\" is not json or toml"),
            );
            format_ok = false;
        }
        _ => {}
    }
    if let (Some(Some("toml")), Some(Some(s))) = (format, structure) {
        report_toml_nulls(cx, s, &at.key("structure"), "structure");
    }
    format_ok.then_some(())?;
    Some(CredentialFile {
        path: path?.to_owned(),
        structure: structure?.map(Node::to_json),
        format: format?.map(str::to_owned),
    })
}

/// Reports every null inside a structure bound for TOML, which has no null.
fn report_toml_nulls(cx: &mut Cx<'_>, node: &Node, at: &At, rel: &str) {
    let mut stack: Vec<(&Node, Path, String)> = vec![(node, at.path.clone(), rel.to_owned())];
    while let Some((n, path, rel)) = stack.pop() {
        match &n.value {
            Value::Null => cx.error(
                &path,
                n.pos,
                format!("{rel} is null, which TOML cannot represent"),
            ),
            Value::Map(entries) => {
                for (k, v) in entries.iter().rev() {
                    stack.push((v, path.key(&k.text), format!("{rel}.{}", k.text)));
                }
            }
            Value::Seq(items) => {
                for (i, v) in items.iter().enumerate().rev() {
                    stack.push((v, path.index(i), format!("{rel}[{i}]")));
                }
            }
            _ => {}
        }
    }
}

/// One key per literal (service, phase) pair (spec §2.3 block rule): a scalar phase and a
/// list naming the same phase collide.
pub(crate) fn block_keys(config: &Node) -> Vec<BlockKey> {
    let Some(service) = super::literal_str(config, "service") else {
        return Vec::new();
    };
    literal_phases(config)
        .into_iter()
        .map(|phase| BlockKey {
            key: format!("credential:{service}/{phase}"),
            what: format!("credential `{service}` for phase {phase}"),
        })
        .collect()
}

/// The host part of an inject domain or allow entry for membership: cut at the first `:`.
fn strip_port(host: &str) -> &str {
    host.split_once(':').map_or(host, |(h, _)| h)
}

/// Cross-entry check (§2.1 / §2.3): every inject domain (port stripped at the first ':')
/// must appear (exact string, port-stripped) in the allow list of EACH phase the credential
/// declares, unless that phase's allow holds a bare `*` or `**`; bounded @2 allow hosts
/// count; globs are not expanded; an absent phase block is an empty allow set. The error
/// path is the inject rule's domain, e.g. `capabilities[1].config.apiKey.inject[0].domain`.
pub(crate) fn check_inject_within_allow(
    cx: &mut Cx<'_>,
    credential: &Credential,
    credential_config: &Node,
    config_path: &Path,
    (policy, egress): (Option<&NetworkPolicy>, &[&str]),
) {
    let Some(api_key) = &credential.api_key else {
        return;
    };
    let rules = credential_config
        .get("apiKey")
        .and_then(|k| k.get("inject"))
        .and_then(Node::as_seq);
    for &phase in &credential.phases {
        // Hosts are compared byte for byte (no case folding, spec §4.5).
        let mut allow: Vec<&str> = policy
            .and_then(|p| p.phase(phase))
            .map(|r| {
                r.allow
                    .iter()
                    .flat_map(|e| &e.hosts)
                    .map(|h| strip_port(h))
                    .collect()
            })
            .unwrap_or_default();
        // A pack's egress triples (dev.capgate/egress@1) are runtime grants.
        if phase == Phase::Runtime {
            allow.extend_from_slice(egress);
        }
        if allow.iter().any(|h| *h == "*" || *h == "**") {
            continue;
        }
        for (j, rule) in api_key.inject.iter().enumerate() {
            if !cx.judgeable(&rule.domain) || allow.contains(&strip_port(&rule.domain)) {
                continue;
            }
            let pos = rules
                .and_then(|r| r.get(j))
                .and_then(|r| r.get("domain"))
                .map_or(credential_config.pos, |n| n.pos);
            cx.error(
                &config_path.key("apiKey").key("inject").index(j).key("domain"),
                pos,
                format!(
                    "credential `{}`: inject domain `{}` is not in the network policy's {phase} allow list; the key would be presented to a host the phase cannot reach",
                    credential.service, rule.domain
                ),
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::caps::network;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn decode_text(text: &str, lenient: bool) -> (Option<Credential>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        assert!(diags.is_empty(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        cx.lenient = lenient;
        let c = decode(&mut cx, &node, &Path::from(AT));
        (c, diags)
    }

    fn ok(text: &str) -> Credential {
        let (c, d) = decode_text(text, false);
        assert!(!d.has_errors(), "{text}\n{d:?}");
        c.expect("typed value")
    }

    fn err(text: &str, path: &str, fragment: &str) -> Diagnostics {
        let (c, d) = decode_text(text, false);
        assert!(
            d.contains(path, fragment),
            "{text}\nwant {path}: {fragment}\ngot {d:?}"
        );
        assert!(c.is_none(), "{text}");
        d
    }

    #[test]
    fn accepts_the_documented_shapes() {
        let c = ok(
            "service: github\nphase: runtime\napiKey: {name: GH_TOKEN, proxyManaged: true, inject: [{domain: api.github.com}]}\n",
        );
        assert_eq!(c.service, "github");
        assert_eq!(c.phases, vec![Phase::Runtime]);
        let k = c.api_key.as_ref().unwrap();
        assert_eq!(k.env_name(), Some("GH_TOKEN"));
        assert!(k.proxy_managed);
        assert_eq!(k.inject[0].header_or_default(), "Authorization");
        assert_eq!(k.inject[0].format_or_default(), "Bearer %s");
        let c = ok(
            "service: npm\nphase: [install, runtime]\napiKey: {inject: [{domain: registry.npmjs.org, header: X-Key, format: '%s', scheme: basic, username: me}]}\n",
        );
        assert_eq!(c.phases, vec![Phase::Install, Phase::Runtime]);
        let k = c.api_key.unwrap();
        assert_eq!(k.env_name(), None);
        assert_eq!(k.inject[0].header_or_default(), "X-Key");
        assert_eq!(k.inject[0].format_or_default(), "%s");
        let c = ok(
            "service: gh\nphase: runtime\napiKey: {name: '', inject: [{domain: a.example.com}]}\n",
        );
        assert_eq!(c.api_key.unwrap().env_name(), None);
        for phase in [
            "install",
            "runtime",
            "[runtime]",
            "[install, runtime]",
            "[runtime, install]",
        ] {
            ok(&format!(
                "service: gh\nphase: {phase}\napiKey: {{name: GH_TOKEN}}\n"
            ));
        }
        ok("service: claude\nphase: runtime\noauth: {}\n");
    }

    #[test]
    fn rejects_per_the_acceptance_cases() {
        let base = "service: github\nphase: runtime\n";
        let cases: &[(&str, &str, &str)] = &[
            // credential without phase → error mentioning phase
            ("service: github\napiKey: {name: GH_TOKEN}\n", AT, "phase"),
            // apiKey with only proxyManaged
            (
                "apiKey: {proxyManaged: true}\n",
                "capabilities[0].config.apiKey",
                "apiKey needs a name, inject rules, or both",
            ),
            (
                "apiKey: {name: null}\n",
                "capabilities[0].config.apiKey.name",
                "apiKey.name is null",
            ),
            (
                "oauth: null\n",
                "capabilities[0].config.oauth",
                "oauth is null; omit the field or declare a value",
            ),
            (
                "oauth: {credentialFile: {path: /x, format: ini}}\n",
                "capabilities[0].config.oauth.credentialFile.format",
                "credentialFile.format \"ini\" is not json or toml",
            ),
            (
                "oauth: {credentialFile: {path: /x, format: ''}}\n",
                "capabilities[0].config.oauth.credentialFile.format",
                "credentialFile.format is empty",
            ),
            (
                "oauth: {credentialFile: {path: /x, format: null}}\n",
                "capabilities[0].config.oauth.credentialFile.format",
                "credentialFile.format is null",
            ),
            (
                "oauth: {credentialFile: {path: /x, structure: null}}\n",
                "capabilities[0].config.oauth.credentialFile.structure",
                "credentialFile.structure is null",
            ),
            (
                "oauth: {credentialFile: null}\n",
                "capabilities[0].config.oauth.credentialFile",
                "oauth.credentialFile is null",
            ),
            (
                "oauth: {responseFields: {accessToken: access_token, refreshToken: null}}\n",
                "capabilities[0].config.oauth.responseFields.refreshToken",
                "oauth.responseFields.refreshToken is null",
            ),
            (
                "oauth: {credentialFile: {path: /x, format: toml, structure: {nested: {endpoint: null}}}}\n",
                "capabilities[0].config.oauth.credentialFile.structure.nested.endpoint",
                "structure.nested.endpoint is null, which TOML cannot represent",
            ),
        ];
        for (extra, path, fragment) in cases {
            let text = if extra.starts_with("service") {
                (*extra).to_owned()
            } else {
                format!("{base}{extra}")
            };
            err(&text, path, fragment);
        }
    }

    #[test]
    fn grammar_errors() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "phase: runtime\napiKey: {name: X}\n",
                AT,
                "`service` is required",
            ),
            (
                "service: GitHub\nphase: runtime\napiKey: {name: X}\n",
                "capabilities[0].config.service",
                "is not a service name",
            ),
            (
                "service: -gh\nphase: runtime\napiKey: {name: X}\n",
                "capabilities[0].config.service",
                "is not a service name",
            ),
            (
                "service: ''\nphase: runtime\napiKey: {name: X}\n",
                "capabilities[0].config.service",
                "service is empty",
            ),
            (
                "service: gh\nphase: null\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "phase is null",
            ),
            (
                "service: gh\nphase: []\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "phase list is empty",
            ),
            (
                "service: gh\nphase: ''\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "must be install or runtime",
            ),
            (
                "service: gh\nphase: always\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "phase `always` must be install or runtime",
            ),
            (
                "service: gh\nphase: [runtime, runtime]\napiKey: {name: X}\n",
                "capabilities[0].config.phase[1]",
                "listed twice",
            ),
            (
                "service: gh\nphase: [install, always]\napiKey: {name: X}\n",
                "capabilities[0].config.phase[1]",
                "must be install or runtime",
            ),
            (
                "service: gh\nphase: [install, null]\napiKey: {name: X}\n",
                "capabilities[0].config.phase[1]",
                "is null",
            ),
            (
                "service: gh\nphase: [install, 42]\napiKey: {name: X}\n",
                "capabilities[0].config.phase[1]",
                "expected a string",
            ),
            (
                "service: gh\nphase: 42\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "found a number",
            ),
            (
                "service: gh\nphase: {}\napiKey: {name: X}\n",
                "capabilities[0].config.phase",
                "found a mapping",
            ),
            (
                "service: gh\nphase: runtime\n",
                AT,
                "declare apiKey, oauth, or both",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {}\n",
                "capabilities[0].config.apiKey",
                "apiKey needs a name, inject rules, or both",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {inject: []}\n",
                "capabilities[0].config.apiKey",
                "apiKey needs a name",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {name: 1BAD}\n",
                "capabilities[0].config.apiKey.name",
                "is not an environment variable name",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {inject: [{header: X}]}\n",
                "capabilities[0].config.apiKey.inject[0]",
                "`domain` is required",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {inject: [{domain: ''}]}\n",
                "capabilities[0].config.apiKey.inject[0].domain",
                "apiKey.inject[0].domain is empty",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {inject: [null]}\n",
                "capabilities[0].config.apiKey.inject[0]",
                "apiKey.inject[0] is null",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {inject: [{domain: a, header: null}]}\n",
                "capabilities[0].config.apiKey.inject[0].header",
                "apiKey.inject[0].header is null",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {name: X, proxyManaged: yes}\n",
                "capabilities[0].config.apiKey.proxyManaged",
                "expected true or false",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {name: X, nmae: Y}\n",
                "capabilities[0].config.apiKey.nmae",
                "unknown field `nmae`",
            ),
            (
                "service: gh\nphase: runtime\napiKey: null\n",
                "capabilities[0].config.apiKey",
                "apiKey is null",
            ),
            (
                "service: gh\nphase: runtime\nextra: 1\napiKey: {name: X}\n",
                "capabilities[0].config.extra",
                "unknown field `extra`",
            ),
            (
                "service: gh\nphase: runtime\noauth: {tokenEndpoint: {path: /token}}\n",
                "capabilities[0].config.oauth.tokenEndpoint",
                "`host` is required",
            ),
            (
                "service: gh\nphase: runtime\noauth: {tokenEndpoint: {host: ''}}\n",
                "capabilities[0].config.oauth.tokenEndpoint.host",
                "oauth.tokenEndpoint.host is empty",
            ),
            (
                "service: gh\nphase: runtime\noauth: {tokenEndpoint: {host: null}}\n",
                "capabilities[0].config.oauth.tokenEndpoint.host",
                "oauth.tokenEndpoint.host is null",
            ),
            (
                "service: gh\nphase: runtime\noauth: {resourceHosts: [a, null]}\n",
                "capabilities[0].config.oauth.resourceHosts[1]",
                "oauth.resourceHosts[1] is null",
            ),
            (
                "service: gh\nphase: runtime\noauth: {resourceHosts: ['']}\n",
                "capabilities[0].config.oauth.resourceHosts[0]",
                "is empty",
            ),
            (
                "service: gh\nphase: runtime\noauth: {sentinels: {accessToken: null}}\n",
                "capabilities[0].config.oauth.sentinels.accessToken",
                "oauth.sentinels.accessToken is null",
            ),
            (
                "service: gh\nphase: runtime\noauth: {passthrough: null}\n",
                "capabilities[0].config.oauth.passthrough",
                "oauth.passthrough is null",
            ),
            (
                "service: gh\nphase: runtime\noauth: {credentialFile: {format: json}}\n",
                "capabilities[0].config.oauth.credentialFile",
                "`path` is required",
            ),
            (
                "service: gh\nphase: runtime\noauth: {credentialFile: {path: /x, structure: [a]}}\n",
                "capabilities[0].config.oauth.credentialFile.structure",
                "must be a mapping",
            ),
            (
                "service: gh\nphase: runtime\noauth: {credentialFile: {path: /x, format: toml, structure: {list: [1, null]}}}\n",
                "capabilities[0].config.oauth.credentialFile.structure.list[1]",
                "structure.list[1] is null, which TOML cannot represent",
            ),
            (
                "service: gh\nphase: runtime\noauth: {unknown: 1}\n",
                "capabilities[0].config.oauth.unknown",
                "unknown field `unknown`",
            ),
        ];
        for (text, path, fragment) in cases {
            err(text, path, fragment);
        }
    }

    #[test]
    fn nulls_inside_a_json_structure_are_legal() {
        for format in ["", "format: json, "] {
            let c = ok(&format!(
                "service: gh\nphase: runtime\noauth: {{credentialFile: {{path: /x, {format}structure: {{nested: {{endpoint: null}}, token: '{{{{.AccessToken}}}}', odd: '{{{{.Unknown}}}}'}}}}}}\n"
            ));
            let file = c.oauth.unwrap().credential_file.unwrap();
            assert_eq!(
                file.structure.unwrap()["nested"]["endpoint"],
                serde_json::Value::Null
            );
        }
        // An omitted structure is fine under toml.
        let c =
            ok("service: gh\nphase: runtime\noauth: {credentialFile: {path: /x, format: toml}}\n");
        assert_eq!(
            c.oauth.unwrap().credential_file.unwrap().format.as_deref(),
            Some("toml")
        );
    }

    #[test]
    fn round_trips_through_json() {
        let c = ok(
            "service: cursor\nphase: runtime\noauth:\n  tokenEndpoint: {host: api2.cursor.sh, path: /oauth/token}\n  resourceHosts: [api2.cursor.sh]\n  sentinels: {accessToken: sentinel-a}\n  credentialFile: {path: /home/agent/.cursor/auth.json, structure: {accessToken: '{{.AccessToken}}'}, format: json}\n  responseFields: {accessToken: accessToken, refreshToken: refreshToken}\n  passthrough: false\n",
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains(
                r#""responseFields":{"accessToken":"accessToken","refreshToken":"refreshToken"}"#
            ),
            "{json}"
        );
        assert!(json.contains(r#""phase":"runtime""#), "{json}");
        assert!(!json.contains("passthrough"), "{json}");
        let mut diags = Diagnostics::new();
        let node = parse(json.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
        let again = decode(&mut Cx::new(&mut diags), &node, &Path::from(AT)).unwrap();
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(again, c);

        let c = ok(
            "service: gh\nphase: [install, runtime]\napiKey: {name: '', inject: [{domain: a.example.com}]}\n",
        );
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            r#"{"service":"gh","phase":["install","runtime"],"apiKey":{"name":"","inject":[{"domain":"a.example.com"}]}}"#
        );
    }

    #[test]
    fn lenient_entries_keep_shape_rules_and_defer_value_rules() {
        let run = |text: &str| decode_text(text, true);
        // Value rules wait for expansion.
        let (c, d) = run(
            "service: '${{ kit.args.svc }}'\nphase: ['${{ kit.args.phase }}', runtime]\napiKey: {name: '${{ kit.args.var }}', proxyManaged: '${{ kit.args.managed }}'}\noauth: {credentialFile: {path: /x, format: '${{ kit.args.fmt }}', structure: {a: null}}}\n",
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(c.is_none(), "a deferred value cannot be typed");
        // Shape, null and presence rules do not.
        let cases: &[(&str, &str, &str)] = &[
            (
                "service: gh\nphase: ['${{ kit.args.p }}', '${{ kit.args.p }}']\napiKey: {name: '${{ kit.args.n }}'}\n",
                "capabilities[0].config.phase[1]",
                "listed twice",
            ),
            (
                "service: gh\nphase: [always, '${{ kit.args.p }}']\napiKey: {name: '${{ kit.args.n }}'}\n",
                "capabilities[0].config.phase[0]",
                "must be install or runtime",
            ),
            (
                "service: gh\nphase: []\napiKey: {name: '${{ kit.args.n }}'}\n",
                "capabilities[0].config.phase",
                "phase list is empty",
            ),
            (
                "service: gh\nphase: null\napiKey: {name: '${{ kit.args.n }}'}\n",
                "capabilities[0].config.phase",
                "phase is null",
            ),
            (
                "service: gh\nphase: runtime\napiKey: {proxyManaged: '${{ kit.args.m }}'}\n",
                "capabilities[0].config.apiKey",
                "apiKey needs a name, inject rules, or both",
            ),
            (
                "service: gh\nphase: runtime\noauth: null\napiKey: {name: '${{ kit.args.n }}'}\n",
                "capabilities[0].config.oauth",
                "oauth is null",
            ),
            (
                "service: '${{ kit.args.s }}'\nphase: runtime\napiKey: {name: X, bogus: 1}\n",
                "capabilities[0].config.apiKey.bogus",
                "unknown field",
            ),
        ];
        for (text, path, fragment) in cases {
            let (_, d) = run(text);
            assert!(
                d.contains(path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
        }
    }

    #[test]
    fn block_keys_name_every_literal_pair() {
        let mut diags = Diagnostics::new();
        let keys = |text: &str, diags: &mut Diagnostics| {
            block_keys(&parse(text.as_bytes(), &Limits::DEFAULT, diags).unwrap())
        };
        let k = keys("service: github\nphase: runtime\n", &mut diags);
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].key, "credential:github/runtime");
        assert_eq!(k[0].what, "credential `github` for phase runtime");
        let k = keys(
            "service: github\nphase: [install, runtime, runtime]\n",
            &mut diags,
        );
        let got: Vec<&str> = k.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(
            got,
            ["credential:github/install", "credential:github/runtime"]
        );
        // A scalar and a list naming one phase share the key.
        assert_eq!(
            keys("service: github\nphase: [runtime]\n", &mut diags)[0].key,
            "credential:github/runtime"
        );
        let k = keys(
            "service: github\nphase: ['${{ kit.args.p }}', install]\n",
            &mut diags,
        );
        assert_eq!(k.len(), 1);
        assert!(keys("service: '${{ kit.args.s }}'\nphase: runtime\n", &mut diags).is_empty());
        assert!(keys("phase: runtime\n", &mut diags).is_empty());
    }

    /// Decodes `capabilities[*].config` of a small descriptor, runs the inject check on
    /// every credential against the (single) network policy, and returns the diagnostics.
    fn cross_check(text: &str) -> Diagnostics {
        let mut diags = Diagnostics::new();
        let doc = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        let caps = doc.get("capabilities").and_then(Node::as_seq).unwrap();
        let mut cx = Cx::new(&mut diags);
        let mut policy = None;
        let mut credentials = Vec::new();
        for (i, cap) in caps.iter().enumerate() {
            let path = Path::from(format!("capabilities[{i}].config").as_str());
            let config = cap.get("config").unwrap();
            match cap.get("type").and_then(Node::as_str).unwrap() {
                "network-policy@1" => policy = network::decode_v1(&mut cx, config, &path),
                "network-policy@2" => policy = network::decode_v2(&mut cx, config, &path),
                "credential@1" => {
                    credentials.push((decode(&mut cx, config, &path).unwrap(), config, path))
                }
                other => unreachable!("{other}"),
            }
        }
        assert!(!cx.diags.has_errors(), "{:?}", cx.diags);
        for (c, config, path) in &credentials {
            check_inject_within_allow(&mut cx, c, config, path, (policy.as_ref(), &[]));
        }
        diags
    }

    fn with_policy(ty: &str, policy: &str, phase: &str, domain: &str) -> String {
        format!(
            "capabilities:\n  - type: {ty}\n    config: {policy}\n  - type: credential@1\n    config: {{service: svc, phase: {phase}, apiKey: {{name: KEY, inject: [{{domain: '{domain}'}}]}}}}\n"
        )
    }

    #[test]
    fn inject_domains_must_be_reachable_in_each_phase() {
        const DOMAIN: &str = "capabilities[1].config.apiKey.inject[0].domain";
        // (policy type, policy config, phase, domain, expected error fragment or "")
        let cases: &[(&str, &str, &str, &str, &str)] = &[
            (
                "network-policy@1",
                "{runtime: {allow: [npm.corp.example.com]}}",
                "install",
                "npm.corp.example.com",
                "install allow list",
            ),
            (
                "network-policy@1",
                "{runtime: {allow: [api.example.com]}}",
                "runtime",
                "api.example.com",
                "",
            ),
            (
                "network-policy@1",
                "{runtime: {allow: ['*']}}",
                "runtime",
                "api.example.com",
                "",
            ),
            (
                "network-policy@1",
                "{runtime: {allow: ['**']}}",
                "runtime",
                "api.example.com",
                "",
            ),
            (
                "network-policy@1",
                "{runtime: {allow: ['*.example.com']}}",
                "runtime",
                "api.example.com",
                "runtime allow list",
            ),
            (
                "network-policy@2",
                "{runtime: {allow: [{hosts: [api.example.com], methods: [GET]}]}}",
                "runtime",
                "api.example.com",
                "",
            ),
            (
                "network-policy@2",
                "{runtime: {allow: [{hosts: [api.example.com], methods: [GET]}]}}",
                "runtime",
                "elsewhere.example.com",
                "runtime allow list",
            ),
            // Ports are ignored on both sides; case is not folded.
            (
                "network-policy@1",
                "{runtime: {allow: ['api.example.com:443']}}",
                "runtime",
                "api.example.com:8443",
                "",
            ),
            (
                "network-policy@1",
                "{runtime: {allow: [api.example.com]}}",
                "runtime",
                "API.example.com",
                "runtime allow list",
            ),
            // A deny does not count, and an absent phase block allows nothing.
            (
                "network-policy@1",
                "{runtime: {deny: [api.example.com]}}",
                "runtime",
                "api.example.com",
                "runtime allow list",
            ),
            (
                "network-policy@2",
                "{install: {allow: ['*']}}",
                "runtime",
                "api.example.com",
                "runtime allow list",
            ),
            // Every declared phase must reach the domain.
            (
                "network-policy@2",
                "{install: {allow: [api.example.com]}, runtime: {allow: [api.example.com]}}",
                "[install, runtime]",
                "api.example.com",
                "",
            ),
            (
                "network-policy@2",
                "{runtime: {allow: [api.example.com]}}",
                "[install, runtime]",
                "api.example.com",
                "install allow list",
            ),
            (
                "network-policy@1",
                "{install: {allow: [api.example.com]}}",
                "[install, runtime]",
                "api.example.com",
                "runtime allow list",
            ),
        ];
        for (ty, policy, phase, domain, want) in cases {
            let text = with_policy(ty, policy, phase, domain);
            let d = cross_check(&text);
            if want.is_empty() {
                assert!(!d.has_errors(), "{text}\n{d:?}");
            } else {
                assert!(d.contains(DOMAIN, want), "{text}\nwant {want}\ngot {d:?}");
                assert_eq!(d.errors().count(), 1, "{text}\n{d:?}");
            }
        }
    }

    #[test]
    fn inject_check_without_a_policy_and_without_inject_rules() {
        let text = "capabilities:\n  - type: credential@1\n    config: {service: gh, phase: runtime, apiKey: {name: K, inject: [{domain: a.example.com}, {domain: b.example.com}]}}\n";
        let d = cross_check(text);
        assert!(
            d.contains(
                "capabilities[0].config.apiKey.inject[1].domain",
                "runtime allow list"
            ),
            "{d:?}"
        );
        assert_eq!(d.errors().count(), 2);
        let text = "capabilities:\n  - type: credential@1\n    config: {service: gh, phase: runtime, oauth: {resourceHosts: [a.example.com]}}\n";
        assert!(!cross_check(text).has_errors());
    }

    #[test]
    fn schema_admits_no_null_and_says_string_or_list_for_phase() {
        let text = serde_json::to_string(&schemars::schema_for!(Credential)).unwrap();
        assert!(!text.contains("\"null\""), "{text}");
        assert!(text.contains("PhaseForm"), "{text}");
        assert!(text.contains("\"toml\""), "{text}");
    }

    #[test]
    fn service_grammar() {
        for good in ["a", "github", "my-svc", "0", "a1", &"a".repeat(64)] {
            assert!(is_service_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(65)] {
            assert!(!is_service_name(bad), "{bad}");
        }
    }
}
