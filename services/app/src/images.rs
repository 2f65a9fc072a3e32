//! Image builds and imports (docs/ARCHITECTURE.md, "Templates"), the application side of
//! TemplateService/BuildImage and ImportImage: an upload spooled into a file of the data folder (the engine
//! reads it as a stream; nothing is whole in memory), checked, and handed to the backend. A build runs in a
//! task of the runtime's tracker, its output sent back as the engine writes it.

mod owners;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mentis_core::{Error, ImageBuild, Reason, Result, SandboxBackend, SpaceId, quoted};

use crate::auth::Caller;
use crate::config::BuildPolicy;
pub use owners::{ImageOwner, Owners};
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

/// What a build says while it runs: the engine's output, then the image and who may use it (or the
/// build's error, last).
#[derive(Debug)]
pub enum BuildEvent {
    Output(String),
    Built { image: String, owner: ImageOwner },
}

/// Builds and imports on the runtime's backend; builds run on the runtime's tracker and stop at shutdown.
pub struct Images {
    backend: Arc<dyn SandboxBackend>,
    /// Who may use the images.
    owners: Arc<Owners>,
    /// What RUN steps get.
    policy: BuildPolicy,
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
        owners: Arc<Owners>,
        policy: BuildPolicy,
        spool_dir: PathBuf,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            backend,
            owners,
            policy,
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

    /// PERMISSION_DENIED unless `caller` may make sandboxes and templates of `space` from `image` (see
    /// [`Owners::check_use`]).
    pub async fn check_use(&self, caller: &Caller, space: &SpaceId, image: &str) -> Result<()> {
        self.owners.check_use(caller, space, image).await
    }

    /// Shares an image with every space, or gives it back to its own (see [`Owners::share`]).
    pub async fn share(&self, image: &str, shared: bool) -> Result<ImageOwner> {
        self.owners.share(image, shared).await
    }

    /// Starts `build` from `context` for `space` once its FROM images are known to the engine: the
    /// build's events come as the engine writes them, its image (the space's) or its error last. Its RUN
    /// steps get the policy's limits, and no network unless the build asks for egress and the policy allows
    /// it (FAILED_PRECONDITION otherwise).
    pub async fn build(
        &self,
        mut build: ImageBuild,
        space: SpaceId,
        context: Upload,
    ) -> Result<mpsc::UnboundedReceiver<Result<BuildEvent>>> {
        if build.egress && !self.policy.egress {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "this runtime gives builds no network (MENTIS_BUILD_EGRESS=deny): build without egress, \
                 with what the context brings",
            )
            .at("header.egress"));
        }
        build.cpu = self.policy.cpu;
        build.memory_mb = self.policy.memory_mb;
        build.space = space.as_str().to_owned();
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
                mentis_core::image::check_reference(&image).map_err(|cause| {
                    Error::invalid(format!(
                        "FROM {} in the Dockerfile does not name an image: {cause}",
                        quoted(&image)
                    ))
                    .at("context")
                })?;
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
        let owners = Arc::clone(&self.owners);
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
                // Unrecorded, the image would still be labelled with its space, and so nobody's but the
                // admin's: the error says the record failed.
                let last = built.and_then(|image_id| {
                    tracing::info!(image = %build.image, %image_id, %space, "image built");
                    Ok(BuildEvent::Built {
                        image: build.image.clone(),
                        owner: owners.record(&image_id, &build.image, &space)?,
                    })
                });
                let _ = tx.send(last);
            }
            .instrument(span),
        );
        Ok(rx)
    }

    /// Imports the root filesystem `rootfs` as `image` for `space` with `changes` (instructions it
    /// applies); who may use it.
    pub async fn import(
        &self,
        image: &str,
        changes: &[String],
        space: &SpaceId,
        rootfs: Upload,
    ) -> Result<ImageOwner> {
        let mut changes = changes.to_vec();
        changes.push(format!("LABEL {}={space}", mentis_core::IMAGE_SPACE_LABEL));
        let image_id = self
            .backend
            .import_image(image, &changes, &rootfs.path)
            .await?;
        tracing::info!(image = %image, %image_id, %space, "image imported");
        self.owners.record(&image_id, image, space)
    }
}

/// Most build args of one build.
pub const MAX_BUILD_ARGS: usize = 64;
/// Most instructions an import applies.
pub const MAX_CHANGES: usize = 64;
/// Most bytes of a build's args (names and values together), or of an import's instructions.
pub const MAX_HEADER_TEXT: usize = 16 * 1024;
/// Most bytes the same may take once escaped into the engine's request URL (the engine takes them there,
/// and a URL has at most 64 KiB: past that the request could not even be made). Only text that is mostly
/// quotes, backslashes or control characters gets here within [`MAX_HEADER_TEXT`].
pub const MAX_HEADER_TEXT_ESCAPED: usize = 40 * 1024;
/// Longest Dockerfile path in a build's context.
pub const MAX_DOCKERFILE_PATH: usize = 1024;

