//! TemplateService/BuildImage and ImportImage at the edge (docs/ARCHITECTURE.md, "Templates"): the header
//! read and checked, the upload's chunks written into the application's spool as they arrive, and a
//! build's events turned into the response stream. The rest is `crate::images`.

use std::pin::Pin;

use futures::{Stream, StreamExt as _};
use mentis_core::{Error, ImageBuild};
use mentis_proto::api;
use tonic::{Status, Streaming};

use super::status::to_status;
use crate::images::{self, BuildEvent, Images, Spooling, Upload};

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

/// BuildImage: the header, the context spooled, then the build's events as they come.
pub async fn build(
    images: &Images,
    mut requests: Streaming<api::BuildImageRequest>,
) -> Result<BuildStream, Status> {
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
    let events = images.build(build, context).await.map_err(to_status)?;
    let responses = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(|event| {
        use api::build_image_response::Kind;
        let kind = match event.map_err(to_status)? {
            BuildEvent::Output(text) => Kind::Output(text),
            BuildEvent::Built { image, image_id } => {
                Kind::Image(api::BuiltImage { image, image_id })
            }
        };
        Ok(api::BuildImageResponse { kind: Some(kind) })
    });
    Ok(Box::pin(responses))
}

/// ImportImage: the header, the root filesystem spooled, then the import.
pub async fn import(
    images: &Images,
    mut requests: Streaming<api::ImportImageRequest>,
) -> Result<api::ImportImageResponse, Status> {
    use api::import_image_request::Kind;
    let Some(api::ImportImageRequest {
        kind: Some(Kind::Header(header)),
    }) = requests.message().await?
    else {
        return Err(header_first());
    };
    images::check_image_name(&header.image, "header.image").map_err(to_status)?;
    images::check_changes(&header.changes, "header.changes").map_err(to_status)?;
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
    let image_id = images
        .import(&header.image, &header.changes, rootfs)
        .await
        .map_err(to_status)?;
    Ok(api::ImportImageResponse {
        image: Some(api::BuiltImage {
            image: header.image,
            image_id,
        }),
    })
}
