//! The dedicated executor network: a user-defined bridge, internal (no route out) and with inter-container
//! traffic disabled, so sandboxes reach neither each other nor the outside while the host reaches executors.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use mentis_core::{Error, Result};

use crate::config::DockerConfig;
use crate::error::{is_not_found, to_core};
use crate::labels::LABEL_MANAGED;

/// Creates the network when it is missing; checks that an existing one is internal.
pub(crate) async fn ensure(docker: &Docker, config: &DockerConfig) -> Result<()> {
    // Engines of API 1.41 accept two networks with one name; serialise the check-then-create of the
    // runtimes in this process (tests start many) so they never race into a duplicate.
    static ENSURE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _guard = ENSURE.lock().await;
    match docker.inspect_network(&config.network, None).await {
        Ok(net) => {
            if net.internal != Some(true) {
                return Err(Error::FailedPrecondition(format!(
                    "network {} exists but is not internal; remove it and let the runtime create it",
                    config.network
                )));
            }
            return Ok(());
        }
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(to_core("inspect the executor network", e)),
    }
    let request = NetworkCreateRequest {
        name: config.network.clone(),
        driver: Some("bridge".into()),
        internal: Some(true),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_owned(),
            "false".to_owned(),
        )])),
        labels: Some(HashMap::from([(
            LABEL_MANAGED.to_owned(),
            "true".to_owned(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(_) => {
            tracing::info!(network = %config.network, "created the executor network");
            Ok(())
        }
        // Another runtime instance created it at the same moment.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(to_core("create the executor network", e)),
    }
}
