//! Golden fixture corpus of kit descriptors (kit specification v3).
//!
//! `tests/fixtures/invalid/NNN-slug.yaml`: one rule per file. The file opens with a comment
//! header:
//!
//! ```text
//! # rule: <the rule and its spec section>
//! # expect: <path> :: <message fragment> [@ <line>:<column>]   (one or more)
//! # profile: authored | published | effective                  (optional)
//! ```
//!
//! The descriptor must load invalid; every `expect` line must be matched by an error with
//! exactly that path whose message contains the fragment (and that position, when given);
//! and every error must be matched by some `expect` line, so a fixture tests its rule and
//! nothing incidental.
//!
//! `tests/fixtures/valid/NNN-slug.yaml`: header `# rule:` and optional `# profile:`. The
//! descriptor must load with no errors (warnings allowed) and round-trip through its
//! published JSON form to an equal descriptor.
//!
//! All failures are collected and reported in one panic, so one run shows everything.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use capgate_spec::{Diagnostic, Loaded, Options, Profile, load};

const INVALID_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid");
const VALID_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/valid");

/// Fewest fixtures each directory must hold, so deleting fixtures fails the test.
const MIN_INVALID: usize = 90;
const MIN_VALID: usize = 25;

/// One `# expect:` line.
#[derive(Debug)]
struct Expect {
    path: String,
    fragment: String,
    pos: Option<(u32, u32)>,
    line: String,
}

impl Expect {
    fn matches(&self, d: &Diagnostic) -> bool {
        d.path.as_str() == self.path
            && d.message.contains(&self.fragment)
            && self
                .pos
                .is_none_or(|(l, c)| d.pos.line == l && d.pos.column == c)
    }
}

/// The comment header of a fixture.
#[derive(Debug, Default)]
struct Header {
    rule: Option<String>,
    expects: Vec<Expect>,
    profile: Profile,
}

/// The fixture files of a directory, sorted by name.
fn fixture_files(dir: &str) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {dir}: {e}"))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("cannot list {dir}: {e}"))?.path();
        if path.extension().is_some_and(|x| x == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `NNN-slug.yaml`: three digits, a dash, a lowercase slug.
fn well_named(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".yaml") else {
        return false;
    };
    let b = stem.as_bytes();
    b.len() > 4
        && b[..3].iter().all(u8::is_ascii_digit)
        && b[3] == b'-'
        && b[4..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Splits `<pos>` text `line:column` into numbers.
fn parse_pos(s: &str) -> Option<(u32, u32)> {
    let (l, c) = s.trim().split_once(':')?;
    Some((l.trim().parse().ok()?, c.trim().parse().ok()?))
}

/// Reads the leading comment block. Problems with the header itself are returned as text.
fn parse_header(text: &str) -> Result<Header, String> {
    let mut h = Header::default();
    for line in text.lines() {
        let Some(comment) = line.strip_prefix('#') else {
            break;
        };
        let comment = comment.trim_start();
        if let Some(rule) = comment.strip_prefix("rule:") {
            if h.rule.is_some() {
                return Err("two `# rule:` lines".to_owned());
            }
            h.rule = Some(rule.trim().to_owned());
        } else if let Some(rest) = comment.strip_prefix("expect:") {
            let Some((path, rest)) = rest.split_once("::") else {
                return Err(format!("expect line without `::`: {line}"));
            };
            let rest = rest.trim();
            let (fragment, pos) = match rest.rsplit_once(" @ ") {
                Some((frag, p)) if parse_pos(p).is_some() => (frag.trim(), parse_pos(p)),
                _ => (rest, None),
            };
            if fragment.is_empty() {
                return Err(format!("expect line with an empty fragment: {line}"));
            }
            h.expects.push(Expect {
                path: path.trim().to_owned(),
                fragment: fragment.to_owned(),
                pos,
                line: rest.to_owned(),
            });
        } else if let Some(p) = comment.strip_prefix("profile:") {
            h.profile = match p.trim() {
                "authored" => Profile::Authored,
                "published" => Profile::Published,
                "effective" => Profile::Effective,
                other => return Err(format!("unknown profile `{other}`")),
            };
        }
    }
    match &h.rule {
        Some(r) if !r.is_empty() => Ok(h),
        _ => Err("no `# rule:` line".to_owned()),
    }
}

fn opts(profile: Profile) -> Options {
    Options {
        profile,
        ..Options::default()
    }
}

fn show(d: &Diagnostic) -> String {
    format!(
        "{}:{} `{}` :: {}",
        d.pos.line,
        d.pos.column,
        d.path.as_str(),
        d.message
    )
}

fn errors_of(loaded: &Loaded) -> Vec<&Diagnostic> {
    loaded.diagnostics.errors().collect()
}

/// Judges one invalid fixture; returns the problems found (empty when it passes).
fn check_invalid(path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) => return vec![format!("cannot read: {e}")],
    };
    let header = match parse_header(&String::from_utf8_lossy(&text)) {
        Ok(h) => h,
        Err(e) => return vec![format!("bad header: {e}")],
    };
    if header.expects.is_empty() {
        problems.push("no `# expect:` line".to_owned());
    }
    let loaded = load(&text, &opts(header.profile));
    let errors = errors_of(&loaded);
    if loaded.is_valid() {
        problems.push("loaded valid, expected it invalid".to_owned());
    }
    for e in &header.expects {
        if !errors.iter().any(|d| e.matches(d)) {
            problems.push(format!(
                "expected error not reported: `{}` :: {}",
                e.path, e.line
            ));
        }
    }
    for d in &errors {
        if !header.expects.iter().any(|e| e.matches(d)) {
            problems.push(format!("unexpected error: {}", show(d)));
        }
    }
    problems
}

