//! Disk limits of workspaces (docs/ARCHITECTURE.md, Security model: disk). A bounded workspace is an ext4
//! filesystem of its own: a sparse image file `<dir>/<volume>.ext4` of the limit's size, attached to a loop
//! device, which the workspace volume mounts (Docker's local driver, `type=ext4`). Writing past the limit is
//! ENOSPC inside that sandbox only; the host's disk holds what the sandbox really wrote (deleted files are
//! given back through `discard`).
//!
//! The volume names its device through the link `<dir>/<volume>.dev` → `/dev/loopN` and never the loop
//! device itself, because the options of a volume cannot change while the loop number can: before a
//! container starts, [`Disks::attach`] attaches its image wherever a loop device is free and only moves the
//! link.
//!
//! A loop device is a finite host resource that nothing frees when its user goes away, so none is left to
//! outlive its container: once the container runs (its mount holds the device), [`Disks::release`]
//! detaches the device lazily (`losetup -d` of a busy device sets the kernel's autoclear flag), and the
//! kernel frees it when the container's mount goes, whoever stops the container: the runtime, `docker rm
//! -f`, an engine or a runtime container going down (Compose, Docker-in-Docker), a host reboot. A
//! container that starts again gets its image attached again first. At start the runtime releases what a
//! stop left attached (an attach whose start never came, devices of an older runtime).

use std::path::{Path, PathBuf};
use std::time::Duration;

use mentis_core::{Error, Reason, Result};

/// Mount options of a bounded workspace: deleted blocks are punched out of the sparse image.
pub(crate) const MOUNT_OPTIONS: &str = "discard";

/// Where the images are and whom their root belongs to.
#[derive(Debug, Clone)]
pub(crate) struct Disks {
    /// Absolute: the engine resolves the link, and the kernel names backing files by absolute path.
    dir: PathBuf,
    /// `uid:gid` of the workspace's root directory (the sandbox user).
    owner: String,
    /// Bound of each tool run.
    timeout: Duration,
}

