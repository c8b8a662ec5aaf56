//! git-identity@1: the git name and email the workload commits as (kitspec §2.18).
//!
//! capgate selects the pair, never the kit and never anything inside the sandbox: the
//! `--git-identity` flag, else the pair an earlier run pinned for a named sandbox, else the
//! host's global git config (`user.name`, `user.email`). Only those two values cross;
//! nothing else of the host's git config does (no helpers, includes, aliases, hooks or
//! signing). Inside, they become the agent's global `user.name` and `user.email` before any
//! hook or the workload runs, so a repository's own config still wins.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};
use capgate_resolve::plan::Plan;
use capgate_spec::caps::KnownType;

/// Longest name or email accepted, in bytes.
const MAX_LEN: usize = 256;

/// A git name and email.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitIdentity {
    pub name: String,
    pub email: String,
}

impl fmt::Display for GitIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} <{}>", self.name, self.email)
    }
}

impl GitIdentity {
    /// Checks a pair: both non-empty, at most 256 bytes, no control characters and no `<`
    /// or `>` (which would change what a commit's author line says); no space in the email.
    pub fn new(name: &str, email: &str) -> Result<Self, String> {
        let (name, email) = (name.trim(), email.trim());
        for (what, value) in [("name", name), ("email", email)] {
            if value.is_empty() {
                return Err(format!("the git {what} is empty"));
            }
            if value.len() > MAX_LEN {
                return Err(format!("the git {what} is longer than {MAX_LEN} bytes"));
            }
            if value
                .chars()
                .any(|c| c.is_control() || c == '<' || c == '>')
            {
                return Err(format!(
                    "the git {what} `{}` holds a control character, `<` or `>`",
                    value.escape_default()
                ));
            }
        }
        if email.chars().any(char::is_whitespace) {
            return Err(format!("the git email `{email}` holds a space"));
        }
        Ok(Self {
            name: name.to_owned(),
            email: email.to_owned(),
        })
    }

    /// `Name <email>`, as `--git-identity` takes it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let parsed = s.strip_suffix('>').and_then(|rest| rest.rsplit_once('<'));
        match parsed {
            Some((name, email)) => Self::new(name, email),
            None => Err(format!("`{s}` is not of the form `Name <email>`")),
        }
    }
}

/// Whether the composition asks for a git identity: `Some(optional)`.
pub fn wanted(plan: &Plan) -> Option<bool> {
    plan.composed
        .entries
        .iter()
        .find(|e| e.known == Some(KnownType::GitIdentity))
        .map(|e| e.optional)
}

/// The pair for this run: `flag`, else the one pinned at `pin`, else the host's global git
/// config. The reason when there is none.
pub fn select(flag: Option<&GitIdentity>, pin: &Path) -> Result<GitIdentity, String> {
    if let Some(id) = flag {
        return Ok(id.clone());
    }
    if let Ok(pinned) = std::fs::read_to_string(pin) {
        return GitIdentity::parse(&pinned)
            .map_err(|e| format!("the pair pinned in `{}` is unusable: {e}", pin.display()));
    }
    from_host()
}

/// Pins the pair for later runs of the sandbox (a named sandbox keeps its directory).
pub fn pin(path: &Path, id: &GitIdentity) -> Result<()> {
    crate::state::write_atomically(path, format!("{id}\n").as_bytes(), 0o600)
        .with_context(|| format!("cannot pin the git identity in `{}`", path.display()))
}

/// `user.name` and `user.email` of the host user's global git config.
fn from_host() -> Result<GitIdentity, String> {
    let get = |key: &str| -> Result<String, String> {
        // From `/`: the global config only, never a repository's around the current
        // directory (a broken one would fail the read; includeIf would depend on it).
        let out = Command::new("git")
            .args(["config", "--global", "--get", key])
            .current_dir("/")
            .env("GIT_CEILING_DIRECTORIES", "/")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("git could not be run on the host ({e})"))?;
        let value = String::from_utf8(out.stdout)
            .map_err(|_| format!("the host's git `{key}` is not UTF-8"))?;
        // git prints the value and a newline; anything else in it is the value's own.
        let value = value.strip_suffix('\n').unwrap_or(&value);
        if !out.status.success() || value.is_empty() {
            return Err(format!("the host's global git config has no `{key}`"));
        }
        Ok(value.to_owned())
    };
    let name = get("user.name")?;
    let email = get("user.email")?;
    GitIdentity::new(&name, &email).map_err(|e| format!("in the host's global git config, {e}"))
}

/// The script that makes the pair the agent's global `user.name` and `user.email` inside:
/// with git when the sandbox has it (replacing those two keys only), else a `[user]`
/// section appended to `~/.gitconfig` (the last value wins). `$1`/`$2` are the values,
/// `$3`/`$4` the same quoted for a config file.
pub const SCRIPT: &str = r#"set -e
cd /
if command -v git >/dev/null 2>&1; then
  git config --file "$HOME/.gitconfig" --replace-all user.name "$1"
  git config --file "$HOME/.gitconfig" --replace-all user.email "$2"
else
  printf '[user]\n\tname = %s\n\temail = %s\n' "$3" "$4" >> "$HOME/.gitconfig"
fi"#;

/// A value quoted for a git config file (no control characters are ever in it).
pub fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_pair_is_parsed_and_checked() {
        let id = GitIdentity::parse("Ada Lovelace <ada@example.com>").unwrap();
        assert_eq!(id.name, "Ada Lovelace");
        assert_eq!(id.email, "ada@example.com");
        assert_eq!(id.to_string(), "Ada Lovelace <ada@example.com>");
        // What would rewrite a config file or a commit's author line is refused.
        for bad in [
            "Ada\n[core]\n\thooksPath = /tmp <ada@example.com>",
            "Ada <ada@exa\nmple.com>",
            "Ada <a>b@example.com>",
            " <ada@example.com>",
            "Ada <>",
            "Ada <ada @example.com>",
            "Ada ada@example.com",
            "Ada\u{7f} <ada@example.com>",
        ] {
            assert!(GitIdentity::parse(bad).is_err(), "{bad:?}");
        }
        assert!(GitIdentity::new(&"x".repeat(257), "a@b").is_err());
        assert!(GitIdentity::new(&"x".repeat(256), "a@b").is_ok());
    }

    #[test]
    fn config_quoting_escapes_backslashes_and_quotes() {
        assert_eq!(quoted(r#"A "B" \C"#), r#""A \"B\" \\C""#);
    }

    #[test]
    fn a_pinned_pair_wins_over_the_host_and_the_flag_over_both() {
        let dir = tempfile::tempdir().unwrap();
        let pin_file = dir.path().join("git-identity");
        let pinned = GitIdentity::parse("Pinned <p@example.com>").unwrap();
        pin(&pin_file, &pinned).unwrap();
        assert_eq!(select(None, &pin_file).unwrap(), pinned);
        let flag = GitIdentity::parse("Flag <f@example.com>").unwrap();
        assert_eq!(select(Some(&flag), &pin_file).unwrap(), flag);
        std::fs::write(&pin_file, "broken\n").unwrap();
        assert!(select(None, &pin_file).unwrap_err().contains("unusable"));
    }
}
