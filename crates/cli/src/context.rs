//! agent-context@1: the agent's profile (`CLAUDE.md`, `AGENTS.md`, …) inside the sandbox
//! (kitspec §2.13).
//!
//! Each profile the composition names (its `directory`/`filename`, or the workload's
//! legacy `filename` beside the workspace, `/home/agent/FILENAME`) gets a section that
//! capgate manages: guidance about the sandbox, then an index of the kits that contribute
//! a body, each pointing at that body in a file of its own beside the profile
//! (`.capgate-context/NN-KIT.md`). What the profile held outside the section is kept. A
//! `contentFile` is read on the host from the kit's own directory (never from outside it);
//! bodies are the kits' prose, untrusted: the section's markers are neutralized in them.

use std::path::{Component, Path, PathBuf};

use capgate_resolve::plan::Plan;
use capgate_spec::caps::Capability;

/// The first and last line of capgate's section of a profile.
pub const BEGIN: &str = "<!-- capgate:begin (this section is rewritten by capgate at each run) -->";
pub const END: &str = "<!-- capgate:end -->";

/// A profile without a filename anywhere in the composition is called this.
const DEFAULT_FILENAME: &str = "AGENTS.md";
/// Largest body read from a kit's `contentFile`.
const MAX_BODY: u64 = 256 * 1024;

/// What to write inside: per-kit body files, then each profile's section.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Materialize {
    /// `(path inside, content)` of each body file.
    pub bodies: Vec<(String, String)>,
    /// `(path inside, section)` of each profile.
    pub profiles: Vec<(String, String)>,
    /// Whether every ask was optional (a failure to write is then only a warning).
    pub optional: bool,
}

/// The profiles and bodies of `plan`; `base` is where kit references are relative to.
pub fn materialize(plan: &Plan, base: &Path) -> Result<Materialize, String> {
    let asks: Vec<_> = plan
        .composed
        .entries
        .iter()
        .filter_map(|e| match &e.capability {
            Some(Capability::AgentContext(c)) => Some((e.optional, c)),
            _ => None,
        })
        .collect();
    if asks.is_empty() {
        return Ok(Materialize::default());
    }
    let optional = asks.iter().all(|(optional, _)| *optional);
    let mut dirs: Vec<String> = Vec::new();
    let mut profiles: Vec<String> = Vec::new();
    for (_, c) in &asks {
        let filename = c
            .filename
            .as_deref()
            .filter(|f| !f.is_empty())
            .unwrap_or(DEFAULT_FILENAME);
        let dir = c
            .directory
            .as_deref()
            .unwrap_or(capgate_sandbox::AGENT_HOME);
        let path = format!("{}/{filename}", dir.trim_end_matches('/'));
        if !profiles.contains(&path) {
            dirs.push(dir.trim_end_matches('/').to_owned());
            profiles.push(path);
        }
    }
    // The bodies, in composition order, one file each beside every profile.
    // (file name, text, kit name)
    let mut bodies: Vec<(String, String, String)> = Vec::new();
    for (n, source) in plan.composed.context_sources.iter().enumerate() {
        let text = match (&source.content, &source.path) {
            (Some(content), _) => content.clone(),
            (None, Some(path)) => read_content_file(base, &source.reference, path)?,
            (None, None) => continue,
        };
        let name = kit_name(base, &source.reference);
        bodies.push((
            format!("{:02}-{}.md", n + 1, slug(&name)),
            neutralize(&text),
            name,
        ));
    }
    let mut out = Materialize {
        optional,
        ..Materialize::default()
    };
    for (dir, profile) in dirs.iter().zip(&profiles) {
        let mut section = format!(
            "{BEGIN}\n## This sandbox (capgate)\n\nYou run inside a capgate sandbox. The network is reachable only through capgate's gateway (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` are set): what the kits do not grant is refused with HTTP 403 and an `X-Capgate-Reason` header naming why; ask the user to grant it rather than working around it. The workspace is `{}`. Credentials appear only as placeholders; the gateway adds the real values where they are granted.\n",
            capgate_sandbox::WORKSPACE_DIR
        );
        if !bodies.is_empty() {
            section.push_str("\nWhat the kits of this sandbox say, one file each:\n\n");
            for (name, _, reference) in &bodies {
                section.push_str(&format!(
                    "- `{}`: `{dir}/.capgate-context/{name}`\n",
                    neutralize(reference).replace(['`', '\n'], "'")
                ));
            }
        }
        section.push_str(END);
        section.push('\n');
        for (name, text, _) in &bodies {
            out.bodies
                .push((format!("{dir}/.capgate-context/{name}"), text.clone()));
        }
        out.profiles.push((profile.clone(), section));
    }
    Ok(out)
}

