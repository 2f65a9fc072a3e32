//! The Jupyter kernel of a sandbox, as clients see it: variable summaries, and (from the shared model) the
//! rules for asking for them.

pub use mentis_model::kernel::{MAX_INSPECT_NAMES, MAX_VARIABLE_NAME_LEN, validate_names};

/// A JSON summary of one variable of the kernel's user namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSummary {
    pub name: String,
    /// Python type name.
    pub type_name: String,
    pub summary: serde_json::Map<String, serde_json::Value>,
}
