//! Any image as a sandbox (docs/ARCHITECTURE.md, "Any image"): the executor and tini, linked statically,
//! are brought into every sandbox container from a volume mounted read-only at [`MOUNT`], and the
//! container's entrypoint is ours ([`entrypoint`]), whatever the image says. The image need not know
//! anything of MentisSandbox: it needs a `/bin/sh` and the right architecture, which [`DockerBackend::check_image`]
//! and the launcher check before the executor is waited for.
//!
//! The volume is filled from the executor image by `mentis-executor install` in a short-lived container of
//! that image, once at start ([`DockerBackend::ensure_executor_volume`]). It is named after the image's id,
//! so runtimes of one engine share it, a new executor image gets a new volume, and the old one is removed
//! once its image is gone and no container uses it.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures::StreamExt as _;
use mentis_core::{Error, Reason, Resource, Result, SandboxId};

use crate::DockerBackend;
use crate::error::{self, DockerCallExt as _, is_not_found};
use crate::labels::{LABEL_INSTANCE, LABEL_MANAGED};
use crate::layout::MOUNT;

/// `io.mentis.component` of the executor's volumes and of the containers that fill them.
const LABEL_COMPONENT: &str = "io.mentis.component";
const COMPONENT_VOLUME: &str = "executor-volume";
const COMPONENT_INSTALLER: &str = "executor-installer";
/// Another instance's installer that stopped (or never started) this long ago is dead.
const DEAD_INSTALLER_AFTER: Duration = Duration::from_secs(600);
/// How many of a container's last log lines an error quotes.
const LOG_LINES: &str = "20";

/// The name of the executor volume of the image with id `image_id` (`sha256:...`).
fn volume_name(image_id: &str) -> String {
    let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
    format!("mentis-executor-{}", &hex[..hex.len().min(12)])
}

