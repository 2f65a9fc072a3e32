//! Image builds and imports (docs/ARCHITECTURE.md, "Templates"), the application side of
//! TemplateService/BuildImage and ImportImage: an upload spooled into a file of the data folder (the engine
//! reads it as a stream; nothing is whole in memory), checked, and handed to the backend. A build runs in a
//! task of the runtime's tracker, its output sent back as the engine writes it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mentis_core::{Error, ImageBuild, Reason, Result, SandboxBackend, quoted};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

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

/// What a build says while it runs: the engine's output, then the image (or the build's error, last).
#[derive(Debug)]
pub enum BuildEvent {
    Output(String),
    Built { image: String, image_id: String },
}

/// Builds and imports on the runtime's backend; builds run on the runtime's tracker and stop at shutdown.
pub struct Images {
    backend: Arc<dyn SandboxBackend>,
    spool_dir: PathBuf,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field("spool_dir", &self.spool_dir)
            .finish_non_exhaustive()
    }
}

/// An upload in a file of the data folder, removed when dropped.
#[derive(Debug)]
pub struct Upload {
    path: PathBuf,
}

impl Drop for Upload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An upload being written: chunks in order, then [`Spooling::finish`].
#[derive(Debug)]
pub struct Spooling {
    upload: Upload,
    file: tokio::fs::File,
    total: u64,
    max: u64,
    what: &'static str,
}

impl Spooling {
    /// Appends a chunk; RESOURCE_EXHAUSTED past the most bytes of this kind of upload.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.total += chunk.len() as u64;
        if self.total > self.max {
            return Err(Error::new(
                Reason::ResourceExhausted,
                format!("the {} is larger than {} MiB", self.what, self.max >> 20),
            ));
        }
        let what = self.what;
        self.file
            .write_all(chunk)
            .await
            .map_err(|e| spool_error(what, e))
    }

    /// The whole upload; INVALID_ARGUMENT (at `data`) when it is empty.
    pub async fn finish(mut self) -> Result<Upload> {
        let what = self.what;
        self.file.flush().await.map_err(|e| spool_error(what, e))?;
        if self.total == 0 {
            return Err(
                Error::invalid(format!("the {what} is empty: send it after the header")).at("data"),
            );
        }
        Ok(self.upload)
    }
}

fn spool_error(what: &str, e: std::io::Error) -> Error {
    Error::internal(format!("cannot spool the {what}: {e}"))
}

impl Images {
    pub fn new(
        backend: Arc<dyn SandboxBackend>,
        spool_dir: PathBuf,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            backend,
            spool_dir,
            tasks,
            shutdown,
        }
    }

    /// A new upload of a build context.
    pub async fn context_upload(&self) -> Result<Spooling> {
        self.spool(MAX_CONTEXT, "build context").await
    }

    /// A new upload of a root filesystem to import.
    pub async fn rootfs_upload(&self) -> Result<Spooling> {
        self.spool(MAX_ROOTFS, "root filesystem").await
    }

    async fn spool(&self, max: u64, what: &'static str) -> Result<Spooling> {
        tokio::fs::create_dir_all(&self.spool_dir)
            .await
            .map_err(|e| spool_error(what, e))?;
        let upload = Upload {
            path: self
                .spool_dir
                .join(format!("upload-{}", uuid::Uuid::new_v4().simple())),
        };
        let file = tokio::fs::File::create(&upload.path)
            .await
            .map_err(|e| spool_error(what, e))?;
        Ok(Spooling {
            upload,
            file,
            total: 0,
            max,
            what,
        })
    }

    /// Starts `build` from `context` once its FROM images are known to the engine: the build's events come
    /// as the engine writes them, its image or its error last.
    pub async fn build(
        &self,
        build: ImageBuild,
        context: Upload,
    ) -> Result<mpsc::UnboundedReceiver<Result<BuildEvent>>> {
        let path = context.path.clone();
        let file = build.dockerfile.clone();
        let text = tokio::task::spawn_blocking(move || dockerfile_in(&path, &file))
            .await
            .map_err(|e| Error::internal("reading the context failed").with_source(e))?
            .map_err(|e| {
                Error::invalid(format!("the build context is not a readable tar: {e}"))
                    .at("context")
            })?;
        if let Some(text) = text {
            for image in from_images(&text) {
                if !self.backend.has_image(&image).await? {
                    return Err(Error::new(
                        Reason::FailedPrecondition,
                        format!(
                            "FROM {} names an image this engine does not have (there is no registry to pull \
                             from): build, import or load it first",
                            quoted(&image)
                        ),
                    ));
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = Arc::clone(&self.backend);
        let shutdown = self.shutdown.clone();
        let span = tracing::info_span!("image build", image = %build.image);
        self.tasks.spawn(
            async move {
                let output = {
                    let tx = tx.clone();
                    move |text: String| {
                        let _ = tx.send(Ok(BuildEvent::Output(text)));
                    }
                };
                let built = tokio::select! {
                    built = backend.build_image(&build, &context.path, &output) => built,
                    () = shutdown.cancelled() => Err(Error::unavailable(
                        "the runtime is shutting down: the build stopped",
                    )),
                };
                drop(context);
                let last = built.map(|image_id| {
                    tracing::info!(image = %build.image, %image_id, "image built");
                    BuildEvent::Built {
                        image: build.image.clone(),
                        image_id,
                    }
                });
                let _ = tx.send(last);
            }
            .instrument(span),
        );
        Ok(rx)
    }

    /// Imports the root filesystem `rootfs` as `image` with `changes` (instructions it applies); the
    /// image's id.
    pub async fn import(&self, image: &str, changes: &[String], rootfs: Upload) -> Result<String> {
        let image_id = self
            .backend
            .import_image(image, changes, &rootfs.path)
            .await?;
        tracing::info!(image = %image, %image_id, "image imported");
        Ok(image_id)
    }
}

/// Checks a build's or an import's header before its upload: the image's name, and an import's changes.
pub fn check_image_name(image: &str, field: &str) -> Result<()> {
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

/// The changes of an import, each an instruction `docker import` applies.
pub fn check_changes(changes: &[String], field: &str) -> Result<()> {
    for (i, change) in changes.iter().enumerate() {
        let instruction = change.split_whitespace().next().unwrap_or_default();
        if !CHANGES.contains(&instruction.to_ascii_uppercase().as_str()) || change.contains('\n') {
            return Err(Error::invalid(format!(
                "{} is not an instruction an import applies ({})",
                quoted(change),
                CHANGES.join(", ")
            ))
            .at(format!("{field}[{i}]")));
        }
    }
    Ok(())
}

/// A build's Dockerfile path: a path inside the context (default `Dockerfile`).
pub fn dockerfile_path(raw: &str, field: &str) -> Result<String> {
    let dockerfile = if raw.is_empty() { "Dockerfile" } else { raw };
    if dockerfile.contains('\0')
        || dockerfile.starts_with('/')
        || dockerfile.split('/').any(|p| p == "..")
    {
        return Err(Error::invalid("dockerfile must be a path inside the context").at(field));
    }
    Ok(dockerfile.to_owned())
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
