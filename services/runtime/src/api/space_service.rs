//! SpaceService: create, get, list, update and delete spaces.

use std::sync::Arc;

use mentis_core::SpaceId;
use mentis_proto::api::{self, space_service_server::SpaceService};
use tonic::{Request, Response, Status};

use super::access::{self, caller};
use super::paging;
use super::status::to_status;
use crate::convert::{space_from_proto, space_to_proto, update_from_proto};
use crate::sandboxes::Manager;

/// Implementation of `mentis.v1.SpaceService`.
#[derive(Debug, Clone)]
pub struct SpaceApi {
    manager: Arc<Manager>,
}

impl SpaceApi {
    pub fn new(manager: Arc<Manager>) -> Self {
        Self { manager }
    }
}

#[tonic::async_trait]
impl SpaceService for SpaceApi {
    async fn create_space(
        &self,
        req: Request<api::CreateSpaceRequest>,
    ) -> Result<Response<api::CreateSpaceResponse>, Status> {
        access::admin(&req, "CreateSpace")?;
        let space = space_from_proto(req.into_inner().space).map_err(to_status)?;
        let (space, n) = self.manager.create_space(space).map_err(to_status)?;
        Ok(Response::new(api::CreateSpaceResponse {
            space: Some(space_to_proto(&space, n)),
        }))
    }

    async fn get_space(
        &self,
        req: Request<api::GetSpaceRequest>,
    ) -> Result<Response<api::GetSpaceResponse>, Status> {
        let caller = caller(&req)?;
        let id = SpaceId::parse(&req.into_inner().space_id).map_err(to_status)?;
        caller.require_space(&id).map_err(to_status)?;
        let (space, n) = self.manager.get_space(&id).map_err(to_status)?;
        Ok(Response::new(api::GetSpaceResponse {
            space: Some(space_to_proto(&space, n)),
        }))
    }

    async fn list_spaces(
        &self,
        req: Request<api::ListSpacesRequest>,
    ) -> Result<Response<api::ListSpacesResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let page_size = paging::page_size(r.page_size).map_err(to_status)?;
        let after = paging::page_token(&r.page_token, SpaceId::parse).map_err(to_status)?;
        let (page, more) = self.manager.list_spaces(
            after.as_ref().map(SpaceId::as_str),
            page_size,
            caller.spaces(),
        );
        let next_page_token = if more {
            page.last()
                .map(|(s, _)| s.id.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(api::ListSpacesResponse {
            spaces: page.iter().map(|(s, n)| space_to_proto(s, *n)).collect(),
            next_page_token,
        }))
    }

    async fn update_space(
        &self,
        req: Request<api::UpdateSpaceRequest>,
    ) -> Result<Response<api::UpdateSpaceResponse>, Status> {
        access::admin(&req, "UpdateSpace")?;
        let r = req.into_inner();
        let (id, update) = update_from_proto(r.space, r.update_mask).map_err(to_status)?;
        let (space, n) = self.manager.update_space(&id, update).map_err(to_status)?;
        Ok(Response::new(api::UpdateSpaceResponse {
            space: Some(space_to_proto(&space, n)),
        }))
    }

    async fn delete_space(
        &self,
        req: Request<api::DeleteSpaceRequest>,
    ) -> Result<Response<api::DeleteSpaceResponse>, Status> {
        access::admin(&req, "DeleteSpace")?;
        let r = req.into_inner();
        let id = SpaceId::parse(&r.space_id).map_err(to_status)?;
        self.manager
            .delete_space(&id, r.force)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::DeleteSpaceResponse {}))
    }

    async fn set_secret(
        &self,
        req: Request<api::SetSecretRequest>,
    ) -> Result<Response<api::SetSecretResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = SpaceId::parse_or_default(&r.space_id).map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        self.manager
            .set_secret(&space, &r.name, &r.value)
            .map_err(to_status)?;
        Ok(Response::new(api::SetSecretResponse {}))
    }

    async fn list_secrets(
        &self,
        req: Request<api::ListSecretsRequest>,
    ) -> Result<Response<api::ListSecretsResponse>, Status> {
        let caller = caller(&req)?;
        let space = SpaceId::parse_or_default(&req.into_inner().space_id).map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        let names = self.manager.secret_names(&space).map_err(to_status)?;
        Ok(Response::new(api::ListSecretsResponse { names }))
    }

    async fn delete_secret(
        &self,
        req: Request<api::DeleteSecretRequest>,
    ) -> Result<Response<api::DeleteSecretResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = SpaceId::parse_or_default(&r.space_id).map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        self.manager
            .delete_secret(&space, &r.name)
            .map_err(to_status)?;
        Ok(Response::new(api::DeleteSecretResponse {}))
    }
}
