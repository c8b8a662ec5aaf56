//! agent-context@1, agent-sessions@1, agent-interactive-sessions@1, agent-skills@1,
//! agent-skill@1 and acp@1 (spec §2.13–§2.17, §2.21): what a Kit tells the runtime about
//! the agent it carries. None of them grants anything except agent-skills@1 (a skills
//! path on the surface).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use super::lifecycle::{
    CommandForm, Lifecycle, read_command, read_optional, read_strings, without_errors,
};
use super::storage::node_pos;
use super::{BlockKey, is_canonical_absolute, is_env_name, literal_str};
use crate::names::{CapabilityName, NameError};
use crate::node::{Node, Path, Pos, Value};
use crate::read::{Cx, Fields};
use crate::refs;

/// The placeholder a prompt tail must carry.
pub const PROMPT_PLACEHOLDER: &str = "{{.Prompt}}";
/// The placeholder a resume tail must carry.
pub const SESSION_ID_PLACEHOLDER: &str = "{{.SessionID}}";

/// Longest effective skill name, in bytes.
const MAX_SKILL_NAME: usize = 255;

// ---------------------------------------------------------------------------------------
// Typed configs.

/// agent-context@1: an agent profile file and a body of guidance for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("minProperties" = 1))]
pub struct AgentContext {
    /// Profile file name, a single path component (`CLAUDE.md`, `AGENTS.md`, …). Without
    /// `directory` it names the workload's legacy profile beside the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Absolute canonical directory of an explicit profile; requires `filename`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// The body as a file: relative to the build context when authored, the staged
    /// in-image path once published. Exclusive with `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_file: Option<String>,
    /// The body inline. Exclusive with `contentFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

impl AgentContext {
    /// Whether this is an explicit profile (it names its directory).
    pub fn is_explicit(&self) -> bool {
        self.directory.is_some()
    }

    /// Whether it carries a body (a non-empty `contentFile` or `content`).
    pub fn has_body(&self) -> bool {
        self.content_file.as_deref().is_some_and(|s| !s.is_empty())
            || self.content.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// agent-sessions@1: argv tails for headless invocations of the agent. An absent verb is
/// unsupported; for this type an empty tail reads as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSessions {
    /// Tail for a new headless session; some element contains `{{.Prompt}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub prompt: Option<Vec<String>>,
    /// Tail resuming a session; some element contains `{{.SessionID}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub resume: Option<Vec<String>>,
    /// Tail continuing the latest session.
    #[serde(rename = "continue", default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub continue_: Option<Vec<String>>,
    /// A complete command printing session ids, newest first; a string runs as
    /// `sh -c <string>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CommandForm")]
    pub list: Option<Vec<String>>,
}

/// agent-interactive-sessions@1: argv tails for TTY launches. A present verb, even `[]`,
/// is supported (`[]` = launch argv alone); an absent one is not, except `newSession`,
/// whose absence means the lifecycle@1 interactive launch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentInteractiveSessions {
    /// Tail starting a session with a prompt; at least one element, one containing
    /// `{{.Prompt}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub prompt: Option<Vec<String>>,
    /// Tail resuming a session; at least one element, one containing `{{.SessionID}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub resume: Option<Vec<String>>,
    /// Tail continuing the latest session.
    #[serde(rename = "continue", default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub continue_: Option<Vec<String>>,
    /// Tail starting a fresh session; absent means the lifecycle@1 interactive launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub new_session: Option<Vec<String>>,
    /// Tail opening the agent's own session picker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub session_picker: Option<Vec<String>>,
    /// A complete command printing session ids, newest first; a string runs as
    /// `sh -c <string>`. Must name a command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CommandForm")]
    pub list: Option<Vec<String>>,
}

/// Access a Kit asks for to the host's shared skills store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SkillsMode {
    Readonly,
    Readwrite,
}

impl SkillsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SkillsMode::Readonly => "readonly",
            SkillsMode::Readwrite => "readwrite",
        }
    }

    pub fn parse(s: &str) -> Option<SkillsMode> {
        match s {
            "readonly" => Some(SkillsMode::Readonly),
            "readwrite" => Some(SkillsMode::Readwrite),
            _ => None,
        }
    }
}

/// agent-skills@1: a skills discovery directory, where bundled skills are exposed and the
/// host's shared skills store is mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSkills {
    /// Absolute canonical directory inside the sandbox; not `/`.
    pub path: String,
    /// `readonly` (default) or `readwrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SkillsMode>,
}

impl AgentSkills {
    /// The mode asked for: `readonly` unless stated.
    pub fn effective_mode(&self) -> SkillsMode {
        self.mode.unwrap_or(SkillsMode::Readonly)
    }
}

/// agent-skill@1: one skill directory shipped in the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSkill {
    /// Absolute canonical directory in the image holding `SKILL.md`; not `/`.
    pub path: String,
    /// Directory name the skill is exposed under; the last segment of `path` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), length(max = 255))]
    pub name: Option<String>,
}

impl AgentSkill {
    /// The name the skill is exposed under: `name`, else the last segment of `path`.
    pub fn effective_name(&self) -> &str {
        self.name.as_deref().unwrap_or_else(|| basename(&self.path))
    }
}

/// acp@1: an Agent Client Protocol adapter for an agent the composition provides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Acp {
    /// Unversioned capability name of the agent (`claude`, `com.example/agent`), as written.
    pub agent: String,
    /// The complete adapter command; a string runs as `sh -c <string>`.
    #[schemars(with = "CommandForm")]
    pub command: Vec<String>,
    /// Environment overlay for the adapter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// ACP protocol version; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub protocol_version: Option<u32>,
}

impl Acp {
    /// The normalized agent name (`claude` ≡ `com.docker.kit/claude`); `None` only for a
    /// value that was never validated.
    pub fn agent_name(&self) -> Option<CapabilityName> {
        CapabilityName::parse(&self.agent).ok()
    }

    /// The protocol version asked for: 1 unless stated.
    pub fn effective_protocol_version(&self) -> u32 {
        self.protocol_version.unwrap_or(1)
    }
}

fn basename(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, base)| base)
}

// ---------------------------------------------------------------------------------------
// Shared readers.

fn optional_string(cx: &mut Cx<'_>, f: &mut Fields<'_>, key: &str) -> Option<Option<String>> {
    read_optional(f, key, |n, p| cx.string(n, p).map(str::to_owned))
}

fn optional_strings(cx: &mut Cx<'_>, f: &mut Fields<'_>, key: &str) -> Option<Option<Vec<String>>> {
    read_optional(f, key, |n, p| read_strings(cx, n, p))
}

/// Whether some element of `tail` carries `placeholder`, or could once expanded.
fn carries(cx: &Cx<'_>, tail: &[String], placeholder: &str) -> bool {
    tail.iter()
        .any(|s| s.contains(placeholder) || !cx.judgeable(s))
}

