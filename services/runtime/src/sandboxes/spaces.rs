//! Spaces: create, read, list, update, delete (with or without their sandboxes). Written through to the
//! store; the default space always exists.

use std::sync::Arc;
use std::time::SystemTime;

use mentis_core::{Error, Result, Space, SpaceId, SpaceUpdate};

use super::Manager;

/// A space and the number of its live sandboxes.
pub type SpaceView = (Space, u32);

impl Manager {
    fn live_in(&self, space: &SpaceId) -> u32 {
        let n = self.read().values().filter(|h| h.is_live_in(space)).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn spaces_write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, std::collections::BTreeMap<String, Space>> {
        self.spaces.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads the spaces from the store, creating the default one when missing.
    pub(super) fn load_spaces(&self) -> Result<()> {
        let mut spaces = self.store.spaces()?;
        if !spaces.iter().any(|s| s.id.is_default()) {
            let default = Space::default_space(SystemTime::now());
            self.store.put_space(&default)?;
            spaces.push(default);
        }
        let mut map = self.spaces_write();
        for s in spaces {
            map.insert(s.id.as_str().to_owned(), s);
        }
        Ok(())
    }

    /// Creates a space; AlreadyExists when the id is taken.
    pub fn create_space(&self, mut space: Space) -> Result<SpaceView> {
        space.validate()?;
        self.check_space_limits(&space.limits)?;
        let now = SystemTime::now();
        space.created_at = now;
        space.updated_at = now;
        let mut map = self.spaces_write();
        if map.contains_key(space.id.as_str()) {
            return Err(Error::AlreadyExists(format!(
                "space {} already exists",
                space.id
            )));
        }
        self.store.put_space(&space)?;
        map.insert(space.id.as_str().to_owned(), space.clone());
        Ok((space, 0))
    }

    /// One space; NotFound when unknown.
    pub fn get_space(&self, id: &SpaceId) -> Result<SpaceView> {
        let space = self.space_record(id)?;
        let n = self.live_in(id);
        Ok((space, n))
    }

    /// A space's sandbox limits lie within the runtime's policy.
    fn check_space_limits(&self, l: &mentis_core::SpaceLimits) -> Result<()> {
        self.config
            .limits
            .check_space(&l.sandbox_default, &l.sandbox_max)
    }

    /// One page of spaces in id order (only those in `allowed`, when given), and whether more follow.
    pub fn list_spaces(
        &self,
        after: Option<&str>,
        page_size: usize,
        allowed: Option<&std::collections::BTreeSet<SpaceId>>,
    ) -> (Vec<SpaceView>, bool) {
        let page: Vec<Space> = {
            let map = self.spaces.read().unwrap_or_else(|p| p.into_inner());
            let range = match after {
                Some(a) => {
                    map.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                }
                None => map.range::<str, _>(..),
            };
            range
                .filter(|(_, s)| allowed.is_none_or(|a| a.contains(&s.id)))
                .take(page_size + 1)
                .map(|(_, s)| s.clone())
                .collect()
        };
        let more = page.len() > page_size;
        let views = page
            .into_iter()
            .take(page_size)
            .map(|s| {
                let n = self.live_in(&s.id);
                (s, n)
            })
            .collect();
        (views, more)
    }

    /// Changes a space.
    pub fn update_space(&self, id: &SpaceId, update: SpaceUpdate) -> Result<SpaceView> {
        update.validate()?;
        if let Some(l) = &update.limits {
            self.check_space_limits(l)?;
        }
        let space = {
            let mut map = self.spaces_write();
            let space = map
                .get_mut(id.as_str())
                .ok_or_else(|| Error::NotFound(format!("space {id} not found")))?;
            let mut changed = space.clone();
            changed.apply(update, SystemTime::now());
            self.store.put_space(&changed)?;
            *space = changed.clone();
            changed
        };
        let n = self.live_in(id);
        Ok((space, n))
    }

    /// Deletes a space. FailedPrecondition while it has live sandboxes unless `force`, which deletes them
    /// first. The default space stays.
    pub async fn delete_space(self: &Arc<Self>, id: &SpaceId, force: bool) -> Result<()> {
        if id.is_default() {
            return Err(Error::FailedPrecondition(
                "the default space cannot be deleted".into(),
            ));
        }
        self.space_record(id)?;
        let members: Vec<_> = self
            .handles()
            .into_iter()
            .filter(|h| h.is_live_in(id))
            .map(|h| h.id)
            .collect();
        if !members.is_empty() && !force {
            return Err(Error::FailedPrecondition(format!(
                "space {id} still has {} sandboxes; delete them first or pass force",
                members.len()
            )));
        }
        for sandbox in members {
            self.delete_with_reason(sandbox, "deleted with its space")
                .await?;
        }
        // Locks in the order create takes them (sandboxes, then spaces), so a sandbox is either created
        // before this look (and keeps the space) or finds the space gone.
        let sandboxes = self.write();
        if sandboxes.values().any(|h| h.is_live_in(id)) {
            return Err(Error::FailedPrecondition(format!(
                "space {id} got a new sandbox while it was being deleted"
            )));
        }
        let mut spaces = self.spaces_write();
        self.store.delete_space(id)?;
        spaces.remove(id.as_str());
        Ok(())
    }
}