/// Bytes of `text` in a URL's query: letters, digits, `*-._` and space stay one byte, the rest become
/// `%XX`.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"*-._ ".contains(&b) {
                1
            } else {
                3
            }
        })
        .sum()
}

/// INVALID_ARGUMENT at `field` when `plain` bytes (`escaped` once in the URL) are too many.
fn check_text_size(field: &str, what: &str, plain: usize, escaped: usize) -> Result<()> {
    if plain > MAX_HEADER_TEXT {
        return Err(Error::invalid(format!(
            "{field} holds {plain} bytes of {what}, more than {MAX_HEADER_TEXT}"
        ))
        .at(field));
    }
    if escaped > MAX_HEADER_TEXT_ESCAPED {
        return Err(Error::invalid(format!(
            "{field} takes {escaped} bytes once escaped for the engine, more than \
             {MAX_HEADER_TEXT_ESCAPED}: fewer quotes, backslashes and control characters"
        ))
        .at(field));
    }
    Ok(())
}

/// Checks a build's or an import's header before its upload: the name of the image to make, `name[:tag]`
/// in Docker's grammar (a digest is the engine's to give, never the client's).
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
    })?;
    if image.contains('@') {
        return Err(Error::invalid(format!(
            "image {} names a digest: an image to make is named name[:tag], and the engine gives it its \
             digest",
            quoted(image)
        ))
        .at(field));
    }
    Ok(())
}

/// A build's args: at most [`MAX_BUILD_ARGS`] of them, names and values as in an env, [`MAX_HEADER_TEXT`]
/// bytes in all ([`MAX_HEADER_TEXT_ESCAPED`] escaped).
pub fn check_build_args(
    args: &std::collections::HashMap<String, String>,
    field: &str,
) -> Result<()> {
    if args.len() > MAX_BUILD_ARGS {
        return Err(Error::invalid(format!(
            "{field} has {} entries, more than {MAX_BUILD_ARGS}",
            args.len()
        ))
        .at(field));
    }
    mentis_core::sandbox::validate_env(args, field).map_err(|e| Error::from(e).at(field))?;
    let plain = args.iter().map(|(k, v)| k.len() + v.len()).sum();
    // The engine gets them as one JSON object.
    let json = serde_json::to_string(args).unwrap_or_default();
    check_text_size(field, "names and values", plain, escaped_len(&json))
}

/// The changes of an import, each an instruction `docker import` applies, on one line: at most
/// [`MAX_CHANGES`] of them, [`MAX_HEADER_TEXT`] bytes in all ([`MAX_HEADER_TEXT_ESCAPED`] escaped).
pub fn check_changes(changes: &[String], field: &str) -> Result<()> {
    if changes.len() > MAX_CHANGES {
        return Err(Error::invalid(format!(
            "{field} has {} instructions, more than {MAX_CHANGES}",
            changes.len()
        ))
        .at(field));
    }
    for (i, change) in changes.iter().enumerate() {
        let instruction = change.split_whitespace().next().unwrap_or_default();
        if !CHANGES.contains(&instruction.to_ascii_uppercase().as_str())
            || change.contains(['\n', '\r', '\0'])
        {
            return Err(Error::invalid(format!(
                "{} is not an instruction an import applies ({}), on one line",
                quoted(change),
                CHANGES.join(", ")
            ))
            .at(format!("{field}[{i}]")));
        }
    }
    let plain = changes.iter().map(String::len).sum();
    let escaped = changes.iter().map(|c| escaped_len(c)).sum();
    check_text_size(field, "instructions", plain, escaped)
}

/// A build's Dockerfile path: a path inside the context (default `Dockerfile`).
pub fn dockerfile_path(raw: &str, field: &str) -> Result<String> {
    let dockerfile = if raw.is_empty() { "Dockerfile" } else { raw };
    if dockerfile.contains('\0')
        || dockerfile.starts_with('/')
        || dockerfile.split('/').any(|p| p == "..")
        || dockerfile.len() > MAX_DOCKERFILE_PATH
    {
        return Err(Error::invalid(format!(
            "dockerfile must be a path inside the context, of at most {MAX_DOCKERFILE_PATH} bytes"
        ))
        .at(field));
    }
    Ok(dockerfile.to_owned())
}

