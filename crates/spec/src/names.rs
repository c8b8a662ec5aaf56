//! Capability names, versions, and the relations between Kits (§1.5, §1.6).
//!
//! A Kit states what it offers in `provides` (`name` or `name@version`),
//! what it needs in `requires` and `integrates` (`name` or
//! `name <op> version[, <op> version]...`), and what it cannot share a
//! sandbox with in `conflicts` (a name alone). This module parses those
//! entries, normalizes capability names into their namespace, orders
//! versions, and decides whether a provide satisfies a require.
//!
//! Grammar checks are written by hand over byte classes: every pattern is
//! ASCII, and a hand-written check cannot fail to build.

use std::cmp::Ordering;
use std::fmt;

/// The namespace a bare capability name belongs to: `gh` and
/// `com.docker.kit/gh` are one capability.
pub const DEFAULT_NAMESPACE: &str = "com.docker.kit";

/// Reserved single-label namespaces for publish-derived provides.
///
/// Publishing derives `deb/<package>@<version>` and `apk/<package>@<version>`
/// from the image's package database; authors must not write them (checked
/// by the authored-form check, not here). Every other namespace is
/// reverse-DNS with at least two labels.
pub const RESERVED_NAMESPACES: [&str; 2] = ["deb", "apk"];

/// What makes one version the next: `v + ".-"` is the smallest version
/// greater than `v`.
const SUCCESSOR_SUFFIX: &str = ".-";

/// Longest base name (the part after the namespace).
const MAX_BASE_LEN: usize = 64;

/// Longest namespace, a DNS name's limit.
const MAX_NAMESPACE_LEN: usize = 253;

/// Longest namespace label, a DNS label's limit.
const MAX_LABEL_LEN: usize = 63;

/// Why a capability name, version, or relation entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name does not match the capability-name grammar.
    #[error("invalid capability name `{name}`")]
    InvalidCapabilityName {
        /// The name as written.
        name: String,
    },
    /// The namespace is a single label that this specification has not
    /// reserved.
    #[error(
        "invalid capability name `{name}`: namespace `{namespace}` is a single label, which \
         this specification reserves; a namespace of your own is reverse-DNS, as in \
         `com.example/{base}`"
    )]
    SingleLabelNamespace {
        /// The name as written.
        name: String,
        /// Its namespace.
        namespace: String,
        /// Its base name.
        base: String,
    },
    /// The text is not version-shaped (`^[0-9]+(\.[0-9A-Za-z-]+)*$`, no `v`
    /// prefix).
    #[error(
        "invalid version `{version}`: a version is a number followed by dot-separated segments, with no `v` prefix"
    )]
    InvalidVersion {
        /// The version as written, surrounding whitespace trimmed.
        version: String,
    },
    /// A relation entry has no capability name before its constraints.
    #[error("missing capability name in `{entry}`")]
    MissingName {
        /// The entry as written, surrounding whitespace trimmed.
        entry: String,
    },
    /// A constraint operator is not followed by a version.
    #[error("missing version after `{op}` in `{entry}`")]
    MissingVersion {
        /// The entry as written, surrounding whitespace trimmed.
        entry: String,
        /// The operator left without a version.
        op: Op,
    },
    /// The constraint list ends in a comma.
    #[error("trailing comma in `{entry}`")]
    TrailingComma {
        /// The entry as written, surrounding whitespace trimmed.
        entry: String,
    },
    /// A constraint does not start with one of `>=`, `>`, `<=`, `<`, `=`.
    #[error(
        "unknown version operator `{found}` in `{entry}`: expected one of `>=`, `>`, `<=`, `<`, `=`"
    )]
    UnknownOperator {
        /// The entry as written, surrounding whitespace trimmed.
        entry: String,
        /// The text found where an operator was expected.
        found: String,
    },
    /// No version meets every constraint of the entry.
    #[error("unsatisfiable constraints in `{entry}`: they cannot all hold")]
    Unsatisfiable {
        /// The entry as written, surrounding whitespace trimmed.
        entry: String,
    },
    /// A `conflicts` entry carries a version or constraint.
    #[error(
        "conflicts entry `{entry}` carries a version or constraint; a conflict names a capability only"
    )]
    ConstrainedConflict {
        /// The entry as written.
        entry: String,
    },
}

// ---------------------------------------------------------------------------
// Capability names
// ---------------------------------------------------------------------------

/// A validated, normalized capability name: a namespace and a base name.
///
/// A bare name belongs to [`DEFAULT_NAMESPACE`]. Equality, hashing and
/// ordering are over the normalized pair, so `gh` and `com.docker.kit/gh`
/// are equal and `com.example/gh` is different.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CapabilityName {
    namespace: String,
    base: String,
}

impl CapabilityName {
    /// Parses `base` or `namespace/base`.
    ///
    /// The base name is 1–64 characters of lowercase ASCII letters, digits,
    /// `+`, `.` and `-`, starting with a letter or digit and ending with a
    /// letter, digit or `+`. The namespace is at most 253 characters of
    /// dot-separated DNS labels (lowercase letters, digits and inner `-`, at
    /// most 63 each) with at least two labels, unless it is one of
    /// [`RESERVED_NAMESPACES`]. More than one `/` is invalid.
    ///
    /// Nothing is trimmed: callers trim where the specification trims.
    ///
    /// # Errors
    ///
    /// [`NameError::InvalidCapabilityName`] when the text breaks the grammar;
    /// [`NameError::SingleLabelNamespace`] for a well-formed single-label
    /// namespace that is not reserved.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let invalid = || NameError::InvalidCapabilityName { name: s.to_owned() };
        match s.split_once('/') {
            None => {
                if !is_base_name(s) {
                    return Err(invalid());
                }
                Ok(Self {
                    namespace: DEFAULT_NAMESPACE.to_owned(),
                    base: s.to_owned(),
                })
            }
            Some((namespace, base)) => {
                if !is_namespace(namespace) || !is_base_name(base) {
                    return Err(invalid());
                }
                if !namespace.contains('.') && !RESERVED_NAMESPACES.contains(&namespace) {
                    return Err(NameError::SingleLabelNamespace {
                        name: s.to_owned(),
                        namespace: namespace.to_owned(),
                        base: base.to_owned(),
                    });
                }
                Ok(Self {
                    namespace: namespace.to_owned(),
                    base: base.to_owned(),
                })
            }
        }
    }

    /// The namespace, [`DEFAULT_NAMESPACE`] for a bare name.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The base name, the part after the namespace.
    #[must_use]
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The name for humans: the default namespace is implied and stripped,
    /// any other namespace stays (`gh`, `com.example/gh`, `deb/curl`).
    #[must_use]
    pub fn display(&self) -> String {
        if self.namespace == DEFAULT_NAMESPACE {
            self.base.clone()
        } else {
            self.to_string()
        }
    }

    /// Whether the name is in a namespace reserved for publish-derived
    /// provides (`deb/` or `apk/`).
    #[must_use]
    pub fn is_reserved(&self) -> bool {
        RESERVED_NAMESPACES.contains(&self.namespace.as_str())
    }
}

