//! What a caller may do: every service asks here before it acts (the auth layer has put the [`Caller`]
//! into the request's extensions).

use mentis_core::{Error, SandboxId};
use tonic::{Request, Status};

use super::status::to_status;
use crate::auth::Caller;
use crate::sandboxes::Manager;

/// The authenticated caller of a request. A request that did not pass the auth layer has none, and is
/// refused.
pub fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions().get::<Caller>().cloned().ok_or_else(|| {
        to_status(Error::Unauthenticated(
            "the call was not authenticated".into(),
        ))
    })
}

/// The caller may act on this sandbox (its space is among the caller's). NotFound first for an unknown
/// sandbox, then PermissionDenied.
pub fn sandbox(caller: &Caller, manager: &Manager, id: SandboxId) -> Result<(), Status> {
    if caller.spaces().is_none() {
        return Ok(());
    }
    let space = manager.space_of(id).map_err(to_status)?;
    caller.require_space(&space).map_err(to_status)
}
