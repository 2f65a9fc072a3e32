//! Domain types of the control plane.