/// A kit's `contentFile`: a regular file beneath the kit's own directory (its build
/// context), at most 256 KiB, as UTF-8.
fn read_content_file(base: &Path, reference: &str, path: &str) -> Result<String, String> {
    let location = base.join(reference);
    let kit_dir = if location.is_dir() {
        location
    } else {
        location
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    let shown = || format!("agent-context@1 `contentFile: {path}` of kit `{reference}`");
    let rel = Path::new(path);
    if rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!(
            "{}: must be a path inside the kit's directory",
            shown()
        ));
    }
    let kit_real = std::fs::canonicalize(&kit_dir).map_err(|e| format!("{}: {e}", shown()))?;
    let real = std::fs::canonicalize(kit_dir.join(rel)).map_err(|e| format!("{}: {e}", shown()))?;
    if !real.starts_with(&kit_real) {
        return Err(format!(
            "{}: leads to `{}`, outside the kit's directory",
            shown(),
            real.display()
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", shown()))?;
    if !meta.is_file() || meta.len() > MAX_BODY {
        return Err(format!(
            "{}: not a regular file of at most {MAX_BODY} bytes",
            shown()
        ));
    }
    let bytes = std::fs::read(&real).map_err(|e| format!("{}: {e}", shown()))?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", shown()))
}

/// A kit's name for the index: its directory's name (a reference such as `.` or `../x` is
/// relative to `base`), or the reference as written.
fn kit_name(base: &Path, reference: &str) -> String {
    let location = base.join(reference);
    let location = std::fs::canonicalize(&location).unwrap_or(location);
    let dir = if location.is_file() {
        location.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        location
    };
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| reference.to_owned())
}

/// A kit name as a file name part: lowercase letters, digits and `-`.
fn slug(reference: &str) -> String {
    let last = reference
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(reference);
    let last = last.strip_suffix(".yaml").unwrap_or(last);
    let s: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    let s = s.trim_matches('-').to_owned();
    if s.is_empty() { "kit".to_owned() } else { s }
}

/// Kit prose with capgate's section markers made inert.
fn neutralize(text: &str) -> String {
    text.replace("<!-- capgate:", "<!-- (kit text) capgate:")
}

/// The script that writes one file inside as the agent: `$1` the path, the content on
/// stdin; with `$2` = `section`, only capgate's section of the file is replaced (what the
/// file held outside it is kept), else the whole file.
pub const SCRIPT: &str = r#"set -e
mkdir -p "$(dirname "$1")"
tmp="$1.capgate-tmp"
if [ "$2" = section ] && [ -f "$1" ]; then
  sed '/^<!-- capgate:begin/,/^<!-- capgate:end -->$/d' "$1" > "$tmp"
else
  : > "$tmp"
fi
cat >> "$tmp"
mv -f "$tmp" "$1""#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn slugs_and_neutralizing() {
        assert_eq!(slug("../kits/claude"), "claude");
        assert_eq!(slug("kits/Codex Mixin.yaml"), "codex-mixin");
        assert_eq!(slug("///"), "kit");
        assert_eq!(
            neutralize("x\n<!-- capgate:end -->\ny"),
            "x\n<!-- (kit text) capgate:end -->\ny"
        );
    }

    #[test]
    fn a_content_file_is_read_only_from_inside_the_kit() {
        let tmp = tempfile::tempdir().unwrap();
        let kit = tmp.path().join("kit");
        std::fs::create_dir_all(&kit).unwrap();
        std::fs::write(kit.join("kit.yaml"), "x").unwrap();
        std::fs::write(kit.join("context.md"), "be careful\n").unwrap();
        std::fs::write(tmp.path().join("secret"), "host secret").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), kit.join("link.md")).unwrap();
        let read = |reference: &str, path: &str| read_content_file(tmp.path(), reference, path);
        assert_eq!(read("kit", "./context.md").unwrap(), "be careful\n");
        assert_eq!(read("kit/kit.yaml", "context.md").unwrap(), "be careful\n");
        // The attacks: a way out by `..`, an absolute path, a link out of the kit.
        for (path, why) in [
            ("../secret", "inside the kit's directory"),
            ("/etc/passwd", "inside the kit's directory"),
            ("link.md", "outside the kit's directory"),
        ] {
            let err = read("kit", path).unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        }
    }
}
