//! Images without a registry (docs/ARCHITECTURE.md, "Templates"): built from a Dockerfile and its context
//! by the engine's builder, or imported from a root filesystem tarball. The tar comes from a file the
//! runtime spooled the client's upload into, streamed to the engine.

use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use futures::StreamExt as _;
use mentis_core::{Error, ImageBuild, Reason, Result};

use crate::DockerBackend;
use crate::error::{self, is_not_found};

/// The file at `path`, as a stream of chunks (a request's body).
async fn file_stream(
    path: &std::path::Path,
) -> Result<tokio_util::io::ReaderStream<tokio::fs::File>> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
    Ok(tokio_util::io::ReaderStream::new(file))
}

/// Splits `name[:tag]` (a digest is no tag to give).
fn repo_and_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

/// The CFS period of a build step's CPU quota, in microseconds.
const CPU_PERIOD_US: i32 = 100_000;

/// `mb` MiB in bytes, as the build API's client takes them (32 bits: the config bounds `mb` at 2047).
fn memory_bytes(mb: i64) -> i32 {
    i32::try_from(mb.saturating_mul(1 << 20)).unwrap_or(i32::MAX)
}

/// The CFS quota of `cpu` cores per [`CPU_PERIOD_US`].
fn cpu_quota_us(cpu: f64) -> i32 {
    // Bounded by the config (0.01 to 1024 cores); the cast saturates anyway.
    #[allow(clippy::cast_possible_truncation)]
    let quota = (cpu * f64::from(CPU_PERIOD_US)).round() as i32;
    quota.max(1000)
}

/// A failed step's message, with what its exit code 137 most likely means.
fn explained(error: String, build: &ImageBuild) -> String {
    if error.contains("returned a non-zero code: 137") {
        format!(
            "{error} (137: killed, most likely by the build's memory limit of {} MiB, \
             MENTIS_BUILD_LIMITS)",
            build.memory_mb
        )
    } else {
        error
    }
}

/// The error of a build or import (`what`) the engine ended: its message when it refused or a step failed
/// (the client's image or context is to blame, FAILED_PRECONDITION), else as any Docker error.
fn refused(what: &str, e: bollard::errors::Error) -> Error {
    use bollard::errors::Error as B;
    match e {
        B::DockerStreamError { error } => Error::new(
            Reason::FailedPrecondition,
            format!("{what} failed: {error}"),
        ),
        B::DockerResponseServerError { ref message, .. } => Error::new(
            Reason::FailedPrecondition,
            format!("the engine refused {what}: {message}"),
        )
        .with_source(e),
        e => error::to_core("build or import an image", e),
    }
}