impl fmt::Display for CapabilityName {
    /// The normalized, fully qualified name: `namespace/base`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.base)
    }
}

/// `^[a-z0-9]([a-z0-9+.-]{0,62}[a-z0-9+])?$`
fn is_base_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= MAX_BASE_LEN
        && is_lower_alnum(first)
        && (is_lower_alnum(last) || last == b'+')
        && bytes
            .iter()
            .all(|&b| is_lower_alnum(b) || matches!(b, b'+' | b'.' | b'-'))
}

/// At most 253 characters of dot-separated labels, each
/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`. The label count is the caller's
/// concern.
fn is_namespace(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAMESPACE_LEN && s.split('.').all(is_label)
}

/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
fn is_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= MAX_LABEL_LEN
        && is_lower_alnum(first)
        && is_lower_alnum(last)
        && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

/// A validated version: `^[0-9]+(\.[0-9A-Za-z-]+)*$` after trimming
/// surrounding whitespace, no `v` prefix.
///
/// Equality and hashing are textual (`1.0` and `01.0` are different
/// spellings); ordering follows [`compare_versions`], with two spellings of
/// one point (`1.0`, `01.0`) ordered by their text so the order agrees with
/// equality. Use [`compare_versions`] to ask whether two versions name the
/// same point.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(String);

impl Version {
    /// Parses a version, trimming surrounding whitespace.
    ///
    /// # Errors
    ///
    /// [`NameError::InvalidVersion`] when the trimmed text is not
    /// version-shaped.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let trimmed = s.trim();
        if is_version_shaped(trimmed) {
            Ok(Self(trimmed.to_owned()))
        } else {
            Err(NameError::InvalidVersion {
                version: trimmed.to_owned(),
            })
        }
    }

    /// The version text (trimmed, otherwise as written).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The canonical spelling of this version's point: leading zeros
    /// stripped from all-digit segments (`01.007.x` → `1.7.x`). Two
    /// versions compare equal exactly when their canonical spellings are
    /// the same text.
    #[must_use]
    pub fn canonical(&self) -> String {
        canonical_version(&self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        compare_versions(&self.0, &other.0).then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Whether `s` is version-shaped after trimming surrounding whitespace:
/// `^[0-9]+(\.[0-9A-Za-z-]+)*$` (so `v2.98.0` is not).
#[must_use]
pub fn is_version(s: &str) -> bool {
    is_version_shaped(s.trim())
}

fn is_version_shaped(s: &str) -> bool {
    let mut segments = s.split('.');
    let leading_number = segments
        .next()
        .is_some_and(|first| !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()));
    leading_number
        && segments.all(|segment| {
            !segment.is_empty()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Compares two versions (surrounding whitespace ignored).
///
/// Both are split on `.` and compared segment by segment; a missing segment
/// is the empty string. Two all-digit segments compare by numeric value as
/// digit strings (leading zeros ignored, any length); any other pair
/// compares by bytes. So `2.9.0 < 2.98.0`, `13 > 2`, `00123 == 123`,
/// `1.0 < 1.0.0`, and `0 < 0.- < 0.0`.
///
/// Mixing all-digit and other segments at one position can make the order
/// non-transitive (`9 < 10`, `10 < 1a`, `1a < 9`); it is a total order over
/// versions whose segments at each position are of one kind.
#[must_use]
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let mut left = segments(a);
    let mut right = segments(b);
    loop {
        let (l, r) = match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (l, r) => (l.unwrap_or(""), r.unwrap_or("")),
        };
        let order = if is_all_digits(l) && is_all_digits(r) {
            compare_digits(l, r)
        } else {
            l.as_bytes().cmp(r.as_bytes())
        };
        if order != Ordering::Equal {
            return order;
        }
    }
}

/// The segments of a version; none for an empty one.
fn segments(v: &str) -> impl Iterator<Item = &str> {
    let v = v.trim();
    v.split('.').filter(move |_| !v.is_empty())
}

/// A number, which the empty segment is not.
fn is_all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Orders two digit strings by value: more significant digits is larger,
/// equal lengths compare bytewise.
fn compare_digits(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Strips the leading zeros [`compare_versions`] looks past, so two
/// spellings of one point render alike.
fn canonical_version(v: &str) -> String {
    segments(v)
        .map(|segment| {
            if is_all_digits(segment) {
                let trimmed = segment.trim_start_matches('0');
                if trimmed.is_empty() { "0" } else { trimmed }
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The smallest successor of a version, `v + ".-"`, used for exclusive lower bounds.
///
/// A further segment sorts above the version without it, and `-` is the
/// smallest segment the grammar can write (below every digit and letter, and
/// shorter than anything else starting with it), so nothing lies between `v`
/// and `v.-`: `> v` means exactly `>= v.-`.
#[must_use]
pub fn next_version(v: &str) -> String {
    format!("{v}{SUCCESSOR_SUFFIX}")
}

// ---------------------------------------------------------------------------
// Relations
// ---------------------------------------------------------------------------

/// A comparison operator in a version constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `>=`
    Ge,
    /// `>`
    Gt,
    /// `<=`
    Le,
    /// `<`
    Lt,
    /// `=`
    Eq,
}

impl Op {
    /// The operator as written: `>=`, `>`, `<=`, `<` or `=`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ge => ">=",
            Self::Gt => ">",
            Self::Le => "<=",
            Self::Lt => "<",
            Self::Eq => "=",
        }
    }

    /// Whether `order` (a version compared with the constraint's version)
    /// meets this operator.
    fn admits(self, order: Ordering) -> bool {
        match self {
            Self::Ge => order.is_ge(),
            Self::Gt => order.is_gt(),
            Self::Le => order.is_le(),
            Self::Lt => order.is_lt(),
            Self::Eq => order.is_eq(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One comparison in a require: `op version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Constraint {
    /// The comparison.
    pub op: Op,
    /// The version compared against.
    pub version: Version,
}

