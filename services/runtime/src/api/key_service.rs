//! KeyService: create, list and revoke API keys. Admin only.

use std::collections::BTreeSet;
use std::sync::Arc;

use mentis_core::{Error, Reason, SpaceId, quoted};
use mentis_proto::api::{self, key_service_server::KeyService};
use tonic::{Request, Response, Status};

use super::access;
use super::status::to_status;
use crate::auth::{KeyRecord, Keyring};
use crate::convert::timestamp;
use crate::sandboxes::Manager;

/// Implementation of `mentis.v1.KeyService`.
#[derive(Debug, Clone)]
pub struct KeyApi {
    manager: Arc<Manager>,
    keyring: Arc<Keyring>,
}

impl KeyApi {
    pub fn new(manager: Arc<Manager>, keyring: Arc<Keyring>) -> Self {
        Self { manager, keyring }
    }
}

fn key_to_proto(k: &KeyRecord) -> api::ApiKey {
    api::ApiKey {
        key_id: k.id.clone(),
        name: k.name.clone(),
        space_ids: k.spaces.iter().map(ToString::to_string).collect(),
        create_time: Some(timestamp(k.created_at)),
        revoke_time: k.revoked_at.map(timestamp),
    }
}

/// Longest key id a request may name (the runtime's are `key-` and 16 hex digits).
const MAX_KEY_ID_LEN: usize = 64;

/// A key id in a request: given, bounded and printable (an unknown one is then NOT_FOUND).
fn check_key_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::invalid("key_id is required").at("key_id"));
    }
    if id.len() > MAX_KEY_ID_LEN || id.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "key_id {} is not a key id (at most {MAX_KEY_ID_LEN} printable characters, like key-3f9c2a71d0b4e6a8)",
            quoted(id)
        ))
        .at("key_id"));
    }
    Ok(())
}

#[tonic::async_trait]
impl KeyService for KeyApi {
    async fn create_api_key(
        &self,
        req: Request<api::CreateApiKeyRequest>,
    ) -> Result<Response<api::CreateApiKeyResponse>, Status> {
        access::admin(&req, "CreateApiKey")?;
        if !self.keyring.enabled() {
            return Err(to_status(Error::new(
                Reason::AuthDisabled,
                "authentication is disabled (MENTIS_AUTH=disabled): keys would not be checked",
            )));
        }
        let r = req.into_inner();
        let spaces = r
            .space_ids
            .iter()
            .map(|s| SpaceId::parse(s))
            .collect::<Result<BTreeSet<_>, _>>()
            .map_err(to_status)?;
        for s in &spaces {
            // A key for a space that does not exist is most likely a typo.
            self.manager.get_space(s).map_err(to_status)?;
        }
        let (key, secret) = self.keyring.create(&r.name, spaces).map_err(to_status)?;
        Ok(Response::new(api::CreateApiKeyResponse {
            api_key: Some(key_to_proto(&key)),
            secret,
        }))
    }

    async fn list_api_keys(
        &self,
        req: Request<api::ListApiKeysRequest>,
    ) -> Result<Response<api::ListApiKeysResponse>, Status> {
        access::admin(&req, "ListApiKeys")?;
        Ok(Response::new(api::ListApiKeysResponse {
            api_keys: self.keyring.list().iter().map(key_to_proto).collect(),
        }))
    }

    async fn revoke_api_key(
        &self,
        req: Request<api::RevokeApiKeyRequest>,
    ) -> Result<Response<api::RevokeApiKeyResponse>, Status> {
        access::admin(&req, "RevokeApiKey")?;
        let id = req.into_inner().key_id;
        check_key_id(&id).map_err(to_status)?;
        let key = self.keyring.revoke(&id).map_err(to_status)?;
        Ok(Response::new(api::RevokeApiKeyResponse {
            api_key: Some(key_to_proto(&key)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_must_be_given_bounded_and_printable() {
        assert!(check_key_id("key-3f9c2a71d0b4e6a8").is_ok());
        assert!(
            check_key_id("key-nope").is_ok(),
            "well formed: NOT_FOUND later"
        );
        for bad in ["", "a\0b", &"k".repeat(MAX_KEY_ID_LEN + 1)] {
            let e = check_key_id(bad).expect_err(bad);
            assert_eq!(e.field(), Some("key_id"));
            assert!(e.to_string().len() < 200);
        }
    }
}
