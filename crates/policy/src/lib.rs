//! capgate-policy: network rules, one decision function with reasons, the SQLite rule
//! store and the audit log.
//!
//! Rules come from three sources: a kit's grants (provisioned per sandbox, not editable),
//! the user (`capgate policy allow|deny`), and a preset. [`Matcher`] compiles a rule set
//! into maps once and answers every query without scanning rules; deny wins across every
//! scope and source; any error while deciding is a denial.
#![forbid(unsafe_code)]

pub mod audit;
pub mod decision;
pub mod flags;
pub mod matcher;
pub mod path;
pub mod pattern;
pub mod presets;
pub mod provision;
pub mod rule;
pub mod store;

pub use decision::{DenyKind, HttpRequest, Query, Reason, RuleRef, Target, Verdict};
pub use matcher::Matcher;
pub use rule::{CreatedVia, Decision, Method, Phase, Protocol, ResourceType, Rule, Scope, Source};
pub use store::Store;