impl Constraint {
    /// Whether `version` meets this constraint.
    #[must_use]
    pub fn is_satisfied_by(&self, version: &Version) -> bool {
        self.holds(version.as_str())
    }

    fn holds(&self, version: &str) -> bool {
        self.op
            .admits(compare_versions(version, self.version.as_str()))
    }
}

impl fmt::Display for Constraint {
    /// `op version`, e.g. `>= 1.0.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.version)
    }
}

/// A parsed `provides` entry: a capability name and an optional version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Provide {
    /// The normalized capability name.
    pub name: CapabilityName,
    /// The provided version; `None` when the entry carries none.
    pub version: Option<Version>,
}

impl fmt::Display for Provide {
    /// `namespace/base` or `namespace/base@version`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(version) => write!(f, "{}@{version}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// A parsed `requires` or `integrates` entry: a capability name and the
/// constraints (all of them) a provider's version must meet. No constraints means
/// any provider of the name satisfies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Require {
    /// The normalized capability name.
    pub name: CapabilityName,
    /// The constraints as written, in order; empty when unconstrained.
    pub constraints: Vec<Constraint>,
}

impl Require {
    /// The one spelling of this relation, so entries meaning the same thing
    /// compare equal however they were written.
    ///
    /// Format: the full normalized name, then — if any constraint remains —
    /// one space and the simplified constraints as `op version` joined by
    /// `", "`, lower bound first: `com.docker.kit/shell`,
    /// `com.docker.kit/shell = 1.0.0`, `com.docker.kit/shell >= 1.0.0, < 2.0.0`.
    ///
    /// Simplification: a pin dominates every other constraint; `> x` becomes
    /// `>= x.-`; `< x.-` becomes `<= x` (`< x` with any other `x` stays, as
    /// the largest version below it has no spelling); only the tightest
    /// bound in each direction is kept (at one point, `<` is tighter than
    /// `<=`); inclusive bounds that meet (`>= x, <= x`) become `= x`; and
    /// leading zeros are stripped from all-digit version segments. The
    /// implicit floor `>= 0` is not added and an explicit one is not dropped,
    /// because an unversioned provide satisfies `x` but not `x >= 0`.
    #[must_use]
    pub fn canonical(&self) -> String {
        let simplified = simplify(&self.constraints);
        if simplified.is_empty() {
            return self.name.to_string();
        }
        let rendered: Vec<String> = simplified
            .iter()
            .map(|(op, version)| format!("{op} {version}"))
            .collect();
        format!("{} {}", self.name, rendered.join(", "))
    }

    /// Whether `p` satisfies this require; see [`satisfies`].
    #[must_use]
    pub fn is_satisfied_by(&self, p: &Provide) -> bool {
        satisfies(p, self)
    }
}

impl fmt::Display for Require {
    /// The full name and the constraints as written, e.g.
    /// `com.docker.kit/shell >= 1.0.0, < 2.0.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        for (i, constraint) in self.constraints.iter().enumerate() {
            let separator = if i == 0 { " " } else { ", " };
            write!(f, "{separator}{constraint}")?;
        }
        Ok(())
    }
}

/// Reduces constraints to what they say, as canonical `(op, version)` pairs,
/// lower bound first.
fn simplify(constraints: &[Constraint]) -> Vec<(Op, String)> {
    if let Some(pin) = constraints
        .iter()
        .filter(|c| c.op == Op::Eq)
        .map(|c| canonical_version(c.version.as_str()))
        .min()
    {
        return vec![(Op::Eq, pin)];
    }
    // Exclusive bounds become the inclusive bounds they equal, wherever
    // that has a spelling, and every version its canonical spelling.
    let mut bounds: Vec<(Op, String)> = constraints
        .iter()
        .map(|c| {
            let v = c.version.as_str();
            match c.op {
                Op::Gt => (Op::Ge, canonical_version(&next_version(v))),
                Op::Lt => match v.strip_suffix(SUCCESSOR_SUFFIX) {
                    Some(predecessor) => (Op::Le, canonical_version(predecessor)),
                    None => (Op::Lt, canonical_version(v)),
                },
                op => (op, canonical_version(v)),
            }
        })
        .collect();
    // A fixed visiting order keeps the result independent of how the entry
    // listed its constraints, even where the version order is not total.
    bounds.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.as_str().cmp(b.0.as_str())));

    let mut lower: Option<(Op, String)> = None;
    let mut upper: Option<(Op, String)> = None;
    for (op, version) in bounds {
        match op {
            Op::Ge | Op::Gt | Op::Eq => {
                let tighter = lower
                    .as_ref()
                    .is_none_or(|(_, lo)| compare_versions(&version, lo).is_gt());
                if tighter {
                    lower = Some((op, version));
                }
            }
            Op::Le | Op::Lt => {
                let tighter =
                    upper
                        .as_ref()
                        .is_none_or(|(hi_op, hi)| match compare_versions(&version, hi) {
                            Ordering::Less => true,
                            Ordering::Equal => op == Op::Lt && *hi_op == Op::Le,
                            Ordering::Greater => false,
                        });
                if tighter {
                    upper = Some((op, version));
                }
            }
        }
    }
    if let (Some((_, lo)), Some((Op::Le, hi))) = (&lower, &upper)
        && compare_versions(lo, hi).is_eq()
    {
        return vec![(Op::Eq, lo.clone())];
    }
    lower.into_iter().chain(upper).collect()
}