/// Checks that a stated tail carries its placeholder; `false` after reporting.
fn check_placeholder(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    key: &str,
    tail: &[String],
    placeholder: &str,
) -> bool {
    if tail.is_empty() {
        cx.error(
            &path.key(key),
            node_pos(node, key),
            format!("{key} is empty, so it cannot carry the `{placeholder}` placeholder"),
        );
        return false;
    }
    if !carries(cx, tail, placeholder) {
        cx.error(
            &path.key(key),
            node_pos(node, key),
            format!("{key} does not contain the `{placeholder}` placeholder in any element"),
        );
        return false;
    }
    true
}

/// Whether argv names a command: non-empty with a non-blank first element.
fn names_command(argv: &[String]) -> bool {
    argv.first().is_some_and(|first| !first.trim().is_empty())
}

/// Reads a `list` command that must name one; `None` after reporting.
fn read_list_command(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Vec<String>> {
    let form = read_command(cx, node, path)?;
    let blank = match &form {
        CommandForm::Shell(s) => s.trim().is_empty(),
        CommandForm::Argv(v) => !names_command(v),
    };
    if blank {
        cx.error(
            path,
            node.pos,
            "list must name a command (an empty or blank string, an empty list, or a blank first element names none)",
        );
        return None;
    }
    Some(form.into_argv())
}

fn is_empty_seq(node: &Node) -> bool {
    matches!(&node.value, Value::Seq(items) if items.is_empty())
}

/// Checks an absolute canonical directory that is not `/`; `false` after reporting.
fn check_directory(cx: &mut Cx<'_>, node: &Node, path: &Path, key: &str, value: &str) -> bool {
    if !cx.judgeable(value) {
        return true;
    }
    let message = if !value.starts_with('/') {
        format!("{key} `{value}` must be absolute")
    } else if value == "/" {
        format!("{key} `/` is the root; name a canonical directory below it")
    } else if !is_canonical_absolute(value) {
        format!(
            "{key} `{value}` is not canonical (no `.` or `..` segment, `//`, trailing `/`, backslash, NUL or control character); write the canonical form"
        )
    } else {
        return true;
    };
    cx.error(&path.key(key), node_pos(node, key), message);
    false
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]*$`, at most 255 bytes.
fn is_skill_name(s: &str) -> bool {
    s.len() <= MAX_SKILL_NAME
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A profile file name: one path component, not `.` or `..`.
fn is_single_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', '\0'])
}

// ---------------------------------------------------------------------------------------
// agent-context@1

pub(crate) fn decode_context(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentContext> {
    without_errors(cx, |cx| decode_context_fields(cx, node, path))
}

fn decode_context_fields(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentContext> {
    let mut f = cx.fields(node, path)?;
    let stated_nothing = f.is_empty();
    let filename = optional_string(cx, &mut f, "filename");
    let directory = optional_string(cx, &mut f, "directory");
    let has_content_file = f.has("contentFile");
    let has_content = f.has("content");
    let content_file = optional_string(cx, &mut f, "contentFile");
    let content = optional_string(cx, &mut f, "content");
    f.finish(cx);

    if stated_nothing {
        cx.error(
            path,
            node.pos,
            "declares nothing; state a filename, a contentFile or content (or drop the entry)",
        );
        return None;
    }
    // Presence rules: judged even when the entry is parameterized.
    if has_content_file && has_content {
        cx.error(
            path,
            node_pos(node, "content"),
            "contentFile and content are mutually exclusive; give the body one way",
        );
    }
    if node.get("directory").is_some() && node.get("filename").is_none() {
        cx.error(
            path,
            node_pos(node, "directory"),
            "directory requires a filename in the same entry",
        );
    }
    if let Some(Some(name)) = &filename {
        if name.is_empty() {
            cx.error(
                &path.key("filename"),
                node_pos(node, "filename"),
                "filename is empty; name the profile file, such as `AGENTS.md`",
            );
        } else if cx.judgeable(name) && !is_single_component(name) {
            cx.error(
                &path.key("filename"),
                node_pos(node, "filename"),
                format!("filename `{name}` must be a single file name (no `/`, `\\`, NUL, and not `.` or `..`)"),
            );
        }
    }
    if let Some(Some(dir)) = &directory
        && cx.judgeable(dir)
        && !is_canonical_absolute(dir)
    {
        cx.error(
            &path.key("directory"),
            node_pos(node, "directory"),
            format!(
                "directory `{dir}` must be absolute and canonical (no `.` or `..` segment, `//`, trailing `/`, backslash, NUL or control character)"
            ),
        );
    }
    if let Some(Some(file)) = &content_file
        && file.is_empty()
    {
        cx.error(
            &path.key("contentFile"),
            node_pos(node, "contentFile"),
            "contentFile is empty; name the body's file, or drop the field",
        );
    }
    Some(AgentContext {
        filename: filename?,
        directory: directory?,
        content_file: content_file?,
        content: content?,
    })
}

