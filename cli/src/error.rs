//! How a command fails, and the exit status of one that ran to its end.

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// A call was refused or failed: `mentis: <CODE>: <message>`.
    Rpc(tonic::Status),
    /// Arguments clap cannot check alone: `mentis: <message>`, exit status 2.
    Usage(String),
    /// Anything else (a local file, the connection, ...).
    Other(anyhow::Error),
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Self::Rpc(s)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Other(e.into())
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

pub use mentis_proto::code_name;

/// Exit status of a command that ran to its end.
pub type Status = u8;
