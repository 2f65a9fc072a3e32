//! The tower layer in front of every service: it authenticates each call from its `authorization` header
//! and puts the [`Caller`] into the request's extensions, where the services find it. It lets through only
//! health checks and reflection unauthenticated, so a service added later is closed until proven open.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;

use super::status::to_status;
use crate::auth::{Caller, Keyring};

/// Paths that need no key.
fn is_open(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

/// Adds [`Authenticate`] to a server.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    keyring: Arc<Keyring>,
}

impl AuthLayer {
    pub fn new(keyring: Arc<Keyring>) -> Self {
        Self { keyring }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            keyring: Arc::clone(&self.keyring),
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    keyring: Arc<Keyring>,
}

impl<S, B> tower::Service<http::Request<B>> for Authenticate<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, std::future::Ready<Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if is_open(req.uri().path()) {
            return Either::Left(self.inner.call(req));
        }
        let header = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        match self.keyring.authenticate(header) {
            Ok(caller) => {
                req.extensions_mut().insert::<Caller>(caller);
                Either::Left(self.inner.call(req))
            }
            Err(e) => {
                tracing::debug!(path = req.uri().path(), error = %e, "call refused");
                Either::Right(std::future::ready(Ok(to_status(e).into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_health_and_reflection_are_open() {
        assert!(is_open("/grpc.health.v1.Health/Check"));
        assert!(is_open(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        ));
        assert!(is_open(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!is_open("/mentis.v1.SandboxService/CreateSandbox"));
        assert!(!is_open("/mentis.v1.KeyService/CreateApiKey"));
        assert!(!is_open("/grpc.health.v1.HealthX/Check"));
    }
}