/// A Dockerfile's instructions as the engine's parser reads them: parser directives at the top (`#
/// escape=` picks `\` or `` ` ``), comment and blank lines dropped, a line that ends in the escape
/// character (blanks after it allowed) joined with the next, and `\r\n` line ends read as `\n`.
fn instructions(dockerfile: &str) -> Vec<String> {
    let text = dockerfile.strip_prefix('\u{feff}').unwrap_or(dockerfile);
    let mut escape = '\\';
    let mut directives = true;
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for raw in text.split('\n') {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        if directives {
            if let Some((key, value)) = directive(trimmed) {
                if key.eq_ignore_ascii_case("escape") && value == "`" {
                    escape = '`';
                }
                continue;
            }
            directives = false;
        }
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let body = line.trim_end_matches([' ', '\t']);
        let (part, continues) = match body.strip_suffix(escape) {
            Some(part) => (part, true),
            None => (line, false),
        };
        let joined = current.get_or_insert_with(String::new);
        joined.push_str(part);
        if !continues && let Some(done) = current.take() {
            out.push(done);
        }
    }
    out.extend(current);
    out
}

/// `# key=value`, a parser directive.
fn directive(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.strip_prefix('#')?.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| (key, value.trim()))
}

/// The images a Dockerfile's FROM lines name (not `scratch`, an earlier stage, or one built from ARGs).
fn from_images(dockerfile: &str) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for line in instructions(dockerfile) {
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

    #[test]
    fn a_dockerfile_is_read_as_the_engine_reads_it() {
        // CRLF line ends, blanks after the escape, comment and blank lines inside a continuation.
        let crlf = "FROM \\\r\n  team/base:1\r\nRUN a \\ \r\n# a comment\r\n\r\n  b\r\n";
        assert_eq!(instructions(crlf), ["FROM   team/base:1", "RUN a   b"]);
        assert_eq!(from_images(crlf), ["team/base:1"]);
        // The escape directive: a backslash is then a character like any other.
        let backtick = "# escape=`\nFROM `\n  team/base:1\nRUN dir c:\\\nFROM x\n";
        assert_eq!(from_images(backtick), ["team/base:1", "x"]);
        // Directives only at the top.
        assert_eq!(from_images("FROM a\n# escape=`\nFROM `\nb\n"), ["a", "`"]);
        // What the engine would refuse is handed back as written, for the reference check to refuse.
        assert_eq!(
            from_images("FROM Mentis/Executor:latest\nFROM a::b\nFROM x@y\n"),
            ["Mentis/Executor:latest", "a::b", "x@y"]
        );
    }

    #[test]
    fn headers_are_bounded_before_the_engine_sees_them() {
        assert!(check_image_name("team/x:1", "image").is_ok());
        let digest = format!("team/x@sha256:{}", "0".repeat(64));
        let e = check_image_name(&digest, "image").expect_err("a digest");
        assert!(e.to_string().contains("names a digest"), "{e}");
        assert!(check_image_name("Team/X", "image").is_err());

        let args = |n: usize, size: usize| {
            (0..n)
                .map(|i| (format!("A{i}"), "x".repeat(size)))
                .collect::<std::collections::HashMap<_, _>>()
        };
        assert!(check_build_args(&args(MAX_BUILD_ARGS, 200), "build_args").is_ok());
        for (n, size) in [
            (MAX_BUILD_ARGS + 1, 1),
            (100, 30_000),
            (2, MAX_HEADER_TEXT / 2),
        ] {
            assert!(
                check_build_args(&args(n, size), "build_args").is_err(),
                "{n} x {size}"
            );
        }
        // Within the plain bound, but three times as long escaped.
        let quotes: std::collections::HashMap<_, _> =
            [("A".to_owned(), "\"".repeat(15_000))].into();
        let e = check_build_args(&quotes, "build_args").expect_err("escaped");
        assert!(e.to_string().contains("escaped"), "{e}");

        assert!(
            check_changes(
                &["ENV A=1".to_owned(), "WORKDIR /srv".to_owned()],
                "changes"
            )
            .is_ok()
        );
        let long = vec![format!("ENV A={}", "x".repeat(70_000))];
        let e = check_changes(&long, "changes").expect_err("too long");
        assert!(e.to_string().contains("more than"), "{e}");
        assert!(check_changes(&vec!["ENV A=1".to_owned(); MAX_CHANGES + 1], "changes").is_err());
        assert!(check_changes(&["ENV A=1\rRUN x".to_owned()], "changes").is_err());

        assert!(dockerfile_path(&"d/".repeat(MAX_DOCKERFILE_PATH), "dockerfile").is_err());
        assert_eq!(
            dockerfile_path("", "dockerfile").ok().as_deref(),
            Some("Dockerfile")
        );
    }
}
