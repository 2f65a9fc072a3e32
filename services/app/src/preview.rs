//! Preview URLs (docs/ARCHITECTURE.md, "Preview URLs"): SandboxService.GetPreviewUrl signs a token for one
//! sandbox and port ([`token`]); the HTTP listener (`MENTIS_HTTP_LISTEN`) takes it at
//! `/preview/<sandbox>/<port>/`, or on the host `<port>-<sandbox>.<MENTIS_PREVIEW_DOMAIN>`, and passes the
//! traffic, WebSockets too, to that port of the sandbox over the executor network, which only the runtime
//! reaches ([`proxy`]). A token opens while it has not expired and the revocation generations it carries
//! are current (`store::previews`).

mod previews;
pub mod token;

pub use previews::{DEFAULT_TTL, Issued, MAX_TTL, Previews, Refusal, TOKEN_HEADER, TOKEN_PARAM};
