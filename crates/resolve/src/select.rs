//! Selection (spec §1.10, §7.3): which declared entries this runtime honours.
//!
//! The runtime supports one explicit list of types. A required entry of any other type
//! refuses the composition, naming the type; an optional one is skipped and recorded. A
//! group is selected only if every member is; its members then stand in its place.

use capgate_spec::caps::KnownType;
use capgate_spec::{Descriptor, Entry, Item};
use serde::Serialize;

use crate::problem::Refusal;

/// The well-known types capgate does not honour yet: a required entry of one of these
/// refuses the composition instead of being silently ignored.
pub const UNSUPPORTED: [KnownType; 3] = [
    KnownType::UsbDevice,
    KnownType::Privileged,
    KnownType::KitRegistry,
];

/// The capability types this runtime honours: every well-known type but [`UNSUPPORTED`].
pub fn supported_types() -> Vec<KnownType> {
    KnownType::ALL
        .into_iter()
        .filter(|t| !UNSUPPORTED.contains(t))
        .collect()
}

/// The runtime's answer for one declared entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where an entry came from, as the runtime stamps it before selection (spec §8.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceRecord {
    pub kit: String,
    pub path: String,
}

/// What selection decided for one item (an ordinary entry or a group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectionRecord {
    /// The item's path, e.g. `capabilities[1]`.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub source: SourceRecord,
    /// The member paths (`[capabilities[0]]` for an ordinary entry).
    pub members: Vec<String>,
    /// The members the runtime refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
    pub decisions: Vec<Decision>,
}

impl SelectionRecord {
    /// Why the item was not selected, in one sentence.
    pub fn reason(&self) -> String {
        self.decisions
            .iter()
            .filter_map(|d| d.message.clone())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// One kit's selection: the selected entries in order (groups flattened) and the records.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub entries: Vec<(String, Entry)>,
    pub selected: Vec<SelectionRecord>,
    pub skipped: Vec<SelectionRecord>,
}

/// The default decision: accept exactly the supported types.
pub fn decide(entry: &Entry) -> Decision {
    match entry.known {
        Some(t) if !UNSUPPORTED.contains(&t) => Decision {
            accepted: true,
            message: None,
        },
        _ => Decision {
            accepted: false,
            message: Some(format!(
                "unsupported capability type `{}`: capgate does not honour it",
                entry.type_name
            )),
        },
    }
}

/// Selects a kit's declarations with `decide`, which is asked about every member, even
/// after a rejection. A rejected required item is a refusal naming the member.
pub fn select(
    reference: &str,
    descriptor: &Descriptor,
    decide: &dyn Fn(&Entry) -> Decision,
) -> (Selection, Vec<Refusal>) {
    let mut out = Selection::default();
    let mut refusals = Vec::new();
    for (i, item) in descriptor.capabilities.iter().enumerate() {
        let path = format!("capabilities[{i}]");
        let (members, name, optional, source): (Vec<(String, &Entry)>, _, _, _) = match item {
            Item::Entry(e) => (
                vec![(path.clone(), e)],
                e.name.clone(),
                e.optional,
                e.source.as_ref(),
            ),
            Item::Group(g) => (
                g.capabilities
                    .iter()
                    .enumerate()
                    .map(|(j, e)| (format!("{path}.group.capabilities[{j}]"), e))
                    .collect(),
                g.name.clone(),
                g.optional,
                g.source.as_ref(),
            ),
        };
        let decisions: Vec<Decision> = members.iter().map(|(_, e)| decide(e)).collect();
        let rejected: Vec<String> = members
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| !d.accepted)
            .map(|((p, _), _)| p.clone())
            .collect();
        let record = SelectionRecord {
            path: path.clone(),
            name,
            source: SourceRecord {
                kit: source
                    .and_then(|s| s.kit.clone())
                    .unwrap_or_else(|| reference.to_owned()),
                path: source.map_or_else(|| path.clone(), |s| s.path.clone()),
            },
            members: members.iter().map(|(p, _)| p.clone()).collect(),
            rejected: rejected.clone(),
            decisions: decisions.clone(),
        };
        if rejected.is_empty() {
            out.entries
                .extend(members.iter().map(|(p, e)| (p.clone(), (*e).clone())));
            out.selected.push(record);
        } else if optional {
            out.skipped.push(record);
        } else {
            for ((p, e), d) in members.iter().zip(&decisions) {
                if !d.accepted {
                    let why = d
                        .message
                        .clone()
                        .unwrap_or_else(|| format!("the runtime refused `{}`", e.type_name));
                    refusals.push(Refusal::at(
                        reference,
                        p,
                        format!("required capability refused: {why}"),
                    ));
                }
            }
            out.skipped.push(record);
        }
    }
    (out, refusals)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn kit(text: &str) -> Descriptor {
        let loaded = capgate_spec::load(text.as_bytes(), &capgate_spec::Options::default());
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        loaded.descriptor.unwrap()
    }

    #[test]
    fn unsupported_required_refuses_and_optional_skips() {
        let d = kit(
            "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/privileged@1\n  - type: com.example.host/gpu@2\n    optional: true\n    config: {x: 1}\n  - type: com.docker.sandbox/long-running@1\n",
        );
        let (sel, refusals) = select("k", &d, &decide);
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].path.as_deref(), Some("capabilities[0]"));
        assert!(
            refusals[0]
                .message
                .contains("com.docker.sandbox/privileged@1")
        );
        assert_eq!(sel.entries.len(), 1);
        assert_eq!(sel.skipped.len(), 2);
        assert_eq!(sel.skipped[1].path, "capabilities[1]");
        assert!(sel.skipped[1].reason().contains("com.example.host/gpu@2"));
    }

    #[test]
    fn a_group_is_selected_whole_or_not_at_all() {
        let d = kit(
            "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/lifecycle@1\n    config: {files: [{path: /var/tmp/base, content: base}]}\n  - group:\n      optional: true\n      capabilities:\n        - type: com.docker.sandbox/volume@1\n          config: {path: /var/tmp/group-volume}\n        - type: com.docker.sandbox/usb-device@1\n          config: {class: \"03\"}\n",
        );
        let (sel, refusals) = select("groups", &d, &decide);
        assert!(refusals.is_empty());
        assert_eq!(
            sel.entries.len(),
            1,
            "the volume is not selected without its partner"
        );
        assert_eq!(
            sel.skipped[0].rejected,
            vec!["capabilities[1].group.capabilities[1]".to_owned()]
        );
        assert_eq!(sel.skipped[0].members.len(), 2);
        assert_eq!(sel.skipped[0].source.kit, "groups");
        // Every member was asked, and the accepted one says so.
        assert!(sel.skipped[0].decisions[0].accepted);
    }
}
