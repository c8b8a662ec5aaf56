//! Reading untrusted YAML (and JSON) text into a positioned [`Node`] tree.
//!
//! The text is hostile until proven otherwise, so reading is bounded: a size limit on the
//! input, a depth limit, and a limit on the number of values after alias expansion (so a
//! "billion laughs" document is refused instead of eating memory). Duplicate keys, custom
//! tags, several documents and non-UTF-8 bytes are errors. The tree is built without
//! recursion, and no input makes this module panic.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use crate::diag::Diagnostics;
use crate::node::{Key, Node, Path, Pos, Value};

/// Bounds on what one document may cost to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest input accepted, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of lists and mappings.
    pub max_depth: usize,
    /// Most values (scalars, lists, mappings) in the document after alias expansion, a
    /// scalar counting one more value per 64 bytes of its text.
    pub max_nodes: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_bytes: 1024 * 1024,
        max_depth: 64,
        max_nodes: 200_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Reads one YAML document. On failure the diagnostics say why and where; no partial tree
/// is returned.
pub fn parse(bytes: &[u8], limits: &Limits, diags: &mut Diagnostics) -> Option<Node> {
    let root = Path::root();
    if bytes.len() > limits.max_bytes {
        diags.error(
            &root,
            Pos::UNKNOWN,
            format!(
                "descriptor is {} bytes, over the {} byte limit",
                bytes.len(),
                limits.max_bytes
            ),
        );
        return None;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let pos = pos_of_byte(bytes, e.valid_up_to());
            diags.error(&root, pos, "descriptor is not valid UTF-8 text");
            return None;
        }
    };
    // A byte order mark is allowed at the very start of a YAML stream.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some((at, c)) = hidden_control(text) {
        let offset = bytes.len() - text.len() + at;
        let message = if reorders(c) {
            format!(
                "descriptor holds the bidirectional formatting character U+{:04X}: it changes the order in which an editor or a review shows the text around it, so what is read can differ from what is granted (if it is meant, write it as an escape in a double-quoted string)",
                u32::from(c)
            )
        } else {
            format!(
                "descriptor holds the control character U+{:04X}: a kit is text, and a control character (or a carriage return not ending a line) can make a terminal or editor show something other than what is granted",
                u32::from(c)
            )
        };
        diags.error(&root, pos_of_byte(bytes, offset), message);
        return None;
    }
    match Builder::new(limits).run(text) {
        Ok(node) => Some(node),
        Err((pos, message)) => {
            diags.error(&root, pos, message);
            None
        }
    }
}

/// The first control character of `text` other than a tab, a line feed and a carriage
/// return that ends a line (CRLF), or bidirectional formatting character: byte offset and
/// character. ESC, backspace, a lone CR (which YAML reads as a line break, a terminal as a
/// return to the line's start) and the C1 controls let a kit hide a grant from whoever
/// reads it; a bidirectional override or isolate, even in a comment, reorders what an
/// editor shows after it ("Trojan Source", CVE-2021-42574).
fn hidden_control(text: &str) -> Option<(usize, char)> {
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let allowed = match c {
            '\t' | '\n' => true,
            '\r' => chars.peek().is_some_and(|&(_, next)| next == '\n'),
            _ => !c.is_control() && !reorders(c),
        };
        if !allowed {
            return Some((at, c));
        }
    }
    None
}

/// Whether `c` is a bidirectional formatting character: the marks (ALM, LRM, RLM), the
/// embeddings and overrides (U+202A–U+202E) and the isolates (U+2066–U+2069).
fn reorders(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// Line and column (1-based, in characters) of a byte offset, counting only the valid
/// UTF-8 text before it.
fn pos_of_byte(bytes: &[u8], offset: usize) -> Pos {
    let before = String::from_utf8_lossy(&bytes[..offset.min(bytes.len())]);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Pos {
        line: u32::try_from(line).unwrap_or(u32::MAX),
        column: u32::try_from(column).unwrap_or(u32::MAX),
    }
}

fn pos_of(span: &Span) -> Pos {
    Pos {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        column: u32::try_from(span.start.col() + 1).unwrap_or(u32::MAX),
    }
}

type Failure = (Pos, String);

/// An anchored value kept for alias expansion, with what it costs to copy.
struct Anchored {
    node: Node,
    size: usize,
    depth: usize,
}

enum Frame {
    Seq {
        items: Vec<Node>,
        pos: Pos,
        anchor: usize,
        first_node: usize,
    },
    Map {
        entries: Vec<(Key, Node)>,
        seen: HashMap<String, Pos>,
        pending_key: Option<Key>,
        pos: Pos,
        anchor: usize,
        first_node: usize,
    },
}

struct Builder<'l> {
    limits: &'l Limits,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchored>,
    nodes: usize,
    root: Option<Node>,
    documents: usize,
}