/// Whether `provide` satisfies `require`: the names are equal (normalized),
/// and either the require is unconstrained or the provide has a version
/// meeting every constraint. An unversioned provide satisfies only an
/// unconstrained require.
#[must_use]
pub fn satisfies(provide: &Provide, require: &Require) -> bool {
    if provide.name != require.name {
        return false;
    }
    if require.constraints.is_empty() {
        return true;
    }
    provide.version.as_ref().is_some_and(|version| {
        require
            .constraints
            .iter()
            .all(|c| c.is_satisfied_by(version))
    })
}

/// Parses a `provides` entry: `name` or `name@version`, surrounding
/// whitespace trimmed (`"shell "` is `shell`). The name is normalized.
///
/// # Errors
///
/// [`NameError::MissingName`] for an empty name, the errors of
/// [`CapabilityName::parse`] for a malformed one, and
/// [`NameError::InvalidVersion`] for a malformed version (including an empty
/// one after `@`).
pub fn parse_provide(s: &str) -> Result<Provide, NameError> {
    let entry = s.trim();
    let (name, version) = match entry.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (entry, None),
    };
    if name.is_empty() {
        return Err(NameError::MissingName {
            entry: entry.to_owned(),
        });
    }
    Ok(Provide {
        name: CapabilityName::parse(name)?,
        version: version.map(Version::parse).transpose()?,
    })
}

/// Parses a `requires` or `integrates` entry: `name` or
/// `name <op> version[, <op> version]...` with `<op>` one of `>=`, `>`,
/// `<=`, `<`, `=`. Surrounding whitespace is trimmed and whitespace around
/// operators and commas is optional (`shell>=1.0.0`). The name is
/// normalized; constraints are kept as written.
///
/// The name ends at the first whitespace or operator-like character
/// (`<`, `>`, `=`, `~`, `!`, `^`, `,`).
///
/// # Errors
///
/// [`NameError::MissingName`], the errors of [`CapabilityName::parse`],
/// [`NameError::UnknownOperator`] (e.g. `~=`), [`NameError::MissingVersion`],
/// [`NameError::InvalidVersion`] (e.g. a `v` prefix),
/// [`NameError::TrailingComma`], and [`NameError::Unsatisfiable`] when no
/// version can meet every constraint — conflicting pins, a pin outside
/// another bound, inverted bounds, exclusive bounds that touch, or an upper
/// bound below the implicit floor `>= 0`.
pub fn parse_require(s: &str) -> Result<Require, NameError> {
    let entry = s.trim();
    let name_end = entry
        .find(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | '=' | '~' | '!' | '^' | ','))
        .unwrap_or(entry.len());
    let (name, tail) = entry.split_at(name_end);
    if name.is_empty() {
        return Err(NameError::MissingName {
            entry: entry.to_owned(),
        });
    }
    let name = CapabilityName::parse(name)?;
    let tail = tail.trim();
    let constraints = if tail.is_empty() {
        Vec::new()
    } else {
        parse_constraints(entry, tail)?
    };
    Ok(Require { name, constraints })
}

/// Parses a `conflicts` entry: a bare or namespace-qualified capability
/// name, nothing else and nothing trimmed. The name is normalized.
///
/// # Errors
///
/// [`NameError::ConstrainedConflict`] when the entry carries a version or
/// constraint, otherwise the errors of [`CapabilityName::parse`].
pub fn parse_conflict(s: &str) -> Result<CapabilityName, NameError> {
    let has_relation_syntax = s.contains(['@', '<', '>', '=', '~', ',']);
    let named = s
        .trim()
        .split(['@', '<', '>', '=', '~', ',', ' ', '\t'])
        .next()
        .is_some_and(|name| CapabilityName::parse(name).is_ok());
    if has_relation_syntax && named {
        return Err(NameError::ConstrainedConflict {
            entry: s.to_owned(),
        });
    }
    CapabilityName::parse(s)
}

/// Parses a non-empty constraint tail and checks it can be met.
fn parse_constraints(entry: &str, tail: &str) -> Result<Vec<Constraint>, NameError> {
    let mut constraints = Vec::new();
    let mut rest = tail;
    loop {
        let (op, after_op) = cut_op(rest).ok_or_else(|| NameError::UnknownOperator {
            entry: entry.to_owned(),
            found: operator_token(rest).to_owned(),
        })?;
        let (version, next) = match after_op.split_once(',') {
            Some((version, next)) => (version, Some(next)),
            None => (after_op, None),
        };
        if version.trim().is_empty() {
            return Err(NameError::MissingVersion {
                entry: entry.to_owned(),
                op,
            });
        }
        constraints.push(Constraint {
            op,
            version: Version::parse(version)?,
        });
        match next {
            None => break,
            Some(next) if next.trim().is_empty() => {
                return Err(NameError::TrailingComma {
                    entry: entry.to_owned(),
                });
            }
            Some(next) => rest = next.trim_start(),
        }
    }
    if !is_satisfiable(&constraints) {
        return Err(NameError::Unsatisfiable {
            entry: entry.to_owned(),
        });
    }
    Ok(constraints)
}

/// Splits a leading operator off `s` (leading whitespace ignored).
fn cut_op(s: &str) -> Option<(Op, &str)> {
    let s = s.trim_start();
    [
        (">=", Op::Ge),
        ("<=", Op::Le),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ]
    .into_iter()
    .find_map(|(text, op)| s.strip_prefix(text).map(|after| (op, after)))
}

/// What stands where an operator was expected: a run of punctuation
/// (`~=`), or else the first word.
fn operator_token(s: &str) -> &str {
    let s = s.trim_start();
    let punctuation_end = s
        .find(|c: char| c.is_whitespace() || c.is_alphanumeric())
        .unwrap_or(s.len());
    if punctuation_end > 0 {
        return &s[..punctuation_end];
    }
    let word_end = s.find(char::is_whitespace).unwrap_or(s.len());
    &s[..word_end]
}

