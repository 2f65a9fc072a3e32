//! The metrics' gauges read from the manager at each collection (docs/ARCHITECTURE.md, "Observability"):
//! sandboxes by state and space, each pool's idle members, hits and misses, and each running sandbox's
//! usage.

use std::sync::Arc;

use super::pool::Pools;
use super::registry::Registry;
use crate::metrics::{MetricsExport, kv};

/// Registers the metrics' gauges read from `manager` at each collection: sandboxes by state and space, and each
/// pool's idle members, hits and misses.
pub(super) fn observe(export: &MetricsExport, registry: &Arc<Registry>, pools: &Arc<Pools>) {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Mutex, PoisonError};
    let meter = export.meter();
    let m = Arc::downgrade(registry);
    // Every (state, space) ever reported: one that has no sandbox any more reports 0 rather than its
    // last count (the SDK keeps a series' last value).
    let seen: Mutex<BTreeSet<(&'static str, String)>> = Mutex::default();
    let _ = meter
        .u64_observable_gauge("mentis.sandboxes")
        .with_description("Sandboxes by state and space")
        .with_callback(move |o| {
            let Some(registry) = m.upgrade() else { return };
            let mut counts: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
            for h in registry.handles() {
                let s = h.snapshot();
                *counts
                    .entry((s.state.name(), s.space_id.to_string()))
                    .or_default() += 1;
            }
            let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
            seen.extend(counts.keys().cloned());
            for (state, space) in seen.iter() {
                let n = counts.get(&(*state, space.clone())).copied().unwrap_or(0);
                o.observe(n, &[kv("state", *state), kv("space", space.clone())]);
            }
        })
        .build();
    let m = Arc::downgrade(pools);
    let _ = meter
        .u64_observable_gauge("mentis.pool.idle")
        .with_description("Idle members of each warm pool, by image")
        .with_callback(move |o| {
            let Some(pools) = m.upgrade() else { return };
            for p in pools.stats() {
                o.observe(p.idle as u64, &[kv("image", p.image)]);
            }
        })
        .build();
    let m = Arc::downgrade(pools);
    let _ = meter
        .u64_observable_counter("mentis.pool.claims")
        .with_description("Creates that found an idle pool member (hit) or not (miss), by image")
        .with_callback(move |o| {
            let Some(pools) = m.upgrade() else { return };
            for p in pools.stats() {
                o.observe(p.hits, &[kv("image", p.image.clone()), kv("result", "hit")]);
                o.observe(p.misses, &[kv("image", p.image), kv("result", "miss")]);
            }
        })
        .build();
    let m = Arc::downgrade(registry);
    match crate::metrics::SandboxUsage::new(move || {
        let Some(registry) = m.upgrade() else {
            return Vec::new();
        };
        registry
            .handles()
            .into_iter()
            .filter_map(|h| {
                let s = h.snapshot();
                let u = h.usage()?;
                (s.state == mentis_core::SandboxState::Running).then(|| {
                    (
                        s.id.to_string(),
                        s.space_id.to_string(),
                        u.memory_bytes,
                        u.cpu_usec,
                    )
                })
            })
            .collect()
    }) {
        Ok(collector) => export.register(Box::new(collector)),
        Err(e) => tracing::warn!(error = %e, "metrics: cannot make the per-sandbox collector"),
    }
}
