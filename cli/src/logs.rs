//! `mentis logs`: a sandbox's observations (ActionService.StreamObservations), one line each.

use clap::Args;
use futures::StreamExt;
use mentis_proto::api::{self, observation, stream_observations_response};
use serde_json::{Value, json};

use crate::client::Conn;
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The sandbox.
    sandbox: String,
    /// Keep following new observations (until interrupted); without it, stop at the newest one.
    #[arg(long, short = 'f')]
    follow: bool,
    /// Only observations with seq > N.
    #[arg(long, default_value_t = 0, value_name = "N")]
    after_seq: u64,
    /// Only this action's observations.
    #[arg(long, default_value = "", hide_default_value = true)]
    action: String,
}

pub async fn run(conn: &Conn, mut a: LogsArgs, format: Format) -> Result<Status> {
    a.sandbox = conn.sandbox_id(&a.sandbox).await?;
    // Without --follow: everything up to the sandbox's newest seq now.
    let until = if a.follow {
        None
    } else {
        let sb = conn
            .sandboxes()
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: a.sandbox.clone(),
            })
            .await?
            .into_inner()
            .sandbox
            .unwrap_or_default();
        if sb.last_seq <= a.after_seq {
            return Ok(0);
        }
        Some(sb.last_seq)
    };
    let mut stream = conn
        .actions()
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: a.sandbox,
            after_seq: a.after_seq,
            action_id: a.action,
        })
        .await?
        .into_inner();
    while let Some(msg) = stream.next().await {
        let seq = match msg?.kind {
            Some(stream_observations_response::Kind::Observation(o)) => {
                match format {
                    Format::Json => println!("{}", observation_json(&o)),
                    Format::Text => println!("{}", observation_text(&o)),
                }
                o.seq
            }
            Some(stream_observations_response::Kind::Gap(g)) => {
                eprintln!(
                    "mentis: observations {}..{} are no longer kept",
                    g.after_seq + 1,
                    g.first_available_seq.saturating_sub(1)
                );
                g.first_available_seq.saturating_sub(1)
            }
            Some(stream_observations_response::Kind::Keepalive(k)) => k.last_seq,
            None => 0,
        };
        if until.is_some_and(|u| seq >= u) {
            break;
        }
    }
    Ok(0)
}

fn kind_name(o: &api::Observation) -> &'static str {
    use observation::Kind::*;
    match &o.kind {
        Some(CmdStart(_)) => "cmd_start",
        Some(CmdOutput(_)) => "cmd_output",
        Some(CmdEnd(_)) => "cmd_end",
        Some(IpythonStart(_)) => "ipython_start",
        Some(IpythonOutput(_)) => "ipython_output",
        Some(IpythonResult(_)) => "ipython_result",
        Some(Error(_)) => "error",
        Some(AgentState(_)) => "agent_state",
        None => "unknown",
    }
}

/// `SEQ TIME ACTION KIND DETAIL`, the detail on one line (escapes for control characters).
fn observation_text(o: &api::Observation) -> String {
    use observation::Kind::*;
    let detail = match &o.kind {
        Some(CmdStart(s)) => format!("pid={} {}", s.pid, s.command),
        Some(CmdOutput(out)) => format!(
            "{} {:?}",
            output::enum_name(out.stream().as_str_name(), "OUTPUT_STREAM_").to_lowercase(),
            String::from_utf8_lossy(&out.data)
        ),
        Some(CmdEnd(e)) => format!(
            "{} exit_code={} signal={} {}",
            output::enum_name(e.reason().as_str_name(), "END_REASON_"),
            e.exit_code,
            e.signal,
            e.message
        ),
        Some(IpythonStart(s)) => format!("[{}] {:?}", s.execution_count, s.code),
        Some(IpythonOutput(out)) => format!(
            "{} {:?}",
            output::enum_name(out.kind().as_str_name(), "IPYTHON_OUTPUT_KIND_").to_lowercase(),
            out.data.get("text/plain").unwrap_or(&out.text)
        ),
        Some(IpythonResult(r)) => format!(
            "{} {} {}",
            output::enum_name(r.status().as_str_name(), "IPYTHON_STATUS_"),
            r.error_name,
            r.reason
        ),
        Some(Error(e)) => e.message.clone(),
        Some(AgentState(s)) => s.message.clone(),
        None => String::new(),
    };
    let time = o.time.as_ref().map(output::rfc3339).unwrap_or_default();
    format!(
        "{} {} {} {} {}",
        o.seq,
        time,
        o.action_id,
        kind_name(o),
        detail.trim_end()
    )
}

/// One observation as a JSON object (a line of `--output json`).
fn observation_json(o: &api::Observation) -> Value {
    use observation::Kind::*;
    let body = match &o.kind {
        Some(CmdStart(s)) => json!({ "command": s.command, "pid": s.pid }),
        Some(CmdOutput(out)) => json!({
            "stream": output::enum_name(out.stream().as_str_name(), "OUTPUT_STREAM_"),
            "data": String::from_utf8_lossy(&out.data),
        }),
        Some(CmdEnd(e)) => json!({
            "reason": output::enum_name(e.reason().as_str_name(), "END_REASON_"),
            "exit_code": e.exit_code,
            "signal": e.signal,
            "message": e.message,
        }),
        Some(IpythonStart(s)) => json!({ "code": s.code, "execution_count": s.execution_count }),
        Some(IpythonOutput(out)) => json!({
            "kind": output::enum_name(out.kind().as_str_name(), "IPYTHON_OUTPUT_KIND_"),
            "text": out.text,
            "data": output::map(&out.data),
        }),
        Some(IpythonResult(r)) => json!({
            "status": output::enum_name(r.status().as_str_name(), "IPYTHON_STATUS_"),
            "execution_count": r.execution_count,
            "error_name": r.error_name,
            "error_value": r.error_value,
            "traceback": r.traceback,
            "reason": r.reason,
        }),
        Some(Error(e)) => json!({ "message": e.message, "details": output::map(&e.details) }),
        Some(AgentState(s)) => json!({ "message": s.message, "details": output::map(&s.details) }),
        None => Value::Null,
    };
    let mut v = json!({
        "seq": o.seq,
        "sandbox_id": o.sandbox_id,
        "action_id": o.action_id,
        "time": output::time(o.time.as_ref()),
        "kind": kind_name(o),
    });
    if let Value::Object(m) = &mut v {
        m.insert(kind_name(o).to_owned(), body);
    }
    v
}
