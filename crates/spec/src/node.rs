//! The positioned document tree every descriptor is read into.
//!
//! YAML (and JSON, which is YAML) is first parsed into [`Node`]s that remember where they
//! stood in the file, so that every problem found later can name its `line:column`.
//! Equality ignores positions: two documents are equal when their values are.

use std::fmt;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// Where a node starts in its source text (1-based). `line == 0` means "not from text"
/// (a tree built in memory, such as a merged descriptor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    pub const UNKNOWN: Pos = Pos { line: 0, column: 0 };

    pub fn is_known(self) -> bool {
        self.line > 0
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One value of the document with its position.
#[derive(Debug, Clone)]
pub struct Node {
    pub value: Value,
    pub pos: Pos,
}

/// A mapping key: always text in a descriptor.
#[derive(Debug, Clone)]
pub struct Key {
    pub text: String,
    pub pos: Pos,
}

/// The value of a node. Mappings keep their keys in document order.
#[derive(Debug, Clone)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

impl Node {
    pub fn new(value: Value, pos: Pos) -> Self {
        Node { value, pos }
    }

    /// A node built in memory, with no source position.
    pub fn detached(value: Value) -> Self {
        Node {
            value,
            pos: Pos::UNKNOWN,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    /// The value of `key` in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.text == key)
            .map(|(_, v)| v)
    }

    /// What kind of value this is, for messages ("a mapping", "a string", …).
    pub fn kind_name(&self) -> &'static str {
        self.value.kind_name()
    }

    /// Calls `f` on every string value (not keys) in the tree, depth first.
    pub fn for_each_str<'a>(&'a self, f: &mut dyn FnMut(&'a str)) {
        let mut stack = vec![self];
        while let Some(n) = stack.pop() {
            match &n.value {
                Value::Str(s) => f(s),
                Value::Seq(items) => stack.extend(items.iter().rev()),
                Value::Map(entries) => stack.extend(entries.iter().rev().map(|(_, v)| v)),
                _ => {}
            }
        }
    }

    /// Calls `f` on every mapping key in the tree.
    pub fn for_each_key<'a>(&'a self, f: &mut dyn FnMut(&'a Key)) {
        let mut stack = vec![self];
        while let Some(n) = stack.pop() {
            match &n.value {
                Value::Seq(items) => stack.extend(items.iter()),
                Value::Map(entries) => {
                    for (k, v) in entries {
                        f(k);
                        stack.push(v);
                    }
                }
                _ => {}
            }
        }
    }

    /// Converts to a `serde_json::Value` (keys in document order).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.text.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// Builds a detached tree from a `serde_json::Value`.
    pub fn from_json(value: &serde_json::Value) -> Node {
        use serde_json::Value as J;
        let value = match value {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::Seq(items.iter().map(Node::from_json).collect()),
            J::Object(entries) => Value::Map(
                entries
                    .iter()
                    .map(|(k, v)| {
                        (
                            Key {
                                text: k.clone(),
                                pos: Pos::UNKNOWN,
                            },
                            Node::from_json(v),
                        )
                    })
                    .collect(),
            ),
        };
        Node::detached(value)
    }
}

impl Value {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// Values compare equal regardless of position. Integers and floats that denote the same
/// number are equal (JSON does not tell them apart).
impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Int(a), Value::Float(b)) | (Value::Float(b), Value::Int(a)) => *a as f64 == *b,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Seq(a), Value::Seq(b)) => a == b,
            (Value::Map(a), Value::Map(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|((ka, va), (kb, vb))| ka.text == kb.text && va == vb)
            }
            _ => false,
        }
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.value {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Str(s) => serializer.serialize_str(s),
            Value::Seq(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(&k.text, v)?;
                }
                map.end()
            }
        }
    }
}

/// A JSON-pointer-like location in a descriptor, rendered as
/// `capabilities[2].config.runtime.allow[0].methods`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path(String);

impl Path {
    pub fn root() -> Self {
        Path(String::new())
    }

    /// The path of field `key` below this one.
    pub fn key(&self, key: &str) -> Path {
        if self.0.is_empty() {
            Path(key.to_owned())
        } else {
            Path(format!("{}.{key}", self.0))
        }
    }

    /// The path of element `index` below this one.
    pub fn index(&self, index: usize) -> Path {
        Path(format!("{}[{index}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Path {
    fn from(s: &str) -> Self {
        Path(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_the_spec() {
        let p = Path::root()
            .key("capabilities")
            .index(2)
            .key("config")
            .key("runtime")
            .key("allow")
            .index(0)
            .key("methods");
        assert_eq!(
            p.as_str(),
            "capabilities[2].config.runtime.allow[0].methods"
        );
    }

    #[test]
    fn equality_ignores_positions_and_number_representation() {
        let a = Node::new(Value::Int(3), Pos { line: 1, column: 2 });
        let b = Node::new(Value::Float(3.0), Pos { line: 9, column: 9 });
        assert_eq!(a, b);
        let c = Node::new(Value::Str("3".into()), Pos::UNKNOWN);
        assert_ne!(a, c);
    }

    #[test]
    fn json_round_trip_keeps_key_order() {
        let j = serde_json::json!({"b": 1, "a": [true, null, "x", 1.5]});
        let n = Node::from_json(&j);
        assert_eq!(
            n.to_json().to_string(),
            r#"{"b":1,"a":[true,null,"x",1.5]}"#
        );
    }
}
