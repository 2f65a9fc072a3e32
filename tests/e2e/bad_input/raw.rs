//! Calls any method of the public API with hand-made bytes as its messages (no generated client checks
//! them), and what the answer tells a program: the status code, ErrorInfo's reason and the message.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use mentis_e2e::ApiChannel;
use prost::encoding::{WireType, encode_key, encode_varint};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// How long a stream may take to give its first verdict.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// How a method streams (from the protos).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Unary,
    ServerStream,
    ClientStream,
    Bidi,
}

/// The shape of a method named `Service/Method`.
pub fn shape(rpc: &str) -> Shape {
    match rpc.rsplit('/').next().unwrap_or_default() {
        "Connect" | "Open" | "BuildImage" => Shape::Bidi,
        "WriteFile" | "Upload" | "ImportImage" => Shape::ClientStream,
        "Execute" | "StreamObservations" | "ReadFile" | "Download" => Shape::ServerStream,
        _ => Shape::Unary,
    }
}

/// What a call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: Code,
    pub reason: String,
    pub message: String,
}

impl Answer {
    fn of(s: &Status) -> Self {
        use tonic_types::StatusExt;
        Self {
            code: s.code(),
            reason: s
                .get_error_details()
                .error_info()
                .filter(|i| i.domain == "mentis.dev")
                .map(|i| i.reason.clone())
                .unwrap_or_default(),
            message: s.message().to_owned(),
        }
    }

    fn ok() -> Self {
        Self {
            code: Code::Ok,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn silent() -> Self {
        Self {
            code: Code::DeadlineExceeded,
            reason: String::new(),
            message: format!("no verdict within {ANSWER_WITHIN:?} (the call hangs)"),
        }
    }
}

/// Sends `messages` (already encoded) to `rpc` (`mentis.v1.SandboxService/GetSandbox` without the
/// package: `SandboxService/GetSandbox`). A stream's verdict is its first error or its end; a server stream
/// that delivers a message has accepted the call (Ok).
pub async fn call(channel: &ApiChannel, rpc: &str, messages: Vec<Vec<u8>>) -> Answer {
    let path = PathAndQuery::try_from(format!("/mentis.v1.{rpc}")).expect("a method path");
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if let Err(e) = grpc.ready().await {
        return Answer::of(&Status::unavailable(format!("not ready: {e}")));
    }
    let mut messages: Vec<Bytes> = messages.into_iter().map(Bytes::from).collect();
    let stream = futures::stream::iter(messages.clone());
    let verdict = match shape(rpc) {
        Shape::Unary => {
            let one = messages.pop().unwrap_or_default();
            grpc.unary(tonic::Request::new(one), path, Raw)
                .await
                .map(|_| Answer::ok())
        }
        Shape::ClientStream => grpc
            .client_streaming(tonic::Request::new(stream), path, Raw)
            .await
            .map(|_| Answer::ok()),
        Shape::ServerStream => {
            let one = messages.pop().unwrap_or_default();
            match grpc
                .server_streaming(tonic::Request::new(one), path, Raw)
                .await
            {
                Ok(r) => {
                    match tokio::time::timeout(ANSWER_WITHIN, r.into_inner().message()).await {
                        Ok(Ok(_)) => Ok(Answer::ok()),
                        Ok(Err(s)) => Err(s),
                        Err(_) => Ok(Answer::silent()),
                    }
                }
                Err(s) => Err(s),
            }
        }
        Shape::Bidi => match grpc.streaming(tonic::Request::new(stream), path, Raw).await {
            // Answers to the client's messages are skipped: the verdict is how the stream ends.
            Ok(r) => {
                let mut inbound = r.into_inner();
                loop {
                    match tokio::time::timeout(ANSWER_WITHIN, inbound.message()).await {
                        Ok(Ok(Some(_))) => continue,
                        Ok(Ok(None)) => break Ok(Answer::ok()),
                        Ok(Err(s)) => break Err(s),
                        Err(_) => break Ok(Answer::silent()),
                    }
                }
            }
            Err(s) => Err(s),
        },
    };
    verdict.unwrap_or_else(|s| Answer::of(&s))
}

/// A length-delimited field (a string, bytes or a message) of `tag` holding `value`.
pub fn field(tag: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 10);
    encode_key(tag, WireType::LengthDelimited, &mut out);
    encode_varint(value.len() as u64, &mut out);
    out.extend_from_slice(value);
    out
}

/// Bytes that are not UTF-8.
pub const NOT_UTF8: &[u8] = b"ab\xff\xfe\xc3";

/// Sends and receives messages as the bytes they are.
#[derive(Debug, Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Self::Encoder {
        Raw
    }

    fn decoder(&mut self) -> Self::Decoder {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
