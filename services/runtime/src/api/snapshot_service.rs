//! SnapshotService: take, find, list and delete snapshots of workspaces (`crate::snapshots`); the restore
//! is CreateSandbox's, with `spec.snapshot_id` (`SandboxApi`).

use std::collections::BTreeMap;
use std::sync::Arc;

use mentis_core::{Error, Reason, SpaceId, quoted};
use mentis_proto::api::{self, snapshot_service_server::SnapshotService};
use tonic::{Request, Response, Status};

use super::access::{self, caller};
use super::paging;
use super::status::to_status;
use crate::auth::Caller;
use crate::convert::timestamp;
use crate::sandboxes::Manager;
use crate::sandboxes::{SnapshotFilter, SnapshotRecord};

/// Implementation of `mentis.v1.SnapshotService`.
#[derive(Debug, Clone)]
pub struct SnapshotApi {
    manager: Arc<Manager>,
}

impl SnapshotApi {
    pub fn new(manager: Arc<Manager>) -> Self {
        Self { manager }
    }
}

/// A snapshot id as clients send it: a UUID, else INVALID_ARGUMENT naming `field`.
pub fn parse_id(raw: &str, field: &str) -> Result<String, Error> {
    if raw.is_empty() {
        return Err(Error::invalid(format!("{field} is required")).at(field));
    }
    uuid::Uuid::try_parse(raw)
        .map(|u| u.to_string())
        .map_err(|_| Error::invalid(format!("{field} {} is not a UUID", quoted(raw))).at(field))
}

/// The record of snapshot `raw` when the caller may see it (SNAPSHOT_NOT_FOUND when unknown, the space's
/// refusal when it is another space's).
pub fn find(
    manager: &Manager,
    caller: &Caller,
    raw: &str,
    field: &str,
) -> Result<SnapshotRecord, Error> {
    let id = parse_id(raw, field)?;
    let record = manager.snapshot(&id).map_err(|e| e.at(field))?;
    caller.require_space_of(
        &SpaceId::parse(&record.space_id)?,
        &format!("snapshot {id}"),
        None,
    )?;
    Ok(record)
}

pub fn snapshot_to_proto(s: &SnapshotRecord) -> api::Snapshot {
    api::Snapshot {
        snapshot_id: s.id.clone(),
        sandbox_id: s.sandbox_id.clone(),
        space_id: s.space_id.clone(),
        labels: s.labels.clone().into_iter().collect(),
        create_time: Some(timestamp(s.created_at)),
        size_bytes: s.size,
        archive_bytes: s.archive_bytes,
        sha256: s.sha256.clone(),
        store: s.store.clone(),
    }
}

#[tonic::async_trait]
impl SnapshotService for SnapshotApi {
    async fn create_snapshot(
        &self,
        req: Request<api::CreateSnapshotRequest>,
    ) -> Result<Response<api::CreateSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let labels: BTreeMap<String, String> = r.labels.into_iter().collect();
        mentis_core::check_labels(&labels, "labels").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let record = self
            .manager
            .take_snapshot(sandbox, labels)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::CreateSnapshotResponse {
            snapshot: Some(snapshot_to_proto(&record)),
        }))
    }

    async fn get_snapshot(
        &self,
        req: Request<api::GetSnapshotRequest>,
    ) -> Result<Response<api::GetSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let record = find(
            &self.manager,
            &caller,
            &req.into_inner().snapshot_id,
            "snapshot_id",
        )
        .map_err(to_status)?;
        Ok(Response::new(api::GetSnapshotResponse {
            snapshot: Some(snapshot_to_proto(&record)),
        }))
    }

    async fn list_snapshots(
        &self,
        req: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<api::ListSnapshotsResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let limit = paging::page_size(r.page_size).map_err(to_status)?;
        let before =
            paging::page_token(&r.page_token, |t| parse_id(t, "page_token")).map_err(to_status)?;
        let sandbox = if r.sandbox_id.is_empty() {
            None
        } else {
            Some(
                mentis_core::SandboxId::parse(&r.sandbox_id)
                    .map_err(to_status)?
                    .to_string(),
            )
        };
        let spaces = if r.space_id.is_empty() {
            caller
                .spaces()
                .map(|s| s.iter().map(ToString::to_string).collect())
        } else {
            let space = SpaceId::parse(&r.space_id).map_err(to_status)?;
            caller.require_space(&space).map_err(to_status)?;
            Some(vec![space.to_string()])
        };
        let labels: BTreeMap<String, String> = r.labels.into_iter().collect();
        let filter = SnapshotFilter {
            sandbox_id: sandbox.as_deref(),
            spaces,
            labels: Some(&labels),
            before: before.as_deref(),
            limit: 0,
        };
        let (found, more) = self
            .manager
            .list_snapshots(filter, limit)
            .map_err(to_status)?;
        let next_page_token = match found.last() {
            Some(last) if more => last.id.clone(),
            _ => String::new(),
        };
        Ok(Response::new(api::ListSnapshotsResponse {
            snapshots: found.iter().map(snapshot_to_proto).collect(),
            next_page_token,
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<api::DeleteSnapshotRequest>,
    ) -> Result<Response<api::DeleteSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let raw = req.into_inner().snapshot_id;
        match find(&self.manager, &caller, &raw, "snapshot_id") {
            Ok(record) => {
                self.manager
                    .delete_snapshot(&record)
                    .await
                    .map_err(to_status)?;
                Ok(Response::new(api::DeleteSnapshotResponse {}))
            }
            Err(e) if e.reason() == Reason::SnapshotNotFound => {
                Ok(Response::new(api::DeleteSnapshotResponse {}))
            }
            Err(e) => Err(to_status(e)),
        }
    }
}