/// Judges one valid fixture; returns the problems found (empty when it passes).
fn check_valid(path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) => return vec![format!("cannot read: {e}")],
    };
    let header = match parse_header(&String::from_utf8_lossy(&text)) {
        Ok(h) => h,
        Err(e) => return vec![format!("bad header: {e}")],
    };
    if !header.expects.is_empty() {
        problems.push("a valid fixture states `# expect:` lines".to_owned());
    }
    let o = opts(header.profile);
    let loaded = load(&text, &o);
    for d in errors_of(&loaded) {
        problems.push(format!("error: {}", show(d)));
    }
    let Some(first) = loaded.valid() else {
        if problems.is_empty() {
            problems.push("no descriptor was read".to_owned());
        }
        return problems;
    };
    let json = match serde_json::to_vec(first) {
        Ok(j) => j,
        Err(e) => {
            problems.push(format!("descriptor does not serialize: {e}"));
            return problems;
        }
    };
    let again = load(&json, &o);
    for d in errors_of(&again) {
        problems.push(format!("round trip: error: {}", show(d)));
    }
    match again.valid() {
        Some(second) if second == first => {}
        Some(second) => problems.push(format!(
            "round trip: descriptor differs\n      first:  {first:?}\n      second: {second:?}\n      json: {}",
            String::from_utf8_lossy(&json)
        )),
        None => problems.push(format!(
            "round trip: published form does not load valid: {}",
            String::from_utf8_lossy(&json)
        )),
    }
    problems
}

fn run(dir: &str, min: usize, check: fn(&Path) -> Vec<String>, report: &mut String) -> usize {
    let files = match fixture_files(dir) {
        Ok(files) => files,
        Err(e) => {
            let _ = writeln!(report, "{e}");
            return 0;
        }
    };
    if files.len() < min {
        let _ = writeln!(
            report,
            "{dir}: {} fixtures, expected at least {min}",
            files.len()
        );
    }
    let mut numbers: Vec<String> = Vec::new();
    for path in &files {
        let name = file_name(path);
        let mut problems = check(path);
        if !well_named(&name) {
            problems.insert(0, "file name is not `NNN-slug.yaml`".to_owned());
        } else if numbers.iter().any(|n| n == &name[..3]) {
            problems.insert(0, format!("number {} is used twice", &name[..3]));
        } else {
            numbers.push(name[..3].to_owned());
        }
        if !problems.is_empty() {
            let _ = writeln!(report, "{name}:");
            for p in problems {
                let _ = writeln!(report, "    {p}");
            }
        }
    }
    files.len()
}

#[test]
fn fixtures() {
    let mut report = String::new();
    let invalid = run(INVALID_DIR, MIN_INVALID, check_invalid, &mut report);
    let valid = run(VALID_DIR, MIN_VALID, check_valid, &mut report);
    assert!(
        report.is_empty(),
        "fixture failures ({invalid} invalid, {valid} valid fixtures):\n{report}"
    );
}