impl<'l> Builder<'l> {
    fn new(limits: &'l Limits) -> Self {
        Builder {
            limits,
            stack: Vec::new(),
            anchors: HashMap::new(),
            nodes: 0,
            root: None,
            documents: 0,
        }
    }

    fn run(mut self, text: &str) -> Result<Node, Failure> {
        let mut parser = Parser::new_from_str(text);
        let mut last = Pos { line: 1, column: 1 };
        while let Some(event) = parser.next_event() {
            let (event, span) = event.map_err(|e| {
                let pos = Pos {
                    line: u32::try_from(e.marker().line()).unwrap_or(u32::MAX),
                    column: u32::try_from(e.marker().col() + 1).unwrap_or(u32::MAX),
                };
                (pos, format!("YAML syntax: {}", e.info()))
            })?;
            let pos = pos_of(&span);
            last = pos;
            match event {
                Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
                Event::DocumentStart(_) => {
                    self.documents += 1;
                    if self.documents > 1 {
                        return Err((
                            pos,
                            "a descriptor is one YAML document, and this file has more".into(),
                        ));
                    }
                }
                Event::Scalar(text, style, anchor, tag) => {
                    let value = resolve_scalar(&text, style, tag.as_deref(), pos)?;
                    // Long text weighs as much as the short values it could have been, so
                    // that aliases of it cannot expand a small file into gigabytes.
                    let weight = 1 + text.len() / TEXT_PER_VALUE;
                    self.count(weight, pos)?;
                    self.complete(Node::new(value, pos), anchor, weight, 0)?;
                }
                Event::Alias(id) => {
                    let Some(anchored) = self.anchors.get(&id) else {
                        return Err((pos, "alias names an unknown anchor".into()));
                    };
                    let (size, depth) = (anchored.size, anchored.depth);
                    if self.stack.len() + depth > self.limits.max_depth {
                        return Err((pos, self.depth_message()));
                    }
                    let mut node = anchored.node.clone();
                    node.pos = pos;
                    self.count(size, pos)?;
                    self.complete(node, 0, size, depth)?;
                }
                Event::SequenceStart(anchor, tag) => {
                    reject_tag(tag.as_deref(), pos, "seq")?;
                    self.open(pos)?;
                    self.stack.push(Frame::Seq {
                        items: Vec::new(),
                        pos,
                        anchor,
                        first_node: self.nodes,
                    });
                }
                Event::MappingStart(anchor, tag) => {
                    reject_tag(tag.as_deref(), pos, "map")?;
                    self.open(pos)?;
                    self.stack.push(Frame::Map {
                        entries: Vec::new(),
                        seen: HashMap::new(),
                        pending_key: None,
                        pos,
                        anchor,
                        first_node: self.nodes,
                    });
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    let depth = self.stack.len();
                    let (node, anchor, first) = match self.stack.pop() {
                        Some(Frame::Seq {
                            items,
                            pos,
                            anchor,
                            first_node,
                        }) => (Node::new(Value::Seq(items), pos), anchor, first_node),
                        Some(Frame::Map {
                            entries,
                            pos,
                            anchor,
                            first_node,
                            ..
                        }) => (Node::new(Value::Map(entries), pos), anchor, first_node),
                        None => return Err((pos, "unbalanced YAML structure".into())),
                    };
                    let size = self.nodes - first;
                    let own_depth = depth - self.stack.len();
                    self.complete(node, anchor, size, own_depth)?;
                }
            }
        }
        match self.root {
            Some(node) if !node.is_null() => Ok(node),
            _ => Err((last, "descriptor is empty".into())),
        }
    }

