//! TemplateService/BuildImage and ImportImage at the edge (docs/ARCHITECTURE.md, "Templates"): the header
//! read and checked, the upload's chunks written into the application's spool as they arrive, and a
//! build's events turned into the response stream. The rest is `crate::images`.

use std::pin::Pin;

use futures::{Stream, StreamExt as _};
use mentis_core::{Error, ImageBuild, SpaceId};
use mentis_proto::api;
use tonic::{Status, Streaming};

use super::status::to_status;
use crate::images::{self, BuildEvent, ImageOwner, Spooling, Upload};
use crate::sandboxes::Manager;

pub type BuildStream = Pin<Box<dyn Stream<Item = Result<api::BuildImageResponse, Status>> + Send>>;

/// Writes `chunks` (the client's messages after the header) into `spool`.
async fn spool(
    mut spool: Spooling,
    mut chunks: impl Stream<Item = Result<bytes::Bytes, Status>> + Unpin,
) -> Result<Upload, Status> {
    while let Some(chunk) = chunks.next().await {
        spool.write(&chunk?).await.map_err(to_status)?;
    }
    spool.finish().await.map_err(to_status)
}

fn header_first() -> Status {
    to_status(Error::invalid("the first message must be the header").at("header"))
}

/// The space a header names (empty: "default"), which must exist.
fn space(manager: &Manager, raw: &str) -> Result<SpaceId, Status> {
    let space = SpaceId::parse_or_default(raw).map_err(|e| to_status(e.at("header.space_id")))?;
    manager.get_space(&space).map_err(to_status)?;
    Ok(space)
}

/// The public form of an image `image` and who may use it.
pub fn built_image(image: String, owner: ImageOwner) -> api::BuiltImage {
    api::BuiltImage {
        image,
        image_id: owner.image_id,
        space_id: owner
            .space_id
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        shared: owner.shared,
    }
}

/// BuildImage: the header, the context spooled, then the build's events as they come.
pub async fn build(
    manager: &Manager,
    mut requests: Streaming<api::BuildImageRequest>,
) -> Result<BuildStream, Status> {
    let images = manager.images();
    use api::build_image_request::Kind;
    let Some(api::BuildImageRequest {
        kind: Some(Kind::Header(header)),
    }) = requests.message().await?
    else {
        return Err(header_first());
    };
    images::check_image_name(&header.image, "header.image").map_err(to_status)?;
    images::check_build_args(&header.build_args, "header.build_args").map_err(to_status)?;
    let dockerfile =
        images::dockerfile_path(&header.dockerfile, "header.dockerfile").map_err(to_status)?;
    let space = space(manager, &header.space_id)?;
    let chunks = requests.map(|m| match m {
        Ok(api::BuildImageRequest {
            kind: Some(Kind::Context(data)),
        }) => Ok(data),
        Ok(_) => Err(to_status(
            Error::invalid("after the header, only context chunks").at("context"),
        )),
        Err(s) => Err(s),
    });
    let upload = images.context_upload().await.map_err(to_status)?;
    let context = spool(upload, Box::pin(chunks)).await?;
    let build = ImageBuild {
        image: header.image,
        dockerfile,
        build_args: header.build_args.into_iter().collect(),
        no_cache: header.no_cache,
        egress: header.egress,
        ..ImageBuild::default()
    };
    let events = images
        .build(build, space, context)
        .await
        .map_err(to_status)?;
    let responses = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(|event| {
        use api::build_image_response::Kind;
        let kind = match event.map_err(to_status)? {
            BuildEvent::Output(text) => Kind::Output(text),
            BuildEvent::Built { image, owner } => Kind::Image(built_image(image, owner)),
        };
        Ok(api::BuildImageResponse { kind: Some(kind) })
    });
    Ok(Box::pin(responses))
}

/// ImportImage: the header, the root filesystem spooled, then the import.
pub async fn import(
    manager: &Manager,
    mut requests: Streaming<api::ImportImageRequest>,
) -> Result<api::ImportImageResponse, Status> {
    let images = manager.images();
    use api::import_image_request::Kind;
    let Some(api::ImportImageRequest {
        kind: Some(Kind::Header(header)),
    }) = requests.message().await?
    else {
        return Err(header_first());
    };
    images::check_image_name(&header.image, "header.image").map_err(to_status)?;
    images::check_changes(&header.changes, "header.changes").map_err(to_status)?;
    let space = space(manager, &header.space_id)?;
    let chunks = requests.map(|m| match m {
        Ok(api::ImportImageRequest {
            kind: Some(Kind::Data(data)),
        }) => Ok(data),
        Ok(_) => Err(to_status(
            Error::invalid("after the header, only data chunks").at("data"),
        )),
        Err(s) => Err(s),
    });
    let upload = images.rootfs_upload().await.map_err(to_status)?;
    let rootfs = spool(upload, Box::pin(chunks)).await?;
    let owner = images
        .import(&header.image, &header.changes, &space, rootfs)
        .await
        .map_err(to_status)?;
    Ok(api::ImportImageResponse {
        image: Some(built_image(header.image, owner)),
    })
}
