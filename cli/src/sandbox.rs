//! `mentis sandbox ...`: SandboxService.

use clap::{Args, Subcommand};
use mentis_proto::api;
use serde_json::{Value, json};

use crate::client::{Conn, pairs};
use crate::egress::{self, EgressArgs};
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub enum SandboxCommand {
    /// Create a sandbox and print it once it is RUNNING (text: its id only).
    Create(CreateArgs),
    /// List sandboxes.
    List(ListArgs),
    /// Show one sandbox.
    Get { sandbox: String },
    /// Delete a sandbox (its container and workspace). Deleting one that is not there (any more) is not an
    /// error, as the API's delete is idempotent: mentis says so on stderr.
    Delete { sandbox: String },
    /// Pause a sandbox (its processes are frozen), and print its id and state (`-o json`: the record).
    Pause { sandbox: String },
    /// Resume a paused sandbox, and print its id and state (`-o json`: the record).
    Resume { sandbox: String },
    /// Replace a sandbox's egress rules while it runs, then print its policy (without flags: print it only).
    ///
    /// The rules the flags make replace the sandbox's own (UpdateSandbox), for its next connection and DNS
    /// question. A sandbox made with --egress deny or allow cannot be given rules later.
    Egress(EgressUpdateArgs),
    /// The connections and DNS questions the egress gateway refused a sandbox, oldest first (the latest 256
    /// since the runtime started).
    Denials { sandbox: String },
}

#[derive(Args, Debug)]
pub struct EgressUpdateArgs {
    /// The sandbox's id.
    sandbox: String,
    #[command(flatten)]
    egress: EgressArgs,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Space to create it in (empty: the default space).
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
    /// Image (empty: the runtime's executor image).
    #[arg(long, default_value = "", hide_default_value = true)]
    image: String,
    /// Environment variable for everything the sandbox runs (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// CPUs (0: the runtime's default).
    #[arg(long, default_value_t = 0.0)]
    cpus: f64,
    /// Memory limit in MiB (0: the runtime's default).
    #[arg(long, default_value_t = 0)]
    memory_mb: i64,
    /// Idle timeout in seconds (0: the runtime's default).
    #[arg(long, default_value_t = 0)]
    idle_timeout: u32,
    /// A key of your own for the sandbox, unique in its space (GetSandboxByKey).
    #[arg(long, default_value = "", hide_default_value = true)]
    external_key: String,
    /// Restore the workspace from this snapshot (of the same space) before the sandbox is printed.
    #[arg(
        long = "snapshot",
        value_name = "SNAPSHOT",
        default_value = "",
        hide_default_value = true
    )]
    snapshot_id: String,
    /// Make it from this template of its space (`mentis template`): what the flags leave unset comes from
    /// the template.
    #[arg(long, default_value = "", hide_default_value = true)]
    template: String,
    #[command(flatten)]
    egress: EgressArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only this space's sandboxes.
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
    /// Only sandboxes with this label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
}

