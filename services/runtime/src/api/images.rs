//! TemplateService/BuildImage and ImportImage (docs/ARCHITECTURE.md, "Templates"): an upload spooled into
//! a file of the data folder (the engine reads it as a stream; nothing is whole in memory), checked, and
//! handed to the backend. A build's output streams back as the engine writes it.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use mentis_core::{Error, ImageBuild, Reason, SandboxBackend, quoted};
use mentis_proto::api;
use tokio::io::AsyncWriteExt as _;
use tonic::{Status, Streaming};

use super::status::to_status;

/// Most bytes of a build context.
pub const MAX_CONTEXT: u64 = 1 << 30;
/// Most bytes of a root filesystem to import.
pub const MAX_ROOTFS: u64 = 8 << 30;
/// Instructions `docker import` applies.
const CHANGES: [&str; 9] = [
    "CMD",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "LABEL",
    "ONBUILD",
    "USER",
    "VOLUME",
    "WORKDIR",
];

pub type BuildStream = Pin<Box<dyn Stream<Item = Result<api::BuildImageResponse, Status>> + Send>>;

/// An upload in a file of the data folder, removed when dropped.
struct Spool {
    path: PathBuf,
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes `chunks` into a new file under `dir`; RESOURCE_EXHAUSTED past `max` bytes.
async fn spool(
    dir: &Path,
    mut chunks: impl Stream<Item = Result<Bytes, Status>> + Unpin,
    max: u64,
    what: &str,
) -> Result<Spool, Status> {
    let io =
        |e: std::io::Error| to_status(Error::internal(format!("cannot spool the {what}: {e}")));
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    let spool = Spool {
        path: dir.join(format!("upload-{}", uuid::Uuid::new_v4().simple())),
    };
    let mut file = tokio::fs::File::create(&spool.path).await.map_err(io)?;
    let mut total = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        total += chunk.len() as u64;
        if total > max {
            return Err(to_status(Error::new(
                Reason::ResourceExhausted,
                format!("the {what} is larger than {} MiB", max >> 20),
            )));
        }
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)?;
    if total == 0 {
        return Err(to_status(
            Error::invalid(format!("the {what} is empty: send it after the header")).at("data"),
        ));
    }
    Ok(spool)
}

/// The images a Dockerfile's FROM lines name (not `scratch`, an earlier stage, or one built from ARGs).
fn from_images(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut stages: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for line in joined.lines() {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
        let Some(image) = rest.first() else {
            continue;
        };
        let image = (*image).to_owned();
        let known = image.eq_ignore_ascii_case("scratch")
            || image.contains('$')
            || stages.contains(&image.to_lowercase())
            || images.contains(&image);
        if let [_, as_word, name, ..] = rest.as_slice()
            && as_word.eq_ignore_ascii_case("AS")
        {
            stages.push((*name).to_lowercase());
        }
        if !known {
            images.push(image);
        }
    }
    images
}

/// The Dockerfile at `path` in the context tar `context`; None in a compressed context (the engine reads
/// those itself) or when it is not there.
fn dockerfile_in(context: &Path, path: &str) -> std::io::Result<Option<String>> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(context)?;
    let mut magic = [0u8; 2];
    if file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b] {
        return Ok(None);
    }
    let file = std::fs::File::open(context)?;
    let want = path.trim_start_matches("./");
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries()? {
        let entry = entry?;
        let name = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_owned();
        if name == want {
            let mut text = String::new();
            entry.take(1 << 20).read_to_string(&mut text)?;
            return Ok(Some(text));
        }
    }
    Ok(None)
}

fn check_image_name(image: &str, field: &str) -> Result<(), Error> {
    if image.is_empty() {
        return Err(Error::invalid("image is required").at(field));
    }
    mentis_core::image::check_reference(image).map_err(|cause| {
        Error::invalid(format!(
            "image {} is not a valid image reference: {cause}",
            quoted(image)
        ))
        .at(field)
    })
}

