//! The lock (spec §5.5, §7.4): what the user approved, per kit, and the gate that stops a
//! candidate composition that widens it.
//!
//! The lock records, per kit in layer order, its reference, the digest of its descriptor
//! bytes, its kind, its resolved args and its surface *as declared*: every capability the
//! kit asks for after arg expansion — optional entries and group members included, before
//! selection — so an approval covers everything the kit requests, even what this runtime
//! does not honour yet; its denies, though, are only those it enforces (see
//! `gated_surface`). The gate matches kits by reference.

use std::collections::BTreeMap;

use capgate_spec::Kind;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::plan::Plan;
use crate::resolve::Unit;
use crate::select::Selection;
use crate::surface::{Surface, credential_injects, surface_of, surface_of_entries};
use crate::widen::{Category, Widening, diff_widenings};

/// The only lock format this reader reads.
pub const LOCK_VERSION: u64 = 1;

/// A lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u64,
    pub kits: Vec<LockedKit>,
}

/// One approved kit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedKit {
    /// The reference the kit was composed under; the gate matches by it.
    pub reference: String,
    /// `sha256:<hex>` of the descriptor bytes.
    pub digest: String,
    pub kind: Kind,
    /// Resolved create-arg values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// The kit's declared surface.
    pub permissions: Surface,
    /// Where its credentials' real values go ([`credential_injects`]); capgate's own
    /// field beside the spec's surface. A lock written before it existed has none, so its
    /// first gate asks once for every inject.
    #[serde(
        default,
        rename = "credentialInjects",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub credential_injects: Vec<String>,
}

/// A lock that cannot be used. It is never silently replaced.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LockError {
    #[error("{line}:{column}: the lock is not valid: {message}")]
    Malformed {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("capgate lock version {found} is not supported (this reader reads {LOCK_VERSION})")]
    UnsupportedVersion { found: String },
}

/// A widening, attributed to the kit whose declared surface widens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KitWidening {
    pub kit: String,
    pub category: Category,
    pub detail: String,
}

impl Lock {
    /// The lock that approves exactly this plan.
    pub fn from_plan(plan: &Plan) -> Lock {
        Lock {
            version: LOCK_VERSION,
            kits: plan
                .layered_selections()
                .map(|(u, selection)| LockedKit {
                    reference: u.reference.clone(),
                    digest: u.digest.clone(),
                    kind: u.descriptor.kind,
                    args: u.args.clone(),
                    permissions: gated_surface(u, selection),
                    credential_injects: declared_injects(u),
                })
                .collect(),
        }
    }

    /// Reads a lock: the version is checked first, then the shape strictly.
    pub fn parse(bytes: &[u8]) -> Result<Lock, LockError> {
        let malformed = |e: serde_json::Error| LockError::Malformed {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(malformed)?;
        match value.get("version") {
            Some(v) if v.as_u64() == Some(LOCK_VERSION) => {}
            Some(v) => {
                return Err(LockError::UnsupportedVersion {
                    found: v.to_string(),
                });
            }
            None => {
                return Err(LockError::Malformed {
                    line: 1,
                    column: 1,
                    message: "no `version` field".to_owned(),
                });
            }
        }
        serde_json::from_slice(bytes).map_err(malformed)
    }

    /// The lock text: stable key order, 2-space indentation, a final newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    fn locked(&self, reference: &str) -> Option<&LockedKit> {
        self.kits.iter().find(|k| k.reference == reference)
    }

    /// Every widening of the candidate over this lock, kit by kit in layer order. A kit the
    /// lock does not know widens by its whole surface; a locked kit the candidate no longer
    /// composes takes its denies with it, each a removed deny (then the kits dropped, in
    /// lock order). Empty: the update may apply silently.
    pub fn gate(&self, candidate: &Plan) -> Vec<KitWidening> {
        let empty = Surface::default();
        let composed: Vec<&str> = candidate
            .layered_units()
            .map(|u| u.reference.as_str())
            .collect();
        let dropped = self
            .kits
            .iter()
            .filter(|k| !composed.contains(&k.reference.as_str()))
            .flat_map(|k| {
                diff_widenings(&k.permissions, &empty)
                    .into_iter()
                    .map(|w| KitWidening {
                        kit: k.reference.clone(),
                        category: w.category,
                        detail: w.detail,
                    })
            });
        // Each kit's gated surface, once: compared kit by kit, then merged.
        let surfaces: Vec<(&Unit, Surface)> = candidate
            .layered_selections()
            .map(|(u, selection)| (u, gated_surface(u, selection)))
            .collect();
        let mut widenings = self.gate_composed(&surfaces);
        widenings.extend(dropped);
        // The restrictions bind the composition, not each kit: one kit's list does not
        // bound another's, so a kit that starts stating a list (or a new kit that states
        // one) can widen what the whole is held to while no kit's own surface widens.
        let granted = composed_restrictions(self.kits.iter().map(|k| &k.permissions));
        let said: std::collections::HashSet<(Category, String)> = widenings
            .iter()
            .map(|k| (k.category, k.detail.clone()))
            .collect();
        let candidate = composed_restrictions(surfaces.iter().map(|(_, s)| s));
        for w in diff_widenings(&granted, &candidate) {
            if !said.contains(&(w.category, w.detail.clone())) {
                widenings.push(KitWidening {
                    kit: COMPOSITION.to_owned(),
                    category: w.category,
                    detail: w.detail,
                });
            }
        }
        widenings
    }

