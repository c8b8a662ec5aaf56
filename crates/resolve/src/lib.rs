//! capgate-resolve: one workload plus its mixins composed into one grant set, projected onto
//! the normalized permission surface, locked, and gated against widening. Pure: values in,
//! values out; no I/O.
#![forbid(unsafe_code)]

pub mod compose;
pub mod lint;
pub mod lock;
pub mod plan;
pub mod problem;
pub mod resolve;
pub mod select;
pub mod surface;
pub mod widen;

pub use compose::{Composed, Contribution, compose};
pub use lock::{KitWidening, Lock, LockError, LockedKit, digest_of};
pub use plan::{Plan, Skipped, plan};
pub use problem::Refusal;
pub use resolve::{Resolution, Unit, resolve};
pub use surface::{Surface, surface_of, surface_of_entries};
pub use widen::{Category, Widening, diff_widenings};
