//! lifecycle@1 (spec §2.12): install hooks, startup hooks, files written before the
//! entrypoint, and the tail of the interactive launch.
//!
//! Also home of the command reader shared with the agent types: a command is written as a
//! shell string (run as `sh -c <string>`) or as an argv list, and is kept as argv.

use schemars::JsonSchema;
use serde::Serialize;

use super::is_env_name;
use super::storage::node_pos;
use crate::node::{Node, Path, Value};
use crate::read::{Cx, Fields};

/// lifecycle@1: what runs and what is written around the workload's start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lifecycle {
    /// Hooks run once per sandbox, at create, before the entrypoint first runs, while the
    /// install-phase grants are open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install: Vec<Hook>,
    /// Hooks run on every boot of the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup: Vec<StartupHook>,
    /// Files written before the entrypoint runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileSpec>,
    /// Arguments appended to the launch argv for an interactive (TTY) launch. A stated
    /// empty list means "launch argv alone" and differs from an absent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>")]
    pub interactive: Option<Vec<String>>,
}

/// An install hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// The command: a shell string (run as `sh -c <string>`) or a non-empty argv list.
    /// Always published as argv.
    #[schemars(with = "CommandForm")]
    pub command: Vec<String>,
    /// User to run as (name or uid); the runtime's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Names of environment variables the hook may see, beside the shell baseline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(pattern(r"^[A-Za-z_][A-Za-z0-9_]*$")))]
    pub env: Vec<String>,
    /// What the hook does, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A startup hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartupHook {
    /// The command: a shell string (run as `sh -c <string>`) or a non-empty argv list.
    /// Always published as argv.
    #[schemars(with = "CommandForm")]
    pub command: Vec<String>,
    /// User to run as (name or uid); the runtime's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run without waiting for the hook to finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// Names of environment variables the hook may see, beside the shell baseline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(pattern(r"^[A-Za-z_][A-Za-z0-9_]*$")))]
    pub env: Vec<String>,
    /// What the hook does, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A file written before the entrypoint runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSpec {
    /// Where the file goes; absolute once `${{ kit.env.* }}` references are expanded.
    pub path: String,
    /// The file's content.
    #[serde(default)]
    pub content: String,
    /// Octal mode such as `0644`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-7]{3,4}$"))]
    pub mode: Option<String>,
    /// Replace a file that already exists (default true); `false` keeps it.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub overwrite: bool,
    /// What the file is for, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// How a command may be written: a shell string, run as `sh -c <string>`, or an argv
/// list. Decoding always yields argv.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandForm {
    /// A shell command line.
    Shell(String),
    /// Program and arguments.
    Argv(Vec<String>),
}

