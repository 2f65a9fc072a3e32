//! The executor wire and the journal have schemas of their own (mentis.executor.v1, mentis.journal.v1), made
//! from the public messages they used to carry. Their bytes must stay what those messages encoded: a runtime
//! upgraded in place talks to executors started before, and reads journals written before. Each test fills
//! every field of a public message, and checks that the role's own message reads those bytes and writes them
//! back unchanged (and the other way round), so a field renumbered or retyped on either side fails here.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use mentis_proto::{api, executor as exec, journal};
use prost::Message;

fn ts() -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: 1_700_000_000,
        nanos: 7,
    })
}

fn dur() -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: 3,
        nanos: 9,
    })
}

fn one(k: &str, v: &str) -> std::collections::HashMap<String, String> {
    [(k.to_owned(), v.to_owned())].into()
}

/// `a` encodes to bytes that `B` decodes and encodes back byte for byte, and the same from `B`'s side.
fn same_bytes<A: Message + Default, B: Message + Default>(a: &A) {
    let bytes = a.encode_to_vec();
    assert!(!bytes.is_empty(), "the fixture sets fields");
    let b = B::decode(bytes.as_slice()).unwrap();
    assert_eq!(b.encode_to_vec(), bytes, "{}", std::any::type_name::<B>());
    let back = A::decode(b.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.encode_to_vec(), bytes);
}

fn kinds() -> Vec<api::observation::Kind> {
    use api::observation::Kind as K;
    vec![
        K::CmdStart(api::CmdStart {
            command: "make".into(),
            pid: 42,
        }),
        K::CmdOutput(api::CmdOutput {
            stream: api::OutputStream::Stderr as i32,
            data: Bytes::from_static(b"\xff\x00out"),
        }),
        K::CmdEnd(api::CmdEnd {
            exit_code: 137,
            reason: api::EndReason::PidsLimitReached as i32,
            duration: dur(),
            signal: 9,
            message: "m".into(),
        }),
        K::IpythonStart(api::IPythonStart {
            code: "1 + 1".into(),
            execution_count: 3,
        }),
        K::IpythonOutput(api::IPythonOutput {
            kind: api::IpythonOutputKind::UpdateDisplayData as i32,
            text: "t".into(),
            data: one("text/plain", "2"),
            display_id: "d".into(),
        }),
        K::IpythonResult(api::IPythonResult {
            status: api::IpythonStatus::Aborted as i32,
            execution_count: 3,
            error_name: "E".into(),
            error_value: "v".into(),
            traceback: vec!["a".into(), "b".into()],
            reason: "r".into(),
            duration: dur(),
        }),
        K::Error(api::ErrorObservation {
            message: "m".into(),
            details: one("k", "v"),
        }),
        K::AgentState(api::AgentState {
            message: "m".into(),
            details: one("k", "v"),
        }),
    ]
}

#[test]
fn the_executor_reads_and_writes_what_the_public_messages_did() {
    for action in [
        api::action::Kind::Shell(api::ShellAction {
            command: "echo hi".into(),
            work_dir: "sub".into(),
            env: one("A", "1"),
            timeout_seconds: 7,
            stdin: Bytes::from_static(b"in"),
            keep_stdin_open: true,
            session: "s".into(),
        }),
        api::action::Kind::Ipython(api::IPythonAction {
            code: "x = 1".into(),
            timeout_seconds: 5,
            rollback_on_error: Some(false),
        }),
    ] {
        same_bytes::<_, exec::Action>(&api::Action { kind: Some(action) });
    }
    // An event of an action carries the public kinds' messages under the same numbers as an observation.
    for kind in kinds() {
        let observation = api::Observation {
            kind: Some(kind),
            ..Default::default()
        };
        same_bytes::<_, exec::RunResponse>(&observation);
    }
    same_bytes::<_, exec::VariableSummary>(&api::VariableSummary {
        name: "df".into(),
        r#type: "DataFrame".into(),
        summary: Some(prost_types::Struct {
            fields: [(
                "x".to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::NumberValue(1.5)),
                },
            )]
            .into(),
        }),
    });
    use api::open_request::Kind as In;
    for request in [
        In::Start(api::open_request::Start {
            sandbox_id: "sb".into(),
            command: vec!["/bin/bash".into(), "-l".into()],
            cols: 120,
            rows: 40,
            env: one("TERM", "xterm"),
            work_dir: "w".into(),
            idle_timeout_seconds: 60,
        }),
        In::Attach(api::open_request::Attach {
            sandbox_id: "sb".into(),
            terminal_id: "t".into(),
            after_seq: 9,
        }),
        In::Input(api::open_request::Input {
            data: Bytes::from_static(b"ls\r"),
        }),
        In::Resize(api::open_request::Resize { cols: 80, rows: 24 }),
        In::Signal(api::open_request::Signal { name: "INT".into() }),
    ] {
        same_bytes::<_, exec::OpenRequest>(&api::OpenRequest {
            kind: Some(request),
        });
    }
    use api::open_response::Kind as Out;
    for response in [
        Out::Started(api::open_response::Started {
            terminal_id: "t".into(),
            last_seq: 3,
            cols: 80,
            rows: 24,
        }),
        Out::Output(api::open_response::Output {
            seq: 4,
            data: Bytes::from_static(b"\x1b[0m$ "),
        }),
        Out::Exited(api::open_response::Exited {
            exit_code: 1,
            signal: 15,
        }),
        Out::Keepalive(api::TerminalKeepalive { time: ts() }),
    ] {
        same_bytes::<_, exec::OpenResponse>(&api::OpenResponse {
            kind: Some(response),
        });
    }
    same_bytes::<_, exec::TerminalInfo>(&api::TerminalInfo {
        terminal_id: "t".into(),
        command: vec!["top".into()],
        cols: 80,
        rows: 24,
        pid: 77,
        created_at: ts(),
        last_seq: 12,
        attached: 2,
        exit_code: Some(0),
    });
    same_bytes::<_, exec::FileInfo>(&api::FileInfo {
        path: "a/b".into(),
        r#type: api::FileType::Symlink as i32,
        size: 10,
        mode: 0o644,
        modify_time: ts(),
        symlink_target: "c".into(),
    });
    same_bytes::<_, exec::UploadSummary>(&api::UploadResponse {
        files: 1,
        directories: 2,
        links: 3,
        bytes: 4,
    });
}

/// The origin as runtimes wrote it after an observation, in the fields `Observation` reserves.
#[derive(Clone, PartialEq, prost::Message)]
struct Origin {
    #[prost(string, tag = "2046")]
    action: String,
    #[prost(uint64, tag = "2047")]
    index: u64,
}

#[test]
fn a_journal_record_is_the_observation_and_origin_journals_held() {
    for kind in kinds() {
        let observation = api::Observation {
            seq: 300,
            sandbox_id: "0190-sandbox".into(),
            action_id: "0190-action".into(),
            time: ts(),
            kind: Some(kind),
        };
        same_bytes::<_, journal::Record>(&observation);
        let mut bytes = observation.encode_to_vec();
        Origin {
            action: "0190-action".into(),
            index: 5,
        }
        .encode(&mut bytes)
        .unwrap();
        let record = journal::Record::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            (record.origin_action.as_str(), record.origin_index),
            ("0190-action", 5)
        );
        assert_eq!(record.encode_to_vec(), bytes);
    }
}
