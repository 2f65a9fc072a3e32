//! What a caller may do: every service asks here before it acts (the auth layer has put the [`Caller`]
//! into the request's extensions).

use mentis_core::{Error, Resource, SandboxId};
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

/// PermissionDenied unless the request comes from the admin; `what` names the call.
pub fn admin<T>(req: &Request<T>, what: &str) -> Result<(), Status> {
    caller(req)?.require_admin(what).map_err(to_status)
}

/// The sandbox `raw` names (InvalidArgument if it is no id), if the caller may act on it (its space is
/// among the caller's): NotFound first for an unknown sandbox, then PermissionDenied.
pub fn sandbox(caller: &Caller, manager: &Manager, raw: &str) -> Result<SandboxId, Status> {
    let id = SandboxId::parse(raw).map_err(to_status)?;
    if caller.spaces().is_some() {
        let space = manager.space_of(id).map_err(to_status)?;
        caller
            .require_space_of(
                &space,
                &format!("sandbox {id}"),
                Some(Resource::sandbox(id)),
            )
            .map_err(to_status)?;
    }
    Ok(id)
}
