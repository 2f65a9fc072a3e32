//! `mentis preview ...`: preview URLs of a sandbox's ports (SandboxService.GetPreviewUrl and
//! RevokePreviewUrls; docs/PREVIEW.md).

use clap::{Args, Subcommand};
use mentis_proto::api;
use serde_json::{Value, json};

use crate::client::Conn;
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub enum PreviewCommand {
    /// Print a URL that opens a port of a sandbox from outside, through the runtime's HTTP listener (text:
    /// the URL only). The app there must listen on 0.0.0.0.
    Url(UrlArgs),
    /// Make every preview URL of a sandbox (or of one of its ports) handed out so far stop opening; later
    /// ones work.
    Revoke(RevokeArgs),
}

#[derive(Args, Debug)]
pub struct UrlArgs {
    /// The sandbox's id.
    sandbox: String,
    /// The port inside the sandbox (1-65535).
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// How long the URL opens, in seconds (default: an hour; at most 7 days).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..))]
    ttl: Option<u32>,
}

#[derive(Args, Debug)]
pub struct RevokeArgs {
    /// The sandbox's id.
    sandbox: String,
    /// Only the URLs of this port (default: every port's).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
}

pub async fn run(conn: &Conn, cmd: PreviewCommand, format: Format) -> Result<Status> {
    let mut c = conn.sandboxes();
    match cmd {
        PreviewCommand::Url(mut a) => {
            a.sandbox = conn.sandbox_id(&a.sandbox).await?;
            let r = c
                .get_preview_url(api::GetPreviewUrlRequest {
                    sandbox_id: a.sandbox,
                    port: a.port.into(),
                    ttl_seconds: a.ttl.unwrap_or(0),
                })
                .await?
                .into_inner();
            match format {
                Format::Json => output::print_json(&preview_json(&r)),
                Format::Text => println!("{}", r.url),
            }
        }
        PreviewCommand::Revoke(mut a) => {
            a.sandbox = conn.sandbox_id(&a.sandbox).await?;
            c.revoke_preview_urls(api::RevokePreviewUrlsRequest {
                sandbox_id: a.sandbox.clone(),
                port: a.port.map_or(0, u32::from),
            })
            .await?;
            match format {
                Format::Json => output::print_json(&json!({
                    "sandbox_id": a.sandbox,
                    "port": a.port,
                    "revoked": true,
                })),
                Format::Text => println!("{}", a.sandbox),
            }
        }
    }
    Ok(0)
}

/// GetPreviewUrl's answer as JSON: the proto's field names.
fn preview_json(r: &api::GetPreviewUrlResponse) -> Value {
    json!({
        "url": r.url,
        "expire_time": output::time(r.expire_time.as_ref()),
        "token": r.token,
        "path": r.path,
    })
}
