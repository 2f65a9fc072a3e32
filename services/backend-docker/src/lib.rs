//! Docker backend.
