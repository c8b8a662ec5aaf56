//! Canonical JSON, byte-compatible with Go's `encoding/json` on a `map[string]any`.
//!
//! The reference implementation digests "other" capability configs and compares requests
//! through this form (spec §5.2), so locks written by either implementation agree: keys
//! sorted, no whitespace, `<` `>` `&` U+2028 U+2029 escaped, numbers as float64 in Go's
//! shortest form.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::node::{Node, Value};

/// The canonical JSON text of a value, or `None` when it cannot be encoded (NaN, ±Inf).
pub fn to_string(node: &Node) -> Option<String> {
    let mut out = String::new();
    write_node(node, &mut out).then_some(out)
}

/// `hex(sha256(canonical JSON))[..12]`: the short digest used in surface `services` entries.
pub fn short_digest(node: &Node) -> Option<String> {
    let text = to_string(node)?;
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(12);
    for b in &digest[..6] {
        let _ = write!(hex, "{b:02x}");
    }
    Some(hex)
}

fn write_node(node: &Node, out: &mut String) -> bool {
    // Iterative over an explicit stack would be possible; depth is bounded by the reader.
    match &node.value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let f = *i as f64;
            return write_float(f, out);
        }
        Value::Float(f) => return write_float(*f, out),
        Value::Str(s) => write_string(s, out),
        Value::Seq(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !write_node(item, out) {
                    return false;
                }
            }
            out.push(']');
        }
        Value::Map(entries) => {
            let mut sorted: Vec<_> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.text.cmp(&b.0.text));
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(&k.text, out);
                out.push(':');
                if !write_node(v, out) {
                    return false;
                }
            }
            out.push('}');
        }
    }
    true
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go's `strconv.AppendFloat(f, 'f' or 'e', -1, 64)` as `encoding/json` chooses it.
fn write_float(f: f64, out: &mut String) -> bool {
    if !f.is_finite() {
        return false;
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Exponent form: Rust's `{:e}` gives the shortest digits as `d.ddde-7`; Go writes
        // `e-07` then trims to at least two exponent digits… and then json trims `e-07` to `e-7`.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits}");
    } else {
        let _ = write!(out, "{f}");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(j: serde_json::Value) -> String {
        to_string(&Node::from_json(&j)).unwrap_or_default()
    }

    #[test]
    fn matches_go_encoding_json() {
        assert_eq!(
            canon(serde_json::json!({"path": "/data", "a": [1, 2.5, true, null]})),
            r#"{"a":[1,2.5,true,null],"path":"/data"}"#
        );
        assert_eq!(
            canon(serde_json::json!("<a&b>")),
            r#""\u003ca\u0026b\u003e""#
        );
        assert_eq!(canon(serde_json::json!(1e21)), "1e+21");
        assert_eq!(canon(serde_json::json!(1e-7)), "1e-7");
        assert_eq!(canon(serde_json::json!(123456789.0)), "123456789");
        assert_eq!(canon(serde_json::json!(0.000001)), "0.000001");
    }

    #[test]
    fn digest_is_twelve_hex() {
        let d = short_digest(&Node::from_json(&serde_json::json!({"path": "/data"})));
        assert_eq!(d.as_deref().map(str::len), Some(12));
        assert_ne!(
            d,
            short_digest(&Node::from_json(&serde_json::json!({"path": "/other"})))
        );
    }
}
