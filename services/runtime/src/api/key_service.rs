//! KeyService: create, list and revoke API keys. Admin only.

use std::collections::BTreeSet;
use std::sync::Arc;

use mentis_core::{Error, Reason, SpaceId};
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
        let key = self
            .keyring
            .revoke(&req.into_inner().key_id)
            .map_err(to_status)?;
        Ok(Response::new(api::RevokeApiKeyResponse {
            api_key: Some(key_to_proto(&key)),
        }))
    }
}
