//! API machinery shared by the API server's handlers: pure functions over API objects, no I/O.
//! Status errors, selectors, patches, per-kind defaulting, validation and table columns.

// ApiError is the Status the client gets; it is built only on the failure path, so its size
// (code, reason, message, details, causes) costs nothing where it matters.
#![allow(clippy::result_large_err)]

pub mod cron;
pub mod duration;
pub mod fieldmanager;
pub mod group_kind;
pub mod index_set;
pub mod jsonpath;
pub mod kinds;
pub mod patch;
pub mod quantity;
pub mod quota;
pub mod schema;
pub mod selectors;
pub mod status;
pub mod strict;
pub mod table;
pub mod validation;

pub use group_kind::GroupKind;
pub use kinds::{rules, KindRules};
pub use patch::PatchType;
pub use quantity::Quantity;
pub use selectors::{
    node_selector_matches, node_selector_term_matches, FieldRequirement, FieldSelector,
    LabelSelector,
};
pub use status::{ApiError, CauseType, FieldError, Reason};
pub use table::TableColumnDefinition;