/// BuildImage: the header, the context spooled, its FROM images checked, then the build in a task whose
/// output comes back as it is written.
pub async fn build(
    backend: std::sync::Arc<dyn SandboxBackend>,
    spool_dir: PathBuf,
    mut requests: Streaming<api::BuildImageRequest>,
) -> Result<BuildStream, Status> {
    use api::build_image_request::Kind;
    let header = match requests.message().await? {
        Some(api::BuildImageRequest {
            kind: Some(Kind::Header(h)),
        }) => h,
        _ => {
            return Err(to_status(
                Error::invalid("the first message must be the header").at("header"),
            ));
        }
    };
    check_image_name(&header.image, "header.image").map_err(to_status)?;
    mentis_core::sandbox::validate_env(&header.build_args, "header.build_args")
        .map_err(|e| to_status(e.into()))?;
    let dockerfile = if header.dockerfile.is_empty() {
        "Dockerfile".to_owned()
    } else {
        header.dockerfile.clone()
    };
    if dockerfile.contains('\0')
        || dockerfile.starts_with('/')
        || dockerfile.split('/').any(|p| p == "..")
    {
        return Err(to_status(
            Error::invalid("dockerfile must be a path inside the context").at("header.dockerfile"),
        ));
    }
    let chunks = requests.map(|m| match m {
        Ok(api::BuildImageRequest {
            kind: Some(Kind::Context(data)),
        }) => Ok(data),
        Ok(_) => Err(to_status(
            Error::invalid("after the header, only context chunks").at("context"),
        )),
        Err(s) => Err(s),
    });
    let context = spool(&spool_dir, Box::pin(chunks), MAX_CONTEXT, "build context").await?;
    let path = context.path.clone();
    let file = dockerfile.clone();
    let text = tokio::task::spawn_blocking(move || dockerfile_in(&path, &file))
        .await
        .map_err(|e| to_status(Error::internal("reading the context failed").with_source(e)))?
        .map_err(|e| {
            to_status(
                Error::invalid(format!("the build context is not a readable tar: {e}"))
                    .at("context"),
            )
        })?;
    if let Some(text) = text {
        for image in from_images(&text) {
            if !backend.has_image(&image).await.map_err(to_status)? {
                return Err(to_status(Error::new(
                    Reason::FailedPrecondition,
                    format!(
                        "FROM {} names an image this engine does not have (there is no registry to pull \
                         from): build, import or load it first",
                        quoted(&image)
                    ),
                )));
            }
        }
    }
    let build = ImageBuild {
        image: header.image,
        dockerfile,
        build_args: header.build_args.into_iter().collect(),
        no_cache: header.no_cache,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let output = {
            let tx = tx.clone();
            move |text: String| {
                let _ = tx.send(Ok(api::BuildImageResponse {
                    kind: Some(api::build_image_response::Kind::Output(text)),
                }));
            }
        };
        let built = backend.build_image(&build, &context.path, &output).await;
        drop(context);
        let last = match built {
            Ok(image_id) => {
                tracing::info!(image = %build.image, %image_id, "image built");
                Ok(api::BuildImageResponse {
                    kind: Some(api::build_image_response::Kind::Image(api::BuiltImage {
                        image: build.image.clone(),
                        image_id,
                    })),
                })
            }
            Err(e) => Err(to_status(e)),
        };
        let _ = tx.send(last);
    });
    Ok(Box::pin(
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
    ))
}

/// ImportImage: the header, the root filesystem spooled, then `docker import`.
pub async fn import(
    backend: &dyn SandboxBackend,
    spool_dir: &Path,
    mut requests: Streaming<api::ImportImageRequest>,
) -> Result<api::ImportImageResponse, Status> {
    use api::import_image_request::Kind;
    let header = match requests.message().await? {
        Some(api::ImportImageRequest {
            kind: Some(Kind::Header(h)),
        }) => h,
        _ => {
            return Err(to_status(
                Error::invalid("the first message must be the header").at("header"),
            ));
        }
    };
    check_image_name(&header.image, "header.image").map_err(to_status)?;
    for (i, change) in header.changes.iter().enumerate() {
        let instruction = change.split_whitespace().next().unwrap_or_default();
        if !CHANGES.contains(&instruction.to_ascii_uppercase().as_str()) || change.contains('\n') {
            return Err(to_status(
                Error::invalid(format!(
                    "{} is not an instruction an import applies ({})",
                    quoted(change),
                    CHANGES.join(", ")
                ))
                .at(format!("header.changes[{i}]")),
            ));
        }
    }
    let chunks = requests.map(|m| match m {
        Ok(api::ImportImageRequest {
            kind: Some(Kind::Data(data)),
        }) => Ok(data),
        Ok(_) => Err(to_status(
            Error::invalid("after the header, only data chunks").at("data"),
        )),
        Err(s) => Err(s),
    });
    let rootfs = spool(spool_dir, Box::pin(chunks), MAX_ROOTFS, "root filesystem").await?;
    let image_id = backend
        .import_image(&header.image, &header.changes, &rootfs.path)
        .await
        .map_err(to_status)?;
    tracing::info!(image = %header.image, %image_id, "image imported");
    Ok(api::ImportImageResponse {
        image: Some(api::BuiltImage {
            image: header.image,
            image_id,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dockerfile_names_its_from_images_but_not_stages_scratch_or_args() {
        let dockerfile = "ARG BASE=x\n# FROM commented:1\nFROM --platform=linux/amd64 team/base:1 AS build\n\
                          RUN make\nfrom build AS test\nFROM ${BASE}\nFROM scratch\nFROM \\\n  other/img:2\n\
                          FROM team/base:1\nCOPY --from=build /out /out\n";
        assert_eq!(from_images(dockerfile), ["team/base:1", "other/img:2"]);
    }
}
