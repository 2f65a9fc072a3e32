//! Public proto (`mentis.v1`) ⇄ domain translation, the API's edge. Validation happens here too: a proto
//! value that converts is a valid domain value. (The executor wire and the journal have schemas and
//! conversions of their own, in mentis-app's `executor_client::convert` and `observations::record`.)

mod action;
mod file;
mod kernel;
mod observation;
mod process;
mod sandbox;
mod space;
mod template;
mod terminal;

pub use action::action_from_proto;
pub use file::{file_to_proto, unpacked_to_proto};
pub use kernel::summary_to_proto;
pub use observation::{kind_to_proto, observation_to_proto, observation_to_proto_head, timestamp};
pub use process::process_to_proto;
pub use sandbox::{
    egress_mode_from_proto, egress_to_proto, request_from_proto, rule_from_proto, sandbox_to_proto,
    state_from_proto,
};
pub use space::{space_from_proto, space_to_proto, update_from_proto};
pub use template::{template_from_proto, template_to_proto, template_update_from_proto};
pub use terminal::{terminal_info_to_proto, terminal_input_from_proto, terminal_output_to_proto};
