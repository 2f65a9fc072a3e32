//! SandboxService: create, get, list, delete, pause and resume sandboxes, and find one by its key.

use std::sync::Arc;

use std::time::Duration;

use mentis_core::{Error, Reason, Sandbox, SandboxId, SpaceId};
use mentis_proto::api::{self, sandbox_service_server::SandboxService};
use tonic::{Request, Response, Status};

use super::access::{self, caller};
use super::paging;
use super::snapshot_service;
use super::status::to_status;
use crate::convert::{
    egress_mode_from_proto, request_from_proto, rule_from_proto, sandbox_to_proto, state_from_proto,
};
use crate::preview::{self, Previews};
use crate::sandboxes::{ListQuery, Manager};
use mentis_core::egress::EgressMode;

/// Implementation of `mentis.v1.SandboxService`.
#[derive(Debug, Clone)]
pub struct SandboxApi {
    manager: Arc<Manager>,
    previews: Arc<Previews>,
}

impl SandboxApi {
    pub fn new(manager: Arc<Manager>, previews: Arc<Previews>) -> Self {
        Self { manager, previews }
    }

    /// The sandbox and port a preview call names, checked: the caller may use the sandbox, the port is
    /// one (`allow_zero`: 0 stands for every port) and not the executor's.
    fn preview_target(
        &self,
        req: &Request<impl Sized>,
        sandbox_id: &str,
        port: u32,
        allow_zero: bool,
    ) -> Result<(Sandbox, u16), Status> {
        let caller = caller(req)?;
        let id = access::sandbox(&caller, &self.manager, sandbox_id)?;
        // An unknown sandbox is NOT_FOUND whoever asks (the admin's access is not checked against it).
        let (sandbox, _) = self.manager.get(id).map_err(to_status)?;
        let port = match u16::try_from(port) {
            Ok(0) if allow_zero => 0,
            Ok(p) if p > 0 => p,
            _ => {
                return Err(to_status(
                    Error::invalid(format!("port {port} is not a port (1-65535)")).at("port"),
                ));
            }
        };
        if port != 0 && self.manager.is_executor_port(id, port).map_err(to_status)? {
            return Err(to_status(
                Error::invalid(format!(
                    "port {port} is the sandbox's executor, which no preview reaches"
                ))
                .at("port"),
            ));
        }
        Ok((sandbox, port))
    }
}

