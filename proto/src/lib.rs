//! Generated code for the MentisSandbox protos: the public `mentis.v1` API and the internal
//! `mentis.executor.v1` API spoken between the control plane and each sandbox's executor.
#![allow(clippy::all, missing_docs, unreachable_pub)]

pub mod mentis {
    pub mod v1 {
        tonic::include_proto!("mentis.v1");
    }
    pub mod executor {
        pub mod v1 {
            tonic::include_proto!("mentis.executor.v1");
        }
    }
}

pub use mentis::executor::v1 as executor;
pub use mentis::v1 as api;

/// Encoded FileDescriptorSet of the public `mentis.v1` protos (with their imports), for server reflection.
pub const PUBLIC_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("mentis_v1_descriptor");
