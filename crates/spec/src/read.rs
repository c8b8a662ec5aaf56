//! Typed reading of [`Node`]s with every problem recorded.
//!
//! Each reader either returns the value or records why it could not, and carries on: the
//! caller gets all problems of a document, not the first. In *lenient* mode (an entry whose
//! config still holds `${{ kit.args.* }}` / `${{ kit.env.* }}` references, spec §1.7) a
//! reference standing where a typed value belongs is accepted without judgement: it is
//! judged again, strictly, once expanded.

use crate::diag::Diagnostics;
use crate::node::{Key, Node, Path, Pos, Value};
use crate::refs;

/// The reading context: where problems go and whether references are tolerated.
#[derive(Debug)]
pub struct Cx<'d> {
    pub diags: &'d mut Diagnostics,
    pub lenient: bool,
    /// Host, method and path combinations the descriptor's network-policy@2 entries have
    /// stated so far (each is judged, locked and compared on its own).
    pub http_grants: usize,
}

impl<'d> Cx<'d> {
    pub fn new(diags: &'d mut Diagnostics) -> Self {
        Cx {
            diags,
            lenient: false,
            http_grants: 0,
        }
    }

    pub fn error(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.diags.error(path, pos, message);
    }

    pub fn warning(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.diags.warning(path, pos, message);
    }

    /// Whether `node` is a reference that must be judged after expansion instead of now.
    pub fn deferred(&self, node: &Node) -> bool {
        self.lenient && node.as_str().is_some_and(refs::has_any_ref)
    }

    /// Whether string value `s` may be judged now (it holds no reference, or we are strict).
    pub fn judgeable(&self, s: &str) -> bool {
        !(self.lenient && refs::has_any_ref(s))
    }

    fn wrong_kind(&mut self, node: &Node, path: &Path, expected: &str) {
        let found = node.kind_name();
        let message = if node.is_null() {
            format!("is null; expected {expected}")
        } else {
            format!("expected {expected}, found {found}")
        };
        self.error(path, node.pos, message);
    }

    /// A string value.
    pub fn string<'n>(&mut self, node: &'n Node, path: &Path) -> Option<&'n str> {
        match &node.value {
            Value::Str(s) => Some(s),
            _ => {
                self.wrong_kind(node, path, "a string");
                None
            }
        }
    }

    /// A boolean value (a deferred reference yields `None` without a problem).
    pub fn boolean(&mut self, node: &Node, path: &Path) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            _ if self.deferred(node) => None,
            _ => {
                self.wrong_kind(node, path, "true or false");
                None
            }
        }
    }

    /// A whole number (a float with no fraction counts, as JSON has one number type).
    pub fn integer(&mut self, node: &Node, path: &Path) -> Option<i64> {
        match &node.value {
            Value::Int(i) => Some(*i),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            Value::Float(_) => {
                self.error(path, node.pos, "expected a whole number");
                None
            }
            _ if self.deferred(node) => None,
            _ => {
                self.wrong_kind(node, path, "a number");
                None
            }
        }
    }

    /// Any number.
    pub fn number(&mut self, node: &Node, path: &Path) -> Option<f64> {
        match &node.value {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ if self.deferred(node) => None,
            _ => {
                self.wrong_kind(node, path, "a number");
                None
            }
        }
    }

    /// A list, with each element's path.
    pub fn list<'n>(&mut self, node: &'n Node, path: &Path) -> Option<Vec<(Path, &'n Node)>> {
        match &node.value {
            Value::Seq(items) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (path.index(i), n))
                    .collect(),
            ),
            _ => {
                self.wrong_kind(node, path, "a list");
                None
            }
        }
    }

    /// A list of strings; elements of the wrong kind are reported and left out.
    pub fn string_list<'n>(
        &mut self,
        node: &'n Node,
        path: &Path,
    ) -> Option<Vec<(Path, &'n str, Pos)>> {
        let items = self.list(node, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (p, n) in items {
            if let Some(s) = self.string(n, &p) {
                out.push((p, s, n.pos));
            }
        }
        Some(out)
    }

    /// Opens a mapping for field-by-field reading.
    pub fn fields<'n>(&mut self, node: &'n Node, path: &Path) -> Option<Fields<'n>> {
        match &node.value {
            Value::Map(entries) => Some(Fields {
                entries,
                used: vec![false; entries.len()],
                path: path.clone(),
                pos: node.pos,
            }),
            _ => {
                self.wrong_kind(node, path, "a mapping");
                None
            }
        }
    }
}

/// A mapping being read field by field. [`Fields::finish`] reports every key nobody took.
#[derive(Debug)]
pub struct Fields<'n> {
    entries: &'n [(Key, Node)],
    used: Vec<bool>,
    pub path: Path,
    pub pos: Pos,
}

impl<'n> Fields<'n> {
    /// Takes field `key`, if present (a present `null` is returned as a null node).
    pub fn take(&mut self, key: &str) -> Option<&'n Node> {
        let i = self.entries.iter().position(|(k, _)| k.text == key)?;
        self.used[i] = true;
        Some(&self.entries[i].1)
    }

    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| k.text == key)
    }

    /// The path of field `key`.
    pub fn at(&self, key: &str) -> Path {
        self.path.key(key)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &'n Key> + use<'n> {
        self.entries.iter().map(|(k, _)| k)
    }

    /// A required field: reports its absence.
    pub fn require(&mut self, cx: &mut Cx<'_>, key: &str) -> Option<&'n Node> {
        let node = self.take(key);
        if node.is_none() {
            cx.error(&self.path, self.pos, format!("`{key}` is required"));
        }
        node
    }

    /// An optional string field; `null` is reported.
    pub fn string(&mut self, cx: &mut Cx<'_>, key: &str) -> Option<&'n str> {
        let node = self.take(key)?;
        cx.string(node, &self.path.key(key))
    }

    /// A required string field.
    pub fn required_string(&mut self, cx: &mut Cx<'_>, key: &str) -> Option<&'n str> {
        let node = self.require(cx, key)?;
        cx.string(node, &self.path.key(key))
    }

    /// An optional boolean field.
    pub fn boolean(&mut self, cx: &mut Cx<'_>, key: &str) -> Option<bool> {
        let node = self.take(key)?;
        cx.boolean(node, &self.path.key(key))
    }

    /// An optional list-of-strings field.
    pub fn string_list(&mut self, cx: &mut Cx<'_>, key: &str) -> Option<Vec<(Path, &'n str, Pos)>> {
        let node = self.take(key)?;
        cx.string_list(node, &self.path.key(key))
    }

    /// Reports every field that was not taken as unknown.
    pub fn finish(self, cx: &mut Cx<'_>) {
        for ((key, _), used) in self.entries.iter().zip(self.used) {
            if !used {
                cx.error(
                    &self.path.key(&key.text),
                    key.pos,
                    format!("unknown field `{}`", key.text),
                );
            }
        }
    }
}
