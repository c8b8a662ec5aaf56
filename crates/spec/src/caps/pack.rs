//! capgate's own capability types (namespace `dev.capgate`), for the pack model of seed 002:
//! what a pack promises about its behaviour, beside what it may reach.
//!
//! The kit format grows through types (spec §7.3), so these are ordinary typed entries: a
//! kit that uses them reads strictly here, and a runtime that does not know them refuses a
//! required one by name instead of ignoring it.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;

use crate::node::{Node, Path};
use crate::read::Cx;

/// How reproducible a workload promises to be (seed 002, "Determinism tiers"). The order is
/// the order of trust: each tier promises less than the one before.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    serde::Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The same input gives the same output: the workload reads, never changes anything
    /// outside its sandbox. capgate holds it to that: only `GET`, `HEAD` and `OPTIONS`
    /// requests leave the sandbox, all of them inspected.
    ReadOnly,
    /// The workload makes changes outside the sandbox (posts a message, writes a record).
    SideEffect,
    /// An opaque workload; implies `side-effect`.
    Unrestricted,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::ReadOnly, Tier::SideEffect, Tier::Unrestricted];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::ReadOnly => "read-only",
            Tier::SideEffect => "side-effect",
            Tier::Unrestricted => "unrestricted",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `dev.capgate/determinism@1`: the workload's determinism tier. One per kit; kits of one
/// composition that name different tiers are refused (a workload has one tier).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Determinism {
    /// `read-only`, `side-effect` or `unrestricted`.
    pub tier: Tier,
}

pub(crate) fn decode_determinism(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Determinism> {
    let mut f = cx.fields(node, path)?;
    let tier = f.required_string(cx, "tier").map(|s| (s, f.at("tier")));
    f.finish(cx);
    let (written, at) = tier?;
    if !cx.judgeable(written) {
        return None;
    }
    match Tier::parse(written) {
        Some(tier) => Some(Determinism { tier }),
        None => {
            cx.error(
                &at,
                crate::caps::storage::node_pos(node, "tier"),
                format!(
                    "tier `{written}` is not one of `read-only`, `side-effect`, `unrestricted`"
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn decode_text(text: &str) -> (Option<Determinism>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
        assert!(diags.is_empty(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        let d = decode_determinism(&mut cx, &node, &Path::from(AT));
        (d, diags)
    }

    #[test]
    fn reads_each_tier_strictly() {
        for t in Tier::ALL {
            let (d, diags) = decode_text(&format!("tier: {t}\n"));
            assert!(!diags.has_errors(), "{diags:?}");
            assert_eq!(d, Some(Determinism { tier: t }));
        }
        for (text, path, fragment) in [
            ("{}", AT, "`tier` is required"),
            (
                "tier: readonly\n",
                "capabilities[0].config.tier",
                "not one of",
            ),
            ("tier: 3\n", "capabilities[0].config.tier", "string"),
            (
                "tier: read-only\ncache: true\n",
                "capabilities[0].config.cache",
                "unknown field `cache`",
            ),
            ("[read-only]", AT, "mapping"),
        ] {
            let (d, diags) = decode_text(text);
            assert!(diags.contains(path, fragment), "{text}: {diags:?}");
            if !text.contains("cache") {
                assert_eq!(d, None, "{text}");
            }
        }
    }

    #[test]
    fn tiers_round_trip_and_order_by_trust() {
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.as_str()), Some(t));
        }
        assert!(Tier::ReadOnly < Tier::SideEffect && Tier::SideEffect < Tier::Unrestricted);
        assert_eq!(Tier::parse("readonly"), None);
        assert_eq!(Tier::parse("Read-Only"), None);
    }
}
