//! TemplateService: create, get, list, update and delete the templates of a space (docs/ARCHITECTURE.md,
//! "Templates"). A key scoped to spaces manages the templates of its spaces.

use std::sync::Arc;

use mentis_core::template::check_name;
use mentis_core::{Error, SpaceId};
use mentis_proto::api::{self, template_service_server::TemplateService};
use tonic::{Request, Response, Status};

use super::access::{self, caller};
use super::paging;
use super::status::to_status;
use crate::convert::{template_from_proto, template_to_proto, template_update_from_proto};
use crate::sandboxes::Manager;

/// Implementation of `mentis.v1.TemplateService`.
#[derive(Debug, Clone)]
pub struct TemplateApi {
    manager: Arc<Manager>,
}

impl TemplateApi {
    pub fn new(manager: Arc<Manager>) -> Self {
        Self { manager }
    }
}

fn space_of(raw: &str) -> Result<SpaceId, Status> {
    SpaceId::parse_or_default(raw).map_err(to_status)
}

#[tonic::async_trait]
impl TemplateService for TemplateApi {
    type BuildImageStream = super::images::BuildStream;

    async fn build_image(
        &self,
        req: Request<tonic::Streaming<api::BuildImageRequest>>,
    ) -> Result<Response<Self::BuildImageStream>, Status> {
        access::admin(&req, "BuildImage")?;
        let stream = super::images::build(&self.manager, req.into_inner()).await?;
        Ok(Response::new(stream))
    }

    async fn import_image(
        &self,
        req: Request<tonic::Streaming<api::ImportImageRequest>>,
    ) -> Result<Response<api::ImportImageResponse>, Status> {
        access::admin(&req, "ImportImage")?;
        let response = super::images::import(&self.manager, req.into_inner()).await?;
        Ok(Response::new(response))
    }

    async fn share_image(
        &self,
        req: Request<api::ShareImageRequest>,
    ) -> Result<Response<api::ShareImageResponse>, Status> {
        access::admin(&req, "ShareImage")?;
        let r = req.into_inner();
        if r.image.is_empty() {
            return Err(to_status(Error::invalid("image is required").at("image")));
        }
        mentis_core::image::check_reference(&r.image).map_err(|cause| {
            to_status(
                Error::invalid(format!(
                    "image {} is not a valid image reference: {cause}",
                    mentis_core::quoted(&r.image)
                ))
                .at("image"),
            )
        })?;
        let owner = self
            .manager
            .images()
            .share(&r.image, r.shared)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ShareImageResponse {
            image: Some(super::images::built_image(r.image, owner)),
        }))
    }

    async fn create_template(
        &self,
        req: Request<api::CreateTemplateRequest>,
    ) -> Result<Response<api::CreateTemplateResponse>, Status> {
        let caller = caller(&req)?;
        let template = template_from_proto(req.into_inner().template).map_err(to_status)?;
        caller
            .require_space(&template.space_id)
            .map_err(to_status)?;
        if !template.image.is_empty() {
            self.manager
                .images()
                .check_use(&caller, &template.space_id, &template.image)
                .await
                .map_err(to_status)?;
        }
        let template = self
            .manager
            .create_template(&caller, template)
            .map_err(to_status)?;
        Ok(Response::new(api::CreateTemplateResponse {
            template: Some(template_to_proto(&template)),
        }))
    }

    async fn get_template(
        &self,
        req: Request<api::GetTemplateRequest>,
    ) -> Result<Response<api::GetTemplateResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = space_of(&r.space_id)?;
        check_name(&r.name, "name").map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        let template = self
            .manager
            .get_template(&space, &r.name)
            .map_err(to_status)?;
        Ok(Response::new(api::GetTemplateResponse {
            template: Some(template_to_proto(&template)),
        }))
    }

    async fn list_templates(
        &self,
        req: Request<api::ListTemplatesRequest>,
    ) -> Result<Response<api::ListTemplatesResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = space_of(&r.space_id)?;
        caller.require_space(&space).map_err(to_status)?;
        let page_size = paging::page_size(r.page_size).map_err(to_status)?;
        let after = paging::page_token(&r.page_token, |t| {
            check_name(t, "page_token").map(|()| t.to_owned())
        })
        .map_err(to_status)?
        .unwrap_or_default();
        let (page, more) = self
            .manager
            .list_templates(&space, &after, page_size)
            .map_err(to_status)?;
        let next_page_token = if more {
            page.last().map(|t| t.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(api::ListTemplatesResponse {
            templates: page.iter().map(template_to_proto).collect(),
            next_page_token,
        }))
    }

    async fn update_template(
        &self,
        req: Request<api::UpdateTemplateRequest>,
    ) -> Result<Response<api::UpdateTemplateResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let (space, name, update) =
            template_update_from_proto(r.template, r.update_mask).map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        if let Some(image) = update.image.as_deref().filter(|i| !i.is_empty()) {
            self.manager
                .images()
                .check_use(&caller, &space, image)
                .await
                .map_err(to_status)?;
        }
        let template = self
            .manager
            .update_template(&caller, &space, &name, update)
            .map_err(to_status)?;
        Ok(Response::new(api::UpdateTemplateResponse {
            template: Some(template_to_proto(&template)),
        }))
    }

    async fn delete_template(
        &self,
        req: Request<api::DeleteTemplateRequest>,
    ) -> Result<Response<api::DeleteTemplateResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let space = space_of(&r.space_id)?;
        check_name(&r.name, "name").map_err(to_status)?;
        caller.require_space(&space).map_err(to_status)?;
        self.manager
            .delete_template(&space, &r.name)
            .map_err(to_status)?;
        Ok(Response::new(api::DeleteTemplateResponse {}))
    }
}