/// What one block may hold once: one entry without a directory, one entry with a body,
/// and each explicit destination (literal values only).
pub(crate) fn context_block_keys(config: &Node) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    if config.as_map().is_none() {
        return keys;
    }
    if config.get("directory").is_none() {
        keys.push(BlockKey {
            key: "agent-context:undirected".to_owned(),
            what: "an agent-context profile without a directory".to_owned(),
        });
    }
    let body = |key: &str| {
        config
            .get(key)
            .and_then(Node::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    if body("contentFile") || body("content") {
        keys.push(BlockKey {
            key: "agent-context:body".to_owned(),
            what: "an agent-context body".to_owned(),
        });
    }
    if let (Some(dir), Some(file)) = (
        literal_str(config, "directory"),
        literal_str(config, "filename"),
    ) {
        let destination = if dir.ends_with('/') {
            format!("{dir}{file}")
        } else {
            format!("{dir}/{file}")
        };
        keys.push(BlockKey {
            key: format!("agent-context:profile:{destination}"),
            what: format!("agent-context profile `{destination}`"),
        });
    }
    keys
}

// ---------------------------------------------------------------------------------------
// agent-sessions@1

pub(crate) fn decode_sessions(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSessions> {
    without_errors(cx, |cx| decode_sessions_fields(cx, node, path))
}

fn decode_sessions_fields(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSessions> {
    let mut f = cx.fields(node, path)?;
    let prompt = optional_strings(cx, &mut f, "prompt");
    let resume = optional_strings(cx, &mut f, "resume");
    let continue_ = optional_strings(cx, &mut f, "continue");
    let list = read_optional(&mut f, "list", |n, p| {
        // For this type an empty list reads as absent.
        if is_empty_seq(n) {
            return Some(None);
        }
        read_list_command(cx, n, p).map(Some)
    });
    f.finish(cx);

    let mut ok = true;
    if let Some(Some(tail)) = &prompt {
        ok &= check_placeholder(cx, node, path, "prompt", tail, PROMPT_PLACEHOLDER);
    }
    if let Some(Some(tail)) = &resume {
        ok &= check_placeholder(cx, node, path, "resume", tail, SESSION_ID_PLACEHOLDER);
    }
    // An empty prompt or resume was reported above; other empty tails read as absent.
    let says = |key: &str| node.get(key).is_some_and(|n| !is_empty_seq(n));
    let stated = |key: &str| node.get(key).is_some();
    if !(stated("prompt") || stated("resume") || says("continue") || says("list")) {
        cx.error(
            path,
            node.pos,
            "declares no verb; state at least one non-empty prompt, resume, continue or list",
        );
        return None;
    }
    ok.then_some(())?;
    let non_empty = |v: Option<Vec<String>>| v.filter(|v| !v.is_empty());
    Some(AgentSessions {
        prompt: non_empty(prompt?),
        resume: non_empty(resume?),
        continue_: non_empty(continue_?),
        list: list?.flatten(),
    })
}

// ---------------------------------------------------------------------------------------
// agent-interactive-sessions@1

pub(crate) fn decode_interactive(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
) -> Option<AgentInteractiveSessions> {
    without_errors(cx, |cx| decode_interactive_fields(cx, node, path))
}

fn decode_interactive_fields(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
) -> Option<AgentInteractiveSessions> {
    const VERBS: [&str; 6] = [
        "prompt",
        "resume",
        "continue",
        "newSession",
        "sessionPicker",
        "list",
    ];
    let mut f = cx.fields(node, path)?;
    let prompt = optional_strings(cx, &mut f, "prompt");
    let resume = optional_strings(cx, &mut f, "resume");
    let continue_ = optional_strings(cx, &mut f, "continue");
    let new_session = optional_strings(cx, &mut f, "newSession");
    let session_picker = optional_strings(cx, &mut f, "sessionPicker");
    let list = read_optional(&mut f, "list", |n, p| read_list_command(cx, n, p));
    f.finish(cx);

    let mut ok = true;
    if let Some(Some(tail)) = &prompt {
        ok &= check_placeholder(cx, node, path, "prompt", tail, PROMPT_PLACEHOLDER);
    }
    if let Some(Some(tail)) = &resume {
        ok &= check_placeholder(cx, node, path, "resume", tail, SESSION_ID_PLACEHOLDER);
    }
    if !VERBS.iter().any(|key| node.get(key).is_some()) {
        cx.error(
            path,
            node.pos,
            "declares no verb; state prompt, resume, continue, newSession, sessionPicker or list (`newSession: []` alone declares the plain launch)",
        );
        return None;
    }
    ok.then_some(())?;
    Some(AgentInteractiveSessions {
        prompt: prompt?,
        resume: resume?,
        continue_: continue_?,
        new_session: new_session?,
        session_picker: session_picker?,
        list: list?,
    })
}

/// Same-descriptor agreement checks (§2.15, §6.5 "newSession vs lifecycle interactive"
/// and "list agreement"): newSession vs lifecycle interactive when both stated and neither
/// holds a reference → "disagrees with lifecycle interactive"; agent-sessions list vs
/// agent-interactive-sessions list when both stated → "differs from agent-sessions list"
/// at the interactive entry's `config.list` path. Each argument is the entry's typed value
/// with the path of its `config` field.
pub(crate) fn check_session_agreement(
    cx: &mut Cx<'_>,
    lifecycle: Option<(&Path, &Lifecycle)>,
    sessions: Option<(&Path, &AgentSessions)>,
    interactive: Option<(&Path, &AgentInteractiveSessions)>,
) {
    let Some((at, tui)) = interactive else {
        return;
    };
    let resolved = |argv: &[String]| !argv.iter().any(|s| refs::has_any_ref(s));
    if let (Some((lc_at, lc)), Some(new_session)) = (lifecycle, tui.new_session.as_deref())
        && let Some(tail) = lc.interactive.as_deref()
        && resolved(tail)
        && resolved(new_session)
        && tail != new_session
    {
        cx.error(
            &at.key("newSession"),
            Pos::UNKNOWN,
            format!(
                "newSession `{}` disagrees with lifecycle interactive `{}` at {}; the plain interactive launch has one tail",
                render_argv(new_session),
                render_argv(tail),
                lc_at.key("interactive"),
            ),
        );
    }
    if let (Some((headless_at, headless)), Some(list)) = (sessions, tui.list.as_deref())
        && let Some(headless_list) = headless.list.as_deref()
        && resolved(list)
        && resolved(headless_list)
        && list != headless_list
    {
        cx.error(
            &at.key("list"),
            Pos::UNKNOWN,
            format!(
                "list `{}` differs from agent-sessions list `{}` at {}; one agent lists its sessions one way",
                render_argv(list),
                render_argv(headless_list),
                headless_at.key("list"),
            ),
        );
    }
}

/// An argv for messages, as a JSON list.
fn render_argv(argv: &[String]) -> String {
    serde_json::to_string(argv).unwrap_or_else(|_| argv.join(" "))
}

// ---------------------------------------------------------------------------------------
// agent-skills@1

pub(crate) fn decode_skills(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSkills> {
    without_errors(cx, |cx| decode_skills_fields(cx, node, path))
}

fn decode_skills_fields(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSkills> {
    let mut f = cx.fields(node, path)?;
    let skills_path = f.required_string(cx, "path");
    let mode = read_optional(&mut f, "mode", |n, p| {
        let s = cx.string(n, p)?;
        if let Some(mode) = SkillsMode::parse(s) {
            return Some(mode);
        }
        if cx.judgeable(s) {
            cx.error(
                p,
                n.pos,
                format!("mode must be `readonly` or `readwrite`, not `{s}`"),
            );
        }
        None
    });
    f.finish(cx);
    let skills_path = skills_path?;
    check_directory(cx, node, path, "path", skills_path).then_some(())?;
    Some(AgentSkills {
        path: skills_path.to_owned(),
        mode: mode?,
    })
}

pub(crate) fn skills_block_keys(config: &Node) -> Vec<BlockKey> {
    let Some(p) = literal_str(config, "path") else {
        return Vec::new();
    };
    vec![BlockKey {
        key: format!("agent-skills:{p}"),
        what: format!("agent-skills path `{p}`"),
    }]
}

// ---------------------------------------------------------------------------------------
// agent-skill@1

pub(crate) fn decode_skill(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSkill> {
    without_errors(cx, |cx| decode_skill_fields(cx, node, path))
}

fn decode_skill_fields(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<AgentSkill> {
    let mut f = cx.fields(node, path)?;
    let skill_path = f.required_string(cx, "path");
    let name = optional_string(cx, &mut f, "name");
    f.finish(cx);
    let skill_path = skill_path?;
    let path_ok = check_directory(cx, node, path, "path", skill_path);
    let name = name?;
    match &name {
        Some(n) if n.is_empty() => {
            cx.error(
                &path.key("name"),
                node_pos(node, "name"),
                "name is empty; omit it to use the last segment of path",
            );
            return None;
        }
        Some(n) if cx.judgeable(n) && !is_skill_name(n) => {
            cx.error(
                &path.key("name"),
                node_pos(node, "name"),
                format!(
                    "name `{n}` is not a skill name (letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most {MAX_SKILL_NAME} bytes)"
                ),
            );
            return None;
        }
        Some(_) => {}
        None if path_ok && cx.judgeable(skill_path) && !is_skill_name(basename(skill_path)) => {
            cx.error(
                &path.key("path"),
                node_pos(node, "path"),
                format!(
                    "the last segment of path, `{}`, is not a skill name (letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most {MAX_SKILL_NAME} bytes); state a `name`",
                    basename(skill_path)
                ),
            );
            return None;
        }
        None => {}
    }
    path_ok.then_some(())?;
    Some(AgentSkill {
        path: skill_path.to_owned(),
        name,
    })
}

pub(crate) fn skill_block_keys(config: &Node) -> Vec<BlockKey> {
    let name = if config.get("name").is_some() {
        literal_str(config, "name")
    } else {
        literal_str(config, "path").map(basename)
    };
    match name {
        Some(n) if !n.is_empty() => vec![BlockKey {
            key: format!("agent-skill:{n}"),
            what: format!("agent-skill `{n}`"),
        }],
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// acp@1

pub(crate) fn decode_acp(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Acp> {
    without_errors(cx, |cx| decode_acp_fields(cx, node, path))
}

fn decode_acp_fields(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Acp> {
    let mut f = cx.fields(node, path)?;
    let agent = f.required_string(cx, "agent").and_then(|a| {
        let p = path.key("agent");
        if !cx.judgeable(a) {
            return Some(a);
        }
        match agent_problem(a) {
            None => Some(a),
            Some(message) => {
                cx.error(&p, node_pos(node, "agent"), message);
                None
            }
        }
    });
    let command = f.require(cx, "command").and_then(|n| {
        let p = path.key("command");
        let form = read_command(cx, n, &p)?;
        let blank = match &form {
            CommandForm::Shell(s) => s.trim().is_empty(),
            CommandForm::Argv(v) => !names_command(v),
        };
        let argv = form.into_argv();
        if blank {
            cx.error(
                &p,
                n.pos,
                "command must name a program (an empty or blank string, an empty list, or a blank first element names none)",
            );
            return None;
        }
        if argv.iter().any(|s| s.contains('\0')) {
            cx.error(&p, n.pos, "command contains a NUL character");
            return None;
        }
        Some(argv)
    });
    let env = read_optional(&mut f, "env", |n, p| decode_env(cx, n, p));
    let protocol_version = read_optional(&mut f, "protocolVersion", |n, p| {
        let v = cx.integer(n, p)?;
        match u32::try_from(v) {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                cx.error(
                    p,
                    n.pos,
                    format!("protocolVersion {v} must be a whole number of 1 or more"),
                );
                None
            }
        }
    });
    f.finish(cx);
    Some(Acp {
        agent: agent?.to_owned(),
        command: command?,
        env: env?.unwrap_or_default(),
        protocol_version: protocol_version?,
    })
}

/// Why `agent` is not an unversioned capability name, if it is not.
fn agent_problem(agent: &str) -> Option<String> {
    if let Some((name, version)) = agent.split_once('@') {
        return Some(format!(
            "agent `{agent}` names a version (`{version}`); acp@1 takes an unversioned capability name such as `{name}`"
        ));
    }
    match CapabilityName::parse(agent) {
        Ok(_) => None,
        Err(NameError::InvalidCapabilityName { .. }) => Some(format!(
            "agent `{agent}` is not a capability name (lowercase letters, digits, `+`, `.` and `-`, optionally under a reverse-DNS namespace such as `com.example/agent`)"
        )),
        Err(e) => Some(format!("agent: {e}")),
    }
}

fn decode_env(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<BTreeMap<String, String>> {
    let entries = match &node.value {
        Value::Map(entries) => entries,
        Value::Null => {
            cx.error(
                path,
                node.pos,
                "env is null; omit the field or map names to strings",
            );
            return None;
        }
        _ => {
            cx.error(
                path,
                node.pos,
                format!(
                    "expected a mapping of names to strings, found {}",
                    node.kind_name()
                ),
            );
            return None;
        }
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (key, value) in entries {
        let p = path.key(&key.text);
        if cx.judgeable(&key.text) && !is_env_name(&key.text) {
            cx.error(
                &p,
                key.pos,
                format!(
                    "env name `{}` is not a variable name (letters, digits and `_`, not starting with a digit)",
                    key.text
                ),
            );
            ok = false;
        }
        match cx.string(value, &p) {
            Some(v) if v.contains('\0') => {
                cx.error(&p, value.pos, "env value contains a NUL character");
                ok = false;
            }
            Some(v) => {
                out.insert(key.text.clone(), v.to_owned());
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

pub(crate) fn acp_block_keys(config: &Node) -> Vec<BlockKey> {
    let Some(agent) = literal_str(config, "agent") else {
        return Vec::new();
    };
    if agent.contains('@') {
        return Vec::new();
    }
    let Ok(name) = CapabilityName::parse(agent) else {
        return Vec::new();
    };
    vec![BlockKey {
        key: format!("acp:{name}"),
        what: format!("an acp adapter for agent `{}`", name.display()),
    }]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    type Decoder<T> = fn(&mut Cx<'_>, &Node, &Path) -> Option<T>;

    fn node(text: &str) -> Node {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        assert!(!diags.has_errors(), "{diags:?}");
        node
    }

    fn run<T>(decode: Decoder<T>, text: &str, lenient: bool) -> (Option<T>, Diagnostics) {
        let n = node(text);
        let mut diags = Diagnostics::new();
        let mut cx = Cx::new(&mut diags);
        cx.lenient = lenient;
        let value = decode(&mut cx, &n, &Path::from(AT));
        (value, diags)
    }

    fn ok<T>(decode: Decoder<T>, text: &str) -> T {
        let (v, d) = run(decode, text, false);
        assert!(!d.has_errors(), "{text}: {d:?}");
        v.expect("typed value")
    }

    /// Each case: config text, error path (relative to the config, "" for the config
    /// itself), message fragment. Every case must fail with that error and no value.
    fn fails<T: std::fmt::Debug>(decode: Decoder<T>, lenient: bool, cases: &[(&str, &str, &str)]) {
        for (text, at, fragment) in cases {
            let path = if at.is_empty() {
                AT.to_owned()
            } else {
                format!("{AT}.{at}")
            };
            let (v, d) = run(decode, text, lenient);
            assert!(
                d.contains(&path, fragment),
                "{text}: want {path}: {fragment}, got {d:?}"
            );
            assert!(v.is_none(), "{text}: {v:?}");
        }
    }

    fn argv(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    // --- agent-context@1 ---------------------------------------------------------------

    #[test]
    fn context_valid() {
        let c = ok(
            decode_context,
            "filename: CLAUDE.md\ndirectory: /home/agent/.claude\ncontentFile: ./ctx.md",
        );
        assert!(c.is_explicit());
        assert!(c.has_body());
        let c = ok(decode_context, "contentFile: ./gh-context.md");
        assert!(!c.is_explicit());
        assert!(c.has_body());
        let c = ok(
            decode_context,
            "filename: AGENTS.md\ncontent: \"builder notes\"",
        );
        assert_eq!(c.content.as_deref(), Some("builder notes"));
        let c = ok(decode_context, "filename: AGENTS.md");
        assert!(!c.has_body());
        ok(decode_context, "filename: AGENTS.md\ndirectory: /");
        assert_eq!(
            serde_json::to_string(&ok(
                decode_context,
                "contentFile: /usr/share/sandbox/kit/gh/context.md"
            ))
            .unwrap(),
            r#"{"contentFile":"/usr/share/sandbox/kit/gh/context.md"}"#
        );
    }

    #[test]
    fn context_errors() {
        fails(
            decode_context,
            false,
            &[
                ("{}", "", "declares nothing"),
                ("contentFile: a.md\ncontent: text", "", "mutually exclusive"),
                ("directory: /home/agent", "", "requires a filename"),
                (
                    "directory: home/agent\nfilename: A.md",
                    "directory",
                    "absolute and canonical",
                ),
                (
                    "directory: /home/agent/\nfilename: A.md",
                    "directory",
                    "absolute and canonical",
                ),
                (
                    "directory: /home/../agent\nfilename: A.md",
                    "directory",
                    "absolute and canonical",
                ),
                (
                    "directory: //home\nfilename: A.md",
                    "directory",
                    "absolute and canonical",
                ),
                (
                    "directory: \"/home\\\\agent\"\nfilename: A.md",
                    "directory",
                    "absolute and canonical",
                ),
                (
                    "directory: /home\nfilename: sub/A.md",
                    "filename",
                    "single file name",
                ),
                (
                    "directory: /home\nfilename: \"..\"",
                    "filename",
                    "single file name",
                ),
                (
                    "directory: /home\nfilename: \"\"",
                    "filename",
                    "filename is empty",
                ),
                (
                    "directory: 7\nfilename: A.md",
                    "directory",
                    "expected a string",
                ),
                ("directory: null\nfilename: A.md", "directory", "is null"),
                ("content: null", "content", "is null"),
                ("contentFile: \"\"", "contentFile", "is empty"),
                (
                    "filename: A.md\nprofile: x",
                    "profile",
                    "unknown field `profile`",
                ),
            ],
        );
    }

    #[test]
    fn context_lenient() {
        // contentFile + parameterized content: exclusive even before expansion.
        fails(
            decode_context,
            true,
            &[
                (
                    "contentFile: a.md\ncontent: \"${{ kit.args.body }}\"",
                    "",
                    "mutually exclusive",
                ),
                (
                    "directory: \"${{ kit.args.directory }}\"",
                    "",
                    "requires a filename",
                ),
                (
                    "filename: A.md\ncontent: null\ndirectory: \"${{ kit.args.d }}\"",
                    "content",
                    "is null",
                ),
            ],
        );
        let (v, d) = run(
            decode_context,
            "filename: AGENTS.md\ndirectory: \"${{ kit.args.directory }}\"\ncontent: x",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some_and(|c| c.is_explicit()));
        let (_, d) = run(
            decode_context,
            "filename: AGENTS.md\ndirectory: \"${{ kit.env.HOME }}/.codex\"",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
    }

    #[test]
    fn context_block_keys_cover_the_three_rules() {
        let keys = |text: &str| {
            context_block_keys(&node(text))
                .into_iter()
                .map(|k| k.key)
                .collect::<Vec<_>>()
        };
        assert_eq!(keys("filename: AGENTS.md"), ["agent-context:undirected"]);
        assert_eq!(
            keys("contentFile: a.md"),
            ["agent-context:undirected", "agent-context:body"]
        );
        assert_eq!(
            keys("filename: CLAUDE.md\ndirectory: /home/agent/.claude\ncontent: x"),
            [
                "agent-context:body",
                "agent-context:profile:/home/agent/.claude/CLAUDE.md"
            ]
        );
        assert_eq!(
            keys("filename: CLAUDE.md\ndirectory: \"${{ kit.args.d }}\""),
            Vec::<String>::new()
        );
        assert_eq!(
            keys("filename: A.md\ndirectory: /home\ncontent: \"${{ kit.args.body }}\""),
            ["agent-context:body", "agent-context:profile:/home/A.md"]
        );
        let all = context_block_keys(&node("filename: CLAUDE.md\ndirectory: /home/agent/.claude"));
        assert_eq!(
            all[0].what,
            "agent-context profile `/home/agent/.claude/CLAUDE.md`"
        );
        let undirected = context_block_keys(&node("content: x"));
        assert_eq!(
            undirected[0].what,
            "an agent-context profile without a directory"
        );
        assert_eq!(undirected[1].what, "an agent-context body");
    }

    // --- agent-sessions@1 --------------------------------------------------------------

    const FULL_SESSIONS: &str = r#"
prompt: [-p, "{{.Prompt}}"]
resume: [--resume, "{{.SessionID}}"]
continue: [--continue]
list: "ls -t ~/.agent/sessions"
"#;

    #[test]
    fn sessions_valid() {
        let s = ok(decode_sessions, FULL_SESSIONS);
        assert_eq!(s.prompt, Some(argv(&["-p", "{{.Prompt}}"])));
        assert_eq!(s.continue_, Some(argv(&["--continue"])));
        assert_eq!(s.list, Some(argv(&["sh", "-c", "ls -t ~/.agent/sessions"])));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"prompt":["-p","{{.Prompt}}"],"resume":["--resume","{{.SessionID}}"],"continue":["--continue"],"list":["sh","-c","ls -t ~/.agent/sessions"]}"#
        );
        // The placeholder may sit inside an element.
        let s = ok(decode_sessions, "prompt: [\"--print={{.Prompt}}\"]");
        assert_eq!(s.prompt, Some(argv(&["--print={{.Prompt}}"])));
        // Empty tails other than prompt/resume read as absent.
        let s = ok(decode_sessions, "continue: []\nlist: [ls, ids]");
        assert_eq!(s.continue_, None);
        assert_eq!(s.list, Some(argv(&["ls", "ids"])));
        let s = ok(decode_sessions, "resume: [\"{{.SessionID}}\"]\nlist: []");
        assert_eq!(s.list, None);
    }

    #[test]
    fn sessions_errors() {
        fails(
            decode_sessions,
            false,
            &[
                ("{}", "", "declares no verb"),
                ("continue: []\nlist: []", "", "declares no verb"),
                (
                    "prompt: [-p]",
                    "prompt",
                    "does not contain the `{{.Prompt}}` placeholder",
                ),
                ("prompt: [\"{{.SessionID}}\"]", "prompt", "`{{.Prompt}}`"),
                (
                    "prompt: []",
                    "prompt",
                    "cannot carry the `{{.Prompt}}` placeholder",
                ),
                (
                    "resume: [--resume]",
                    "resume",
                    "does not contain the `{{.SessionID}}` placeholder",
                ),
                ("resume: []\ncontinue: [-c]", "resume", "cannot carry"),
                (
                    "prompts: [\"{{.Prompt}}\"]",
                    "prompts",
                    "unknown field `prompts`",
                ),
                ("prompt: null", "prompt", "is null"),
                ("prompt: [\"{{.Prompt}}\", null]", "prompt[1]", "is null"),
                ("continue: --continue", "continue", "expected a list"),
                ("list: \"  \"", "list", "must name a command"),
                ("list: [\"\"]", "list", "must name a command"),
                ("list: 5", "list", "expected a command"),
            ],
        );
        // An unknown key beside valid verbs is still an error.
        let (v, d) = run(
            decode_sessions,
            "prompt: [\"{{.Prompt}}\"]\nprompts: [x]",
            false,
        );
        assert!(d.contains("capabilities[0].config.prompts", "unknown field"));
        assert!(v.is_none());
    }

    #[test]
    fn sessions_lenient() {
        let (v, d) = run(decode_sessions, "prompt: [\"${{ kit.args.flag }}\"]", true);
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        fails(
            decode_sessions,
            true,
            &[
                (
                    "prompt: []\ncontinue: [\"${{ kit.args.c }}\"]",
                    "prompt",
                    "cannot carry",
                ),
                (
                    "prompts: [\"${{ kit.args.p }}\"]",
                    "prompts",
                    "unknown field",
                ),
                ("{}", "", "declares no verb"),
            ],
        );
    }

    // --- agent-interactive-sessions@1 --------------------------------------------------

    #[test]
    fn interactive_valid() {
        let s = ok(decode_interactive, "newSession: []");
        assert_eq!(s.new_session, Some(Vec::new()));
        assert_eq!(s.prompt, None);
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"newSession":[]}"#);
        assert_eq!(
            serde_json::to_string(&AgentInteractiveSessions::default()).unwrap(),
            "{}"
        );
        let s = ok(decode_interactive, "continue: []\nsessionPicker: []");
        assert_eq!(s.continue_, Some(Vec::new()));
        assert_eq!(s.session_picker, Some(Vec::new()));
        assert_eq!(s.new_session, None);
        let s = ok(decode_interactive, "list: \"ls -t\"");
        assert_eq!(s.list, Some(argv(&["sh", "-c", "ls -t"])));
        let s = ok(
            decode_interactive,
            "prompt: [\"{{.Prompt}}\"]\nresume: [--resume, \"{{.SessionID}}\"]\ncontinue: [--continue]\nnewSession: [--new]\nsessionPicker: [--resume]\nlist: [ls, ids]",
        );
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"prompt":["{{.Prompt}}"],"resume":["--resume","{{.SessionID}}"],"continue":["--continue"],"newSession":["--new"],"sessionPicker":["--resume"],"list":["ls","ids"]}"#
        );
    }

    #[test]
    fn interactive_errors() {
        fails(
            decode_interactive,
            false,
            &[
                ("{}", "", "declares no verb"),
                ("prompt: [-p]", "prompt", "`{{.Prompt}}`"),
                ("prompt: []", "prompt", "cannot carry"),
                ("resume: [--resume]", "resume", "`{{.SessionID}}`"),
                ("resume: []", "resume", "cannot carry"),
                (
                    "new_session: []",
                    "new_session",
                    "unknown field `new_session`",
                ),
                ("list: []", "list", "must name a command"),
                ("list: []\ncontinue: [-c]", "list", "must name a command"),
                ("list: \"\"", "list", "must name a command"),
                ("list: [\"\"]", "list", "must name a command"),
                ("list: [\" \", ids]", "list", "must name a command"),
                ("list: \"  \"", "list", "must name a command"),
                ("prompt: null\ncontinue: [-c]", "prompt", "is null"),
                ("newSession: null\ncontinue: [-c]", "newSession", "is null"),
                ("list: null\ncontinue: [-c]", "list", "is null"),
                ("continue: [-c, null]", "continue[1]", "is null"),
                ("sessionPicker: [null]", "sessionPicker[0]", "is null"),
                ("newSession: {}", "newSession", "expected a list"),
            ],
        );
        // `config: {}` is invalid while `newSession: []` alone is valid (above).
        let (_, d) = run(decode_interactive, "new_session: []", false);
        assert!(d.contains(AT, "declares no verb"), "{d:?}");
    }

    #[test]
    fn interactive_lenient() {
        let (v, d) = run(
            decode_interactive,
            "prompt: [\"${{ kit.args.p }}\"]\nresume: [\"--r=${{ kit.env.X }}\"]",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        fails(
            decode_interactive,
            true,
            &[
                (
                    "prompt: []\nnewSession: [\"${{ kit.args.x }}\"]",
                    "prompt",
                    "cannot carry",
                ),
                (
                    "list: []\nnewSession: [\"${{ kit.args.x }}\"]",
                    "list",
                    "must name a command",
                ),
                (
                    "newSession: [\"${{ kit.args.x }}\", null]",
                    "newSession[1]",
                    "is null",
                ),
            ],
        );
    }

    // --- agreement -----------------------------------------------------------------------

    fn lifecycle_with(interactive: Option<&[&str]>) -> Lifecycle {
        Lifecycle {
            interactive: interactive.map(argv),
            ..Lifecycle::default()
        }
    }

    fn tui(new_session: Option<&[&str]>, list: Option<&[&str]>) -> AgentInteractiveSessions {
        AgentInteractiveSessions {
            new_session: new_session.map(argv),
            list: list.map(argv),
            ..AgentInteractiveSessions::default()
        }
    }

    fn headless(list: Option<&[&str]>) -> AgentSessions {
        AgentSessions {
            list: list.map(argv),
            ..AgentSessions::default()
        }
    }

    fn agree(
        lifecycle: Option<&Lifecycle>,
        sessions: Option<&AgentSessions>,
        interactive: Option<&AgentInteractiveSessions>,
    ) -> Diagnostics {
        let lc_at = Path::from("capabilities[0].config");
        let headless_at = Path::from("capabilities[0].config");
        let tui_at = Path::from("capabilities[1].config");
        let mut diags = Diagnostics::new();
        let mut cx = Cx::new(&mut diags);
        check_session_agreement(
            &mut cx,
            lifecycle.map(|l| (&lc_at, l)),
            sessions.map(|s| (&headless_at, s)),
            interactive.map(|i| (&tui_at, i)),
        );
        diags
    }

    #[test]
    fn new_session_vs_lifecycle_interactive() {
        let empty: &[&str] = &[];
        let agreeing = [
            (Some(empty), Some(empty)),
            (None, Some(empty)),
            (Some(&["--tui"][..]), Some(&["--tui"][..])),
            (Some(&["--tui"][..]), None),
            (Some(&["${{ kit.args.mode }}"][..]), Some(&["--tui"][..])),
        ];
        for (tail, new_session) in agreeing {
            let d = agree(
                Some(&lifecycle_with(tail)),
                None,
                Some(&tui(new_session, None)),
            );
            assert!(!d.has_errors(), "{tail:?} {new_session:?}: {d:?}");
        }
        // newSession tail + no lifecycle at all.
        assert!(!agree(None, None, Some(&tui(Some(&["--tui"]), None))).has_errors());
        let disagreeing = [
            (Some(&["--tui"][..]), Some(empty)),
            (Some(empty), Some(&["--tui"][..])),
            (Some(&["-l"][..]), Some(&["-i"][..])),
        ];
        for (tail, new_session) in disagreeing {
            let d = agree(
                Some(&lifecycle_with(tail)),
                None,
                Some(&tui(new_session, None)),
            );
            assert!(
                d.contains(
                    "capabilities[1].config.newSession",
                    "disagrees with lifecycle interactive"
                ),
                "{tail:?} {new_session:?}: {d:?}"
            );
        }
    }

    #[test]
    fn list_agreement() {
        let same = agree(
            None,
            Some(&headless(Some(&["ls", "ids"]))),
            Some(&tui(None, Some(&["ls", "ids"]))),
        );
        assert!(!same.has_errors());
        // `"a b"` decodes to `[sh, -c, "a b"]` on either side.
        let a = ok(decode_sessions, "list: \"a b\"");
        let b = ok(decode_interactive, "list: [sh, -c, \"a b\"]");
        assert!(!agree(None, Some(&a), Some(&b)).has_errors());
        assert!(!agree(None, Some(&headless(None)), Some(&tui(None, Some(&["ls"])))).has_errors());
        assert!(!agree(None, Some(&headless(Some(&["ls"]))), Some(&tui(None, None))).has_errors());
        assert!(!agree(None, None, Some(&tui(None, Some(&["ls"])))).has_errors());
        assert!(
            !agree(
                None,
                Some(&headless(Some(&["${{ kit.args.ls }}"]))),
                Some(&tui(None, Some(&["ls"])))
            )
            .has_errors()
        );
        let d = agree(
            None,
            Some(&headless(Some(&["ls", "ids"]))),
            Some(&tui(None, Some(&["ls", "all"]))),
        );
        assert!(
            d.contains(
                "capabilities[1].config.list",
                "differs from agent-sessions list"
            ),
            "{d:?}"
        );
    }

    // --- agent-skills@1 ----------------------------------------------------------------

    #[test]
    fn skills_valid() {
        let s = ok(decode_skills, "path: /home/agent/.claude/skills");
        assert_eq!(s.mode, None);
        assert_eq!(s.effective_mode(), SkillsMode::Readonly);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"path":"/home/agent/.claude/skills"}"#
        );
        let s = ok(decode_skills, "path: /x\nmode: readwrite");
        assert_eq!(s.effective_mode(), SkillsMode::Readwrite);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"path":"/x","mode":"readwrite"}"#
        );
        assert_eq!(
            ok(decode_skills, "path: /x\nmode: readonly").mode,
            Some(SkillsMode::Readonly)
        );
    }

    #[test]
    fn skills_errors() {
        fails(
            decode_skills,
            false,
            &[
                ("path: relative/skills", "path", "must be absolute"),
                ("path: /x/../skills", "path", "canonical"),
                ("path: /skills/", "path", "canonical"),
                ("path: /skills/./sub", "path", "canonical"),
                ("path: //skills", "path", "canonical"),
                ("path: /", "path", "canonical"),
                ("path: /x\nmode: rw", "mode", "mode must be"),
                ("path: /x\nmode: \"\"", "mode", "mode must be"),
                ("path: /x\nmode: null", "mode", "is null"),
                ("path: 7", "path", "expected a string"),
                ("path: null", "path", "is null"),
                ("mode: readonly", "", "`path` is required"),
                ("path: /x\nwrite: true", "write", "unknown field `write`"),
            ],
        );
    }

    #[test]
    fn skills_lenient_and_keys() {
        let (v, d) = run(
            decode_skills,
            "path: \"${{ kit.env.HOME }}/skills\"\nmode: \"${{ kit.args.mode }}\"",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_none(), "a deferred mode leaves no typed value");
        let (v, d) = run(decode_skills, "path: \"${{ kit.env.HOME }}/skills\"", true);
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        fails(
            decode_skills,
            true,
            &[(
                "path: \"${{ kit.args.p }}\"\nmode: rw",
                "mode",
                "mode must be",
            )],
        );
        let keys = skills_block_keys(&node("path: /x\nmode: readwrite"));
        assert_eq!(keys, skills_block_keys(&node("path: /x")));
        assert_eq!(keys[0].key, "agent-skills:/x");
        assert!(skills_block_keys(&node("path: \"${{ kit.args.p }}\"")).is_empty());
        assert_ne!(skills_block_keys(&node("path: /y")), keys);
    }

    // --- agent-skill@1 -----------------------------------------------------------------

    #[test]
    fn skill_valid() {
        let s = ok(decode_skill, "path: /usr/share/skills-hub/code-review");
        assert_eq!(s.effective_name(), "code-review");
        let s = ok(decode_skill, "path: /usr/share/skills/x\nname: Review_2.v1");
        assert_eq!(s.effective_name(), "Review_2.v1");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"path":"/usr/share/skills/x","name":"Review_2.v1"}"#
        );
    }

    #[test]
    fn skill_errors() {
        let long = "a".repeat(256);
        let long_name = format!("path: /s/x\nname: {long}");
        let long_path = format!("path: /s/{long}");
        fails(
            decode_skill,
            false,
            &[
                ("name: x", "", "`path` is required"),
                ("path: skills/x", "path", "must be absolute"),
                ("path: /", "path", "canonical"),
                ("path: /s/x/", "path", "canonical"),
                ("path: /s/../x", "path", "canonical"),
                ("path: /s/x\nname: \"\"", "name", "name is empty"),
                ("path: /s/x\nname: null", "name", "is null"),
                ("path: /s/x\nname: -x", "name", "not a skill name"),
                ("path: /s/x\nname: a/b", "name", "not a skill name"),
                ("path: /s/x\nname: \"..\"", "name", "not a skill name"),
                (&long_name, "name", "not a skill name"),
                ("path: \"/s/my skill\"", "path", "not a skill name"),
                (&long_path, "path", "not a skill name"),
                ("path: /s/x\nlabel: y", "label", "unknown field"),
            ],
        );
        ok(
            decode_skill,
            &format!("path: /s/x\nname: {}", "a".repeat(255)),
        );
    }

    #[test]
    fn skill_lenient_and_keys() {
        let (v, d) = run(
            decode_skill,
            "path: \"/usr/share/skills-hub/${{ kit.args.skill }}\"",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        fails(
            decode_skill,
            true,
            &[(
                "path: \"/s/${{ kit.args.skill }}\"\nname: \"\"",
                "name",
                "name is empty",
            )],
        );
        let key = |text: &str| {
            skill_block_keys(&node(text))
                .into_iter()
                .map(|k| k.key)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            key("path: /usr/share/skills/review"),
            ["agent-skill:review"]
        );
        assert_eq!(key("path: /a/other\nname: review"), ["agent-skill:review"]);
        assert!(key("path: \"/s/${{ kit.args.skill }}\"").is_empty());
        assert!(key("path: /s/x\nname: \"${{ kit.args.n }}\"").is_empty());
    }

    // --- acp@1 -------------------------------------------------------------------------

    #[test]
    fn acp_valid() {
        let a = ok(
            decode_acp,
            "agent: claude\ncommand: claude-code-acp\nenv: {ACP_MODE: \"\", X_1: y}\nprotocolVersion: 1",
        );
        assert_eq!(a.command, argv(&["sh", "-c", "claude-code-acp"]));
        assert_eq!(a.env.get("ACP_MODE").map(String::as_str), Some(""));
        assert_eq!(a.effective_protocol_version(), 1);
        assert_eq!(a.agent_name().unwrap().to_string(), "com.docker.kit/claude");
        let a = ok(
            decode_acp,
            "agent: com.example/agent\ncommand: [/usr/bin/adapter, --stdio]",
        );
        assert_eq!(a.command, argv(&["/usr/bin/adapter", "--stdio"]));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"agent":"com.example/agent","command":["/usr/bin/adapter","--stdio"]}"#
        );
        assert_eq!(
            ok(decode_acp, "agent: a\ncommand: [x]\nprotocolVersion: 2").protocol_version,
            Some(2)
        );
    }

    #[test]
    fn acp_errors() {
        fails(
            decode_acp,
            false,
            &[
                ("command: [x]", "", "`agent` is required"),
                ("agent: null\ncommand: [x]", "agent", "is null"),
                ("agent: claude", "", "`command` is required"),
                ("agent: claude\ncommand: null", "command", "is null"),
                ("agent: claude@1.0.0\ncommand: [x]", "agent", "version"),
                (
                    "agent: Claude\ncommand: [x]",
                    "agent",
                    "not a capability name",
                ),
                (
                    "agent: \" claude \"\ncommand: [x]",
                    "agent",
                    "not a capability name",
                ),
                (
                    "agent: example/claude\ncommand: [x]",
                    "agent",
                    "single label",
                ),
                (
                    "agent: claude\ncommand: \"\"",
                    "command",
                    "must name a program",
                ),
                (
                    "agent: claude\ncommand: \"   \"",
                    "command",
                    "must name a program",
                ),
                (
                    "agent: claude\ncommand: []",
                    "command",
                    "must name a program",
                ),
                (
                    "agent: claude\ncommand: [\" \", x]",
                    "command",
                    "must name a program",
                ),
                ("agent: claude\ncommand: [x, null]", "command[1]", "is null"),
                (
                    "agent: claude\ncommand: [x, 5]",
                    "command[1]",
                    "expected a string",
                ),
                ("agent: claude\ncommand: \"x\\0y\"", "command", "NUL"),
                ("agent: claude\ncommand: [x, \"a\\0\"]", "command", "NUL"),
                (
                    "agent: claude\ncommand: [x]\nenv: null",
                    "env",
                    "env is null",
                ),
                (
                    "agent: claude\ncommand: [x]\nenv: {A: null}",
                    "env.A",
                    "is null",
                ),
                (
                    "agent: claude\ncommand: [x]\nenv: {A: 5}",
                    "env.A",
                    "expected a string",
                ),
                (
                    "agent: claude\ncommand: [x]\nenv: {1A: x}",
                    "env.1A",
                    "not a variable name",
                ),
                (
                    "agent: claude\ncommand: [x]\nenv: {A: \"x\\0\"}",
                    "env.A",
                    "NUL",
                ),
                (
                    "agent: claude\ncommand: [x]\nenv: [A]",
                    "env",
                    "expected a mapping",
                ),
                (
                    "agent: claude\ncommand: [x]\nprotocolVersion: 0",
                    "protocolVersion",
                    "1 or more",
                ),
                (
                    "agent: claude\ncommand: [x]\nprotocolVersion: -1",
                    "protocolVersion",
                    "1 or more",
                ),
                (
                    "agent: claude\ncommand: [x]\nprotocolVersion: 1.5",
                    "protocolVersion",
                    "whole number",
                ),
                (
                    "agent: claude\ncommand: [x]\nprotocolVersion: null",
                    "protocolVersion",
                    "is null",
                ),
                (
                    "agent: claude\ncommand: [x]\nprotocolVersion: \"1\"",
                    "protocolVersion",
                    "expected a number",
                ),
                (
                    "agent: claude\ncommand: [x]\nargs: [y]",
                    "args",
                    "unknown field `args`",
                ),
            ],
        );
    }

    #[test]
    fn acp_lenient() {
        let (v, d) = run(
            decode_acp,
            "agent: \"${{ kit.args.agent }}\"\ncommand: [\"${{ kit.args.cmd }}\"]",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        // Presence and null rules run even when another field is parameterized.
        fails(
            decode_acp,
            true,
            &[
                (
                    "agent: \"${{ kit.args.agent }}\"",
                    "",
                    "`command` is required",
                ),
                (
                    "agent: \"${{ kit.args.agent }}\"\ncommand: []",
                    "command",
                    "must name a program",
                ),
                (
                    "agent: \"${{ kit.args.agent }}\"\ncommand: [x, null]",
                    "command[1]",
                    "is null",
                ),
                (
                    "agent: \"${{ kit.args.agent }}\"\ncommand: [x]\nenv: {A: null}",
                    "env.A",
                    "is null",
                ),
                (
                    "agent: \"${{ kit.args.agent }}\"\ncommand: [x]\nprotocolVersion: null",
                    "protocolVersion",
                    "is null",
                ),
                (
                    "agent: Claude\ncommand: [\"${{ kit.args.cmd }}\"]",
                    "agent",
                    "not a capability name",
                ),
            ],
        );
        // A deferred protocol version leaves no typed value and no error.
        let (v, d) = run(
            decode_acp,
            "agent: claude\ncommand: [x]\nprotocolVersion: \"${{ kit.args.v }}\"",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_none());
    }

    #[test]
    fn acp_block_key_is_the_normalized_agent() {
        let key = |text: &str| {
            acp_block_keys(&node(text))
                .into_iter()
                .map(|k| k.key)
                .collect::<Vec<_>>()
        };
        assert_eq!(key("agent: claude"), ["acp:com.docker.kit/claude"]);
        assert_eq!(key("agent: com.docker.kit/claude"), key("agent: claude"));
        assert_ne!(key("agent: com.example/claude"), key("agent: claude"));
        assert!(key("agent: \"${{ kit.args.a }}\"").is_empty());
        assert!(key("agent: claude@1.0.0").is_empty());
        assert!(key("agent: Claude").is_empty());
        assert_eq!(
            acp_block_keys(&node("agent: claude"))[0].what,
            "an acp adapter for agent `claude`"
        );
    }

    #[test]
    fn schemas_build() {
        for text in [
            serde_json::to_string(&schemars::schema_for!(AgentContext)).unwrap(),
            serde_json::to_string(&schemars::schema_for!(AgentInteractiveSessions)).unwrap(),
            serde_json::to_string(&schemars::schema_for!(Acp)).unwrap(),
        ] {
            assert!(text.contains("additionalProperties"), "{text}");
        }
        let sessions = serde_json::to_string(&schemars::schema_for!(AgentSessions)).unwrap();
        assert!(sessions.contains("\"continue\""), "{sessions}");
        assert!(sessions.contains("CommandForm"), "{sessions}");
    }
}
