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

/// Whether every agent-context@1 ask of the composition is optional.
pub fn all_optional(plan: &Plan) -> bool {
    plan.composed
        .entries
        .iter()
        .filter(|e| matches!(e.capability, Some(Capability::AgentContext(_))))
        .all(|e| e.optional)
}

/// The profiles and bodies of `plan`; `base` is where kit references are relative to.
pub fn materialize(plan: &Plan, base: &Path) -> Result<Materialize, String> {
    let asks: Vec<_> = plan
        .composed
        .entries
        .iter()
        .filter_map(|e| match &e.capability {
            Some(Capability::AgentContext(c)) => Some(c),
            _ => None,
        })
        .collect();
    if asks.is_empty() {
        return Ok(Materialize::default());
    }
    let optional = all_optional(plan);
    let mut dirs: Vec<String> = Vec::new();
    let mut profiles: Vec<String> = Vec::new();
    for c in &asks {
        let filename = c
            .filename
            .as_deref()
            .filter(|f| !f.is_empty())
            .unwrap_or(DEFAULT_FILENAME);
        let dir = c
            .directory
            .as_deref()
            .unwrap_or(capgate_sandbox::AGENT_HOME);
        if format!("{dir}{filename}").chars().any(char::is_control) {
            return Err(format!(
                "agent-context@1 profile `{}`: a control character in its directory or filename",
                capgate_spec::text::printable(&format!("{dir}/{filename}"))
            ));
        }
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
            (None, Some(path)) => read_content_file(&base.join(&source.reference), path)?,
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

/// A kit's `contentFile`, `kit` being the kit's directory or its own descriptor: a regular
/// file beneath the kit's own directory (its build
/// context), at most 256 KiB, as UTF-8. The kit must be a directory (a loose descriptor
/// file's folder holds whatever else lies beside it), no component may be hidden (`.ssh`),
/// and the file is opened once, beneath the kit's directory without following any link.
fn read_content_file(kit: &Path, path: &str) -> Result<String, String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use std::io::Read as _;
    // The kit as the user can find it (a reference is often `.`): `components` drops the
    // `.` parts.
    let location: std::path::PathBuf = kit.components().collect();
    let shown = || {
        format!(
            "agent-context@1 `contentFile: {path}` of kit `{}`",
            location.display()
        )
    };
    // A kit directory, or its own descriptor (`kit.yaml`, `<directory-name>.yaml`) in it.
    let own_descriptor = |file: &Path| {
        let dir_name = file.parent().and_then(Path::file_name);
        file.file_name() == Some(std::ffi::OsStr::new("kit.yaml"))
            || (file.file_stem().is_some() && file.file_stem() == dir_name)
    };
    let kit_dir = if location.is_file() && own_descriptor(&location) {
        location.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        location.clone()
    };
    if !kit_dir.is_dir() {
        return Err(format!(
            "{}: a contentFile needs the kit to be a directory (its build context), not a loose descriptor file",
            shown()
        ));
    }
    let rel = Path::new(path);
    let hidden = rel.components().any(|c| match c {
        Component::Normal(name) => name.as_encoded_bytes().first() == Some(&b'.'),
        Component::CurDir => false,
        _ => true,
    });
    if hidden || rel.is_absolute() || path.is_empty() {
        return Err(format!(
            "{}: must be a path inside the kit's directory, with no `..` and no hidden component",
            shown()
        ));
    }
    let dir = rustix::fs::open(
        &kit_dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", shown()))?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => format!(
            "{}: leads outside the kit's directory (through a link)",
            shown()
        ),
        e => format!("{}: {e}", shown()),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("{}: {e}", shown()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(format!("{}: not a regular file", shown()));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_BODY + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", shown()))?;
    if bytes.len() as u64 > MAX_BODY {
        return Err(format!("{}: larger than {MAX_BODY} bytes", shown()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", shown()))
}

/// What `capgate lint` says of a `contentFile` of the kit at `kit` (a directory or its
/// descriptor): why the run could not read it, if it could not.
pub fn content_file_problem(kit: &Path, path: &str) -> Option<String> {
    read_content_file(kit, path).err()
}

/// A kit's name for the index: its directory's name (a reference such as `.` or `../x` is
/// relative to `base`), or the reference as written.
fn kit_name(base: &Path, reference: &str) -> String {
    let location = base.join(reference);
    let location = std::fs::canonicalize(&location).unwrap_or(location);
    // A loose descriptor is named by its stem, a kit directory (or its `kit.yaml`) by the
    // directory.
    let named = match location.file_stem() {
        Some(stem) if location.is_file() && stem != "kit" => PathBuf::from(stem),
        _ if location.is_file() => location.parent().map(Path::to_path_buf).unwrap_or_default(),
        _ => location,
    };
    named
        .file_name()
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
/// stdin; with `$2` = `section`, only capgate's section of the file is replaced (`$3` and
/// `$4` its exact first and last lines; a line that is only almost a marker, or a section
/// left open, is kept as the file's own text), else the whole file. A file or folder on
/// the way that is a symbolic link (one a repository ships, say), or a path that is not a
/// regular file (a FIFO would block), is refused; the new text is built in a file
/// `mktemp` makes, given the old file's mode, and renamed over it (a full disk leaves the
/// old file whole; `rename` does not follow a link).
pub const SCRIPT: &str = r#"set -e
dir=$(dirname "$1")
p="$1"
while [ "$p" != / ] && [ "$p" != . ]; do
  if [ -L "$p" ]; then
    echo "capgate: \`$p\` is a symbolic link: \`$1\` is not written" >&2
    exit 3
  fi
  p=$(dirname "$p")
done
mkdir -p "$dir"
if [ -e "$1" ] && [ ! -f "$1" ]; then
  echo "capgate: \`$1\` is not a regular file: not written" >&2
  exit 3
fi
tmp=$(mktemp "$dir/.capgate-XXXXXX")
trap 'rm -f "$tmp"' EXIT
if [ -f "$1" ]; then chmod "$(stat -c %a "$1")" "$tmp"; else chmod 644 "$tmp"; fi
if [ "$2" = section ] && [ -f "$1" ]; then
  awk -v b="$3" -v e="$4" '
    { line = $0; sub(/\r$/, "", line) }
    !open && line == b { open = 1; held = $0 ORS; next }
    open { held = held $0 ORS; if (line == e) { open = 0; held = "" }; next }
    { print }
    END { if (open) printf "%s", held }
  ' "$1" > "$tmp"
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
        std::fs::create_dir_all(kit.join(".ssh")).unwrap();
        std::fs::write(kit.join("kit.yaml"), "x").unwrap();
        std::fs::write(kit.join("context.md"), "be careful\n").unwrap();
        std::fs::write(kit.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
        std::fs::write(tmp.path().join("secret"), "host secret").unwrap();
        std::fs::write(tmp.path().join("loose.yaml"), "x").unwrap();
        std::fs::write(kit.join("big.md"), vec![b'x'; MAX_BODY as usize + 1]).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), kit.join("link.md")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            kit.join("fifo.md"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let read =
            |reference: &str, path: &str| read_content_file(&tmp.path().join(reference), path);
        assert_eq!(read("kit", "./context.md").unwrap(), "be careful\n");
        assert_eq!(read("kit/kit.yaml", "context.md").unwrap(), "be careful\n");
        // A missing file names the kit where the user can find it (a `.` reference too).
        let err = read("kit/.", "gone.md").unwrap_err();
        let kit_shown = format!("of kit `{}`: ", kit.display());
        assert!(
            err.contains(&kit_shown) && err.contains("No such file"),
            "{err}"
        );
        assert_eq!(content_file_problem(&kit, "gone.md"), Some(err));
        assert_eq!(content_file_problem(&kit, "context.md"), None);
        // The attacks: a way out by `..`, an absolute path, a link out of the kit, a hidden
        // file, a loose descriptor's folder (the secret beside it), a FIFO, a huge file.
        for (reference, path, why) in [
            ("kit", "../secret", "no `..` and no hidden component"),
            ("kit", "/etc/passwd", "no `..` and no hidden component"),
            ("kit", "link.md", "leads outside the kit's directory"),
            ("kit", ".ssh/id_ed25519", "no hidden component"),
            ("loose.yaml", "secret", "needs the kit to be a directory"),
            ("kit", "fifo.md", "not a regular file"),
            ("kit", "big.md", "larger than"),
        ] {
            let err = read(reference, path).unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        }
    }

    /// Runs [`SCRIPT`] on the host (it is POSIX sh and awk) on `file` with `stdin`.
    fn write(file: &Path, how: &str, stdin: &str) -> std::process::Output {
        use std::io::Write as _;
        let mut child = std::process::Command::new("sh")
            .args(["-c", SCRIPT, "test"])
            .arg(file)
            .args([how, BEGIN, END])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A script that refuses exits without reading: its stdin may be closed already.
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        child.wait_with_output().unwrap()
    }

    /// The section is replaced, never the profile's own text: not a line that only looks
    /// like a marker, nor a section left open, nor CRLF lines; a missing final newline is
    /// supplied; the file keeps its mode; a link on the way, or a FIFO, is refused.
    #[test]
    fn only_capgates_section_of_a_profile_is_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("AGENTS.md");
        let section = |n: u8| format!("{BEGIN}\nrun {n}\n{END}\n");
        std::fs::write(&file, "# Mine\r\n<!-- capgate:begin but mine\r\nno newline").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .unwrap();
        assert!(write(&file, "section", &section(1)).status.success());
        assert!(write(&file, "section", &section(2)).status.success());
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            text,
            format!(
                "# Mine\r\n<!-- capgate:begin but mine\r\nno newline\n{}",
                section(2)
            )
        );

        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&file).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o640);
        // A section written with CRLF is still capgate's; one left open is the file's.
        std::fs::write(&file, format!("a\r\n{BEGIN}\r\nold\r\n{END}\r\nb\r\n")).unwrap();
        assert!(write(&file, "section", &section(3)).status.success());
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("a\r\nb\r\n{}", section(3))
        );
        std::fs::write(&file, format!("a\n{BEGIN}\nkept\n")).unwrap();
        assert!(write(&file, "section", &section(4)).status.success());
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("a\n{BEGIN}\nkept\n{}", section(4))
        );
        // The attack: a profile (or a folder on its way) that is a link, as a repository
        // could ship one to a git hook.
        let hook = tmp.path().join("pre-commit");
        std::fs::write(&hook, "#!/bin/sh\n").unwrap();
        let linked = tmp.path().join("CLAUDE.md");
        std::os::unix::fs::symlink(&hook, &linked).unwrap();
        assert_eq!(
            write(&linked, "section", &section(5)).status.code(),
            Some(3)
        );
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("via")).unwrap();
        let through = tmp.path().join("via/.capgate-context/01-k.md");
        assert_eq!(write(&through, "whole", "body").status.code(), Some(3));
        assert_eq!(std::fs::read_to_string(&hook).unwrap(), "#!/bin/sh\n");
        // A FIFO (it would block the write) is refused.
        let fifo = tmp.path().join("FIFO.md");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(write(&fifo, "section", &section(6)).status.code(), Some(3));
        assert!(!tmp.path().join("real/.capgate-context").exists());
        // Nothing is left behind but the files written.
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".capgate-"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }
}