    fn depth_message(&self) -> String {
        format!(
            "nesting is deeper than {} levels; a descriptor never needs that",
            self.limits.max_depth
        )
    }

    fn open(&mut self, pos: Pos) -> Result<(), Failure> {
        if self.stack.len() >= self.limits.max_depth {
            return Err((pos, self.depth_message()));
        }
        self.count(1, pos)
    }

    fn count(&mut self, n: usize, pos: Pos) -> Result<(), Failure> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > self.limits.max_nodes {
            return Err((
                pos,
                format!(
                    "document expands to more than {} values (aliases included, text counted as one value per {TEXT_PER_VALUE} bytes); refusing to read it",
                    self.limits.max_nodes
                ),
            ));
        }
        Ok(())
    }

    /// A value is finished: record its anchor, then place it in its parent.
    fn complete(
        &mut self,
        node: Node,
        anchor: usize,
        size: usize,
        depth: usize,
    ) -> Result<(), Failure> {
        if anchor != 0 {
            self.anchors.insert(
                anchor,
                Anchored {
                    node: node.clone(),
                    size,
                    depth,
                },
            );
        }
        let pos = node.pos;
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Frame::Seq { items, .. }) => {
                items.push(node);
                Ok(())
            }
            Some(Frame::Map {
                entries,
                seen,
                pending_key,
                ..
            }) => match pending_key.take() {
                Some(key) => {
                    entries.push((key, node));
                    Ok(())
                }
                None => {
                    let text = match node.value {
                        Value::Str(s) => s,
                        Value::Null => String::new(),
                        Value::Bool(b) => b.to_string(),
                        Value::Int(i) => i.to_string(),
                        Value::Float(f) => f.to_string(),
                        Value::Seq(_) | Value::Map(_) => {
                            return Err((pos, "a mapping key must be text".into()));
                        }
                    };
                    if let Some(first) = seen.get(&text) {
                        return Err((
                            pos,
                            format!("duplicate key `{text}` (first at line {})", first.line),
                        ));
                    }
                    seen.insert(text.clone(), pos);
                    *pending_key = Some(Key { text, pos });
                    Ok(())
                }
            },
        }
    }
}

/// Bytes of scalar text that count as one value against [`Limits::max_nodes`].
const TEXT_PER_VALUE: usize = 64;

const CORE_TAG_PREFIX: &str = "tag:yaml.org,2002:";

fn core_tag(tag: &Tag) -> Option<&str> {
    if tag.handle == "!!" || tag.handle == CORE_TAG_PREFIX {
        Some(tag.suffix.as_str())
    } else {
        None
    }
}

fn reject_tag(tag: Option<&Tag>, pos: Pos, expected: &str) -> Result<(), Failure> {
    match tag {
        None => Ok(()),
        Some(t) if core_tag(t) == Some(expected) => Ok(()),
        Some(t) => Err((
            pos,
            format!(
                "YAML tag `{}{}` is not supported in a descriptor",
                t.handle, t.suffix
            ),
        )),
    }
}

/// Resolves a scalar by the YAML 1.2 core schema: quoted and block scalars are text; plain
/// scalars may be null, booleans, integers or floats.
fn resolve_scalar(
    text: &str,
    style: ScalarStyle,
    tag: Option<&Tag>,
    pos: Pos,
) -> Result<Value, Failure> {
    if let Some(tag) = tag {
        let bad = || {
            (
                pos,
                format!("`{text}` does not fit its tag `!!{}`", tag.suffix),
            )
        };
        return match core_tag(tag) {
            Some("str") => Ok(Value::Str(text.to_owned())),
            Some("null") => match plain_scalar(text) {
                Value::Null => Ok(Value::Null),
                _ => Err(bad()),
            },
            Some("bool") => match plain_scalar(text) {
                v @ Value::Bool(_) => Ok(v),
                _ => Err(bad()),
            },
            Some("int") => match plain_scalar(text) {
                v @ Value::Int(_) => Ok(v),
                _ => Err(bad()),
            },
            Some("float") => match plain_scalar(text) {
                Value::Int(i) => Ok(Value::Float(i as f64)),
                v @ Value::Float(_) => Ok(v),
                _ => Err(bad()),
            },
            _ => Err((
                pos,
                format!(
                    "YAML tag `{}{}` is not supported in a descriptor",
                    tag.handle, tag.suffix
                ),
            )),
        };
    }
    if style == ScalarStyle::Plain {
        Ok(plain_scalar(text))
    } else {
        Ok(Value::Str(text.to_owned()))
    }
}

