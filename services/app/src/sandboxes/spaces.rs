//! Spaces: create, read, list, update, delete. Written through to the store; the default space always
//! exists. Deleting a space with its sandboxes is orchestrated by the manager, which ends them first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use mentis_core::{Error, LimitsPolicy, Reason, Resource, Result, Space, SpaceId, SpaceUpdate};

use super::registry::Registry;
use crate::auth::SpaceGenerations;
use crate::store::Store;

/// A space and the number of its live sandboxes.
pub type SpaceView = (Space, u32);

/// Every space of this runtime.
pub struct Spaces {
    map: RwLock<BTreeMap<String, Space>>,
    store: Arc<Store>,
    registry: Arc<Registry>,
    /// The runtime's limits, which every space's lie within.
    limits: LimitsPolicy,
    /// The generation of each space that exists (the keyring reads it).
    generations: Arc<SpaceGenerations>,
    /// Spaces whose deletion has begun and not finished: their ids cannot be taken yet.
    deleting: RwLock<BTreeSet<SpaceId>>,
}

impl std::fmt::Debug for Spaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spaces").finish_non_exhaustive()
    }
}

impl Spaces {
    pub fn new(
        store: Arc<Store>,
        registry: Arc<Registry>,
        limits: LimitsPolicy,
        generations: Arc<SpaceGenerations>,
    ) -> Self {
        Self {
            map: RwLock::new(BTreeMap::new()),
            store,
            registry,
            limits,
            generations,
            deleting: RwLock::new(BTreeSet::new()),
        }
    }