impl DockerBackend {
    /// Fills (or refreshes) the volume of the executor image's `/.mentis` and returns its name; removes the
    /// volumes of earlier executor images that nothing uses any more.
    pub(crate) async fn ensure_executor_volume(&self) -> Result<String> {
        let image = &self.config.executor_image;
        let info = self
            .call("inspect image", self.docker.inspect_image(image))
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    Error::new(
                        Reason::FailedPrecondition,
                        format!(
                            "the executor image {} is not on this engine: build it (make image) or load it",
                            mentis_core::quoted(image)
                        ),
                    )
                } else {
                    error::to_core("inspect the executor image", e)
                }
            })?;
        let id = info.id.unwrap_or_default();
        let volume = volume_name(&id);
        self.call(
            "create volume",
            self.docker.create_volume(VolumeCreateRequest {
                name: Some(volume.clone()),
                driver: Some("local".into()),
                labels: Some(HashMap::from([
                    (LABEL_MANAGED.to_owned(), "true".to_owned()),
                    (LABEL_COMPONENT.to_owned(), COMPONENT_VOLUME.to_owned()),
                ])),
                ..Default::default()
            }),
        )
        .await
        .docker_ctx("create the executor volume")?;
        self.remove_dead_installers().await;
        self.install_into(&volume).await?;
        self.remove_stale_executor_volumes(&volume).await;
        tracing::info!(%volume, image, "executor volume ready");
        Ok(volume)
    }

    /// Runs `mentis-executor install` of the executor image into `volume`, in a container that is removed
    /// whatever happens.
    async fn install_into(&self, volume: &str) -> Result<()> {
        let name = format!("mentis-install-{}", uuid::Uuid::new_v4().simple());
        let body = ContainerCreateBody {
            image: Some(self.config.executor_image.clone()),
            entrypoint: Some(vec![
                format!("{MOUNT}/bin/mentis-executor"),
                "install".to_owned(),
                "/target".to_owned(),
            ]),
            cmd: Some(Vec::new()),
            user: Some("0:0".to_owned()),
            labels: Some(HashMap::from([
                (LABEL_MANAGED.to_owned(), "true".to_owned()),
                (LABEL_INSTANCE.to_owned(), self.config.instance.clone()),
                (LABEL_COMPONENT.to_owned(), COMPONENT_INSTALLER.to_owned()),
            ])),
            host_config: Some(HostConfig {
                binds: Some(vec![format!("{volume}:/target")]),
                network_mode: Some("none".to_owned()),
                // Root owns the new volume; writing there needs no capability.
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let result = async {
            self.call(
                "create container",
                self.docker.create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                    body,
                ),
            )
            .await
            .docker_ctx("create the executor's installer")?;
            self.call("start container", self.docker.start_container(&name, None))
                .await
                .docker_ctx("start the executor's installer")?;
            let code = self.wait_exit(&name).await?;
            if code == 0 {
                return Ok(());
            }
            let log = self.log_tail(&name).await;
            Err(Error::new(
                Reason::FailedPrecondition,
                format!(
                    "the executor image {} could not install its executor (exit code {code}): {log} \
                     (an image from before executors were linked statically? rebuild it: make image)",
                    mentis_core::quoted(&self.config.executor_image)
                ),
            ))
        }
        .await;
        self.remove_installer(&name).await;
        result
    }

    /// Removes an installer container, in whatever state; whether it was there to remove (a failure is
    /// logged: nothing waits for an installer's removal).
    async fn remove_installer(&self, name: &str) -> bool {
        let removed = self
            .call(
                "remove container",
                self.docker.remove_container(
                    name,
                    Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                ),
            )
            .await;
        match removed {
            Ok(()) => true,
            Err(e) if is_not_found(&e) => false,
            Err(e) => {
                tracing::warn!(container = %name, error = %e, "could not remove the executor's installer");
                false
            }
        }
    }

    /// Removes the installers, stopped or never started, that no install waits for any more: this
    /// instance's (its earlier process was stopped, or killed, in the middle of an install: the engine
    /// finishes a create whose caller is gone, and nothing of a dropped install removes its container),
    /// and other instances' made more than [`DEAD_INSTALLER_AFTER`] ago (an install takes seconds).
    /// Best effort: the install goes on whatever this finds.
    async fn remove_dead_installers(&self) {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_COMPONENT}={COMPONENT_INSTALLER}")],
        )]);
        let Ok(list) = self.all_containers(&filters).await else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for c in list {
            let ours = c.labels.as_ref().and_then(|l| l.get(LABEL_INSTANCE))
                == Some(&self.config.instance);
            let created = c.created.and_then(|t| u64::try_from(t).ok()).unwrap_or(now);
            use bollard::models::ContainerSummaryStateEnum as S;
            let stopped = !matches!(c.state, Some(S::RUNNING | S::RESTARTING));
            let dead =
                stopped && (ours || now.saturating_sub(created) > DEAD_INSTALLER_AFTER.as_secs());
            let Some(id) = c.id.filter(|_| dead) else {
                continue;
            };
            if self.remove_installer(&id).await {
                tracing::info!(container = %id, "removed an installer an earlier install left");
            }
        }
    }

    /// The exit code of a container, once it exits.
    async fn wait_exit(&self, name: &str) -> Result<i64> {
        let options = WaitContainerOptionsBuilder::default()
            .condition("not-running")
            .build();
        let mut waits = self.docker.wait_container(name, Some(options));
        let next = tokio::time::timeout(self.config.call_timeout, waits.next()).await;
        match next {
            Ok(Some(Ok(r))) => Ok(r.status_code),
            // bollard reports a non-zero exit as this error.
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => {
                Ok(code)
            }
            Ok(Some(Err(e))) => Err(error::to_core("wait for a container", e)),
            Ok(None) => Err(Error::internal(format!(
                "the wait for container {name} ended without an answer"
            ))),
            Err(_) => Err(Error::new(
                Reason::EngineUnavailable,
                format!("container {name} did not exit in time"),
            )),
        }
    }

    /// A container's last log lines (stdout and stderr), for an error message.
    pub(crate) async fn log_tail(&self, name: &str) -> String {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(LOG_LINES)
            .build();
        let mut logs = self.docker.logs(name, Some(options));
        let mut text = String::new();
        let read = async {
            while let Some(Ok(chunk)) = logs.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        let text = text.trim();
        if text.is_empty() {
            "it wrote nothing".to_owned()
        } else {
            text.to_owned()
        }
    }

    /// Removes the executor volumes of images that are gone, unless a container still uses them.
    async fn remove_stale_executor_volumes(&self, current: &str) {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_COMPONENT}={COMPONENT_VOLUME}")],
        )]);
        let Ok(list) = self
            .call(
                "list volumes",
                self.docker.list_volumes(Some(
                    ListVolumesOptionsBuilder::default()
                        .filters(&filters)
                        .build(),
                )),
            )
            .await
        else {
            return;
        };
        for v in list.volumes.unwrap_or_default() {
            let Some(short_id) = v.name.strip_prefix("mentis-executor-") else {
                continue;
            };
            // Kept while its image exists: a runtime started from it may still make sandboxes.
            if v.name == current
                || !matches!(
                    self.call("inspect image", self.docker.inspect_image(short_id)).await,
                    Err(ref e) if is_not_found(e)
                )
            {
                continue;
            }
            // Not forced: the engine refuses while a container uses it.
            match self
                .call(
                    "remove volume",
                    self.docker.remove_volume(
                        &v.name,
                        Some(RemoveVolumeOptionsBuilder::default().force(false).build()),
                    ),
                )
                .await
            {
                Ok(()) => tracing::info!(volume = %v.name, "removed an earlier executor volume"),
                Err(e) => {
                    tracing::debug!(volume = %v.name, error = %e, "an earlier executor volume stays")
                }
            }
        }
    }

    /// Whether `spec.image` can run a sandbox here, before anything is made: it is on this engine, and
    /// built for this machine's architecture.
    pub(crate) async fn check_image(&self, id: SandboxId, image: &str) -> Result<()> {
        let quoted = mentis_core::quoted(image);
        let info = match self
            .call("inspect image", self.docker.inspect_image(image))
            .await
        {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => {
                return Err(Error::new(
                    Reason::ImageMissing,
                    format!(
                        "image {quoted} is not on this engine (there is no registry to pull from): build it, \
                         import it or load it first"
                    ),
                )
                .about(Resource::sandbox(id)));
            }
            Err(e) => return Err(error::to_core("inspect the image", e)),
        };
        let arch = info.architecture.unwrap_or_default();
        if !arch.is_empty() && arch != self.arch {
            return Err(Error::new(
                Reason::FailedPrecondition,
                format!(
                    "image {quoted} is built for {arch}, and this engine runs {} containers",
                    self.arch
                ),
            )
            .about(Resource::sandbox(id)));
        }
        Ok(())
    }

    /// Why the container of a sandbox that is starting stopped, when it did: its exit code and last log
    /// lines (the launcher says what the image lacks).
    pub(crate) async fn why_stopped(&self, id: SandboxId) -> Result<Option<Error>> {
        let name = Self::container_name(id);
        let info = match self
            .call(
                "inspect container",
                self.docker.inspect_container(&name, None),
            )
            .await
        {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(error::to_core("inspect the container", e)),
        };
        let Some(state) = info.state else {
            return Ok(None);
        };
        use bollard::models::ContainerStateStatusEnum as S;
        if !matches!(state.status, Some(S::EXITED | S::DEAD)) {
            return Ok(None);
        }
        let code = state.exit_code.unwrap_or(-1);
        let mut why = self.log_tail(&name).await;
        if state.oom_killed == Some(true) {
            why = format!("killed for lack of memory; {why}");
        } else if let Some(e) = state.error.filter(|e| !e.is_empty()) {
            why = format!("{e}; {why}");
        }
        let image = info.config.and_then(|c| c.image).unwrap_or_default();
        Ok(Some(
            Error::new(
                Reason::FailedPrecondition,
                format!(
                    "the container of image {} exited as it started (exit code {code}), so it cannot run a \
                     sandbox: {why}",
                    mentis_core::quoted(&image)
                ),
            )
            .about(Resource::sandbox(id)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_is_named_after_its_image() {
        assert_eq!(
            volume_name("sha256:0123456789abcdef0123"),
            "mentis-executor-0123456789ab"
        );
    }
}