impl Disks {
    /// Creates `dir` when missing.
    pub(crate) fn new(dir: &Path, user: &str, timeout: Duration) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::internal(format!(
                "cannot create the disk image folder {}: {e}",
                dir.display()
            ))
        })?;
        // The images hold the sandboxes' files: for root (and the engine) only.
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| {
                Error::internal(format!(
                    "cannot restrict the disk image folder {}: {e}",
                    dir.display()
                ))
            })?;
        let dir = std::fs::canonicalize(dir).map_err(|e| {
            Error::internal(format!(
                "cannot resolve the disk image folder {}: {e}",
                dir.display()
            ))
        })?;
        Ok(Self {
            dir,
            owner: owner_of(user),
            timeout,
        })
    }

    /// The image file of a volume.
    pub(crate) fn image(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.ext4"))
    }

    /// The link the volume mounts, pointing at the image's loop device.
    pub(crate) fn link(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.dev"))
    }

    /// Whether a volume has an image here.
    pub(crate) fn has(&self, volume: &str) -> bool {
        self.image(volume).exists()
    }

    /// Checks that the tools are installed and loop devices can be had, so a missing piece stops the start
    /// rather than every create.
    pub(crate) async fn check(&self) -> Result<()> {
        for (tool, arg) in [
            ("mkfs.ext4", "-V"),
            ("debugfs", "-V"),
            ("losetup", "--version"),
        ] {
            self.run(tool, &[arg]).await.map_err(|e| {
                Error::new(
                    Reason::FailedPrecondition,
                    format!(
                        "disk limits need {tool} (e2fsprogs, util-linux): {e}; install them \
                     (deploy/ensure-disks.sh) or set MENTIS_DISK_LIMITS=off"
                    ),
                )
            })?;
        }
        if !Path::new("/dev/loop-control").exists() {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "disk limits need loop devices, and /dev/loop-control is missing: load the loop module \
                 (modprobe loop) or set MENTIS_DISK_LIMITS=off",
            ));
        }
        Ok(())
    }

    /// Makes the image of `volume`, `size_mb` MiB, with an empty ext4 filesystem whose root belongs to the
    /// sandbox user, attaches it and returns the link to mount.
    pub(crate) async fn create(&self, volume: &str, size_mb: i64) -> Result<PathBuf> {
        let image = self.image(volume);
        let size = u64::try_from(size_mb)
            .ok()
            .and_then(|mb| mb.checked_mul(1 << 20))
            .ok_or_else(|| Error::invalid(format!("disk limit {size_mb} MiB")))?;
        // Images are sparse, so sandboxes may together promise more than the host has; but one limit
        // larger than what is free could never be honoured: refused rather than claimed.
        if let Ok(fs) = nix::sys::statvfs::statvfs(self.dir.as_path()) {
            let free = fs.blocks_available().saturating_mul(fs.fragment_size());
            if size > free {
                return Err(Error::new(
                    mentis_core::Reason::FailedPrecondition,
                    format!(
                        "a disk limit of {size_mb} MiB is more than the {} MiB free where workspaces are kept",
                        free >> 20
                    ),
                ));
            }
        }
        // 0600: the image holds the sandbox's files (the folder is 0700 too).
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&image)
                .map_err(|e| io_err("create", &image, e))?
        };
        // Sparse: the host's disk holds only what is written.
        file.set_len(size).map_err(|e| io_err("size", &image, e))?;
        drop(file);
        let image_arg = image.to_string_lossy().into_owned();
        // No reserved blocks (nobody writes as root); the inode tables and the journal are not zeroed
        // ahead, so a new image costs about 2 MiB of the host's disk whatever its size.
        let extended = format!(
            "root_owner={},lazy_itable_init=1,lazy_journal_init=1",
            self.owner
        );
        self.run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", "-E", &extended, &image_arg],
        )
        .await?;
        // An empty root, like a fresh named volume: Docker copies the image's /workspace into it on first
        // use, and listings of the workspace do not show lost+found (e2fsck makes it again when needed).
        self.run("debugfs", &["-w", "-R", "rmdir lost+found", &image_arg])
            .await?;
        self.attach(volume).await
    }

    /// Makes sure the image of `volume` is attached to a loop device that stays until released, and the
    /// link points at it (the number may differ from the last time). Idempotent. A device of the image
    /// already released (autoclear) goes away with its last user: it is waited out (its container has just
    /// stopped) and a device of its own attached, unless something still holds it after
    /// [`RUNDOWN_WAIT`], which then keeps it for the mount to come.
    pub(crate) async fn attach(&self, volume: &str) -> Result<PathBuf> {
        let image = self.image(volume);
        let deadline = tokio::time::Instant::now() + RUNDOWN_WAIT;
        let held = loop {
            let devices = loops_of(&image);
            if let Some(kept) = devices.iter().find(|d| !autoclear(d)) {
                break Some(kept.clone());
            }
            if devices.is_empty() {
                break None;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(%volume, devices = ?devices, "a released loop device is still held: using it");
                break devices.into_iter().next();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let device = match held {
            Some(device) => device,
            None => {
                let device = self.loop_device(&image).await?;
                tracing::info!(%volume, device = %device.display(), "attached a workspace image");
                device
            }
        };
        let link = self.link(volume);
        if std::fs::read_link(&link).ok().as_deref() != Some(device.as_path()) {
            // A new link renamed over the old one: the link is never missing or half made.
            let tmp = self.dir.join(format!("{volume}.dev.tmp"));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&device, &tmp).map_err(|e| io_err("link", &tmp, e))?;
            std::fs::rename(&tmp, &link).map_err(|e| io_err("link", &link, e))?;
        }
        Ok(link)
    }

    /// Lets the kernel free the loop devices of `volume`'s image once nothing holds them: at once when
    /// nothing does, else when its container's mount goes (`losetup -d` of a busy device sets autoclear).
    /// Call it once the container runs. Idempotent.
    pub(crate) async fn release(&self, volume: &str) -> Result<()> {
        let image = self.image(volume);
        for device in loops_of(&image) {
            if autoclear(&device) {
                continue;
            }
            let device = device.to_string_lossy().into_owned();
            if let Err(e) = self.run("losetup", &["-d", &device]).await {
                // Gone meanwhile: nothing is left to release.
                if loops_of(&image).iter().any(|d| !autoclear(d)) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Detaches the image of `volume` and removes it and its link. Idempotent. Call it once the volume
    /// is gone (a device still held is freed by the kernel with its last user).
    pub(crate) async fn remove(&self, volume: &str) -> Result<()> {
        let image = self.image(volume);
        self.release(volume).await?;
        // A device still held (a mount the engine has not let go of yet) goes with its last user.
        let deadline = tokio::time::Instant::now() + RUNDOWN_WAIT;
        while !loops_of(&image).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !loops_of(&image).is_empty() {
            tracing::warn!(%volume, "a removed workspace image's loop device is still held; the kernel frees it with its last user");
        }
        for path in [image, self.link(volume)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path, e)),
            }
        }
        Ok(())
    }

    /// The volumes that have an image here.
    pub(crate) fn volumes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".ext4"))
                    .map(str::to_owned)
            })
            .collect()
    }

    /// A free loop device with `image` attached. `losetup --find` creates the device through
    /// `/dev/loop-control`; where `/dev` is not a devtmpfs the node may be missing, so it is made.
    async fn loop_device(&self, image: &Path) -> Result<PathBuf> {
        let image_arg = image.to_string_lossy().into_owned();
        let first = match self
            .run(
                "losetup",
                &["--find", "--show", "--direct-io=on", &image_arg],
            )
            .await
        {
            Ok(out) => return Ok(PathBuf::from(out.trim())),
            Err(e) => e,
        };
        let free = self.run("losetup", &["--find"]).await.map_err(|_| first)?;
        let device = PathBuf::from(free.trim());
        let minor = device
            .to_str()
            .and_then(|d| d.strip_prefix("/dev/loop"))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty())
            .ok_or_else(|| Error::internal(format!("losetup named no loop device: {free:?}")))?
            .to_owned();
        if !device.exists() {
            let path = device.to_string_lossy().into_owned();
            self.run("mknod", &["-m", "0660", &path, "b", "7", &minor])
                .await?;
        }
        let path = device.to_string_lossy().into_owned();
        self.run("losetup", &["--direct-io=on", &path, &image_arg])
            .await?;
        Ok(device)
    }

    /// Runs a tool and returns its stdout; its stderr is in the error.
    async fn run(&self, tool: &str, args: &[&str]) -> Result<String> {
        let out = tokio::time::timeout(
            self.timeout,
            tokio::process::Command::new(tool_path(tool))
                .args(args)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| Error::unavailable(format!("{tool} did not finish in time")))?
        .map_err(|e| Error::internal(format!("cannot run {tool}: {e}")))?;
        if !out.status.success() {
            return Err(Error::internal(format!(
                "{tool} {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A tool by name, found in PATH or else in the sbin folders (where e2fsprogs and losetup live, and which
/// a service's PATH may lack).
fn tool_path(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(tool))
}

/// `uid:gid` from the container user (`1000:1000`, or `1000` for uid and gid alike).
pub(crate) fn owner_of(user: &str) -> String {
    match user.split_once(':') {
        Some((uid, gid)) => format!("{uid}:{gid}"),
        None => format!("{user}:{user}"),
    }
}

/// How long [`Disks::attach`] waits for a released device of the image to go away.
const RUNDOWN_WAIT: Duration = Duration::from_secs(5);

/// Whether the kernel frees `device` with its last user (autoclear, set by [`Disks::release`]).
pub(crate) fn autoclear(device: &Path) -> bool {
    let Some(name) = device.file_name() else {
        return false;
    };
    std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/autoclear"))
        .is_ok_and(|v| v.trim() == "1")
}

/// The loop devices whose backing file is `image`, from sysfs (a deleted image reads `<path> (deleted)`).
pub(crate) fn loops_of(image: &Path) -> Vec<PathBuf> {
    let want = image.to_string_lossy();
    backing_files()
        .into_iter()
        .filter(|(_, file)| file.strip_suffix(" (deleted)").unwrap_or(file) == want.as_ref())
        .map(|(device, _)| device)
        .collect()
}

/// Every attached loop device with its backing file.
fn backing_files() -> Vec<(PathBuf, String)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !name.starts_with("loop") {
                return None;
            }
            let file = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            Some((
                Path::new("/dev").join(name),
                file.trim_end_matches('\n').to_owned(),
            ))
        })
        .collect()
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::internal(format!(
        "cannot {what} the disk image file {}: {e}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tools_are_found_in_path_or_sbin() {
        assert!(tool_path("sh").is_absolute());
        assert_eq!(
            tool_path("no-such-tool-here"),
            PathBuf::from("no-such-tool-here")
        );
    }

    #[test]
    fn the_owner_is_the_container_user() {
        assert_eq!(owner_of("1000:1000"), "1000:1000");
        assert_eq!(owner_of("1001"), "1001:1001");
    }

    #[test]
    fn images_and_links_live_in_the_folder_and_are_listed_by_volume() {
        let dir = tempfile::tempdir().unwrap();
        let disks = Disks::new(
            &dir.path().join("disks"),
            "1000:1000",
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(disks.image("mentis-ws-a").is_absolute());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("disks"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            disks.link("mentis-ws-a").file_name().unwrap(),
            "mentis-ws-a.dev"
        );
        std::fs::write(disks.image("mentis-ws-a"), b"").unwrap();
        std::fs::write(disks.link("mentis-ws-a"), b"").unwrap();
        assert_eq!(disks.volumes(), vec!["mentis-ws-a".to_owned()]);
        assert!(disks.has("mentis-ws-a") && !disks.has("mentis-ws-b"));
        // Not attached anywhere: removing takes the files and is idempotent.
        assert!(loops_of(&disks.image("mentis-ws-a")).is_empty());
        futures::executor::block_on(disks.remove("mentis-ws-a")).unwrap();
        futures::executor::block_on(disks.remove("mentis-ws-a")).unwrap();
        assert!(disks.volumes().is_empty());
    }
}