    fn is_deleting(&self, id: &SpaceId) -> bool {
        self.deleting
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Space>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads the spaces from the store, creating the default one when missing.
    pub fn load(&self) -> Result<()> {
        let mut spaces = self.store.spaces()?;
        if !spaces.iter().any(|s| s.id.is_default()) {
            let default = Space::default_space(crate::clock::now());
            self.store.put_space(&default)?;
            spaces.push(default);
        }
        let deleting: BTreeSet<SpaceId> = self.store.spaces_being_deleted()?.into_iter().collect();
        let mut map = self.write();
        for s in spaces {
            if !deleting.contains(&s.id) {
                self.generations.set(&s.id, s.generation);
            }
            map.insert(s.id.as_str().to_owned(), s);
        }
        *self.deleting.write().unwrap_or_else(|p| p.into_inner()) = deleting;
        Ok(())
    }

    /// A copy of a space's record; NotFound when unknown.
    pub fn record(&self, id: &SpaceId) -> Result<Space> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id.as_str())
            .cloned()
            .ok_or_else(|| Error::space_not_found(id))
    }

    /// A copy of a space's record, for something new in it (a sandbox, a template); NotFound while the
    /// space is being deleted, so nothing new lands in it after its deletion has looked for what it holds.
    pub fn admitting(&self, id: &SpaceId) -> Result<Space> {
        if self.is_deleting(id) {
            return Err(Error::space_not_found(id));
        }
        self.record(id)
    }

    /// Creates a space; AlreadyExists when the id is taken.
    pub fn create(&self, mut space: Space) -> Result<SpaceView> {
        space.validate().map_err(|e| e.within("space"))?;
        self.check_limits(&space.limits)
            .map_err(|e| e.within("space"))?;
        let now = crate::clock::now();
        space.created_at = now;
        space.updated_at = now;
        let mut map = self.write();
        if map.contains_key(space.id.as_str()) {
            return Err(Error::new(
                Reason::SpaceExists,
                format!("space {} already exists", space.id),
            )
            .about(Resource::space(&space.id)));
        }
        if self.is_deleting(&space.id) {
            return Err(Error::new(
                Reason::FailedPrecondition,
                format!(
                    "space {} is still being deleted: try again when DeleteSpace has returned",
                    space.id
                ),
            )
            .about(Resource::space(&space.id)));
        }
        // Another generation than any space of this id before it.
        space.generation = self.store.next_space_generation(&space.id)?;
        self.store.put_space(&space)?;
        self.generations.set(&space.id, space.generation);
        map.insert(space.id.as_str().to_owned(), space.clone());
        Ok((space, 0))
    }

    /// One space; NotFound when unknown.
    pub fn get(&self, id: &SpaceId) -> Result<SpaceView> {
        let space = self.record(id)?;
        Ok((space, self.registry.live_in(id)))
    }

    /// A space's sandbox limits lie within the runtime's policy.
    fn check_limits(&self, l: &mentis_core::SpaceLimits) -> Result<()> {
        self.limits.check_space(&l.sandbox_default, &l.sandbox_max)
    }

    /// One page of spaces in id order (only those in `allowed`, when given), and whether more follow.
    pub fn list(
        &self,
        after: Option<&str>,
        page_size: usize,
        allowed: Option<&BTreeSet<SpaceId>>,
    ) -> (Vec<SpaceView>, bool) {
        let page: Vec<Space> = {
            let map = self.map.read().unwrap_or_else(|p| p.into_inner());
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
                let n = self.registry.live_in(&s.id);
                (s, n)
            })
            .collect();
        (views, more)
    }

    /// Changes a space.
    pub fn update(&self, id: &SpaceId, update: SpaceUpdate) -> Result<SpaceView> {
        update.validate().map_err(|e| e.within("space"))?;
        if let Some(l) = &update.limits {
            self.check_limits(l).map_err(|e| e.within("space"))?;
        }
        let space = {
            let mut map = self.write();
            if self.is_deleting(id) {
                return Err(Error::space_not_found(id));
            }
            let space = map
                .get_mut(id.as_str())
                .ok_or_else(|| Error::space_not_found(id))?;
            let mut changed = space.clone();
            changed.apply(update, crate::clock::now());
            changed.check_egress().map_err(|e| e.within("space"))?;
            self.store.put_space(&changed)?;
            *space = changed.clone();
            changed
        };
        Ok((space, self.registry.live_in(id)))
    }

    /// Begins deleting a space: marked in the store (a restart finishes it), its id reserved until
    /// [`Spaces::finish_delete`], and out of every key's reach at once.
    pub fn begin_delete(&self, id: &SpaceId) -> Result<()> {
        self.store.mark_space_deleting(id)?;
        self.deleting
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone());
        self.generations.remove(id);
        Ok(())
    }

    /// Gives up a deletion that could not go on (a sandbox came in without `force`): the space is as it was.
    pub fn cancel_delete(&self, id: &SpaceId) -> Result<()> {
        let space = self.record(id)?;
        self.store.put_space(&space)?;
        self.generations.set(id, space.generation);
        self.deleting
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        Ok(())
    }

    /// Takes a space that has no live sandbox left out of the map (its record stays, marked, until
    /// [`Spaces::finish_delete`]). Locks in the order create takes them (sandboxes, then spaces), so a
    /// sandbox is either created before this look (and keeps the space) or finds the space gone.
    pub fn remove_if_empty(&self, id: &SpaceId) -> Result<()> {
        let sandboxes = self.registry.write();
        if sandboxes.values().any(|h| h.is_live_in(id)) {
            return Err(Error::new(
                Reason::SpaceNotEmpty,
                format!("space {id} got a new sandbox while it was being deleted"),
            )
            .about(Resource::space(id)));
        }
        self.write().remove(id.as_str());
        Ok(())
    }

    /// Ends a deletion once everything of the space is gone: the record goes, and the id may be taken again
    /// (by a space of the next generation).
    pub fn finish_delete(&self, id: &SpaceId) -> Result<()> {
        self.store.delete_space(id)?;
        self.write().remove(id.as_str());
        self.deleting
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_space_being_deleted_admits_nothing_new_and_its_id_is_taken_again_by_another_generation() {
        let store = Arc::new(Store::in_memory().unwrap());
        let registry = Arc::new(Registry::new(
            Arc::clone(&store),
            8,
            std::time::Duration::from_secs(60),
        ));
        let generations = Arc::new(SpaceGenerations::default());
        let spaces = Spaces::new(
            store,
            registry,
            LimitsPolicy::default(),
            Arc::clone(&generations),
        );
        spaces.load().unwrap();
        let id = SpaceId::parse("tz").unwrap();
        let mut space = Space::default_space(crate::clock::now());
        space.id = id.clone();
        let (made, _) = spaces.create(space.clone()).unwrap();
        assert_eq!(generations.current(&id), Some(made.generation));
        spaces.admitting(&id).unwrap();

        spaces.begin_delete(&id).unwrap();
        // Its deletion still reads it; nothing new gets in; keys lose it; its id is not free yet.
        spaces.record(&id).unwrap();
        assert!(matches!(spaces.admitting(&id), Err(Error::NotFound(_))));
        assert_eq!(generations.current(&id), None);
        assert!(spaces.create(space.clone()).is_err());

        spaces.remove_if_empty(&id).unwrap();
        spaces.finish_delete(&id).unwrap();
        let (again, _) = spaces.create(space).unwrap();
        assert!(again.generation > made.generation);
        assert_eq!(generations.current(&id), Some(again.generation));
    }
}
