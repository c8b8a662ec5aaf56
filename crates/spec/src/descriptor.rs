//! The kit descriptor as written (spec §1.3): what a kit says about itself.
//!
//! These types mirror the file. They are produced by [`crate::load`], which reads strictly
//! and validates completely; a `Descriptor` handed out with no errors is a valid one.
//! Serializing one gives the published JSON form, which reads back to an equal value.

use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::caps::{Capability, KnownType};
use crate::node::{Node, Pos};

/// What a kit is (spec §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The root filesystem and image config; exactly one per composition.
    Workload,
    /// An overlay on a workload; zero or more per composition.
    Mixin,
    /// An authored list of other kits, flattened at publish.
    Set,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Workload => "workload",
            Kind::Mixin => "mixin",
            Kind::Set => "set",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kit descriptor, schema version 3.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub schema_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icon_url: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub licenses: Vec<String>,
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "serialize_args"
    )]
    pub args: Vec<ArgDecl>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub provides: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub integrates: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kits: Option<Vec<KitEntry>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Item>,
}

impl Descriptor {
    /// Every ordinary entry and every group member, in document order, with its path
    /// (`capabilities[1]` or `capabilities[1].group.capabilities[0]`).
    pub fn declared_entries(&self) -> Vec<(String, &Entry)> {
        let mut out = Vec::new();
        for (i, item) in self.capabilities.iter().enumerate() {
            match item {
                Item::Entry(e) => out.push((format!("capabilities[{i}]"), e)),
                Item::Group(g) => {
                    for (j, e) in g.capabilities.iter().enumerate() {
                        out.push((format!("capabilities[{i}].group.capabilities[{j}]"), e));
                    }
                }
            }
        }
        out
    }

    /// The declared capability types, de-duplicated and sorted.
    pub fn capability_type_list(&self) -> Vec<&str> {
        let mut types: Vec<&str> = self
            .declared_entries()
            .into_iter()
            .map(|(_, e)| e.type_name.as_str())
            .collect();
        types.sort_unstable();
        types.dedup();
        types
    }

    /// The declared capability types, de-duplicated, sorted and comma-joined (the
    /// `vnd.docker.sandbox.kit.capabilities` annotation, spec §8.1).
    pub fn capability_types(&self) -> String {
        self.capability_type_list().join(",")
    }

    pub fn arg(&self, name: &str) -> Option<&ArgDecl> {
        self.args.iter().find(|a| a.name == name)
    }
}

fn serialize_args<S: Serializer>(args: &[ArgDecl], s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(args.len()))?;
    for a in args {
        map.serialize_entry(&a.name, a)?;
    }
    map.end()
}

/// An argument the kit accepts (spec §1.8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArgDecl {
    #[serde(skip)]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(rename = "enum", skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_arg: Option<String>,
}

impl ArgDecl {
    /// Build-phase args (`buildArg`) are expanded at publish; all others at create.
    pub fn is_build_phase(&self) -> bool {
        self.build_arg.is_some()
    }
}

/// One member of a set (spec §1.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KitEntry {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "serialize_pairs"
    )]
    pub args: Vec<(String, String)>,
}

fn serialize_pairs<S: Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// An item of `capabilities`: an ordinary entry or a group (spec §1.10).
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Entry(Entry),
    Group(Group),
}

impl Serialize for Item {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Item::Entry(e) => e.serialize(s),
            Item::Group(g) => {
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("group", &GroupBody(g))?;
                if let Some(src) = &g.source {
                    map.serialize_entry("source", src)?;
                }
                map.end()
            }
        }
    }
}

/// One capability request (spec §1.7).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The type as written, e.g. `com.docker.sandbox/network-policy@2`.
    pub type_name: String,
    /// The well-known type, when it is one.
    pub known: Option<KnownType>,
    /// Display label only: never identity.
    pub name: Option<String>,
    pub optional: bool,
    pub description: Option<String>,
    /// The config as written; `Some(null)` when the key was stated as null.
    pub config: Option<Node>,
    pub source: Option<SourceRef>,
    /// Whether the config still holds `${{ kit.args.* }}` / `${{ kit.env.* }}` references.
    pub parameterized: bool,
    /// The typed config: set for well-known types whose config is literal and valid.
    pub capability: Option<Capability>,
    /// Where the entry's `type` was written (unknown for merged entries).
    pub type_pos: Place,
}

/// Where something was written, for messages only: equal to every other place, so that
/// the same entry written on two lines is still the same entry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Place(pub Pos);

impl PartialEq for Place {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("type", &self.type_name)?;
        if let Some(n) = &self.name {
            map.serialize_entry("name", n)?;
        }
        if self.optional {
            map.serialize_entry("optional", &true)?;
        }
        if let Some(d) = &self.description {
            map.serialize_entry("description", d)?;
        }
        if let Some(c) = &self.config {
            map.serialize_entry("config", c)?;
        }
        if let Some(src) = &self.source {
            map.serialize_entry("source", src)?;
        }
        map.end()
    }
}

/// Entries selected together or not at all (spec §1.10).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: Option<String>,
    pub description: Option<String>,
    pub optional: bool,
    pub capabilities: Vec<Entry>,
    pub source: Option<SourceRef>,
}

struct GroupBody<'g>(&'g Group);

impl Serialize for GroupBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let g = self.0;
        let mut map = s.serialize_map(None)?;
        if let Some(n) = &g.name {
            map.serialize_entry("name", n)?;
        }
        if let Some(d) = &g.description {
            map.serialize_entry("description", d)?;
        }
        if g.optional {
            map.serialize_entry("optional", &true)?;
        }
        map.serialize_entry("capabilities", &g.capabilities)?;
        map.end()
    }
}

/// Diagnostic provenance of an entry: never trust or identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kit: Option<String>,
    pub path: String,
}
