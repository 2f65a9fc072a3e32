//! `mentis template ...`: TemplateService (a sandbox from one is `mentis sandbox create --template NAME`),
//! and the images a template names, built from a Dockerfile or imported from a root filesystem.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use mentis_proto::api;
use serde_json::{Value, json};

use crate::client::{Conn, pairs};
use crate::error::{Result, Status};
use crate::output::{self, Format};

/// Upload chunks of a build context or a root filesystem.
const CHUNK: usize = 1 << 20;

#[derive(Subcommand, Debug)]
pub enum TemplateCommand {
    /// Create a template (text: its name).
    Create(CreateArgs),
    /// List a space's templates.
    List {
        /// The space (default: `default`).
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
    /// Show one template.
    Get {
        name: String,
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
    /// Delete a template (its sandboxes keep running).
    Delete {
        name: String,
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
    /// Build an image on the runtime's engine from a folder with a Dockerfile (its output streams on
    /// stderr; text: the image's name once built). Every FROM must name an image the engine has.
    Build(BuildArgs),
    /// Make an image from a root filesystem tarball (plain or gzip) on the runtime's engine.
    Import(ImportArgs),
    /// Share an image with every space (admin; text: the image's name).
    Share {
        image: String,
        /// Give it back to its own space alone instead.
        #[arg(long)]
        unshare: bool,
    },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// 1-63 lowercase letters, digits or '-'.
    name: String,
    /// The space it belongs to (default: `default`).
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
    /// Image of its sandboxes (empty: the runtime's default).
    #[arg(long, default_value = "", hide_default_value = true)]
    image: String,
    #[arg(long, default_value = "", hide_default_value = true)]
    description: String,
    /// Environment variable of its sandboxes (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// CPUs of its sandboxes (0: the space's default).
    #[arg(long, default_value_t = 0.0)]
    cpus: f64,
    /// Memory limit of its sandboxes in MiB (0: the space's default).
    #[arg(long, default_value_t = 0)]
    memory_mb: i64,
    /// Where shell commands start, relative to /workspace.
    #[arg(long, default_value = "", hide_default_value = true)]
    work_dir: String,
    /// A start-up command, run in each new sandbox before it is handed out (repeatable, in order).
    #[arg(long = "setup", value_name = "COMMAND")]
    setup: Vec<String>,
    /// Sandboxes of it kept ready (start-up commands done).
    #[arg(long, default_value_t = 0)]
    pool_size: u32,
    /// Runtime class of its sandboxes, one the runtime offers (MENTIS_RUNTIME_CLASSES), such as runsc for
    /// gVisor; admin key only (empty: the space's).
    #[arg(long, default_value = "", hide_default_value = true)]
    runtime_class: String,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The folder sent as the build context.
    context: PathBuf,
    /// The name to give the image, for example team/node:22.
    #[arg(long, short = 't')]
    tag: String,
    /// The Dockerfile's path in the context.
    #[arg(long, short = 'f', default_value = "Dockerfile")]
    file: String,
    /// ARG value (repeatable).
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    build_args: Vec<String>,
    /// Build every step again.
    #[arg(long)]
    no_cache: bool,
    /// Give RUN steps a route out (when the runtime allows it: MENTIS_BUILD_EGRESS=allow).
    #[arg(long)]
    egress: bool,
    /// The space the image belongs to (default: `default`).
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The root filesystem as a tar file (plain or gzip), or `-` for stdin.
    tarball: PathBuf,
    /// The name to give the image.
    #[arg(long, short = 't')]
    tag: String,
    /// A Dockerfile instruction to apply, such as "ENV PATH=/usr/bin:/bin" (repeatable).
    #[arg(long = "change", short = 'c', value_name = "INSTRUCTION")]
    changes: Vec<String>,
    /// The space the image belongs to (default: `default`).
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
}

pub async fn run(conn: &Conn, cmd: TemplateCommand, format: Format) -> Result<Status> {
    let mut c = conn.templates();
    match cmd {
        TemplateCommand::Create(a) => {
            let t = c
                .create_template(api::CreateTemplateRequest {
                    template: Some(api::Template {
                        space_id: a.space,
                        name: a.name,
                        description: a.description,
                        image: a.image,
                        limits: Some(api::SandboxLimits {
                            cpu: a.cpus,
                            memory_mb: a.memory_mb,
                            ..Default::default()
                        }),
                        env: pairs(&a.env, "--env")?,
                        work_dir: a.work_dir,
                        setup_commands: a.setup,
                        pool_size: a.pool_size,
                        runtime_class: a.runtime_class,
                        ..Default::default()
                    }),
                })
                .await?
                .into_inner()
                .template
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&template_json(&t)),
                Format::Text => println!("{}", t.name),
            }
        }
        TemplateCommand::List { space } => {
            let mut all = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_templates(api::ListTemplatesRequest {
                        space_id: space.clone(),
                        page_size: 1000,
                        page_token: page_token.clone(),
                    })
                    .await?
                    .into_inner();
                all.extend(r.templates);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match format {
                Format::Json => {
                    output::print_json(&Value::Array(all.iter().map(template_json).collect()))
                }
                Format::Text => output::table(
                    &["NAME", "IMAGE", "POOL", "SETUP", "SPACE"],
                    &all.iter()
                        .map(|t| {
                            vec![
                                t.name.clone(),
                                t.image.clone(),
                                t.pool_size.to_string(),
                                t.setup_commands.len().to_string(),
                                t.space_id.clone(),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        }
        TemplateCommand::Get { name, space } => {
            let t = c
                .get_template(api::GetTemplateRequest {
                    space_id: space,
                    name,
                })
                .await?
                .into_inner()
                .template
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&template_json(&t)),
                Format::Text => output::fields(&template_json(&t)),
            }
        }
        TemplateCommand::Delete { name, space } => {
            c.delete_template(api::DeleteTemplateRequest {
                space_id: space,
                name: name.clone(),
            })
            .await?;
            match format {
                Format::Json => output::print_json(&json!({ "name": name, "deleted": true })),
                Format::Text => println!("{name}"),
            }
        }
        TemplateCommand::Build(a) => return build(&mut c, a, format).await,
        TemplateCommand::Import(a) => {
            let data = if a.tarball == Path::new("-") {
                let mut buf = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut buf)
                    .await
                    .context("reading stdin")?;
                buf
            } else {
                std::fs::read(&a.tarball)
                    .with_context(|| format!("reading {}", a.tarball.display()))?
            };
            let messages = std::iter::once(api::ImportImageRequest {
                kind: Some(api::import_image_request::Kind::Header(
                    api::ImportImageHeader {
                        image: a.tag,
                        changes: a.changes,
                        space_id: a.space,
                    },
                )),
            })
            .chain(data.chunks(CHUNK).map(|chunk| api::ImportImageRequest {
                kind: Some(api::import_image_request::Kind::Data(chunk.to_vec().into())),
            }))
            .collect::<Vec<_>>();
            let image = c
                .import_image(futures::stream::iter(messages))
                .await?
                .into_inner()
                .image
                .unwrap_or_default();
            print_image(&image, format);
        }
        TemplateCommand::Share { image, unshare } => {
            let image = c
                .share_image(api::ShareImageRequest {
                    image,
                    shared: !unshare,
                })
                .await?
                .into_inner()
                .image
                .unwrap_or_default();
            print_image(&image, format);
        }
    }
    Ok(0)
}

/// The context folder as a tar (links kept as links).
fn context_tar(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", dir)
        .with_context(|| format!("archiving {}", dir.display()))?;
    builder.into_inner().context("archiving the context")
}

async fn build(
    c: &mut mentis_proto::api::template_service_client::TemplateServiceClient<crate::client::Api>,
    a: BuildArgs,
    format: Format,
) -> Result<Status> {
    let context = context_tar(&a.context)?;
    let messages = std::iter::once(api::BuildImageRequest {
        kind: Some(api::build_image_request::Kind::Header(
            api::BuildImageHeader {
                image: a.tag,
                dockerfile: a.file,
                build_args: pairs(&a.build_args, "--build-arg")?,
                no_cache: a.no_cache,
                egress: a.egress,
                space_id: a.space,
            },
        )),
    })
    .chain(context.chunks(CHUNK).map(|chunk| api::BuildImageRequest {
        kind: Some(api::build_image_request::Kind::Context(
            chunk.to_vec().into(),
        )),
    }))
    .collect::<Vec<_>>();
    let mut stream = c
        .build_image(futures::stream::iter(messages))
        .await?
        .into_inner();
    while let Some(message) = stream.message().await? {
        match message.kind {
            Some(api::build_image_response::Kind::Output(text)) => eprint!("{text}"),
            Some(api::build_image_response::Kind::Image(image)) => {
                print_image(&image, format);
                return Ok(0);
            }
            None => {}
        }
    }
    Err(anyhow::anyhow!("the build's stream ended without an image").into())
}

fn print_image(image: &api::BuiltImage, format: Format) {
    match format {
        Format::Json => {
            output::print_json(&json!({
                "image": image.image,
                "image_id": image.image_id,
                "space_id": image.space_id,
                "shared": image.shared,
            }));
        }
        Format::Text => println!("{}", image.image),
    }
}

fn template_json(t: &api::Template) -> Value {
    let limits = t.limits.unwrap_or_default();
    json!({
        "space_id": t.space_id,
        "name": t.name,
        "description": t.description,
        "image": t.image,
        "limits": {
            "cpu": limits.cpu,
            "memory_mb": limits.memory_mb,
            "pids": limits.pids,
            "nofile": limits.nofile,
            "disk_mb": limits.disk_mb,
        },
        "env": output::map(&t.env),
        "work_dir": t.work_dir,
        "setup_commands": t.setup_commands,
        "pool_size": t.pool_size,
        "runtime_class": t.runtime_class,
        "create_time": output::time(t.create_time.as_ref()),
        "update_time": output::time(t.update_time.as_ref()),
    })
}
