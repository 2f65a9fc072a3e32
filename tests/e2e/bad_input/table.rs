//! The bad-input suite: every method of the public API (read from the protos' descriptor, so a new
//! method without cases fails here) gets the usual malformed inputs — bytes that are no message, a string
//! that is not UTF-8, a message over the size limit — and the mistakes of its own fields (empty, huge, NUL,
//! unknown enum numbers, out-of-range numbers, deep paths), and each answer's code (and reason, where one is
//! named) is checked, with a bounded message. One line per case: see `cases`. docs/ERRORS.md lists what a
//! client gets for each mistake.

use std::collections::BTreeSet;

use mentis_proto::api;
use prost::Message;
use tonic::Code;

use super::raw::{Answer, NOT_UTF8, call, field};
use mentis_e2e::*;

/// Longest message a refusal may carry: input is quoted by a short prefix only.
const MAX_MESSAGE: usize = 1024;

/// Size limit the suite's runtime gets (MENTIS_MAX_MESSAGE_BYTES), so "huge" stays cheap; ActionService
/// admits the largest action whatever it is.
pub const LIMIT: usize = 64 * 1024;
/// Over every service's limit (ActionService's is about 10 MiB).
const OVER_ACTION_LIMIT: usize = 11 * 1024 * 1024;

/// One case: a method, what is wrong, the messages sent, the code expected and the reason ("" = any).
pub struct Case {
    pub rpc: String,
    pub what: String,
    pub messages: Vec<Vec<u8>>,
    pub code: Code,
    pub reason: &'static str,
}

fn case(rpc: &str, what: &str, messages: Vec<Vec<u8>>, code: Code, reason: &'static str) -> Case {
    Case {
        rpc: rpc.to_owned(),
        what: what.to_owned(),
        messages,
        code,
        reason,
    }
}

fn one<M: Message>(m: M) -> Vec<Vec<u8>> {
    vec![m.encode_to_vec()]
}

/// What the suite's cases may refer to: a running sandbox with one finished action.
pub struct Fixture {
    pub sandbox: String,
    pub last_seq: u64,
    /// An image with no command (no ENTRYPOINT or CMD).
    pub no_command_image: String,
    /// The name a valid build of the suite tags (removed by the test).
    pub built_image: String,
    /// The name the refused builds and imports ask for (removed by the test, should one be made).
    pub refused_image: String,
}

/// A build context holding only `dockerfile`.
fn dockerfile(text: &str) -> bytes::Bytes {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(text.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "Dockerfile", text.as_bytes())
        .expect("a tar in memory");
    builder.into_inner().expect("a tar in memory").into()
}

/// BuildImage of `header` with `context`.
fn build(header: api::BuildImageHeader, context: bytes::Bytes) -> Vec<Vec<u8>> {
    use api::build_image_request::Kind;
    vec![
        api::BuildImageRequest {
            kind: Some(Kind::Header(header)),
        }
        .encode_to_vec(),
        api::BuildImageRequest {
            kind: Some(Kind::Context(context)),
        }
        .encode_to_vec(),
    ]
}

/// ImportImage of `image` with `changes` and some data (never read: the header is refused first).
fn import(image: &str, changes: Vec<String>) -> Vec<Vec<u8>> {
    use api::import_image_request::Kind;
    vec![
        api::ImportImageRequest {
            kind: Some(Kind::Header(api::ImportImageHeader {
                image: image.into(),
                changes,
                ..Default::default()
            })),
        }
        .encode_to_vec(),
        api::ImportImageRequest {
            kind: Some(Kind::Data(bytes::Bytes::from_static(b"not read"))),
        }
        .encode_to_vec(),
    ]
}