    /// Each composed kit's widenings over what the lock granted it (`surfaces`: the
    /// candidate's kits with their gated surfaces, in layer order).
    fn gate_composed(&self, surfaces: &[(&Unit, Surface)]) -> Vec<KitWidening> {
        let empty = Surface::default();
        surfaces
            .iter()
            .flat_map(|(u, surface)| {
                let locked = self.locked(&u.reference);
                let granted = locked.map_or(&empty, |k| &k.permissions);
                let granted_injects = locked.map_or(&[][..], |k| &k.credential_injects[..]);
                let new_injects = declared_injects(u)
                    .into_iter()
                    .filter(|i| !granted_injects.contains(i))
                    .map(|detail| Widening {
                        category: Category::CredentialsInject,
                        detail,
                    });
                let mut widenings = diff_widenings(granted, surface);
                widenings.extend(new_injects);
                widenings.sort_by_key(|w| w.category);
                widenings.into_iter().map(|w| KitWidening {
                    kit: u.reference.clone(),
                    category: w.category,
                    detail: w.detail,
                })
            })
            .collect()
    }
}

/// The surface the lock records and the gate compares for one kit: everything it declares
/// (optional entries and group members included: an approval covers all it asks for), but
/// only the restrictions it enforces, those of its selected entries: denies, write places,
/// read lists, programs, the determinism tier. A restriction that selection leaves out (in
/// an optional group this runtime skips) is not in force, so the gate must not count it as
/// kept: counting declared allows errs towards asking, counting declared restrictions
/// would err towards granting.
fn gated_surface(unit: &Unit, selection: &Selection) -> Surface {
    let mut surface = surface_of(&unit.descriptor);
    let enforced = surface_of_entries(selection.entries.iter().map(|(_, e)| e));
    surface.network_install_deny = enforced.network_install_deny;
    surface.network_runtime_deny = enforced.network_runtime_deny;
    surface.network_install_http_deny = enforced.network_install_http_deny;
    surface.network_runtime_http_deny = enforced.network_runtime_http_deny;
    surface.filesystem_write = enforced.filesystem_write;
    surface.filesystem_read = enforced.filesystem_read;
    surface.exec_allow = enforced.exec_allow;
    surface.determinism = enforced.determinism;
    surface
}

/// What a widening of the composition as a whole (not of one kit) is attributed to.
pub const COMPOSITION: &str = "(the composition: its kits together)";

/// The restrictions kits' surfaces hold the composition to, merged as composition merges
/// them: write places and programs add up over the kits that state them; the workspace
/// is shown whole when one kit that states filesystem@1 reads all of it (no `read`); the
/// widest tier counts. A kit that states none of these adds nothing. Only these fields
/// are set.
fn composed_restrictions<'a>(surfaces: impl IntoIterator<Item = &'a Surface>) -> Surface {
    let mut out = Surface::default();
    let mut reads_all = false;
    for s in surfaces {
        // A kit's write list is there exactly when it states filesystem@1.
        if let Some(write) = &s.filesystem_write {
            out.filesystem_write
                .get_or_insert_with(Vec::new)
                .extend(write.iter().cloned());
            match &s.filesystem_read {
                Some(read) => out
                    .filesystem_read
                    .get_or_insert_with(Vec::new)
                    .extend(read.iter().cloned()),
                None => reads_all = true,
            }
        }
        if let Some(programs) = &s.exec_allow {
            out.exec_allow
                .get_or_insert_with(Vec::new)
                .extend(programs.iter().cloned());
        }
        if let Some(tier) = s.determinism {
            out.determinism = Some(out.determinism.map_or(tier, |t| t.max(tier)));
        }
    }
    if reads_all {
        out.filesystem_read = None;
    }
    out.normalize();
    out
}

/// Every credential destination a kit declares (group members included, like allows).
fn declared_injects(unit: &Unit) -> Vec<String> {
    credential_injects(
        unit.descriptor
            .declared_entries()
            .into_iter()
            .map(|(_, e)| e),
    )
}

/// `sha256:<hex>` of descriptor bytes.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn unknown_versions_are_refused_and_bad_json_located() {
        let e = Lock::parse(br#"{"version": 2, "kits": []}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "capgate lock version 2 is not supported (this reader reads 1)"
        );
        let e = Lock::parse(b"{\"version\": 1,\n \"kits\": [}").unwrap_err();
        assert!(matches!(e, LockError::Malformed { line: 2, .. }), "{e:?}");
        let e = Lock::parse(br#"{"version": 1, "kits": [], "extra": true}"#).unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
    }

    #[test]
    fn round_trip_is_stable() {
        let lock = Lock {
            version: 1,
            kits: vec![LockedKit {
                reference: "examples/kits/shell".into(),
                digest: digest_of(b"x"),
                kind: Kind::Workload,
                args: [
                    ("b".to_owned(), "2".to_owned()),
                    ("a".to_owned(), "1".to_owned()),
                ]
                .into(),
                permissions: Surface {
                    network_runtime_allow: vec!["deb.debian.org".into()],
                    ..Surface::default()
                },
                credential_injects: vec![
                    "runtime github api.github.com Authorization: Bearer %s".into(),
                ],
            }],
        };
        let text = lock.to_json();
        assert!(
            text.starts_with("{\n  \"version\": 1,\n  \"kits\": [\n    {\n      \"reference\"")
        );
        assert!(text.find("\"a\"").unwrap() < text.find("\"b\"").unwrap());
        assert_eq!(Lock::parse(text.as_bytes()).unwrap(), lock);
        assert_eq!(Lock::parse(text.as_bytes()).unwrap().to_json(), text);
    }
}
