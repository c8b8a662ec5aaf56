//! Showing untrusted text (kit values, hosts and paths a workload sent) on a terminal.
//!
//! A kit string can hold any character YAML can escape: `"\e[1A\e[2K"` moves the cursor up
//! and erases the line above, so a line printed after a widening in an approval prompt
//! could wipe that widening off the screen; `\r` and `\n` can overwrite or fake a line;
//! bidirectional overrides can reorder what is shown. [`printable`] spells every such
//! character out, so what the user reads is what the text holds.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` would act on a terminal, or change how the text around it reads, instead of
/// showing itself: C0 controls (newline and tab included), DEL, C1 controls, and Unicode's
/// invisible, filler and bidirectional formatting characters (with them, two names that
/// differ look the same: `api.github.com` and `api.github.com\u{ad}`).
pub(crate) fn acts(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'..='\u{1160}'
                | '\u{17B4}'..='\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
                | '\u{E0100}'..='\u{E01EF}'
        )
}

/// `s` with every character that `acts` written as `\u{…}` (and a backslash that would
/// start such a spelling doubled), borrowed unchanged when there is none.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| acts(c) || c == '\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if acts(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else if c == '\\' && chars.peek() == Some(&'u') {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// JSON text (as serde_json writes it) with every character that `acts` and that serde
/// leaves as it is (DEL, C1 controls, invisible and bidirectional characters) written as a
/// `\uXXXX` escape: the same JSON value, safe to print on a terminal. JSON's own structure
/// is ASCII, and serde already escapes the C0 controls inside strings.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    let escaped = |c: char| acts(c) && u32::from(c) >= 0x7F;
    if !json.chars().any(escaped) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if escaped(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JSON keeps its value and loses what would act on a terminal.
    #[test]
    fn json_is_escaped_beyond_what_serde_escapes() {
        let value = "a\u{9b}2J\u{202e}b\u{7f}\u{e0041}\n";
        let json = format!("{{\n  \"k\": {}\n}}", serde_json_like(value));
        let safe = json_safe(&json);
        assert!(!safe.chars().any(|c| acts(c) && c != '\n'), "{safe}");
        assert!(
            safe.contains("\\u009b") && safe.contains("\\u202e") && safe.contains("\\udb40\\udc41")
        );
        assert_eq!(json_safe("{\"plain\": 1}"), "{\"plain\": 1}");
    }

    /// A JSON string literal as serde_json writes one (C0 escaped, the rest as it is).
    fn serde_json_like(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '\n' => out.push_str("\\n"),
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// Characters that show nothing, so that two names that differ look the same.
    #[test]
    fn invisible_fillers_and_tags_are_spelled_out() {
        for (shown, c) in [
            ("ad", '\u{ad}'),
            ("3164", '\u{3164}'),
            ("180e", '\u{180e}'),
            ("fe0f", '\u{fe0f}'),
            ("e0041", '\u{e0041}'),
            ("34f", '\u{34f}'),
        ] {
            let text = format!("api.github.com{c}");
            assert_eq!(printable(&text), format!("api.github.com\\u{{{shown}}}"));
        }
        // The twin: letters of other scripts are shown as they are.
        assert_eq!(printable("api.gіthub.com"), "api.gіthub.com");
    }

    #[test]
    fn terminal_controls_are_spelled_out() {
        assert_eq!(
            printable("/x\r\u{1b}[2K\u{1b}[1A  + storage: /home"),
            "/x\\u{d}\\u{1b}[2K\\u{1b}[1A  + storage: /home"
        );
        assert_eq!(
            printable("a\nb\tc\u{7f}\u{9b}"),
            "a\\u{a}b\\u{9}c\\u{7f}\\u{9b}"
        );
        // Bidirectional overrides and invisible characters.
        assert_eq!(
            printable("evil\u{202e}moc.elpmaxe\u{200b}"),
            "evil\\u{202e}moc.elpmaxe\\u{200b}"
        );
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in [
            "api.github.com",
            "/home/agent/.cache",
            "GET api.example.com/**",
            "héllo wörld",
            "C:\\dir",
        ] {
            assert!(
                matches!(printable(s), Cow::Borrowed(_)) || s.contains('\\'),
                "{s}"
            );
            assert_eq!(printable(s), s);
        }
        // A backslash-u already in the text cannot pass for a spelled-out character.
        assert_eq!(printable("\\u{1b}"), "\\\\u{1b}");
    }
}
