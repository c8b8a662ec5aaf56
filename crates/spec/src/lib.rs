//! capgate-spec: kit descriptors (kit specification v3) read strictly and validated
//! completely. Pure: bytes in, values and diagnostics out; no I/O.
//!
//! Start at [`load`]: it reads YAML or JSON text into a [`Descriptor`] and reports every
//! problem with its field path and `line:column`.
#![forbid(unsafe_code)]

pub mod args;
pub mod canonical;
pub mod caps;
pub mod descriptor;
pub mod diag;
mod load;
pub mod names;
pub mod node;
pub mod read;
pub mod reference;
pub mod refs;
pub mod schema;
pub mod text;
pub mod yaml;

pub use descriptor::{ArgDecl, Descriptor, Entry, Group, Item, Kind, KitEntry, SourceRef};
pub use diag::{Diagnostic, Diagnostics, Severity};
pub use load::{
    BUDGET_ERROR_BYTES, BUDGET_WARNING_BYTES, Loaded, Options, Profile, load, load_tree,
};