impl DockerBackend {
    pub(crate) async fn has_image_inner(&self, image: &str) -> Result<bool> {
        match self
            .call("inspect image", self.docker.inspect_image(image))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            // A reference the engine's grammar refuses (ours is checked first; this is the backstop).
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 400,
                message,
            }) => Err(Error::invalid(format!(
                "the engine takes {} for no image reference: {message}",
                mentis_core::quoted(image)
            ))),
            Err(e) => Err(error::to_core("inspect an image", e)),
        }
    }

    pub(crate) async fn image_info_inner(
        &self,
        image: &str,
    ) -> Result<Option<mentis_core::ImageInfo>> {
        let info = match self
            .call("inspect image", self.docker.inspect_image(image))
            .await
        {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 400,
                message,
            }) => {
                return Err(Error::invalid(format!(
                    "the engine takes {} for no image reference: {message}",
                    mentis_core::quoted(image)
                )));
            }
            Err(e) => return Err(error::to_core("inspect an image", e)),
        };
        let names = info
            .repo_tags
            .unwrap_or_default()
            .into_iter()
            .chain(info.repo_digests.unwrap_or_default())
            .collect();
        let space_label = info
            .config
            .and_then(|c| c.labels)
            .and_then(|mut labels| labels.remove(mentis_core::IMAGE_SPACE_LABEL));
        Ok(Some(mentis_core::ImageInfo {
            id: info.id.unwrap_or_default(),
            names,
            space_label,
        }))
    }

    async fn image_id(&self, image: &str) -> Result<String> {
        let info = self
            .call("inspect image", self.docker.inspect_image(image))
            .await
            .map_err(|e| error::to_core("inspect the new image", e))?;
        Ok(info.id.unwrap_or_default())
    }

    pub(crate) async fn build_image_inner(
        &self,
        build: &ImageBuild,
        context: &std::path::Path,
        output: &(dyn Fn(String) + Send + Sync),
    ) -> Result<String> {
        let labels = std::collections::HashMap::from([
            ("io.mentis.built-by".to_owned(), "mentis-runtime".to_owned()),
            (
                mentis_core::IMAGE_SPACE_LABEL.to_owned(),
                build.space.clone(),
            ),
        ]);
        let options = BuildImageOptionsBuilder::default()
            .t(&build.image)
            .dockerfile(&build.dockerfile)
            .buildargs(&build.build_args.clone().into_iter().collect())
            .nocache(build.no_cache)
            // Intermediate containers go, also after a failed step.
            .rm(true)
            .forcerm(true)
            .labels(&labels)
            // RUN steps: no network at all, or the egress network of sandboxes that asked for a route out
            // (its host guard included); never the default bridge.
            .networkmode(if build.egress {
                &self.config.egress_network
            } else {
                "none"
            })
            .memory(memory_bytes(build.memory_mb))
            // No swap beyond the memory.
            .memswap(memory_bytes(build.memory_mb))
            .cpuperiod(CPU_PERIOD_US)
            .cpuquota(cpu_quota_us(build.cpu))
            .build();
        let body = bollard::body_try_stream(file_stream(context).await?);
        // No call timeout: a build takes as long as its steps (the client may hang up to stop waiting).
        let mut events = self.docker.build_image(options, None, Some(body));
        while let Some(event) = events.next().await {
            match event {
                Ok(info) => {
                    if let Some(error) = info.error_detail.and_then(|d| d.message) {
                        let error = explained(error, build);
                        let failed = bollard::errors::Error::DockerStreamError { error };
                        return Err(refused(&format!("the build of {}", build.image), failed));
                    }
                    if let Some(text) = info.stream.or(info.status)
                        && !text.is_empty()
                    {
                        output(text);
                    }
                }
                Err(bollard::errors::Error::DockerStreamError { error }) => {
                    let failed = bollard::errors::Error::DockerStreamError {
                        error: explained(error, build),
                    };
                    return Err(refused(&format!("the build of {}", build.image), failed));
                }
                Err(e) => return Err(refused(&format!("the build of {}", build.image), e)),
            }
        }
        self.image_id(&build.image).await
    }

    pub(crate) async fn import_image_inner(
        &self,
        image: &str,
        changes: &[String],
        rootfs: &std::path::Path,
    ) -> Result<String> {
        let (repo, tag) = repo_and_tag(image);
        let options = CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .changes(changes.to_vec())
            .build();
        let body = bollard::body_try_stream(file_stream(rootfs).await?);
        let mut events = self.docker.create_image(Some(options), Some(body), None);
        while let Some(event) = events.next().await {
            match event {
                Ok(info) => {
                    if let Some(error) = info.error_detail.and_then(|d| d.message) {
                        let failed = bollard::errors::Error::DockerStreamError { error };
                        return Err(refused(&format!("the import of {image}"), failed));
                    }
                }
                Err(e) => return Err(refused(&format!("the import of {image}"), e)),
            }
        }
        self.image_id(image).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_s_limits_become_the_engine_s_units() {
        assert_eq!(memory_bytes(1024), 1 << 30);
        assert_eq!(memory_bytes(2047), 2047 << 20);
        assert_eq!(memory_bytes(4096), i32::MAX);
        assert_eq!(cpu_quota_us(1.0), 100_000);
        assert_eq!(cpu_quota_us(0.5), 50_000);
        assert_eq!(cpu_quota_us(0.001), 1000);
        let build = ImageBuild {
            memory_mb: 64,
            ..ImageBuild::default()
        };
        let said = explained(
            "The command '/bin/sh -c x' returned a non-zero code: 137".into(),
            &build,
        );
        assert!(
            said.ends_with("memory limit of 64 MiB, MENTIS_BUILD_LIMITS)"),
            "{said}"
        );
        assert_eq!(explained("other".into(), &build), "other");
    }

    #[test]
    fn an_image_name_splits_into_repository_and_tag() {
        assert_eq!(repo_and_tag("team/node:22"), ("team/node", "22"));
        assert_eq!(repo_and_tag("team/node"), ("team/node", "latest"));
        assert_eq!(
            repo_and_tag("host:5000/team/node"),
            ("host:5000/team/node", "latest")
        );
    }
}
