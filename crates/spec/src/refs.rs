//! `${{ kit.args.NAME }}` and `${{ kit.env.NAME }}` references (spec §1.8, §1.9).
//!
//! Scanned by hand: the grammar is tiny and a scanner cannot fail to build.

/// Which namespace a reference reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    Arg,
    Env,
}

/// One reference found in a string: its byte range and the name it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference<'s> {
    pub kind: RefKind,
    pub name: &'s str,
    pub start: usize,
    pub end: usize,
}

/// `[A-Za-z_][A-Za-z0-9_]*`: the grammar of arg names, env names and exported variables.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Every well-formed reference in `s`, in order.
pub fn find(s: &str) -> Vec<Reference<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(rel) = s[from..].find("${{") {
        let start = from + rel;
        match parse_at(s, start) {
            Some(r) => {
                from = r.end;
                out.push(r);
            }
            None => from = start + 3,
        }
    }
    out
}

/// `s` without its leading whitespace as the spec's pattern reads it (RE2's `\s`: space,
/// tab, line feed, form feed, carriage return; not Unicode spaces nor vertical tab).
fn trim_space(s: &str) -> &str {
    s.trim_start_matches([' ', '\t', '\n', '\x0c', '\r'])
}

/// Parses `${{ kit.(args|env).NAME }}` starting at byte `start` (which holds `${{`).
fn parse_at(s: &str, start: usize) -> Option<Reference<'_>> {
    let rest = s.get(start + 3..)?;
    let inner_start = start + 3 + (rest.len() - trim_space(rest).len());
    let rest = &s[inner_start..];
    let (kind, after) = if let Some(r) = rest.strip_prefix("kit.args.") {
        (RefKind::Arg, r)
    } else if let Some(r) = rest.strip_prefix("kit.env.") {
        (RefKind::Env, r)
    } else {
        return None;
    };
    let name_len = after
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_alphanumeric() || c == '_') || (i == 0 && c.is_ascii_digit()))
        .map_or(after.len(), |(i, _)| i);
    let name = &after[..name_len];
    if !is_identifier(name) {
        return None;
    }
    let tail = &after[name_len..];
    let trimmed = trim_space(tail);
    let close = trimmed.strip_prefix("}}")?;
    let end = s.len() - close.len();
    Some(Reference {
        kind,
        name,
        start,
        end,
    })
}

pub fn has_arg_ref(s: &str) -> bool {
    find(s).iter().any(|r| r.kind == RefKind::Arg)
}

pub fn has_env_ref(s: &str) -> bool {
    find(s).iter().any(|r| r.kind == RefKind::Env)
}

pub fn has_any_ref(s: &str) -> bool {
    !find(s).is_empty()
}

/// The name when `s` is exactly one arg reference and nothing else (no padding).
pub fn whole_arg_ref(s: &str) -> Option<&str> {
    match find(s).as_slice() {
        [r] if r.kind == RefKind::Arg && r.start == 0 && r.end == s.len() => Some(r.name),
        _ => None,
    }
}

/// Whether `s` holds something that opens like an env reference but is malformed
/// (`${{ kit.env` with no valid name or closing braces).
pub fn has_malformed_env_opener(s: &str) -> bool {
    let mut from = 0;
    while let Some(rel) = s[from..].find("${{") {
        let start = from + rel;
        let inner = s[start + 3..].trim_start();
        if inner.starts_with("kit.env") && parse_at(s, start).is_none_or(|r| r.kind != RefKind::Env)
        {
            return true;
        }
        from = start + 3;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_references_with_optional_spaces() {
        let s = "a ${{kit.args.x}} b ${{  kit.env.HOME  }} ${{ kit.args.1bad }} ${{ kit.other.y }}";
        let found: Vec<_> = find(s).iter().map(|r| (r.kind, r.name)).collect();
        assert_eq!(found, vec![(RefKind::Arg, "x"), (RefKind::Env, "HOME")]);
    }

    /// The padding inside `${{ }}` is the spec pattern's `\s` (RE2: ASCII space, tab, LF,
    /// FF, CR): Unicode spaces and vertical tab make no reference, so the text stays as
    /// written (an arg cannot slip into it).
    #[test]
    fn padding_is_ascii_whitespace_only() {
        let found = |s: &str| {
            find(s)
                .iter()
                .map(|r| r.name.to_owned())
                .collect::<Vec<String>>()
        };
        assert_eq!(found("${{\t kit.args.host\r\n }}"), ["host"]);
        assert!(found("${{\u{3000}kit.args.host }}").is_empty());
        assert!(found("${{ kit.args.host\u{a0}}}").is_empty());
        assert!(found("${{\x0bkit.args.host }}").is_empty());
    }

    #[test]
    fn whole_reference_means_no_padding() {
        assert_eq!(whole_arg_ref("${{ kit.args.port }}"), Some("port"));
        assert_eq!(whole_arg_ref(" ${{ kit.args.port }}"), None);
        assert_eq!(whole_arg_ref("v${{ kit.args.port }}"), None);
        assert_eq!(whole_arg_ref("${{ kit.env.port }}"), None);
    }

    #[test]
    fn shell_syntax_is_literal() {
        assert!(find("$VAR ${VAR} ~ ${{ }}").is_empty());
    }

    #[test]
    fn malformed_env_openers_are_seen() {
        assert!(has_malformed_env_opener("${{ kit.env }}"));
        assert!(has_malformed_env_opener("${{ kit.env.X"));
        assert!(!has_malformed_env_opener("${{ kit.env.X }}"));
    }
}
