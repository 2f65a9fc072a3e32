//! Who may use an image (docs/ARCHITECTURE.md, Security model, "Images belong to a space"). An image a
//! build or import of this runtime made belongs to the space it was made for, unless the admin shared it;
//! the images the runtime provides (the executor image, those of `MENTIS_POOL`) and the images no build of
//! a runtime made (an operator's `docker pull`, images built before owners were kept) are every space's.
//! The admin may use any image; a key of a space, only those. Ownership goes by the engine's image id, so
//! a second name, a digest or a short id leads to the same answer; and a space's key must name an image by
//! one of its names, not by its id.

use std::collections::BTreeSet;
use std::sync::Arc;

use mentis_core::{Error, ImageInfo, Reason, Result, SandboxBackend, SpaceId, quoted};

use crate::auth::Caller;
use crate::config::RuntimeConfig;
use crate::store::Store;
pub use crate::store::images::ImageOwner;

/// Decides and records who may use an image.
pub struct Owners {
    store: Arc<Store>,
    backend: Arc<dyn SandboxBackend>,
    /// The runtime's own images, in their familiar form: every space may use them.
    provided: BTreeSet<String>,
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners")
            .field("provided", &self.provided)
            .finish_non_exhaustive()
    }
}

impl Owners {
    pub fn new(
        config: &RuntimeConfig,
        store: Arc<Store>,
        backend: Arc<dyn SandboxBackend>,
    ) -> Self {
        let provided = std::iter::once(config.executor_image.as_str())
            .chain(config.pools.iter().map(|p| p.image.as_str()))
            .map(mentis_core::image::familiar)
            .collect();
        Self {
            store,
            backend,
            provided,
        }
    }

    /// PERMISSION_DENIED (IMAGE_NOT_ALLOWED) unless `caller` may make sandboxes and templates of `space`
    /// from `image`. An image the engine does not have passes: the create says IMAGE_MISSING, and a
    /// template may name an image to be built.
    pub async fn check_use(&self, caller: &Caller, space: &SpaceId, image: &str) -> Result<()> {
        if caller.spaces().is_none() {
            return Ok(());
        }
        let familiar = mentis_core::image::familiar(image);
        if self.provided.contains(&familiar) {
            return Ok(());
        }
        let Some(info) = self.backend.image_info(image).await? else {
            return Ok(());
        };
        if !info
            .names
            .iter()
            .any(|n| mentis_core::image::familiar(n) == familiar)
        {
            return Err(Error::new(
                Reason::ImageNotAllowed,
                format!(
                    "{} is not a name of the image it leads to (an id?): a space's key names an image \
                     by one of its names, name[:tag] or name@digest",
                    quoted(image)
                ),
            ));
        }
        if self.allowed(&info, space)? {
            Ok(())
        } else {
            Err(Error::new(
                Reason::ImageNotAllowed,
                format!(
                    "image {} is not space {space}'s and not shared: the admin may share it \
                     (TemplateService/ShareImage)",
                    quoted(image)
                ),
            ))
        }
    }

    /// Whether `space` may use the image `info` describes (not one of the runtime's own).
    fn allowed(&self, info: &ImageInfo, space: &SpaceId) -> Result<bool> {
        Ok(match self.store.image_owner(&info.id)? {
            Some(owner) => owner.shared || owner.space_id.as_ref() == Some(space),
            // Made for a space by a runtime, but not recorded here (another runtime of the engine, or a
            // record that could not be written): nobody's but the admin's. Otherwise an operator's image.
            None => info.space_label.is_none(),
        })
    }

    /// Records that `image_id` was made as `image` for `space`.
    pub fn record(&self, image_id: &str, image: &str, space: &SpaceId) -> Result<ImageOwner> {
        self.store.put_image_owner(image_id, image, space)
    }

    /// Shares the image `image` names with every space, or gives it back to its own space alone (an image
    /// no build of this runtime made is then the admin's alone). FAILED_PRECONDITION (IMAGE_MISSING) when
    /// the engine has no such image.
    pub async fn share(&self, image: &str, shared: bool) -> Result<ImageOwner> {
        let info = self.backend.image_info(image).await?.ok_or_else(|| {
            Error::new(
                Reason::ImageMissing,
                format!("image {} is not on this engine", quoted(image)),
            )
        })?;
        let owner = self.store.set_image_shared(&info.id, image, shared)?;
        tracing::info!(image = %image, image_id = %info.id, shared, "image sharing changed");
        Ok(owner)
    }
}
