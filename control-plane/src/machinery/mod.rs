//! API machinery shared by the API server's handlers: pure functions over API objects, no I/O.
//! Status errors, selectors, patches, per-kind defaulting, validation and table columns.

pub mod status;

pub use status::{ApiError, CauseType, FieldError, Reason};
