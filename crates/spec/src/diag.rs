//! Problems found in a descriptor, each with the place it was found.
//!
//! Reading and validating never stop at the first problem: every check appends to a
//! [`Diagnostics`] list, and the caller decides what to do with all of them.

use std::fmt;

use serde::Serialize;

use crate::node::{Path, Pos};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem: where it is (field path and, for text input, line and column) and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Field path such as `capabilities[0].config.container`; empty for the whole document.
    pub path: Path,
    /// Position in the source text, when the descriptor came from text.
    #[serde(skip)]
    pub pos: Pos,
    pub message: String,
}

impl Serialize for Path {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// `line:col: path: message` (position and path left out when unknown).
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pos.is_known() {
            write!(f, "{}: ", self.pos)?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        // Messages quote kit text: spelled out, so a kit cannot write to the terminal.
        if !self.path.is_root() {
            write!(f, "{}: ", crate::text::printable(&self.path.to_string()))?;
        }
        f.write_str(&crate::text::printable(&self.message))
    }
}

/// The problems collected while reading one descriptor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(Vec<Diagnostic>);

impl Diagnostics {
    pub fn new() -> Self {
        Diagnostics(Vec::new())
    }

    pub fn error(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.0.push(Diagnostic {
            severity: Severity::Error,
            path: path.clone(),
            pos,
            message: message.into(),
        });
    }

    pub fn warning(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.0.push(Diagnostic {
            severity: Severity::Warning,
            path: path.clone(),
            pos,
            message: message.into(),
        });
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }

    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }

    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.is_error())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sorted by position (problems without a position last), then path, keeping the
    /// order of discovery otherwise; exact repeats dropped.
    pub fn sorted(mut self) -> Self {
        self.0.sort_by(|a, b| {
            let ka = (!a.pos.is_known(), a.pos, &a.path);
            let kb = (!b.pos.is_known(), b.pos, &b.path);
            ka.cmp(&kb)
        });
        self.0.dedup();
        self
    }

    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.0
    }

    /// Whether some error's path is `path` and its message contains `fragment`.
    pub fn contains(&self, path: &str, fragment: &str) -> bool {
        self.errors()
            .any(|d| d.path.as_str() == path && d.message.contains(fragment))
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}