fn plain_scalar(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Value::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Value::Float(f64::NAN),
        _ => {}
    }
    if let Some(v) = core_int(text) {
        return v;
    }
    if is_core_float(text)
        && let Ok(f) = text.parse::<f64>()
    {
        return Value::Float(f);
    }
    Value::Str(text.to_owned())
}

fn core_int(text: &str) -> Option<Value> {
    let (digits, radix) = if let Some(h) = text.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = text.strip_prefix("0o") {
        (o, 8)
    } else {
        let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
        if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some(match text.parse::<i64>() {
            Ok(i) => Value::Int(i),
            // Too large for i64: JSON readers would see a float, so do we.
            Err(_) => Value::Float(text.parse::<f64>().ok()?),
        });
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    i64::from_str_radix(digits, radix).ok().map(Value::Int)
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
fn is_core_float(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
                && !(int.is_empty() && frac.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn read(text: &str) -> Result<Node, String> {
        let mut d = Diagnostics::new();
        parse(text.as_bytes(), &Limits::DEFAULT, &mut d).ok_or_else(|| {
            d.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    /// A control character that could make a terminal or an editor show another kit than
    /// the one read (ESC sequences, a lone CR, DEL, C1) is refused where it stands; tabs,
    /// line feeds and CRLF line ends are text.
    #[test]
    fn control_characters_that_hide_text_are_refused_where_they_stand() {
        for (text, at) in [
            ("a: 1\n# x \u{1b}[1A\u{1b}[2K\n", "2:5"),
            ("a: [x]\nb: y\r# only x\n", "2:5"),
            ("a: \"\u{7f}\"\n", "1:5"),
            ("a: x\u{85}y\n", "1:5"),
            ("a: \u{8}x\n", "1:4"),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.contains("control character"), "{text:?}: {e}");
            assert!(e.starts_with(at), "{text:?}: {e}");
        }
        for text in ["a: 1\r\nb: 2\r\n", "a: 1 \t# c\n", "a: \"tab\tin\"\n"] {
            assert!(read(text).is_ok(), "{text:?}");
        }
    }

    /// A bidirectional override or isolate reorders what an editor shows after it, in a
    /// comment as in a value: refused where it stands. Its twins: the same character
    /// written as an escape in a double-quoted string, and right-to-left text itself.
    #[test]
    fn bidirectional_formatting_is_refused_even_in_comments() {
        for (text, at) in [
            ("paths: [/tmp] # \u{202E}]cte/ ,\n", "1:17"),
            ("a: x\n# \u{2066}note\u{2069}\n", "2:3"),
            ("a: \"b\u{200F}c\"\n", "1:6"),
            ("a: 1\nb: \u{061C}2\n", "2:4"),
        ] {
            let e = read(text).unwrap_err();
            assert!(
                e.starts_with(at) && e.contains("bidirectional formatting character"),
                "{text:?}: {e}"
            );
        }
        let escaped = read("a: \"x\\u202Ey\"\n").unwrap();
        assert_eq!(escaped.get("a").and_then(Node::as_str), Some("x\u{202E}y"));
        assert!(read("a: \"שלום\" # عربي\n").is_ok());
    }

    fn err(text: &str) -> String {
        match read(text) {
            Ok(n) => format!("unexpectedly read {n:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn scalars_resolve_by_the_core_schema() {
        let n = read("a: 1\nb: '1'\nc: true\nd: ~\ne: 1.5\nf: 0x10\ng: 1e3\nh: v1\ni: -7\n")
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(n.get("a").map(|n| &n.value), Some(&Value::Int(1)));
        assert_eq!(n.get("b").and_then(Node::as_str), Some("1"));
        assert_eq!(n.get("c").map(|n| &n.value), Some(&Value::Bool(true)));
        assert!(n.get("d").is_some_and(Node::is_null));
        assert_eq!(n.get("e").map(|n| &n.value), Some(&Value::Float(1.5)));
        assert_eq!(n.get("f").map(|n| &n.value), Some(&Value::Int(16)));
        assert_eq!(n.get("g").map(|n| &n.value), Some(&Value::Float(1000.0)));
        assert_eq!(n.get("h").and_then(Node::as_str), Some("v1"));
        assert_eq!(n.get("i").map(|n| &n.value), Some(&Value::Int(-7)));
    }

    #[test]
    fn positions_are_one_based() {
        let n = read("a:\n  b: [1, 2]\n").unwrap_or_else(|e| unreachable!("{e}"));
        let b = n.get("a").and_then(|a| a.get("b"));
        assert_eq!(b.map(|b| b.pos), Some(Pos { line: 2, column: 6 }));
    }

    #[test]
    fn duplicate_keys_are_refused_with_both_places() {
        let e = err("a: 1\nb: 2\na: 3\n");
        assert!(
            e.contains("3:1") && e.contains("duplicate key `a`") && e.contains("line 1"),
            "{e}"
        );
    }

    #[test]
    fn billion_laughs_is_refused() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            doc.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(err(&doc).contains("expands to more than"), "{}", err(&doc));
    }

    /// Few aliases of one long string: few values, gigabytes of text. Refused by weight
    /// (unweighed, the copies exhaust memory); the twin, the string used a few times,
    /// reads.
    #[test]
    fn aliases_of_long_text_are_weighed_by_their_bytes() {
        let long = "x".repeat(400_000);
        let mut doc = format!("a: &a \"{long}\"\nb:\n");
        for _ in 0..100_000 {
            doc.push_str("- *a\n");
        }
        assert!(err(&doc).contains("expands to more than"), "{}", err(&doc));
        let few = format!("a: &a \"{long}\"\nb: [*a, *a, *a]\n");
        let mut diags = Diagnostics::default();
        assert!(
            parse(few.as_bytes(), &Limits::DEFAULT, &mut diags).is_some(),
            "{diags:?}"
        );
    }

    #[test]
    fn deep_nesting_is_refused() {
        let doc = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(err(&doc).contains("nesting is deeper"), "{}", err(&doc));
        // Far deeper input stops in the parser's own recursion guard, also as an error.
        let doc = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = err(&doc);
        assert!(
            e.contains("nesting is deeper") || e.contains("recursion limit"),
            "{e}"
        );
        let doc = "a:\n".to_owned() + &" - ".repeat(5000);
        assert!(read(&doc).is_err());
    }

    #[test]
    fn hostile_bytes_are_errors_not_panics() {
        let mut d = Diagnostics::new();
        assert!(parse(b"a: \xff\xfe\n", &Limits::DEFAULT, &mut d).is_none());
        assert!(
            d.iter()
                .any(|d| d.message.contains("UTF-8") && d.pos.line == 1)
        );
        assert!(err("a:\n\tb: 1\n").contains("2:"));
        assert!(err("a: 1\n---\nb: 2\n").contains("one YAML document"));
        assert!(err("").contains("empty"));
        assert!(err("a: !custom x\n").contains("not supported"));
        assert!(err("? [a]\n: 1\n").contains("must be text"));
        assert!(err("a: *nope\n").contains("YAML syntax") || err("a: *nope\n").contains("anchor"));
        let big = vec![b'a'; Limits::DEFAULT.max_bytes + 1];
        let mut d = Diagnostics::new();
        assert!(parse(&big, &Limits::DEFAULT, &mut d).is_none());
        assert!(d.iter().any(|d| d.message.contains("byte limit")));
    }

    #[test]
    fn a_leading_bom_is_allowed_and_json_reads() {
        let n = read("\u{feff}{\"a\": [1, \"x\"], \"b\": null}")
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            n.get("a").and_then(Node::as_seq).map(<[Node]>::len),
            Some(2)
        );
        assert!(n.get("b").is_some_and(Node::is_null));
    }

    #[test]
    fn aliases_to_strings_are_copied() {
        let n = read("a: &x hello\nb: *x\n").unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(n.get("b").and_then(Node::as_str), Some("hello"));
    }
}