/// The methods of the public API, `Service/Method`, from the descriptor set the runtime serves.
pub fn public_methods() -> BTreeSet<String> {
    let set = prost_types::FileDescriptorSet::decode(mentis_proto::PUBLIC_FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes");
    set.file
        .iter()
        .filter(|f| f.package() == "mentis.v1")
        .flat_map(|f| f.service.iter())
        .flat_map(|s| {
            s.method
                .iter()
                .map(move |m| format!("{}/{}", s.name(), m.name()))
        })
        .collect()
}

/// For every method: a body whose first string field (or a string inside its first message field) is not
/// UTF-8 — none for methods with no string field.
fn not_utf8(rpc: &str) -> Option<Vec<u8>> {
    let s = |tag| field(tag, NOT_UTF8);
    let nested = |outer, inner| field(outer, &field(inner, NOT_UTF8));
    Some(match rpc.rsplit('/').next().unwrap_or_default() {
        "ListPools" | "ListApiKeys" => return None,
        "CreateSandbox" => nested(1, 2), // spec.image
        "UpdateSandbox" => nested(1, 1), // sandbox.sandbox_id
        "GetSandboxByKey" | "CancelAction" | "InspectVariables" => s(2), // external_key, action_id, names
        "CreateSpace" | "UpdateSpace" => nested(1, 1),                   // space.space_id
        "ListSpaces" => s(2),                                            // page_token
        "Connect" | "WriteFile" | "Upload" | "Open" => nested(1, 1), // attach/header/start .sandbox_id
        "ReadFile" | "ListFiles" | "StatFile" | "DeleteFile" | "MakeDirectory" | "MoveFile"
        | "Download" => s(2),
        "EditFile" => s(3), // old_string
        _ => s(1),          // sandbox_id, space_id, name, key_id
    })
}

/// The cases every method gets.
#[rustfmt::skip]
fn wire_cases(rpc: &str) -> Vec<Case> {
    let over = if rpc.starts_with("ActionService/") {
        OVER_ACTION_LIMIT
    } else {
        LIMIT + 1024
    };
    let mut cases = vec![
        case(rpc, "bytes that are no protobuf message", vec![vec![0xff; 9]], Code::InvalidArgument, "INVALID_ARGUMENT"),
        case(rpc, "a truncated field", vec![vec![0x0a, 0x20, b'x']], Code::InvalidArgument, "INVALID_ARGUMENT"),
        // An unknown field, so only the size is wrong.
        case(rpc, "a message over the size limit", vec![field(99, &vec![b'x'; over])], Code::ResourceExhausted, "MESSAGE_TOO_LARGE"),
    ];
    if let Some(body) = not_utf8(rpc) {
        cases.push(case(rpc, "a string field that is not UTF-8", vec![body], Code::InvalidArgument, "INVALID_ARGUMENT"));
    }
    cases
}

/// The cases of each method's own fields.
#[rustfmt::skip]
#[allow(clippy::too_many_lines)]
fn field_cases(f: &Fixture) -> Vec<Case> {
    use Code::*;
    let sb = f.sandbox.clone();
    let unknown = uuid::Uuid::new_v4().to_string();
    let huge = "x".repeat(LIMIT / 2);
    let deep = "d/".repeat(3000);
    let tag = api::BuildImageHeader { image: f.refused_image.clone(), ..Default::default() };
    let spec = |s: api::SandboxSpec| one(api::CreateSandboxRequest { spec: Some(s) });
    let image = |i: &str| {
        spec(api::SandboxSpec {
            image: i.into(),
            ..Default::default()
        })
    };
    let get = |id: &str| {
        one(api::GetSandboxRequest {
            sandbox_id: id.into(),
        })
    };
    let list = |l: api::ListSandboxesRequest| one(l);
    let space = |s: api::Space| one(api::CreateSpaceRequest { space: Some(s) });
    let limits = |root_filesystem| api::Space {
        space_id: "bad-enum".into(),
        limits: Some(api::SpaceLimits {
            root_filesystem,
            ..Default::default()
        }),
        ..Default::default()
    };
    let exec = |id: &str, action: Option<api::Action>| {
        one(api::ExecuteRequest {
            sandbox_id: id.into(),
            action,
            action_id: String::new(),
        })
    };
    let watch = |after_seq, action_id: &str| {
        one(api::StreamObservationsRequest {
            sandbox_id: sb.clone(),
            after_seq,
            action_id: action_id.into(),
        })
    };
    let connect = |kind| api::ConnectRequest { kind: Some(kind) }.encode_to_vec();
    let attach = |id: &str, after_seq| {
        connect(api::connect_request::Kind::Attach(
            api::connect_request::Attach {
                sandbox_id: id.into(),
                after_seq,
            },
        ))
    };
    let read = |path: &str| {
        one(api::ReadFileRequest {
            sandbox_id: sb.clone(),
            path: path.into(),
            ..Default::default()
        })
    };
    let stat = |path: &str| {
        one(api::StatFileRequest {
            sandbox_id: sb.clone(),
            path: path.into(),
        })
    };
    let write_header = |path: &str| {
        api::WriteFileRequest {
            kind: Some(api::write_file_request::Kind::Header(
                api::WriteFileHeader {
                    sandbox_id: sb.clone(),
                    path: path.into(),
                    mode: 0,
                },
            )),
        }
        .encode_to_vec()
    };
    let write_data = |d: Vec<u8>| {
        api::WriteFileRequest {
            kind: Some(api::write_file_request::Kind::Data(d.into())),
        }
        .encode_to_vec()
    };
    let upload_header = |path: &str| {
        api::UploadRequest {
            kind: Some(api::upload_request::Kind::Header(api::UploadHeader {
                sandbox_id: sb.clone(),
                path: path.into(),
            })),
        }
        .encode_to_vec()
    };
    let upload_data = |d: Vec<u8>| {
        api::UploadRequest {
            kind: Some(api::upload_request::Kind::Data(d.into())),
        }
        .encode_to_vec()
    };
    let revoke = |id: &str| one(api::RevokeApiKeyRequest { key_id: id.into() });
    vec![
        // SandboxService
        case("SandboxService/CreateSandbox", "image ../../etc", image("../../etc"), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "image UPPER/../x", image("UPPER/../x"), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "a huge image name", image(&huge), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "an image with NUL", image("py\0thon"), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "an image with no command", image(&f.no_command_image), FailedPrecondition, "FAILED_PRECONDITION"),
        case("SandboxService/CreateSandbox", "an unknown snapshot", spec(api::SandboxSpec { snapshot_id: unknown.clone(), ..Default::default() }), NotFound, "SNAPSHOT_NOT_FOUND"),
        case("SandboxService/CreateSandbox", "a malformed snapshot id", spec(api::SandboxSpec { snapshot_id: "snap".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/CreateSandbox", "idle_policy 99", spec(api::SandboxSpec { idle_policy: 99, ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "egress 99", spec(api::SandboxSpec { egress: 99, ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "root_filesystem 99", spec(api::SandboxSpec { root_filesystem: 99, ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "memory_limit_mb -1", spec(api::SandboxSpec { memory_limit_mb: -1, ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "cpu_limit NaN", spec(api::SandboxSpec { cpu_limit: f64::NAN, ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "an env name with NUL", spec(api::SandboxSpec { env: [("A\0".into(), "1".into())].into(), ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "a huge label key", spec(api::SandboxSpec { labels: [(huge.clone(), "1".into())].into(), ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/CreateSandbox", "a huge external key", spec(api::SandboxSpec { external_key: huge.clone(), ..Default::default() }), InvalidArgument, "INVALID_SPEC"),
        case("SandboxService/GetSandbox", "an empty id", get(""), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandbox", "a huge id", get(&huge), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandbox", "an id with NUL", get("\0"), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandbox", "an unknown id", get(&unknown), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/ListSandboxes", "page_size -1", list(api::ListSandboxesRequest { page_size: -1, ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/ListSandboxes", "a page token it never gave", list(api::ListSandboxesRequest { page_token: "garbage".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/ListSandboxes", "state 99", list(api::ListSandboxesRequest { states: vec![99], ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/ListSandboxes", "a malformed space", list(api::ListSandboxesRequest { space_id: "Not A Space".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/DeleteSandbox", "an empty id", one(api::DeleteSandboxRequest { sandbox_id: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/PauseSandbox", "an unknown id", one(api::PauseSandboxRequest { sandbox_id: unknown.clone(), }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/ResumeSandbox", "an empty id", one(api::ResumeSandboxRequest { sandbox_id: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandboxByKey", "an empty key", one(api::GetSandboxByKeyRequest { space_id: String::new(), external_key: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandboxByKey", "a huge key", one(api::GetSandboxByKeyRequest { space_id: String::new(), external_key: huge.clone(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetSandboxByKey", "an unknown key", one(api::GetSandboxByKeyRequest { space_id: String::new(), external_key: "nobody".into(), }), NotFound, "EXTERNAL_KEY_NOT_FOUND"),
        case("SandboxService/ListPools", "nothing wrong", one(api::ListPoolsRequest {}), Ok, ""),
        case("SandboxService/GetPreviewUrl", "an empty sandbox id", one(api::GetPreviewUrlRequest { sandbox_id: String::new(), port: 8000, ttl_seconds: 0 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetPreviewUrl", "an unknown sandbox", one(api::GetPreviewUrlRequest { sandbox_id: unknown.clone(), port: 8000, ttl_seconds: 0 }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/GetPreviewUrl", "port 0", one(api::GetPreviewUrlRequest { sandbox_id: sb.clone(), port: 0, ttl_seconds: 0 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetPreviewUrl", "port 65536", one(api::GetPreviewUrlRequest { sandbox_id: sb.clone(), port: 65_536, ttl_seconds: 0 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetPreviewUrl", "the executor's port", one(api::GetPreviewUrlRequest { sandbox_id: sb.clone(), port: 50_052, ttl_seconds: 0 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetPreviewUrl", "a lifetime over 7 days", one(api::GetPreviewUrlRequest { sandbox_id: sb.clone(), port: 8000, ttl_seconds: 7 * 24 * 3600 + 1 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/GetPreviewUrl", "nothing wrong", one(api::GetPreviewUrlRequest { sandbox_id: sb.clone(), port: 8000, ttl_seconds: 60 }), Ok, ""),
        case("SandboxService/RevokePreviewUrls", "an empty sandbox id", one(api::RevokePreviewUrlsRequest { sandbox_id: String::new(), port: 0 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/RevokePreviewUrls", "an unknown sandbox", one(api::RevokePreviewUrlsRequest { sandbox_id: unknown.clone(), port: 0 }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/RevokePreviewUrls", "port 70000", one(api::RevokePreviewUrlsRequest { sandbox_id: sb.clone(), port: 70_000 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/RevokePreviewUrls", "nothing wrong", one(api::RevokePreviewUrlsRequest { sandbox_id: sb.clone(), port: 8000 }), Ok, ""),
        case("SandboxService/UpdateSandbox", "an empty mask", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: sb.clone(), ..Default::default() }), update_mask: None }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/UpdateSandbox", "a field that cannot change", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: sb.clone(), ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["image".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/UpdateSandbox", "an empty sandbox id", one(api::UpdateSandboxRequest { sandbox: None, update_mask: Some(prost_types::FieldMask { paths: vec!["egress_rules".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/UpdateSandbox", "an unknown sandbox", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: unknown.clone(), ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["egress_rules".into()] }) }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/UpdateSandbox", "an unknown egress number", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: sb.clone(), egress: 99, ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["egress".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/UpdateSandbox", "a bad rule", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: sb.clone(), egress: api::Egress::Rules as i32, egress_rules: vec![api::EgressRule { domain: "*".into(), ..Default::default() }], ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["egress".into(), "egress_rules".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/UpdateSandbox", "rules with EGRESS_DENY", one(api::UpdateSandboxRequest { sandbox: Some(api::Sandbox { sandbox_id: sb.clone(), egress: api::Egress::Deny as i32, egress_rules: vec![api::EgressRule { domain: "a.test".into(), ..Default::default() }], ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["egress".into(), "egress_rules".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/ListEgressDenials", "an empty sandbox id", one(api::ListEgressDenialsRequest { sandbox_id: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SandboxService/ListEgressDenials", "an unknown sandbox", one(api::ListEgressDenialsRequest { sandbox_id: unknown.clone() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SandboxService/ListEgressDenials", "nothing wrong", one(api::ListEgressDenialsRequest { sandbox_id: sb.clone() }), Ok, ""),
        // SpaceService
        case("SpaceService/CreateSpace", "no space", one(api::CreateSpaceRequest { space: None }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/CreateSpace", "a huge id", space(api::Space { space_id: huge.clone(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/CreateSpace", "root_filesystem 99", space(limits(99)), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/CreateSpace", "a taken id", space(api::Space { space_id: "default".into(), ..Default::default() }), AlreadyExists, "SPACE_EXISTS"),
        case("SpaceService/GetSpace", "an empty id", one(api::GetSpaceRequest { space_id: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/GetSpace", "an unknown id", one(api::GetSpaceRequest { space_id: "no-such-space".into(), }), NotFound, "SPACE_NOT_FOUND"),
        case("SpaceService/ListSpaces", "a page token it never gave", one(api::ListSpacesRequest { page_size: 0, page_token: "Not A Space!".into(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/ListSpaces", "page_size -5", one(api::ListSpacesRequest { page_size: -5, page_token: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/UpdateSpace", "an unknown mask path", one(api::UpdateSpaceRequest { space: Some(api::Space { space_id: "default".into(), ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["bogus".into()], }), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/UpdateSpace", "root_filesystem 99", one(api::UpdateSpaceRequest { space: Some(limits(99)), update_mask: None, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/DeleteSpace", "the default space", one(api::DeleteSpaceRequest { space_id: "default".into(), force: false, }), FailedPrecondition, "DEFAULT_SPACE"),
        case("SpaceService/DeleteSpace", "an empty id", one(api::DeleteSpaceRequest { space_id: String::new(), force: false, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/SetSecret", "a bad name", one(api::SetSecretRequest { space_id: String::new(), name: "1-bad".into(), value: "v".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/SetSecret", "a huge value", one(api::SetSecretRequest { space_id: String::new(), name: "TOKEN".into(), value: huge.clone() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/SetSecret", "a value with a newline", one(api::SetSecretRequest { space_id: String::new(), name: "TOKEN".into(), value: "a\r\nX-Injected: 1".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/SetSecret", "an unknown space", one(api::SetSecretRequest { space_id: "nowhere".into(), name: "TOKEN".into(), value: "v".into() }), NotFound, "SPACE_NOT_FOUND"),
        case("SpaceService/SetSecret", "a malformed space id", one(api::SetSecretRequest { space_id: "Not A Space".into(), name: "TOKEN".into(), value: "v".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SpaceService/ListSecrets", "an unknown space", one(api::ListSecretsRequest { space_id: "nowhere".into() }), NotFound, "SPACE_NOT_FOUND"),
        case("SpaceService/ListSecrets", "nothing wrong", one(api::ListSecretsRequest { space_id: String::new() }), Ok, ""),
        case("SpaceService/DeleteSecret", "a secret that does not exist", one(api::DeleteSecretRequest { space_id: String::new(), name: "NONE".into() }), NotFound, ""),
        case("SpaceService/DeleteSecret", "an unknown space", one(api::DeleteSecretRequest { space_id: "nowhere".into(), name: "TOKEN".into() }), NotFound, "SPACE_NOT_FOUND"),
        // ActionService
        case("ActionService/Execute", "no action", exec(&sb, None), InvalidArgument, "INVALID_ACTION"),
        case("ActionService/Execute", "an empty sandbox id", exec("", Some(shell_action(cmd("true")))), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/Execute", "a command with NUL", exec(&sb, Some(shell_action(cmd("echo \0")))), InvalidArgument, "INVALID_ACTION"),
        case("ActionService/Execute", "timeout_seconds u32::MAX", exec(&sb, Some(shell_action(api::ShellAction { command: "true".into(), timeout_seconds: u32::MAX, ..Default::default() }))), InvalidArgument, "INVALID_ACTION"),
        case("ActionService/Execute", "empty code", exec(&sb, Some(cell(""))), InvalidArgument, "INVALID_ACTION"),
        case("ActionService/StreamObservations", "after_seq 2^63", watch(1 << 63, ""), OutOfRange, "SEQ_OUT_OF_RANGE"),
        case("ActionService/StreamObservations", "after_seq 2^64-1", watch(u64::MAX, ""), OutOfRange, "SEQ_OUT_OF_RANGE"),
        case("ActionService/StreamObservations", "after_seq one past the newest", watch(f.last_seq + 1, ""), OutOfRange, "SEQ_OUT_OF_RANGE"),
        case("ActionService/StreamObservations", "an unknown action", watch(0, &unknown), NotFound, "ACTION_NOT_FOUND"),
        case("ActionService/StreamObservations", "a malformed action id", watch(0, "has spaces"), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/Connect", "submit before attach", vec![connect(api::connect_request::Kind::Submit(api::connect_request::Submit { action: Some(shell_action(cmd("true"))), action_id: String::new(), }))], InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/Connect", "attach after_seq 2^64-1", vec![attach(&sb, Some(u64::MAX))], OutOfRange, "SEQ_OUT_OF_RANGE"),
        case("ActionService/Connect", "attach an unknown sandbox", vec![attach(&unknown, None)], NotFound, "SANDBOX_NOT_FOUND"),
        case("ActionService/Connect", "a message over the limit after attach", vec![attach(&sb, None), field(99, &vec![b'x'; OVER_ACTION_LIMIT])], ResourceExhausted, "MESSAGE_TOO_LARGE"),
        case("ActionService/Connect", "garbage after attach", vec![attach(&sb, None), vec![0xff; 9]], InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/CancelAction", "an empty action id", one(api::CancelActionRequest { sandbox_id: sb.clone(), action_id: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/CancelAction", "an unknown action", one(api::CancelActionRequest { sandbox_id: sb.clone(), action_id: unknown.clone(), }), NotFound, "ACTION_NOT_FOUND"),
        case("ActionService/ResetKernel", "an empty sandbox id", one(api::ResetKernelRequest { sandbox_id: String::new(), }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/InspectVariables", "a name that is no identifier", one(api::InspectVariablesRequest { sandbox_id: sb.clone(), names: vec!["not a name".into()], }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/InspectVariables", "a huge name", one(api::InspectVariablesRequest { sandbox_id: sb.clone(), names: vec![huge.clone()], }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/ListProcesses", "nothing wrong", one(api::ListProcessesRequest { sandbox_id: sb.clone() }), Ok, ""),
        case("ActionService/SignalProcess", "pid 0", one(api::SignalProcessRequest { sandbox_id: sb.clone(), pid: 0, signal: "TERM".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/SignalProcess", "a signal with no name on the list", one(api::SignalProcessRequest { sandbox_id: sb.clone(), pid: 2, signal: "SIGSEGV".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("ActionService/SignalProcess", "a pid nobody has", one(api::SignalProcessRequest { sandbox_id: sb.clone(), pid: 4_000_000, signal: "TERM".into() }), NotFound, "PROCESS_NOT_FOUND"),
        case("ActionService/SignalProcess", "PID 1", one(api::SignalProcessRequest { sandbox_id: sb.clone(), pid: 1, signal: "KILL".into() }), FailedPrecondition, "FAILED_PRECONDITION"),
        // FileService
        case("FileService/ReadFile", "a path out of the workspace", read("../etc/passwd"), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/ReadFile", "a path with NUL", read("a\0b"), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/ReadFile", "a deep path", read(&deep), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/ReadFile", "a missing file", read("no/such/file"), NotFound, "PATH_NOT_FOUND"),
        case("FileService/ReadFile", "a deep path within PATH_MAX", read(&"d/".repeat(2000)), NotFound, "PATH_NOT_FOUND"),
        case("FileService/ReadFile", "a component over NAME_MAX", read(&"n".repeat(300)), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WriteFile", "data before the header", vec![write_data(b"x".to_vec())], InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WriteFile", "a path out of the workspace", vec![write_header("../x"), write_data(b"x".to_vec())], InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WriteFile", "a chunk over the limit", vec![write_header("big"), write_data(vec![b'x'; LIMIT + 1024])], ResourceExhausted, "MESSAGE_TOO_LARGE"),
        case("FileService/ListFiles", "a page token it never gave", one(api::ListFilesRequest { sandbox_id: sb.clone(), page_token: "garbage".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/ListFiles", "a huge path", one(api::ListFilesRequest { sandbox_id: sb.clone(), path: huge.clone(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/StatFile", "a missing file", stat("nothing-here"), NotFound, "PATH_NOT_FOUND"),
        case("FileService/StatFile", "a deep path", stat(&deep), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/EditFile", "an empty old_string", one(api::EditFileRequest { sandbox_id: sb.clone(), path: "f.txt".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/DeleteFile", "a path out of the workspace", one(api::DeleteFileRequest { sandbox_id: sb.clone(), path: "/etc".into(), recursive: true, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/MakeDirectory", "a path with NUL", one(api::MakeDirectoryRequest { sandbox_id: sb.clone(), path: "a\0".into(), mode: 0, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/MoveFile", "a source out of the workspace", one(api::MoveFileRequest { sandbox_id: sb.clone(), source: "/etc/passwd".into(), destination: "p".into(), overwrite: false, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/MoveFile", "a missing source", one(api::MoveFileRequest { sandbox_id: sb.clone(), source: "nothing-here".into(), destination: "p".into(), overwrite: false, }), NotFound, "PATH_NOT_FOUND"),
        case("FileService/MoveFile", "a destination with NUL", one(api::MoveFileRequest { sandbox_id: sb.clone(), source: "a".into(), destination: "p\0".into(), overwrite: false, }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WatchFiles", "a path out of the workspace", one(api::WatchFilesRequest { sandbox_id: sb.clone(), path: "/etc".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WatchFiles", "a malformed watch id", one(api::WatchFilesRequest { sandbox_id: sb.clone(), watch_id: "watch-?".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/WatchFiles", "a watch nobody has", one(api::WatchFilesRequest { sandbox_id: sb.clone(), watch_id: "watch-000000000000".into(), ..Default::default() }), NotFound, "PATH_NOT_FOUND"),
        case("FileService/Upload", "data before the header", vec![upload_data(b"x".to_vec())], InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/Upload", "an archive that is no tar", vec![upload_header("up"), upload_data(vec![0xff; 1024])], InvalidArgument, "INVALID_ARGUMENT"),
        case("FileService/Download", "a path out of the workspace", one(api::DownloadRequest { sandbox_id: sb.clone(), path: "../..".into(), }), InvalidArgument, "INVALID_ARGUMENT"),
        // KeyService
        case("KeyService/CreateApiKey", "no space", one(api::CreateApiKeyRequest { name: "k".into(), space_ids: vec![], }), InvalidArgument, "INVALID_ARGUMENT"),
        case("KeyService/CreateApiKey", "an unknown space", one(api::CreateApiKeyRequest { name: "k".into(), space_ids: vec!["no-such-space".into()], }), NotFound, "SPACE_NOT_FOUND"),
        case("KeyService/ListApiKeys", "nothing wrong", one(api::ListApiKeysRequest {}), Ok, ""),
        case("KeyService/RevokeApiKey", "an empty key id", revoke(""), InvalidArgument, "INVALID_ARGUMENT"),
        case("KeyService/RevokeApiKey", "a huge key id", revoke(&huge), InvalidArgument, "INVALID_ARGUMENT"),
        case("KeyService/RevokeApiKey", "an unknown key id", revoke("key-0000000000000000"), NotFound, "API_KEY_NOT_FOUND"),
        // SnapshotService
        case("SnapshotService/CreateSnapshot", "an unknown sandbox", one(api::CreateSnapshotRequest { sandbox_id: unknown.clone(), labels: Default::default() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("SnapshotService/CreateSnapshot", "an empty sandbox id", one(api::CreateSnapshotRequest { sandbox_id: String::new(), labels: Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/CreateSnapshot", "a label with a reserved key", one(api::CreateSnapshotRequest { sandbox_id: sb.clone(), labels: [("io.mentis.x".to_owned(), "1".to_owned())].into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/GetSnapshot", "an empty id", one(api::GetSnapshotRequest { snapshot_id: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/GetSnapshot", "a malformed id", one(api::GetSnapshotRequest { snapshot_id: huge.clone() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/GetSnapshot", "an unknown id", one(api::GetSnapshotRequest { snapshot_id: unknown.clone() }), NotFound, "SNAPSHOT_NOT_FOUND"),
        case("SnapshotService/ListSnapshots", "a page token it never gave", one(api::ListSnapshotsRequest { page_token: "nope".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/ListSnapshots", "page_size -5", one(api::ListSnapshotsRequest { page_size: -5, ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/ListSnapshots", "a malformed sandbox id", one(api::ListSnapshotsRequest { sandbox_id: "x".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/ListSnapshots", "an unknown space", one(api::ListSnapshotsRequest { space_id: "no-such-space".into(), ..Default::default() }), Ok, ""),
        case("SnapshotService/DeleteSnapshot", "an empty id", one(api::DeleteSnapshotRequest { snapshot_id: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("SnapshotService/DeleteSnapshot", "an unknown id", one(api::DeleteSnapshotRequest { snapshot_id: unknown.clone() }), Ok, ""),
        // TemplateService
        case("TemplateService/CreateTemplate", "no template", one(api::CreateTemplateRequest { template: None }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "a malformed name", one(api::CreateTemplateRequest { template: Some(api::Template { name: "No Name".into(), ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "a huge name", one(api::CreateTemplateRequest { template: Some(api::Template { name: huge.clone(), ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "a malformed image", one(api::CreateTemplateRequest { template: Some(api::Template { name: "t".into(), image: "Not An Image".into(), ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "negative limits", one(api::CreateTemplateRequest { template: Some(api::Template { name: "t".into(), limits: Some(api::SandboxLimits { memory_mb: -1, ..Default::default() }), ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "an env name holding '='", one(api::CreateTemplateRequest { template: Some(api::Template { name: "t".into(), env: [("A=B".to_owned(), "1".to_owned())].into(), ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "an empty start-up command", one(api::CreateTemplateRequest { template: Some(api::Template { name: "t".into(), setup_commands: vec![" ".into()], ..Default::default() }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/CreateTemplate", "an unknown space", one(api::CreateTemplateRequest { template: Some(api::Template { space_id: "no-such-space".into(), name: "t".into(), ..Default::default() }) }), NotFound, "SPACE_NOT_FOUND"),
        case("TemplateService/GetTemplate", "an unknown name", one(api::GetTemplateRequest { space_id: String::new(), name: "no-such-template".into() }), NotFound, "NOT_FOUND"),
        case("TemplateService/GetTemplate", "a huge name", one(api::GetTemplateRequest { space_id: String::new(), name: huge.clone() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/GetTemplate", "a malformed space", one(api::GetTemplateRequest { space_id: "Bad Space".into(), name: "t".into() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ListTemplates", "a page token it never gave", one(api::ListTemplatesRequest { page_token: "Not A Token".into(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ListTemplates", "page_size -5", one(api::ListTemplatesRequest { page_size: -5, ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ListTemplates", "an unknown space", one(api::ListTemplatesRequest { space_id: "no-such-space".into(), ..Default::default() }), NotFound, "SPACE_NOT_FOUND"),
        case("TemplateService/UpdateTemplate", "a path it cannot update", one(api::UpdateTemplateRequest { template: Some(api::Template { name: "t".into(), ..Default::default() }), update_mask: Some(prost_types::FieldMask { paths: vec!["name".into()] }) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/UpdateTemplate", "an unknown template", one(api::UpdateTemplateRequest { template: Some(api::Template { name: "no-such-template".into(), ..Default::default() }), update_mask: None }), NotFound, "NOT_FOUND"),
        case("TemplateService/DeleteTemplate", "an empty name", one(api::DeleteTemplateRequest { space_id: String::new(), name: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/DeleteTemplate", "an unknown template", one(api::DeleteTemplateRequest { space_id: String::new(), name: "no-such-template".into() }), NotFound, "NOT_FOUND"),
        case("TemplateService/BuildImage", "context before the header", one(api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Context(bytes::Bytes::from_static(b"x"))) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a malformed image name", one(api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Header(api::BuildImageHeader { image: "Not An Image".into(), ..Default::default() })) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a Dockerfile outside the context", one(api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Header(api::BuildImageHeader { image: "x/y:1".into(), dockerfile: "../Dockerfile".into(), ..Default::default() })) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "no context", one(api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Header(api::BuildImageHeader { image: "x/y:1".into(), ..Default::default() })) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a context that is no tar", vec![api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Header(api::BuildImageHeader { image: "x/y:1".into(), ..Default::default() })) }.encode_to_vec(), api::BuildImageRequest { kind: Some(api::build_image_request::Kind::Context(bytes::Bytes::from(vec![0xffu8; 2048]))) }.encode_to_vec()], InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ImportImage", "data before the header", one(api::ImportImageRequest { kind: Some(api::import_image_request::Kind::Data(bytes::Bytes::from_static(b"x"))) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ImportImage", "an instruction an import does not apply", one(api::ImportImageRequest { kind: Some(api::import_image_request::Kind::Header(api::ImportImageHeader { image: "x/y:1".into(), changes: vec!["RUN rm -rf /".into()], ..Default::default() })) }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ImportImage", "no data", one(api::ImportImageRequest { kind: Some(api::import_image_request::Kind::Header(api::ImportImageHeader { image: "x/y:1".into(), changes: vec![], ..Default::default() })) }), InvalidArgument, "INVALID_ARGUMENT"),
        // Issue 40: each of these was INTERNAL (or FAILED_PRECONDITION for a digest).
        case("TemplateService/BuildImage", "FROM Mentis/Executor:latest (upper case)", build(tag.clone(), dockerfile("FROM Mentis/Executor:latest\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "FROM a::b", build(tag.clone(), dockerfile("FROM a::b\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "FROM x@y", build(tag.clone(), dockerfile("FROM x@y\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a valid FROM \\ and CRLF continuation", build(api::BuildImageHeader { image: f.built_image.clone(), ..Default::default() }, dockerfile(&format!("FROM \\\r\n  {}\r\nLABEL crlf=yes\r\n", f.no_command_image))), Ok, ""),
        case("TemplateService/BuildImage", "a tag with a digest", build(api::BuildImageHeader { image: format!("x/y@sha256:{}", "0".repeat(64)), ..Default::default() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "65 build args", build(api::BuildImageHeader { build_args: (0..65).map(|i| (format!("A{i}"), "1".to_owned())).collect(), ..tag.clone() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "20 KB of build args", build(api::BuildImageHeader { build_args: (0..2).map(|i| (format!("A{i}"), "x".repeat(10_000))).collect(), ..tag.clone() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "build args of 15,000 quotes (90 KB escaped)", build(api::BuildImageHeader { build_args: [("A".to_owned(), "\"".repeat(15_000))].into(), ..tag.clone() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a 2000-byte Dockerfile path", build(api::BuildImageHeader { dockerfile: "d/".repeat(1000), ..tag.clone() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ImportImage", "a 20,000-character change", import(&f.refused_image, vec![format!("ENV A={}", "x".repeat(20_000))]), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ImportImage", "65 changes", import(&f.refused_image, vec!["ENV A=1".to_owned(); 65]), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "a malformed space", build(api::BuildImageHeader { space_id: "Not A Space".into(), ..tag.clone() }, dockerfile("FROM scratch\n")), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/BuildImage", "an unknown space", build(api::BuildImageHeader { space_id: "no-such-space".into(), ..tag.clone() }, dockerfile("FROM scratch\n")), NotFound, "SPACE_NOT_FOUND"),
        case("TemplateService/ImportImage", "an unknown space", vec![api::ImportImageRequest { kind: Some(api::import_image_request::Kind::Header(api::ImportImageHeader { image: f.refused_image.clone(), space_id: "no-such-space".into(), ..Default::default() })) }.encode_to_vec()], NotFound, "SPACE_NOT_FOUND"),
        case("TemplateService/ShareImage", "an empty image", one(api::ShareImageRequest { image: String::new(), shared: true }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ShareImage", "a malformed image", one(api::ShareImageRequest { image: "Not An Image".into(), shared: true }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ShareImage", "a huge image", one(api::ShareImageRequest { image: huge.clone(), shared: true }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TemplateService/ShareImage", "an image the engine does not have", one(api::ShareImageRequest { image: "mentis/no-such-image:none".into(), shared: true }), FailedPrecondition, "IMAGE_MISSING"),
        case("TemplateService/ShareImage", "nothing wrong", one(api::ShareImageRequest { image: f.no_command_image.clone(), shared: false }), Ok, ""),
        case("TemplateService/ImportImage", "a tag with a digest", import(&format!("x/y@sha256:{}", "0".repeat(64)), vec![]), InvalidArgument, "INVALID_ARGUMENT"),
        // SandboxService, with a template
        case("SandboxService/CreateSandbox", "an unknown template", one(api::CreateSandboxRequest { spec: Some(api::SandboxSpec { template: "no-such-template".into(), ..Default::default() }) }), NotFound, "NOT_FOUND"),
        // TerminalService
        case("TerminalService/Open", "input before start", vec![term(input(b"ls\r"))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "start in an unknown sandbox", vec![term(start(&unknown, &["cat"], 0))], NotFound, "SANDBOX_NOT_FOUND"),
        case("TerminalService/Open", "start with an empty sandbox id", vec![term(start("", &["cat"], 0))], InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/Open", "start 5000 columns wide", vec![term(start(&sb, &["cat"], 5000))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "start an empty program name", vec![term(start(&sb, &[""], 0))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "start a command with NUL", vec![term(start(&sb, &["c\0at"], 0))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "start 257 arguments", vec![term(start(&sb, &["x"; 257], 0))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "start with an env name holding '='", vec![term(api::open_request::Kind::Start(api::open_request::Start { sandbox_id: sb.clone(), env: [("A=B".to_owned(), "1".to_owned())].into(), ..Default::default() }))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "attach a malformed terminal id", vec![term(attach_terminal(&sb, "../x", 0))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "attach a huge terminal id", vec![term(attach_terminal(&sb, &huge, 0))], InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/Open", "attach an unknown terminal", vec![term(attach_terminal(&sb, "term-000000000000", 0))], NotFound, "TERMINAL_NOT_FOUND"),
        case("TerminalService/Open", "a resize to 0 x 5000 after start", vec![term(start(&sb, &["cat"], 0)), term(api::open_request::Kind::Resize(api::open_request::Resize { cols: 0, rows: 5000 }))], InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/Open", "an unknown signal after start", vec![term(start(&sb, &["cat"], 0)), term(api::open_request::Kind::Signal(api::open_request::Signal { name: "SEGV".into() }))], InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/Open", "a second start", vec![term(start(&sb, &["cat"], 0)), term(start(&sb, &["cat"], 0))], InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/Open", "garbage after start", vec![term(start(&sb, &["cat"], 0)), vec![0xff; 9]], InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/ListTerminals", "an empty sandbox id", one(api::ListTerminalsRequest { sandbox_id: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/ListTerminals", "an unknown sandbox", one(api::ListTerminalsRequest { sandbox_id: unknown.clone() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("TerminalService/ListTerminals", "nothing wrong", one(api::ListTerminalsRequest { sandbox_id: sb.clone() }), Ok, ""),
        case("TerminalService/CloseTerminal", "an empty terminal id", one(api::CloseTerminalRequest { sandbox_id: sb.clone(), terminal_id: String::new() }), InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/CloseTerminal", "a malformed terminal id", one(api::CloseTerminalRequest { sandbox_id: sb.clone(), terminal_id: "a b".into() }), InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/CloseTerminal", "an unknown terminal", one(api::CloseTerminalRequest { sandbox_id: sb.clone(), terminal_id: "term-000000000000".into() }), NotFound, "TERMINAL_NOT_FOUND"),
        case("TerminalService/CloseTerminal", "an unknown sandbox", one(api::CloseTerminalRequest { sandbox_id: unknown.clone(), terminal_id: "term-000000000000".into() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("TerminalService/CreateTerminalLink", "an empty sandbox id", one(api::CreateTerminalLinkRequest { sandbox_id: String::new(), ..Default::default() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/CreateTerminalLink", "an unknown sandbox", one(api::CreateTerminalLinkRequest { sandbox_id: unknown.clone(), ..Default::default() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("TerminalService/CreateTerminalLink", "a malformed terminal id", one(api::CreateTerminalLinkRequest { sandbox_id: sb.clone(), terminal_id: "../x".into(), ttl_seconds: 0 }), InvalidArgument, "INVALID_TERMINAL"),
        case("TerminalService/CreateTerminalLink", "a lifetime over 12 hours", one(api::CreateTerminalLinkRequest { sandbox_id: sb.clone(), terminal_id: String::new(), ttl_seconds: 12 * 3600 + 1 }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/CreateTerminalLink", "an unknown terminal", one(api::CreateTerminalLinkRequest { sandbox_id: sb.clone(), terminal_id: "term-000000000000".into(), ttl_seconds: 0 }), NotFound, "TERMINAL_NOT_FOUND"),
        case("TerminalService/CreateTerminalLink", "nothing wrong", one(api::CreateTerminalLinkRequest { sandbox_id: sb.clone(), ..Default::default() }), Ok, ""),
        case("TerminalService/RevokeTerminalLinks", "an empty sandbox id", one(api::RevokeTerminalLinksRequest { sandbox_id: String::new() }), InvalidArgument, "INVALID_ARGUMENT"),
        case("TerminalService/RevokeTerminalLinks", "an unknown sandbox", one(api::RevokeTerminalLinksRequest { sandbox_id: unknown.clone() }), NotFound, "SANDBOX_NOT_FOUND"),
        case("TerminalService/RevokeTerminalLinks", "nothing wrong", one(api::RevokeTerminalLinksRequest { sandbox_id: sb.clone() }), Ok, ""),
    ]
}

fn term(kind: api::open_request::Kind) -> Vec<u8> {
    api::OpenRequest { kind: Some(kind) }.encode_to_vec()
}

fn input(data: &'static [u8]) -> api::open_request::Kind {
    api::open_request::Kind::Input(api::open_request::Input {
        data: bytes::Bytes::from_static(data),
    })
}

fn start(sandbox: &str, command: &[&str], cols: u32) -> api::open_request::Kind {
    api::open_request::Kind::Start(api::open_request::Start {
        sandbox_id: sandbox.to_owned(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        cols,
        ..Default::default()
    })
}

fn attach_terminal(sandbox: &str, terminal: &str, after_seq: u64) -> api::open_request::Kind {
    api::open_request::Kind::Attach(api::open_request::Attach {
        sandbox_id: sandbox.to_owned(),
        terminal_id: terminal.to_owned(),
        after_seq,
    })
}

/// Every case of the suite.
pub fn cases(f: &Fixture) -> Vec<Case> {
    let methods = public_methods();
    let fields = field_cases(f);
    let named: BTreeSet<String> = fields.iter().map(|c| c.rpc.clone()).collect();
    assert_eq!(
        named, methods,
        "every method of the public API has cases of its own fields, and only those"
    );
    let mut all: Vec<Case> = methods.iter().flat_map(|m| wire_cases(m)).collect();
    all.extend(fields);
    all
}

/// Runs every case; the mismatches, one line each.
pub async fn run(channel: &ApiChannel, cases: &[Case]) -> Vec<String> {
    let mut wrong = Vec::new();
    for c in cases {
        let got: Answer = call(channel, &c.rpc, c.messages.clone()).await;
        let reason_ok = c.reason.is_empty() || got.reason == c.reason;
        if got.code != c.code || !reason_ok || got.message.len() > MAX_MESSAGE {
            let shown: String = got.message.chars().take(300).collect();
            wrong.push(format!(
                "{} with {}: want {:?} {}, got {:?} {} ({} bytes: {shown})",
                c.rpc,
                c.what,
                c.code,
                c.reason,
                got.code,
                got.reason,
                got.message.len()
            ));
        }
    }
    wrong
}