/// Whether some version meets every constraint.
///
/// The constraints cut an interval out of the version order whose floor is
/// `0` (every version is `>= 0`). The smallest version meeting all lower
/// bounds is the greatest of `0`, each `>= x`'s `x`, each `> x`'s successor
/// `x.-` (nothing lies between `x` and `x.-`), and a pin; the set is
/// satisfiable exactly when that version also meets every upper bound. So
/// exclusive bounds "touch" — and nothing fits — when `> x` meets `<= y`
/// with `y < x.-` or `< y` with `y <= x.-`: `> 0, < 0.-` is empty while
/// `> 0, < 0.0` holds `0.-`.
///
/// Rather than trusting a single maximum, every such candidate is tried
/// against every constraint, which gives the same answer wherever the order
/// is total and never accepts a set no candidate meets where it is not.
fn is_satisfiable(constraints: &[Constraint]) -> bool {
    let candidates =
        std::iter::once("0".to_owned()).chain(constraints.iter().filter_map(|c| match c.op {
            Op::Ge | Op::Eq => Some(c.version.as_str().to_owned()),
            Op::Gt => Some(next_version(c.version.as_str())),
            Op::Le | Op::Lt => None,
        }));
    candidates
        .into_iter()
        .any(|candidate| constraints.iter().all(|c| c.holds(&candidate)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
#[allow(clippy::expect_used, reason = "tests")]
#[allow(clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    fn provide(s: &str) -> Provide {
        parse_provide(s).unwrap_or_else(|e| panic!("provide `{s}`: {e}"))
    }

    fn require(s: &str) -> Require {
        parse_require(s).unwrap_or_else(|e| panic!("require `{s}`: {e}"))
    }

    fn canonical(s: &str) -> String {
        require(s).canonical()
    }

    // -- names --------------------------------------------------------------

    #[test]
    fn capability_names_accepted() {
        for (input, namespace, base, display) in [
            ("gh", "com.docker.kit", "gh", "gh"),
            ("com.docker.kit/gh", "com.docker.kit", "gh", "gh"),
            ("com.example/gh", "com.example", "gh", "com.example/gh"),
            ("deb/curl", "deb", "curl", "deb/curl"),
            ("apk/busybox", "apk", "busybox", "apk/busybox"),
            ("deb/libstdc++6", "deb", "libstdc++6", "deb/libstdc++6"),
            (
                "deb/containerd.io",
                "deb",
                "containerd.io",
                "deb/containerd.io",
            ),
            (
                "python-3.14",
                "com.docker.kit",
                "python-3.14",
                "python-3.14",
            ),
            ("c++", "com.docker.kit", "c++", "c++"),
            ("7", "com.docker.kit", "7", "7"),
            ("a.b-c.d/x", "a.b-c.d", "x", "a.b-c.d/x"),
            (
                "io.github.some-org/tool",
                "io.github.some-org",
                "tool",
                "io.github.some-org/tool",
            ),
        ] {
            let name = CapabilityName::parse(input).unwrap_or_else(|e| panic!("`{input}`: {e}"));
            assert_eq!(name.namespace(), namespace, "{input}");
            assert_eq!(name.base(), base, "{input}");
            assert_eq!(name.display(), display, "{input}");
            assert_eq!(name.to_string(), format!("{namespace}/{base}"), "{input}");
        }
    }

    #[test]
    fn capability_names_rejected() {
        let long_base = "a".repeat(65);
        let long_label = format!("{}.com/x", "a".repeat(64));
        let long_namespace = format!("{}/x", vec!["a".repeat(60); 5].join("."));
        for input in [
            "",
            "Com.Example/gh",
            "com.example/gh/extra",
            "GH",
            "-gh",
            "gh-",
            "gh.",
            ".gh",
            "+gh",
            "+",
            "g h",
            "gh ",
            " gh",
            "gh_x",
            "/gh",
            "com.example/",
            "com..example/gh",
            ".com.example/gh",
            "com.example./gh",
            "com.-example/gh",
            "com.example-/gh",
            "com.exa+mple/gh",
            "com.example/Gh",
            long_base.as_str(),
            long_label.as_str(),
            long_namespace.as_str(),
        ] {
            let err = CapabilityName::parse(input).expect_err(input);
            assert!(
                err.to_string().contains("invalid capability name"),
                "`{input}`: {err}"
            );
        }
        // The longest admissible base and namespace.
        assert!(CapabilityName::parse(&"a".repeat(64)).is_ok());
        assert!(CapabilityName::parse(&format!("{}.com/x", "a".repeat(63))).is_ok());
        let max_namespace = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "a".repeat(61));
        assert_eq!(max_namespace.len(), 253);
        assert!(CapabilityName::parse(&format!("{max_namespace}/x")).is_ok());
    }

    #[test]
    fn single_label_namespaces() {
        for input in ["example/x", "docker/gh", "com/gh"] {
            let err = CapabilityName::parse(input).expect_err(input);
            assert!(
                matches!(err, NameError::SingleLabelNamespace { .. }),
                "`{input}`: {err:?}"
            );
            assert!(err.to_string().contains("single label"), "{err}");
        }
        for reserved in RESERVED_NAMESPACES {
            let name = CapabilityName::parse(&format!("{reserved}/pkg")).unwrap();
            assert!(name.is_reserved());
        }
        assert!(!CapabilityName::parse("gh").unwrap().is_reserved());
        assert!(!CapabilityName::parse("com.deb/gh").unwrap().is_reserved());
    }

    #[test]
    fn normalization() {
        let bare = CapabilityName::parse("gh").unwrap();
        let full = CapabilityName::parse("com.docker.kit/gh").unwrap();
        let other = CapabilityName::parse("com.example/gh").unwrap();
        assert_eq!(bare, full);
        assert_ne!(bare, other);
        assert_eq!(bare.to_string(), "com.docker.kit/gh");
        // Display strips only the default namespace.
        assert_eq!(other.display(), "com.example/gh");
        assert_eq!(
            CapabilityName::parse("com.docker.kit.extra/gh")
                .unwrap()
                .display(),
            "com.docker.kit.extra/gh"
        );
    }

    // -- versions -----------------------------------------------------------

    #[test]
    fn version_shapes() {
        for (input, ok) in [
            ("2.98.0", true),
            ("1", true),
            ("0", true),
            ("13", true),
            ("00123", true),
            ("1.0.0-rc1", true),
            ("1.0.0.-", true),
            ("1.x.Y-z", true),
            ("2.99.0", true),
            (" 1.0 ", true),
            ("99999999999999999999999999999999", true),
            ("v2.98.0", false),
            ("V1", false),
            ("", false),
            ("  ", false),
            ("1.", false),
            (".1", false),
            ("1..0", false),
            ("a.1", false),
            ("-1", false),
            ("1.0+build", false),
            ("1.0_0", false),
            ("1 .0", false),
            ("${{ kit.args.version }}", false),
        ] {
            assert_eq!(is_version(input), ok, "`{input}`");
            assert_eq!(Version::parse(input).is_ok(), ok, "`{input}`");
        }
        assert_eq!(Version::parse(" 1.0 ").unwrap().as_str(), "1.0");
        let err = Version::parse("v2.98.0").unwrap_err();
        assert!(
            err.to_string().contains("invalid version `v2.98.0`"),
            "{err}"
        );
    }

    #[test]
    fn version_comparison() {
        use Ordering::{Equal, Greater, Less};
        for (a, b, want) in [
            ("2.9.0", "2.98.0", Less),
            ("13", "2", Greater),
            ("00123", "123", Equal),
            ("1.0", "1.0.0", Less),
            ("0", "0.-", Less),
            ("0.-", "0.0", Less),
            ("0", "0.0", Less),
            ("1.0.0", "1.0.0", Equal),
            ("1.10", "1.9", Greater),
            ("1.0.0-rc1", "1.0.0-rc2", Less),
            ("1.a", "1.B", Greater),
            ("1.0.0", "1.0.0.-", Less),
            ("99999999999999999999", "100000000000000000000", Less),
            ("18446744073709551616", "18446744073709551615", Greater),
            ("1.000000000000000000000000001", "1.1", Equal),
            (" 1.0", "1.0 ", Equal),
        ] {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_versions(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn version_ord_agrees_with_eq() {
        let a = Version::parse("1.0").unwrap();
        let b = Version::parse("01.0").unwrap();
        assert_ne!(a, b);
        assert_ne!(a.cmp(&b), Ordering::Equal);
        assert_eq!(compare_versions(a.as_str(), b.as_str()), Ordering::Equal);
        assert_eq!(a.canonical(), b.canonical());
        let mut sorted = [
            Version::parse("2.0").unwrap(),
            Version::parse("1.10").unwrap(),
            Version::parse("1.9").unwrap(),
        ];
        sorted.sort();
        let texts: Vec<&str> = sorted.iter().map(Version::as_str).collect();
        assert_eq!(texts, ["1.9", "1.10", "2.0"]);
    }

    #[test]
    fn successor() {
        assert_eq!(next_version("1.0.0"), "1.0.0.-");
        assert_eq!(next_version("0"), "0.-");
        assert!(is_version(&next_version("1.0.0")));
        for v in ["0", "1.0.0", "1.0.0-rc1", "13"] {
            assert_eq!(compare_versions(v, &next_version(v)), Ordering::Less, "{v}");
        }
        // Nothing lies between v and its successor.
        for w in [
            "1.0.0.0",
            "1.0.0.a",
            "1.0.0.--",
            "1.0.0.-.0",
            "1.0.1",
            "1.0.0.A",
        ] {
            assert_eq!(compare_versions(w, "1.0.0.-"), Ordering::Greater, "{w}");
        }
    }

    // -- provides -----------------------------------------------------------

    #[test]
    fn provides() {
        for (input, name, version) in [
            ("gh@2.99.0", "com.docker.kit/gh", Some("2.99.0")),
            ("gh", "com.docker.kit/gh", None),
            ("shell ", "com.docker.kit/shell", None),
            ("  shell@1.0.0  ", "com.docker.kit/shell", Some("1.0.0")),
            ("debian@13", "com.docker.kit/debian", Some("13")),
            (
                "browser-automation",
                "com.docker.kit/browser-automation",
                None,
            ),
            ("com.example/gh@1.0", "com.example/gh", Some("1.0")),
            ("deb/nodejs@20.5.0", "deb/nodejs", Some("20.5.0")),
        ] {
            let p = provide(input);
            assert_eq!(p.name.to_string(), name, "{input}");
            assert_eq!(p.version.as_ref().map(Version::as_str), version, "{input}");
        }
        assert_eq!(
            provide("gh@2.99.0"),
            Provide {
                name: CapabilityName::parse("com.docker.kit/gh").unwrap(),
                version: Some(Version::parse("2.99.0").unwrap()),
            }
        );
        for (input, fragment) in [
            ("gh@v2.0.0", "invalid version"),
            ("gh@", "invalid version"),
            ("gh@1.0@2", "invalid version"),
            ("@1.0", "missing capability name"),
            ("", "missing capability name"),
            ("GH@1.0", "invalid capability name"),
            ("gh @1.0", "invalid capability name"),
            ("example/gh@1.0", "single label"),
            ("gh@${{ kit.args.version }}", "invalid version"),
        ] {
            let err = parse_provide(input).expect_err(input);
            assert!(err.to_string().contains(fragment), "`{input}`: {err}");
        }
    }

    // -- requires -----------------------------------------------------------

    #[test]
    fn requires_accepted() {
        for input in [
            "shell",
            "shell ",
            "shell >= 1.0.0",
            "shell>=1.0.0",
            "shell >=1.0.0",
            "shell>= 1.0.0",
            "com.docker.kit/shell >= 1.0.0",
            "node >= 20.0.0, < 21.0.0",
            "node>=20.0.0,<21.0.0",
            "node >= 20.0.0 ,< 21.0.0",
            "node = 20.5.0",
            "node > 1.0.0, < 2.0.0",
            "thing >= 1.0.0, <= 1.0.0",
            "thing = 1.0.0, >= 1.0.0, <= 1.0.0",
            "thing <= 0",
            "thing > 1.0.0, <= 1.0.0.-",
            "thing > 0, < 0.0",
            "thing >= 0",
            "thing < 0.-",
            "thing = 0",
            "thing = 1.0, = 01.0",
            "thing >= 99999999999999999999, < 100000000000000000000",
            "thing > 99999999999999999999, <= 100000000000000000000",
            "docker-engine >= 25.0.0",
            "com.example/gh >= 2.0.0",
            "deb/openssl >= 3.5",
        ] {
            assert!(
                parse_require(input).is_ok(),
                "`{input}`: {:?}",
                parse_require(input)
            );
        }
        let r = require("node >= 20.0.0, < 21.0.0");
        assert_eq!(r.name.to_string(), "com.docker.kit/node");
        assert_eq!(
            r.constraints,
            vec![
                Constraint {
                    op: Op::Ge,
                    version: Version::parse("20.0.0").unwrap()
                },
                Constraint {
                    op: Op::Lt,
                    version: Version::parse("21.0.0").unwrap()
                },
            ]
        );
        assert_eq!(r.to_string(), "com.docker.kit/node >= 20.0.0, < 21.0.0");
        assert!(require("shell").constraints.is_empty());
    }

    #[test]
    fn requires_malformed() {
        for (input, fragment) in [
            ("thing >=", "missing version after `>=`"),
            ("thing >= ,< 2.0", "missing version after `>=`"),
            ("thing >= 1.0.0,", "trailing comma"),
            ("thing >= 1.0.0, ", "trailing comma"),
            ("thing ~= 1.0", "unknown version operator `~=`"),
            ("thing~=1.0", "unknown version operator `~=`"),
            ("thing >= 1.0, ~ 2.0", "unknown version operator `~`"),
            ("thing 1.0", "unknown version operator `1.0`"),
            ("thing >= 1.0,, < 2.0", "unknown version operator `,`"),
            (">= 1.0.0", "missing capability name"),
            ("  >= 1.0.0", "missing capability name"),
            ("", "missing capability name"),
            ("thing >= v1.0.0", "invalid version `v1.0.0`"),
            ("thing >= 1.0.0 < 2.0.0", "invalid version `1.0.0 < 2.0.0`"),
            ("thing == 1.0", "invalid version `= 1.0`"),
            ("Com.Example/gh", "invalid capability name"),
            ("com.example/gh/extra", "invalid capability name"),
            ("com.example/gh/extra >= 1.0", "invalid capability name"),
            ("example/x >= 1.0", "single label"),
            ("gh@1.0", "invalid capability name"),
            ("thing >= ${{ kit.args.v }}", "invalid version"),
        ] {
            let err = parse_require(input).expect_err(input);
            assert!(err.to_string().contains(fragment), "`{input}`: {err}");
        }
    }

    #[test]
    fn requires_unsatisfiable() {
        for input in [
            "thing = 1.0.0, = 2.0.0",
            "thing = 1.0.0, >= 2.0.0",
            "thing = 2.0.0, < 2.0.0",
            "thing = 1.0.0, > 1.0.0",
            "thing >= 2.0.0, <= 1.0.0",
            "thing >= 2.0.0, < 1.0.0",
            "thing > 1.0.0, <= 1.0.0",
            "thing >= 1.0.0, < 1.0.0",
            "thing > 1.0.0, < 1.0.0",
            "thing < 0",
            "thing < 00",
            "thing > 0, < 0.-",
            "thing > 1.0.0, < 1.0.0.-",
            "thing > 1.0.0, <= 1.0.0.-, < 1.0.0.-",
            "thing < 2.0.0, >= 1.0.0, >= 3.0.0",
            "thing >= 100000000000000000000, < 99999999999999999999",
        ] {
            let err = parse_require(input).expect_err(input);
            assert!(
                matches!(err, NameError::Unsatisfiable { .. }),
                "`{input}`: {err:?}"
            );
            assert!(err.to_string().contains("cannot all hold"), "{err}");
        }
    }

    // -- satisfies ----------------------------------------------------------

    #[test]
    fn satisfaction() {
        for (p, r, want) in [
            ("debian@13", "debian >= 13", true),
            ("debian@13", "debian >= 14", false),
            ("browser-automation", "browser-automation", true),
            ("browser-automation", "browser-automation >= 1.0", false),
            ("browser-automation", "browser-automation >= 0", false),
            ("node@20.5.0", "node >= 20.0.0, < 21.0.0", true),
            ("node@20.5.0", "node > 20.5.0, < 21.0.0", false),
            ("node@20.5.0", "node >= 20.0.0, < 20.5.0", false),
            ("node@20.5.0", "node <= 1.0.0", false),
            ("node@20.5.0", "node = 20.5.0", true),
            ("node@20.5.0", "node = 20.5.1", false),
            ("node@20.5.0", "node = 020.05.0", true),
            ("node", "node = 20.5.0", false),
            ("node@20.5.0", "node", true),
            ("gh@2.5.0", "com.docker.kit/gh >= 2.0.0", true),
            ("com.docker.kit/gh@2.5.0", "gh >= 2.0.0", true),
            ("gh@2.5.0", "com.example/gh >= 2.0.0", false),
            ("com.example/gh@2.5.0", "gh", false),
            ("gh@2.5.0", "hub", false),
            // provides fallback (§6.5).
            ("base@1.4.2", "base >= 1.0.0", true),
            ("base@1.4.2", "base >= 9.0.0", false),
            ("foo@1.0.0", "foo >= 2.0.0", false),
            ("foo@2.0.0", "foo >= 2.0.0", true),
            ("claude@2.1.6", "claude >= 2.0.0", true),
            ("claude@2.1.6", "claude >= 99.0.0", false),
            ("docker-engine@25.0.0", "docker-engine >= 25.0.0", true),
            ("thing@1.0.0.-", "thing > 1.0.0, <= 1.0.0.-", true),
            ("thing@0.-", "thing > 0, < 0.0", true),
            (
                "big@100000000000000000000",
                "big > 99999999999999999999",
                true,
            ),
        ] {
            let (p, r) = (provide(p), require(r));
            assert_eq!(satisfies(&p, &r), want, "{p} vs {r}");
            assert_eq!(r.is_satisfied_by(&p), want, "{p} vs {r}");
        }
        // `provides: ["shell "]` with the Kit's version as fallback.
        let trimmed = provide("shell ");
        let with_fallback = Provide {
            version: Some(Version::parse("1.0.0").unwrap()),
            ..trimmed
        };
        assert_eq!(with_fallback.to_string(), "com.docker.kit/shell@1.0.0");
        // One Kit offering foo@1.0.0 and foo@2.0.0 satisfies `foo >= 2.0.0`.
        let offered = [provide("foo@1.0.0"), provide("foo@2.0.0")];
        let needed = require("foo >= 2.0.0");
        assert!(offered.iter().any(|p| satisfies(p, &needed)));
    }

    // -- canonical rendering ------------------------------------------------

    #[test]
    fn canonical_spellings_agree() {
        for group in [
            &[
                "shell >= 1.0.0",
                "shell>=1.0.0",
                "com.docker.kit/shell >= 1.0.0",
                " shell >=1.0.0 ",
            ][..],
            &[
                "node >= 20.0.0, < 21.0.0",
                "node < 21.0.0, >= 20.0.0",
                "node<21.0.0,>=20.0.0",
            ],
            &["thing >= 1, >= 2", "thing >= 2", "thing >= 2, >= 1"],
            &["thing < 3, < 2", "thing < 2"],
            &[
                "thing > 1.0.0, >= 1.0.0",
                "thing > 1.0.0",
                "thing >= 1.0.0, > 1.0.0",
            ],
            &[
                "thing = 1.0.0, >= 0.5.0",
                "thing = 1.0.0",
                "thing >= 0.5, = 1.0.0, < 3",
            ],
            &[
                "thing >= 1.0.0, <= 1.0.0",
                "thing = 1.0.0",
                "thing <= 1.0.0, >= 1.0.0",
            ],
            &["thing > 1.0.0", "thing >= 1.0.0.-"],
            &["thing < 1.0.0.-", "thing <= 1.0.0"],
            &["thing >= 01.002.0", "thing >= 1.2.0"],
            &["thing = 1.0, = 01.0", "thing = 1.0"],
            &["thing <= 2.0, < 2.0", "thing < 2.0"],
            &["thing > 1.0.0, <= 1.0.0.-", "thing = 1.0.0.-"],
            &["thing >= 1.0.0.-, < 1.0.0.-.-", "thing = 1.0.0.-"],
            &["shell", "com.docker.kit/shell", "shell "],
        ] {
            let first = canonical(group[0]);
            for other in &group[1..] {
                assert_eq!(canonical(other), first, "`{}` vs `{other}`", group[0]);
            }
        }
    }

    #[test]
    fn canonical_spellings_differ() {
        for (a, b) in [
            ("thing < 1.0.1", "thing <= 1.0.1"),
            ("thing < 1.0.1", "thing <= 1.0.0"),
            ("shell >= 1.0.0", "com.example/shell >= 1.0.0"),
            ("shell", "shell >= 0"),
            ("thing >= 1.0", "thing >= 1.0.0"),
            ("thing > 1.0.0", "thing >= 1.0.0"),
            ("thing >= 1.0.0", "thing = 1.0.0"),
        ] {
            assert_ne!(canonical(a), canonical(b), "`{a}` vs `{b}`");
        }
    }

    #[test]
    fn canonical_format() {
        for (input, want) in [
            ("shell", "com.docker.kit/shell"),
            ("shell >= 1.0.0", "com.docker.kit/shell >= 1.0.0"),
            (
                "node < 21.0.0, >= 20.0.0",
                "com.docker.kit/node >= 20.0.0, < 21.0.0",
            ),
            ("thing >= 1, >= 2", "com.docker.kit/thing >= 2"),
            ("thing < 3, < 2", "com.docker.kit/thing < 2"),
            ("thing > 1.0.0, >= 1.0.0", "com.docker.kit/thing >= 1.0.0.-"),
            ("thing = 1.0.0, >= 0.5, < 3", "com.docker.kit/thing = 1.0.0"),
            ("thing >= 1.0.0, <= 1.0.0", "com.docker.kit/thing = 1.0.0"),
            ("thing > 1.0.0", "com.docker.kit/thing >= 1.0.0.-"),
            ("thing < 1.0.0.-", "com.docker.kit/thing <= 1.0.0"),
            ("thing < 1.0.1", "com.docker.kit/thing < 1.0.1"),
            ("thing <= 1.0.1", "com.docker.kit/thing <= 1.0.1"),
            (
                "thing >= 007.00.10-rc01",
                "com.docker.kit/thing >= 7.0.10-rc01",
            ),
            ("thing <= 0", "com.docker.kit/thing <= 0"),
            ("com.example/gh > 2, <= 3", "com.example/gh >= 2.-, <= 3"),
            ("deb/openssl >= 3.5", "deb/openssl >= 3.5"),
        ] {
            let got = canonical(input);
            assert_eq!(got, want, "`{input}`");
            // The canonical form is itself a require with the same canonical form.
            assert_eq!(canonical(&got), got, "`{got}`");
        }
    }

    // -- conflicts ----------------------------------------------------------

    #[test]
    fn conflicts() {
        assert_eq!(
            parse_conflict("podman").unwrap().to_string(),
            "com.docker.kit/podman"
        );
        assert_eq!(
            parse_conflict("com.example/podman").unwrap().display(),
            "com.example/podman"
        );
        for (input, fragment) in [
            ("podman >= 1.0", "carries a version or constraint"),
            ("podman@1.0", "carries a version or constraint"),
            ("podman>1", "carries a version or constraint"),
            ("Podman", "invalid capability name"),
            ("podman ", "invalid capability name"),
            ("", "invalid capability name"),
            ("com.example/podman/x", "invalid capability name"),
            ("example/podman", "single label"),
        ] {
            let err = parse_conflict(input).expect_err(input);
            assert!(err.to_string().contains(fragment), "`{input}`: {err}");
        }
    }

    #[test]
    fn error_messages_are_lowercase_without_final_period() {
        let errors = [
            CapabilityName::parse("Com.Example/gh").unwrap_err(),
            CapabilityName::parse("example/x").unwrap_err(),
            Version::parse("v1").unwrap_err(),
            parse_require(">= 1").unwrap_err(),
            parse_require("x >=").unwrap_err(),
            parse_require("x >= 1,").unwrap_err(),
            parse_require("x ~= 1").unwrap_err(),
            parse_require("x < 0").unwrap_err(),
            parse_conflict("x@1").unwrap_err(),
        ];
        for err in errors {
            let message = err.to_string();
            assert!(
                message.chars().next().is_some_and(char::is_lowercase),
                "{message}"
            );
            assert!(!message.ends_with('.'), "{message}");
        }
    }
}
