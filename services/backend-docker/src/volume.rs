//! Workspace volumes: one named volume per sandbox, mounted on /workspace. A sandbox with a disk limit gets
//! a volume on a filesystem of its own ([`crate::disk`]); one without (disk limits off, or a sandbox made
//! before them) a plain volume on the host's disk.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::RemoveVolumeOptionsBuilder;
use mentis_core::{BackendSpec, Error, Reason, Result, SandboxId};

use crate::DockerBackend;
use crate::disk::MOUNT_OPTIONS;
use crate::error::{self, DockerCallExt, is_not_found};
use crate::labels::LABEL_DISK_IMAGE;

impl DockerBackend {
    pub(crate) fn volume_name(id: SandboxId) -> String {
        format!("mentis-ws-{id}")
    }

    /// Creates the workspace volume of `spec`, bounded by its disk limit when it has one, and returns its
    /// name.
    pub(crate) async fn create_volume(
        &self,
        spec: &BackendSpec,
        mut labels: HashMap<String, String>,
    ) -> Result<String> {
        let volume = Self::volume_name(spec.id);
        let mut driver_opts = None;
        if spec.limits.disk_mb > 0 {
            let disks = self.disks.as_ref().ok_or_else(|| {
                Error::new(
                    Reason::FailedPrecondition,
                    "this backend has no folder for disk images, so it cannot bound a workspace",
                )
            })?;
            let link = disks.create(&volume, spec.limits.disk_mb).await?;
            labels.insert(
                LABEL_DISK_IMAGE.to_owned(),
                disks.image(&volume).to_string_lossy().into_owned(),
            );
            driver_opts = Some(HashMap::from([
                ("type".to_owned(), "ext4".to_owned()),
                ("device".to_owned(), link.to_string_lossy().into_owned()),
                ("o".to_owned(), MOUNT_OPTIONS.to_owned()),
            ]));
        }
        self.call(
            "create volume",
            self.docker.create_volume(VolumeCreateRequest {
                name: Some(volume.clone()),
                driver: Some("local".into()),
                driver_opts,
                labels: Some(labels),
                ..Default::default()
            }),
        )
        .await
        .docker_ctx("create the workspace volume")?;
        Ok(volume)
    }

    /// Removes the workspace volume of a sandbox and its disk image (idempotent). The container must be
    /// gone.
    pub(crate) async fn remove_volume(&self, id: SandboxId) -> Result<()> {
        let volume = Self::volume_name(id);
        // The engine may still hold the volume for a moment after a forced remove: retry briefly.
        let mut attempt = 0;
        loop {
            match self
                .call(
                    "remove volume",
                    self.docker.remove_volume(
                        &volume,
                        Some(RemoveVolumeOptionsBuilder::default().force(true).build()),
                    ),
                )
                .await
            {
                Ok(()) => break,
                Err(e) if is_not_found(&e) => break,
                Err(e) if attempt < 20 => {
                    tracing::debug!(%volume, error = %e, "volume still busy, retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(error::to_core("remove the workspace volume", e)),
            }
        }
        match &self.disks {
            Some(disks) => disks.remove(&volume).await,
            None => Ok(()),
        }
    }

    /// Before a sandbox's container starts again: its disk image must be attached (its device went with
    /// the container's last stop: see [`crate::disk`]).
    pub(crate) async fn attach_disk(&self, id: SandboxId) -> Result<()> {
        let volume = Self::volume_name(id);
        match &self.disks {
            Some(disks) if disks.has(&volume) => disks.attach(&volume).await.map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Once a sandbox's container runs: its disk image's device goes when the container's mount does.
    /// A failure is logged (the device then stays until the sandbox is deleted or the next start).
    pub(crate) async fn release_disk(&self, id: SandboxId) {
        let volume = Self::volume_name(id);
        if let Some(disks) = &self.disks
            && disks.has(&volume)
            && let Err(e) = disks.release(&volume).await
        {
            tracing::warn!(%volume, error = %e.chain(), "could not release a workspace's loop device");
        }
    }

    /// At start: checks what disk limits need (when new sandboxes get them), releases the loop device of
    /// every workspace image (those of running containers go with their mounts; others at once: an attach
    /// whose start never came, devices of a runtime before releases), and removes images whose volume is
    /// gone (a crash between making the image and the volume, or a volume removed by hand).
    pub(crate) async fn reconcile_disks(&self) -> Result<()> {
        let Some(disks) = &self.disks else {
            return Ok(());
        };
        if self.config.disk_limits {
            disks.check().await?;
        }
        for volume in disks.volumes() {
            // Any instance's volume of that name counts: an image is removed only when no volume uses it.
            match self
                .call("inspect volume", self.docker.inspect_volume(&volume))
                .await
            {
                Ok(_) => {
                    if let Err(e) = disks.release(&volume).await {
                        tracing::warn!(%volume, error = %e.chain(), "could not release a workspace's loop device");
                    }
                }
                Err(e) if is_not_found(&e) => {
                    tracing::info!(%volume, "removing a disk image whose volume is gone");
                    if let Err(e) = disks.remove(&volume).await {
                        tracing::warn!(%volume, error = %e.chain(), "could not remove a disk image");
                    }
                }
                Err(e) => return Err(error::to_core("inspect a workspace volume", e)),
            }
        }
        Ok(())
    }
}