impl CommandForm {
    /// The argv this command runs: a shell string becomes `["sh", "-c", <string>]`.
    pub fn into_argv(self) -> Vec<String> {
        match self {
            CommandForm::Shell(s) => vec!["sh".to_owned(), "-c".to_owned(), s],
            CommandForm::Argv(v) => v,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Readers shared with the agent types.

/// Reads a command written as a string or a list of strings. `None` (after reporting)
/// when it is neither, or when an element is not a string.
pub(crate) fn read_command(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<CommandForm> {
    match &node.value {
        Value::Str(s) => Some(CommandForm::Shell(s.clone())),
        Value::Seq(_) => read_strings(cx, node, path).map(CommandForm::Argv),
        Value::Null => {
            cx.error(
                path,
                node.pos,
                "is null; expected a command (a string or a list of strings)",
            );
            None
        }
        _ => {
            cx.error(
                path,
                node.pos,
                format!(
                    "expected a command (a string or a list of strings), found {}",
                    node.kind_name()
                ),
            );
            None
        }
    }
}

/// Reads a list of strings. `None` (after reporting) when it is not a list or when some
/// element is not a string.
pub(crate) fn read_strings(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Vec<String>> {
    let items = cx.list(node, path)?;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, n) in items {
        match cx.string(n, &p) {
            Some(s) => out.push(s.to_owned()),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// An optional field read with `read`: `Some(None)` when absent, `Some(Some(v))` when
/// read, `None` when present but unreadable (reported by `read`, or deferred).
pub(crate) fn read_optional<'n, T>(
    f: &mut Fields<'n>,
    key: &str,
    read: impl FnOnce(&'n Node, &Path) -> Option<T>,
) -> Option<Option<T>> {
    match f.take(key) {
        None => Some(None),
        Some(n) => read(n, &f.at(key)).map(Some),
    }
}

/// An optional string field, owned.
fn optional_string(cx: &mut Cx<'_>, f: &mut Fields<'_>, key: &str) -> Option<Option<String>> {
    read_optional(f, key, |n, p| cx.string(n, p).map(str::to_owned))
}

fn is_octal_mode(s: &str) -> bool {
    (3..=4).contains(&s.len()) && s.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

fn is_empty_seq(node: &Node) -> bool {
    matches!(&node.value, Value::Seq(items) if items.is_empty())
}

// ---------------------------------------------------------------------------------------
// Decoding.

pub(crate) fn decode(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Lifecycle> {
    without_errors(cx, |cx| decode_lifecycle(cx, node, path))
}

/// Runs a decode and keeps its value only when it reported no error (an unknown field
/// is reported without stopping the read, but still leaves no typed value).
pub(crate) fn without_errors<T>(
    cx: &mut Cx<'_>,
    decode: impl FnOnce(&mut Cx<'_>) -> Option<T>,
) -> Option<T> {
    let before = cx.diags.errors().count();
    let value = decode(cx);
    value.filter(|_| cx.diags.errors().count() == before)
}

fn decode_lifecycle(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Lifecycle> {
    let mut f = cx.fields(node, path)?;
    let install_node = f.take("install");
    let startup_node = f.take("startup");
    let files_node = f.take("files");
    let interactive_node = f.take("interactive");
    f.finish(cx);

    let install = match install_node {
        None => Some(Vec::new()),
        Some(n) => decode_each(cx, n, &path.key("install"), |cx, n, p| {
            decode_hook(cx, n, p, false)
        })
        .map(|hooks| hooks.into_iter().map(|(hook, _)| hook).collect()),
    };
    let startup = match startup_node {
        None => Some(Vec::new()),
        Some(n) => decode_each(cx, n, &path.key("startup"), |cx, n, p| {
            decode_hook(cx, n, p, true)
        })
        .map(|hooks| {
            hooks
                .into_iter()
                .map(|(hook, background)| StartupHook {
                    command: hook.command,
                    user: hook.user,
                    background,
                    env: hook.env,
                    description: hook.description,
                })
                .collect()
        }),
    };
    let files = match files_node {
        None => Some(Vec::new()),
        Some(n) => decode_each(cx, n, &path.key("files"), decode_file),
    };
    let interactive = match interactive_node {
        None => Some(None),
        Some(n) => read_strings(cx, n, &path.key("interactive")).map(Some),
    };

    // A list of the wrong kind was reported already; only a truly empty entry is judged.
    let says_something = |n: Option<&Node>| n.is_some_and(|n| !is_empty_seq(n));
    if !(says_something(install_node)
        || says_something(startup_node)
        || says_something(files_node)
        || interactive_node.is_some())
    {
        cx.error(
            path,
            node.pos,
            "declares no install or startup hooks, no files and no interactive tail; drop the entry instead",
        );
        return None;
    }

    Some(Lifecycle {
        install: install?,
        startup: startup?,
        files: files?,
        interactive: interactive?,
    })
}

/// Decodes every element of a list with `one`; `None` when the list or any element could
/// not be read (every element is still visited).
fn decode_each<T>(
    cx: &mut Cx<'_>,
    node: &Node,
    path: &Path,
    one: impl Fn(&mut Cx<'_>, &Node, &Path) -> Option<T>,
) -> Option<Vec<T>> {
    let items = cx.list(node, path)?;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, n) in items {
        match one(cx, n, &p) {
            Some(v) => out.push(v),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// An install or startup hook; the flag is `background` (startup hooks only).
fn decode_hook(cx: &mut Cx<'_>, node: &Node, path: &Path, startup: bool) -> Option<(Hook, bool)> {
    let mut f = cx.fields(node, path)?;
    let command = f.require(cx, "command").and_then(|n| {
        let p = path.key("command");
        let argv = read_command(cx, n, &p)?.into_argv();
        if argv.is_empty() {
            cx.error(
                &p,
                n.pos,
                "command is an empty list; name a program, or write a shell string",
            );
            return None;
        }
        Some(argv)
    });
    let user = optional_string(cx, &mut f, "user");
    let background = if startup {
        read_optional(&mut f, "background", |n, p| cx.boolean(n, p))
    } else {
        Some(None)
    };
    let env = read_optional(&mut f, "env", |n, p| env_names(cx, n, p));
    let description = optional_string(cx, &mut f, "description");
    f.finish(cx);
    let hook = Hook {
        command: command?,
        user: user?,
        env: env?.unwrap_or_default(),
        description: description?,
    };
    Some((hook, background?.unwrap_or(false)))
}

/// A hook's `env`: variable names.
fn env_names(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Vec<String>> {
    let items = cx.list(node, path)?;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, n) in items {
        let Some(name) = cx.string(n, &p) else {
            ok = false;
            continue;
        };
        if cx.judgeable(name) && !is_env_name(name) {
            cx.error(
                &p,
                n.pos,
                format!("env name `{name}` is not a variable name (letters, digits and `_`, not starting with a digit)"),
            );
            ok = false;
        }
        out.push(name.to_owned());
    }
    ok.then_some(out)
}

fn decode_file(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<FileSpec> {
    let mut f = cx.fields(node, path)?;
    let file_path = f.required_string(cx, "path");
    let content = optional_string(cx, &mut f, "content");
    let mode = optional_string(cx, &mut f, "mode");
    let overwrite = read_optional(&mut f, "overwrite", |n, p| cx.boolean(n, p));
    let description = optional_string(cx, &mut f, "description");
    f.finish(cx);
    let mut ok = true;
    if let Some(p) = file_path
        && cx.judgeable(p)
        && !p.starts_with('/')
    {
        cx.error(
            &path.key("path"),
            node_pos(node, "path"),
            format!("path `{p}` must be absolute"),
        );
        ok = false;
    }
    if let Some(Some(m)) = &mode
        && cx.judgeable(m)
        && !is_octal_mode(m)
    {
        cx.error(
            &path.key("mode"),
            node_pos(node, "mode"),
            format!("mode `{m}` is not an octal mode such as `0644`"),
        );
        ok = false;
    }
    ok.then_some(())?;
    Some(FileSpec {
        path: file_path?.to_owned(),
        content: content?.unwrap_or_default(),
        mode: mode?,
        overwrite: overwrite?.unwrap_or(true),
        description: description?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn run(text: &str, lenient: bool) -> (Option<Lifecycle>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        assert!(!diags.has_errors(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        cx.lenient = lenient;
        let value = decode(&mut cx, &node, &Path::from(AT));
        (value, diags)
    }

    fn ok(text: &str) -> Lifecycle {
        let (v, d) = run(text, false);
        assert!(!d.has_errors(), "{text}: {d:?}");
        v.expect("typed value")
    }

    fn argv(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn full_entry_decodes() {
        let l = ok(r#"
install:
  - command: apt-get install -y jq
    user: root
    env: [HTTP_PROXY, HTTPS_PROXY]
    description: tools
startup:
  - command: [dockerd]
    user: "0"
    background: true
  - command: "echo hi"
files:
  - path: /home/agent/.config/pip/pip.conf
    content: "[global]\n"
    mode: "0644"
    overwrite: false
  - path: /etc/x
interactive: [--tui]
"#);
        assert_eq!(l.install.len(), 1);
        assert_eq!(
            l.install[0].command,
            argv(&["sh", "-c", "apt-get install -y jq"])
        );
        assert_eq!(l.install[0].user.as_deref(), Some("root"));
        assert_eq!(l.install[0].env, argv(&["HTTP_PROXY", "HTTPS_PROXY"]));
        assert_eq!(l.startup[0].command, argv(&["dockerd"]));
        assert!(l.startup[0].background);
        assert!(!l.startup[1].background);
        assert_eq!(l.startup[1].command, argv(&["sh", "-c", "echo hi"]));
        assert!(!l.files[0].overwrite);
        assert_eq!(l.files[0].mode.as_deref(), Some("0644"));
        assert!(l.files[1].overwrite);
        assert_eq!(l.files[1].content, "");
        assert_eq!(l.interactive, Some(argv(&["--tui"])));
    }

    #[test]
    fn stated_empty_interactive_is_kept_and_serialized() {
        let l = ok("startup: [{command: [\"true\"]}]\ninteractive: []");
        assert_eq!(l.interactive, Some(Vec::new()));
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            r#"{"startup":[{"command":["true"]}],"interactive":[]}"#
        );
        let alone = ok("interactive: []");
        assert_eq!(
            serde_json::to_string(&alone).unwrap(),
            r#"{"interactive":[]}"#
        );
        let absent = ok("startup: [{command: [\"true\"]}]");
        assert_eq!(absent.interactive, None);
        assert_eq!(
            serde_json::to_string(&absent).unwrap(),
            r#"{"startup":[{"command":["true"]}]}"#
        );
    }

    #[test]
    fn string_command_serializes_as_argv() {
        let l = ok(
            "install: [{command: \"make install\"}]\nfiles: [{path: /a, content: x, overwrite: true}]",
        );
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            r#"{"install":[{"command":["sh","-c","make install"]}],"files":[{"path":"/a","content":"x"}]}"#
        );
    }

    #[test]
    fn errors() {
        let nothing = "declares no install or startup hooks";
        let cases: &[(&str, &str, &str)] = &[
            ("{}", AT, nothing),
            ("install: []\nstartup: []\nfiles: []", AT, nothing),
            (
                "install: [{command: []}]",
                "capabilities[0].config.install[0].command",
                "empty list",
            ),
            (
                "install: [{user: root}]",
                "capabilities[0].config.install[0]",
                "`command` is required",
            ),
            (
                "install: [{command: null}]",
                "capabilities[0].config.install[0].command",
                "is null",
            ),
            (
                "install: [{command: 7}]",
                "capabilities[0].config.install[0].command",
                "found a number",
            ),
            (
                "install: [{command: [ls, null]}]",
                "capabilities[0].config.install[0].command[1]",
                "is null",
            ),
            (
                "install: [{command: ls, env: [1BAD]}]",
                "capabilities[0].config.install[0].env[0]",
                "not a variable name",
            ),
            (
                "install: [{command: ls, env: [A-B]}]",
                "capabilities[0].config.install[0].env[0]",
                "not a variable name",
            ),
            (
                "install: [{command: ls, env: null}]",
                "capabilities[0].config.install[0].env",
                "is null",
            ),
            (
                "install: [{command: ls, background: true}]",
                "capabilities[0].config.install[0].background",
                "unknown field `background`",
            ),
            (
                "startup: [{command: ls, background: yes}]",
                "capabilities[0].config.startup[0].background",
                "expected true or false",
            ),
            (
                "startup: [{command: ls, user: 0}]",
                "capabilities[0].config.startup[0].user",
                "expected a string",
            ),
            (
                "startup: [{command: ls, when: boot}]",
                "capabilities[0].config.startup[0].when",
                "unknown field `when`",
            ),
            (
                "files: [{path: relative/x, content: a}]",
                "capabilities[0].config.files[0].path",
                "must be absolute",
            ),
            (
                "files: [{content: a}]",
                "capabilities[0].config.files[0]",
                "`path` is required",
            ),
            (
                "files: [{path: /a, mode: \"0999\"}]",
                "capabilities[0].config.files[0].mode",
                "not an octal mode",
            ),
            (
                "files: [{path: /a, mode: \"12345\"}]",
                "capabilities[0].config.files[0].mode",
                "not an octal mode",
            ),
            (
                "files: [{path: /a, mode: \"64\"}]",
                "capabilities[0].config.files[0].mode",
                "not an octal mode",
            ),
            (
                "files: [{path: /a, mode: 644}]",
                "capabilities[0].config.files[0].mode",
                "expected a string",
            ),
            (
                "files: [{path: /a, overwrite: null}]",
                "capabilities[0].config.files[0].overwrite",
                "is null",
            ),
            (
                "files: [{path: /a, content: null}]",
                "capabilities[0].config.files[0].content",
                "is null",
            ),
            (
                "interactive: null",
                "capabilities[0].config.interactive",
                "is null",
            ),
            (
                "interactive: [--tui, null]",
                "capabilities[0].config.interactive[1]",
                "is null",
            ),
            (
                "interactive: --tui",
                "capabilities[0].config.interactive",
                "expected a list",
            ),
            (
                "install: {command: ls}",
                "capabilities[0].config.install",
                "expected a list",
            ),
            (
                "startup: [ls]",
                "capabilities[0].config.startup[0]",
                "expected a mapping",
            ),
            (
                "hooks: []\ninstall: [{command: ls}]",
                "capabilities[0].config.hooks",
                "unknown field `hooks`",
            ),
        ];
        for (text, path, fragment) in cases {
            let (v, d) = run(text, false);
            assert!(
                d.contains(path, fragment),
                "{text}: want {path}: {fragment}, got {d:?}"
            );
            assert!(v.is_none(), "{text}");
        }
    }

    #[test]
    fn wrong_kind_list_does_not_also_say_nothing() {
        let (_, d) = run("install: 5", false);
        assert_eq!(d.errors().count(), 1, "{d:?}");
    }

    #[test]
    fn modes_and_paths_accepted() {
        for m in ["644", "0644", "7777", "000"] {
            ok(&format!("files: [{{path: /a, mode: \"{m}\"}}]"));
        }
        ok("files: [{path: \"/data/./x\"}]");
    }

    #[test]
    fn lenient_defers_values_but_not_shapes() {
        // A file path under `${{ kit.env.HOME }}` is judged after expansion.
        let (v, d) = run(
            "files: [{path: \"${{ kit.env.HOME }}/.config/x\", mode: \"${{ kit.args.mode }}\"}]\ninstall: [{command: ls, env: [\"${{ kit.args.var }}\"]}]",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_some());
        // A deferred boolean cannot be read: no error, no typed value.
        let (v, d) = run(
            "startup: [{command: ls, background: \"${{ kit.args.bg }}\"}]",
            true,
        );
        assert!(!d.has_errors(), "{d:?}");
        assert!(v.is_none());
        // Strict: the same path is judged (a literal reference is not absolute).
        let (_, d) = run("files: [{path: \"${{ kit.args.target }}\"}]", false);
        assert!(d.contains("capabilities[0].config.files[0].path", "must be absolute"));
        // Shape rules still fire.
        for (text, path, fragment) in [
            (
                "install: [{command: []}]\nfiles: [{path: \"${{ kit.args.p }}\"}]",
                "capabilities[0].config.install[0].command",
                "empty list",
            ),
            (
                "files: [{path: \"${{ kit.args.p }}\", colour: red}]",
                "capabilities[0].config.files[0].colour",
                "unknown field",
            ),
            (
                "install: []\nfiles: []\nstartup: []",
                AT,
                "drop the entry instead",
            ),
            (
                "files: [{path: \"${{ kit.args.p }}\", content: null}]",
                "capabilities[0].config.files[0].content",
                "is null",
            ),
        ] {
            let (v, d) = run(text, true);
            assert!(d.contains(path, fragment), "{text}: {d:?}");
            assert!(v.is_none());
        }
        // Value rules do not.
        let (_, d) = run("files: [{path: \"${{ kit.args.p }}\"}]", true);
        assert!(!d.has_errors(), "{d:?}");
    }

    #[test]
    fn json_form_decodes_the_same() {
        let yaml = ok("install: [{command: \"a b\"}]\ninteractive: []");
        let json = ok(r#"{"install":[{"command":["sh","-c","a b"]}],"interactive":[]}"#);
        assert_eq!(yaml, json);
    }

    #[test]
    fn schema_says_string_or_list() {
        let schema = schemars::schema_for!(Lifecycle);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("CommandForm"), "{text}");
        assert!(text.contains("^[0-7]{3,4}$"), "{text}");
    }
}