pub async fn run(conn: &Conn, cmd: SandboxCommand, format: Format) -> Result<Status> {
    let mut c = conn.sandboxes();
    match cmd {
        SandboxCommand::Create(a) => {
            let (egress, egress_rules) = a.egress.policy()?;
            let spec = api::SandboxSpec {
                space_id: a.space,
                image: a.image,
                env: pairs(&a.env, "--env")?,
                labels: pairs(&a.labels, "--label")?,
                cpu_limit: a.cpus,
                memory_limit_mb: a.memory_mb,
                idle_timeout_seconds: a.idle_timeout,
                external_key: a.external_key,
                snapshot_id: a.snapshot_id,
                template: a.template,
                egress: egress.map_or(0, |m| m as i32),
                egress_rules,
                ..Default::default()
            };
            let sb = c
                .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
                .await?
                .into_inner()
                .sandbox
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&sandbox_json(&sb)),
                Format::Text => println!("{}", sb.sandbox_id),
            }
        }
        SandboxCommand::List(a) => {
            let labels = pairs(&a.labels, "--label")?;
            let mut all = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_sandboxes(api::ListSandboxesRequest {
                        space_id: a.space.clone(),
                        labels: labels.clone(),
                        page_token: page_token.clone(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                all.extend(r.sandboxes);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match format {
                Format::Json => {
                    output::print_json(&Value::Array(all.iter().map(sandbox_json).collect()))
                }
                Format::Text => output::table(
                    &["SANDBOX", "STATE", "IMAGE", "CREATED", "SPACE"],
                    &all.iter()
                        .map(|s| {
                            vec![
                                s.sandbox_id.clone(),
                                state(s),
                                s.image.clone(),
                                s.create_time
                                    .as_ref()
                                    .map(output::rfc3339)
                                    .unwrap_or_default(),
                                s.space_id.clone(),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        }
        SandboxCommand::Get { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let sb = c
                .get_sandbox(api::GetSandboxRequest {
                    sandbox_id: sandbox,
                })
                .await?
                .into_inner()
                .sandbox
                .unwrap_or_default();
            print_one(&sb, format);
        }
        SandboxCommand::Delete { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let found = c
                .delete_sandbox(api::DeleteSandboxRequest {
                    sandbox_id: sandbox.clone(),
                })
                .await?
                .into_inner()
                .found;
            match format {
                Format::Json => {
                    output::print_json(&json!({ "sandbox_id": sandbox, "deleted": found }))
                }
                Format::Text if found => println!("{sandbox}"),
                Format::Text => {
                    eprintln!("mentis: no sandbox {sandbox} was there to delete (nothing done)")
                }
            }
        }
        SandboxCommand::Pause { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let sb = c
                .pause_sandbox(api::PauseSandboxRequest {
                    sandbox_id: sandbox,
                })
                .await?
                .into_inner()
                .sandbox
                .unwrap_or_default();
            print_state(&sb, format);
        }
        SandboxCommand::Resume { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let sb = c
                .resume_sandbox(api::ResumeSandboxRequest {
                    sandbox_id: sandbox,
                })
                .await?
                .into_inner()
                .sandbox
                .unwrap_or_default();
            print_state(&sb, format);
        }
        SandboxCommand::Egress(mut a) => {
            a.sandbox = conn.sandbox_id(&a.sandbox).await?;
            let sb = if a.egress.given() {
                let (mode, egress_rules) = a.egress.policy()?;
                // The rules always; the mode only when named (the mask keeps it otherwise).
                let mut paths = vec!["egress_rules".to_owned()];
                if mode.is_some() {
                    paths.push("egress".to_owned());
                }
                c.update_sandbox(api::UpdateSandboxRequest {
                    sandbox: Some(api::Sandbox {
                        sandbox_id: a.sandbox,
                        egress: mode.map_or(0, |m| m as i32),
                        egress_rules,
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                })
                .await?
                .into_inner()
                .sandbox
            } else {
                c.get_sandbox(api::GetSandboxRequest {
                    sandbox_id: a.sandbox,
                })
                .await?
                .into_inner()
                .sandbox
            };
            let sb = sb.unwrap_or_default();
            match format {
                Format::Json => output::print_json(&egress::policy_json(&sb)),
                Format::Text => {
                    for (name, value) in egress::policy_lines(&sb) {
                        output::field(name, &value);
                    }
                }
            }
        }
        SandboxCommand::Denials { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let denials = c
                .list_egress_denials(api::ListEgressDenialsRequest {
                    sandbox_id: sandbox,
                })
                .await?
                .into_inner()
                .denials;
            match format {
                Format::Json => output::print_json(&Value::Array(
                    denials
                        .iter()
                        .map(|d| {
                            json!({
                                "time": output::time(d.time.as_ref()),
                                "protocol": d.protocol,
                                "name": d.name,
                                "address": d.address,
                                "reason": d.reason,
                            })
                        })
                        .collect(),
                )),
                Format::Text => output::table(
                    &["TIME", "PROTOCOL", "NAME", "ADDRESS", "REASON"],
                    &denials
                        .iter()
                        .map(|d| {
                            vec![
                                d.time.as_ref().map(output::rfc3339).unwrap_or_default(),
                                d.protocol.clone(),
                                d.name.clone(),
                                d.address.clone(),
                                d.reason.clone(),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        }
    }
    Ok(0)
}

fn state(s: &api::Sandbox) -> String {
    output::enum_name(s.state().as_str_name(), "SANDBOX_STATE_")
}

/// What a pause or resume changed: the id and the state it is in now (`-o json`: the whole record).
fn print_state(sb: &api::Sandbox, format: Format) {
    match format {
        Format::Json => output::print_json(&sandbox_json(sb)),
        Format::Text => println!("{}  {}", sb.sandbox_id, state(sb)),
    }
}

fn print_one(sb: &api::Sandbox, format: Format) {
    match format {
        Format::Json => output::print_json(&sandbox_json(sb)),
        Format::Text => output::fields(&sandbox_json(sb)),
    }
}

/// A sandbox as JSON: the proto's field names, enums by name without their prefix.
pub fn sandbox_json(s: &api::Sandbox) -> Value {
    json!({
        "sandbox_id": s.sandbox_id,
        "space_id": s.space_id,
        "state": state(s),
        "state_reason": s.state_reason,
        "image": s.image,
        "labels": output::map(&s.labels),
        "create_time": output::time(s.create_time.as_ref()),
        "update_time": output::time(s.update_time.as_ref()),
        "last_activity_time": output::time(s.last_activity_time.as_ref()),
        "last_seq": s.last_seq,
        "external_key": s.external_key,
        "cpu_limit": s.cpu_limit,
        "memory_limit_mb": s.memory_limit_mb,
        "pids_limit": s.pids_limit,
        "nofile_limit": s.nofile_limit,
        "disk_limit_mb": s.disk_limit_mb,
        "template": s.template,
        "work_dir": s.work_dir,
        "runtime_class": s.runtime_class,
        "idle_timeout_seconds": s.idle_timeout_seconds,
        "idle_policy": output::enum_name(s.idle_policy().as_str_name(), "IDLE_POLICY_"),
        "max_lifetime_seconds": s.max_lifetime_seconds,
        "auto_resume": s.auto_resume,
        "egress": egress::mode_name(s),
        "egress_rules": egress::rules_json(&s.egress_rules),
        "root_filesystem": output::enum_name(s.root_filesystem().as_str_name(), "ROOT_FILESYSTEM_"),
    })
}
