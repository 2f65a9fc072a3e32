//! The public gRPC API: proto requests become domain calls on the manager, domain results become protos.
//! This layer (with `status`) is the only one that knows tonic's server side.

pub mod access;
mod action_service;
pub mod authenticate;
mod connect;
pub mod decode;
mod file_service;
pub mod follow;
mod images;
mod key_service;
pub mod outbound;
mod paging;
mod sandbox_service;
pub mod snapshot_service;
mod space_service;
pub mod status;
mod template_service;
mod terminal_service;

pub use action_service::ActionApi;
pub use file_service::FileApi;
pub use key_service::KeyApi;
pub use sandbox_service::SandboxApi;
pub use snapshot_service::SnapshotApi;
pub use space_service::SpaceApi;
pub use template_service::TemplateApi;
pub use terminal_service::TerminalApi;