#[tonic::async_trait]
impl SandboxService for SandboxApi {
    async fn create_sandbox(
        &self,
        req: Request<api::CreateSandboxRequest>,
    ) -> Result<Response<api::CreateSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let spec = req.into_inner().spec;
        let snapshot_id = spec
            .as_ref()
            .map(|s| s.snapshot_id.clone())
            .unwrap_or_default();
        let request = request_from_proto(spec).map_err(to_status)?;
        let space = request.space().map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        let snapshot = if snapshot_id.is_empty() {
            None
        } else {
            Some(
                snapshot_service::find(&self.manager, &caller, &snapshot_id, "spec.snapshot_id")
                    .map_err(to_status)?,
            )
        };
        let sandbox = self
            .manager
            .create(request, snapshot.as_ref(), &caller)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::CreateSandboxResponse {
            sandbox: Some(sandbox_to_proto(&sandbox, 0)),
        }))
    }

    async fn get_sandbox(
        &self,
        req: Request<api::GetSandboxRequest>,
    ) -> Result<Response<api::GetSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let id = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
        let (sandbox, last_seq) = self.manager.get(id).map_err(to_status)?;
        Ok(Response::new(api::GetSandboxResponse {
            sandbox: Some(sandbox_to_proto(&sandbox, last_seq)),
        }))
    }

    async fn list_sandboxes(
        &self,
        req: Request<api::ListSandboxesRequest>,
    ) -> Result<Response<api::ListSandboxesResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let page_size = paging::page_size(r.page_size).map_err(to_status)?;
        let after = paging::page_token(&r.page_token, SandboxId::parse).map_err(to_status)?;
        if !r.space_id.is_empty() {
            let space = SpaceId::parse(&r.space_id).map_err(to_status)?;
            caller.require_space(&space).map_err(to_status)?;
        }
        let states = r
            .states
            .iter()
            .map(|v| state_from_proto(*v))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_status)?;
        let query = ListQuery {
            space_id: (!r.space_id.is_empty()).then_some(r.space_id),
            allowed: caller.spaces().cloned(),
            labels: r.labels.into_iter().collect(),
            states,
            page_size,
            after,
        };
        let (page, more) = self.manager.list(&query);
        let next_page_token = if more {
            page.last()
                .map(|(s, _)| s.id.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(api::ListSandboxesResponse {
            sandboxes: page
                .iter()
                .map(|(s, seq)| sandbox_to_proto(s, *seq))
                .collect(),
            next_page_token,
        }))
    }

    async fn delete_sandbox(
        &self,
        req: Request<api::DeleteSandboxRequest>,
    ) -> Result<Response<api::DeleteSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let id = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
        let found = self.manager.delete(id).await.map_err(to_status)?;
        Ok(Response::new(api::DeleteSandboxResponse { found }))
    }

    async fn pause_sandbox(
        &self,
        req: Request<api::PauseSandboxRequest>,
    ) -> Result<Response<api::PauseSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let id = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
        let sandbox = self.manager.pause(id).await.map_err(to_status)?;
        let (_, last_seq) = self.manager.get(id).map_err(to_status)?;
        Ok(Response::new(api::PauseSandboxResponse {
            sandbox: Some(sandbox_to_proto(&sandbox, last_seq)),
        }))
    }

    async fn resume_sandbox(
        &self,
        req: Request<api::ResumeSandboxRequest>,
    ) -> Result<Response<api::ResumeSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let id = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
        let sandbox = self.manager.resume(id).await.map_err(to_status)?;
        let (_, last_seq) = self.manager.get(id).map_err(to_status)?;
        Ok(Response::new(api::ResumeSandboxResponse {
            sandbox: Some(sandbox_to_proto(&sandbox, last_seq)),
        }))
    }

    async fn get_preview_url(
        &self,
        req: Request<api::GetPreviewUrlRequest>,
    ) -> Result<Response<api::GetPreviewUrlResponse>, Status> {
        let r = req.get_ref();
        let (sandbox, port) = self.preview_target(&req, &r.sandbox_id, r.port, false)?;
        let id = sandbox.id;
        let ttl = Duration::from_secs(r.ttl_seconds.into());
        if ttl > preview::MAX_TTL {
            return Err(to_status(
                Error::invalid(format!(
                    "ttl_seconds is {}; a preview URL lives at most {} seconds",
                    r.ttl_seconds,
                    preview::MAX_TTL.as_secs()
                ))
                .at("ttl_seconds"),
            ));
        }
        if sandbox.state.is_final() {
            return Err(to_status(Error::new(
                Reason::SandboxEnded,
                format!("sandbox {id} has ended; its ports are gone"),
            )));
        }
        let issued = self.previews.issue(id, port, ttl).map_err(to_status)?;
        Ok(Response::new(api::GetPreviewUrlResponse {
            url: issued.url,
            expire_time: Some(crate::convert::timestamp(issued.expires_at)),
            token: issued.token,
            path: issued.path,
        }))
    }

    async fn revoke_preview_urls(
        &self,
        req: Request<api::RevokePreviewUrlsRequest>,
    ) -> Result<Response<api::RevokePreviewUrlsResponse>, Status> {
        let r = req.get_ref();
        let (sandbox, port) = self.preview_target(&req, &r.sandbox_id, r.port, true)?;
        let id = sandbox.id;
        self.previews.revoke(id, port).map_err(to_status)?;
        tracing::info!(sandbox_id = %id, port, "preview URLs revoked");
        Ok(Response::new(api::RevokePreviewUrlsResponse {}))
    }

    async fn list_pools(
        &self,
        req: Request<api::ListPoolsRequest>,
    ) -> Result<Response<api::ListPoolsResponse>, Status> {
        let caller = caller(&req)?;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(api::ListPoolsResponse {
            pools: self
                .manager
                .pool_stats()
                .into_iter()
                // A template's pool shows to those who may see its space.
                .filter(|p| {
                    p.template
                        .as_ref()
                        .is_none_or(|(space, _)| caller.require_space(space).is_ok())
                })
                .map(|p| api::Pool {
                    image: p.image,
                    space_id: p
                        .template
                        .as_ref()
                        .map(|(s, _)| s.to_string())
                        .unwrap_or_default(),
                    template: p.template.map(|(_, t)| t).unwrap_or_default(),
                    min_idle: count(p.min_idle),
                    max_total: count(p.max_total),
                    idle: count(p.idle),
                    creating: count(p.creating),
                    hits: p.hits,
                    misses: p.misses,
                })
                .collect(),
        }))
    }

    async fn update_sandbox(
        &self,
        req: Request<api::UpdateSandboxRequest>,
    ) -> Result<Response<api::UpdateSandboxResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = r.sandbox.unwrap_or_default();
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        if paths.is_empty() {
            return Err(to_status(
                Error::invalid("update_mask names no field: name egress, egress_rules or both")
                    .at("update_mask"),
            ));
        }
        if let Some(other) = paths
            .iter()
            .find(|p| !matches!(p.as_str(), "egress" | "egress_rules"))
        {
            return Err(to_status(
                Error::invalid(format!(
                    "update_mask: {} cannot change on a sandbox (egress, egress_rules can)",
                    mentis_core::quoted(other)
                ))
                .at("update_mask"),
            ));
        }
        let id = access::sandbox(&caller, &self.manager, &sandbox.sandbox_id)?;
        let (current, _) = self.manager.get(id).map_err(to_status)?;
        let named = |p: &str| paths.iter().any(|x| x == p);
        let mode = if named("egress") {
            egress_mode_from_proto(sandbox.egress)
                .map_err(|e| to_status(e.within("sandbox")))?
                .ok_or_else(|| {
                    to_status(
                        Error::invalid(
                            "sandbox.egress: name EGRESS_DENY, EGRESS_ALLOW or EGRESS_RULES",
                        )
                        .at("sandbox.egress"),
                    )
                })?
        } else {
            current.egress.mode()
        };
        let rules = if named("egress_rules") {
            sandbox
                .egress_rules
                .into_iter()
                .map(rule_from_proto)
                .collect()
        } else if mode == EgressMode::Rules {
            current.egress.to_requests()
        } else {
            Vec::new()
        };
        let egress =
            mentis_core::egress::validate(Some(mode), rules, &current.egress, "sandbox.egress")
                .map_err(to_status)?;
        let updated = self
            .manager
            .update_egress(id, egress)
            .await
            .map_err(to_status)?;
        tracing::info!(sandbox_id = %id, "sandbox egress updated");
        Ok(Response::new(api::UpdateSandboxResponse {
            sandbox: Some(sandbox_to_proto(&updated, 0)),
        }))
    }

    async fn list_egress_denials(
        &self,
        req: Request<api::ListEgressDenialsRequest>,
    ) -> Result<Response<api::ListEgressDenialsResponse>, Status> {
        let caller = caller(&req)?;
        let id = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
        let denials = self.manager.egress_denials(id).map_err(to_status)?;
        Ok(Response::new(api::ListEgressDenialsResponse {
            denials: denials
                .into_iter()
                .map(|d| api::EgressDenial {
                    time: Some(crate::convert::timestamp(d.time)),
                    protocol: d.denial.protocol.to_owned(),
                    name: d.denial.name.unwrap_or_default(),
                    address: d.denial.address.map(|a| a.to_string()).unwrap_or_default(),
                    reason: d.denial.reason,
                })
                .collect(),
        }))
    }

    async fn get_sandbox_by_key(
        &self,
        req: Request<api::GetSandboxByKeyRequest>,
    ) -> Result<Response<api::GetSandboxByKeyResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = SpaceId::parse_or_default(&r.space_id).map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        mentis_core::sandbox::validate_external_key(&r.external_key).map_err(to_status)?;
        let (sandbox, last_seq) = self
            .manager
            .get_by_key(&space, &r.external_key)
            .map_err(to_status)?;
        Ok(Response::new(api::GetSandboxByKeyResponse {
            sandbox: Some(sandbox_to_proto(&sandbox, last_seq)),
        }))
    }
}
