//! Heatmaps: the layers an attachment holds in remote storage, the most recently read
//! first, published as `tenants/<tenant>/heatmap.json` for a warm secondary, which
//! downloads the hottest of them ahead of need ([`warm`]), so that a failover or a
//! migration to it starts with the layers reads want on local disk.
//!
//! A heatmap is advice, never a source of truth: an old one (written by a superseded
//! attachment before it stopped, or simply out of date) can only make a secondary download
//! a layer nobody reads, or miss one; every layer it names is checked against its size and
//! CRC-32C at download, as any download is, and a warm copy is used at attach only when the
//! index being loaded names that very object ([`adopt`]: same name, same generation, same
//! size). Only an attachment that is not superseded writes one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use proto::{TenantId, TimelineId};
use remote_storage::{RemoteError, RemoteStorage};
use serde::{Deserialize, Serialize};

use super::{layer_object_key, Generation, IndexLayer};

pub const HEATMAP_FORMAT_VERSION: u32 = 1;

/// What a secondary should hold, hottest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heatmap {
    pub format_version: u32,
    /// The attachment that wrote it.
    pub generation: Generation,
    pub timelines: Vec<HeatmapTimeline>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeatmapTimeline {
    pub timeline_id: TimelineId,
    /// Most recently read first; layers never read by this attachment last.
    pub layers: Vec<HeatmapLayer>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeatmapLayer {
    /// The layer file name (its `LayerDesc`).
    pub name: String,
    #[serde(flatten)]
    pub object: IndexLayer,
    /// Milliseconds since a read last used it, when the heatmap was made; `None`: never.
    pub idle_ms: Option<u64>,
}

pub fn heatmap_key(tenant: TenantId) -> String {
    format!("tenants/{tenant}/heatmap.json")
}

/// The tenant's heatmap, if one was published.
pub fn download_heatmap(storage: &RemoteStorage, tenant: TenantId) -> anyhow::Result<Option<Heatmap>> {
    let key = heatmap_key(tenant);
    let bytes = match storage.get(&key) {
        Ok(b) => b,
        Err(RemoteError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let heatmap: Heatmap = serde_json::from_slice(&bytes).with_context(|| format!("parse {key} in {storage}"))?;
    anyhow::ensure!(
        heatmap.format_version == HEATMAP_FORMAT_VERSION,
        "{key} in {storage} has format version {}, this build reads {HEATMAP_FORMAT_VERSION}",
        heatmap.format_version
    );
    Ok(Some(heatmap))
}

pub(super) fn upload(storage: &RemoteStorage, tenant: TenantId, heatmap: &Heatmap) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(heatmap).expect("a heatmap serializes");
    storage.put(&heatmap_key(tenant), Bytes::from(json))?;
    Ok(())
}

/// The file name of a warm copy: the object's own suffix, so that a copy is of one object
/// exactly.
pub fn warm_file_name(name: &str, generation: Generation) -> String {
    format!("{name}-{generation}")
}

/// What [`warm`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarmOutcome {
    pub downloaded_layers: u64,
    pub downloaded_bytes: u64,
    pub removed_layers: u64,
    /// Named by the heatmap, but no longer in object storage.
    pub gone_layers: u64,
    /// What the directory holds afterwards.
    pub layers: u64,
    pub bytes: u64,
}

/// Brings `dir` (`<dir>/<timeline>/<warm file name>`) to the hottest layers of `heatmap`
/// that fit in `budget_bytes`: downloads the missing ones (checked like every download)
/// and removes copies the heatmap no longer wants. A layer whose object is gone (compacted
/// or collected since the heatmap was made) is skipped; any other failed download ends the
/// round (the next one tries again), keeping what it has. Nothing is downloaded once
/// `keep_going` says no. Names that are not layer file names are ignored: a heatmap never
/// chooses a path.
pub fn warm(
    storage: &RemoteStorage,
    tenant: TenantId,
    heatmap: &Heatmap,
    dir: &Path,
    budget_bytes: u64,
    keep_going: &dyn Fn() -> bool,
) -> anyhow::Result<WarmOutcome> {
    // Hottest first across timelines: the layers read most recently anywhere.
    let mut all: Vec<(&HeatmapTimeline, &HeatmapLayer)> = heatmap
        .timelines
        .iter()
        .flat_map(|t| t.layers.iter().map(move |l| (t, l)))
        .filter(|(_, l)| l.name.parse::<crate::layer::LayerDesc>().is_ok_and(|d| d.file_name() == l.name))
        .collect();
    all.sort_by_key(|(_, l)| l.idle_ms.unwrap_or(u64::MAX));
    let mut wanted: BTreeSet<PathBuf> = BTreeSet::new();
    let mut planned = 0u64;
    for (t, l) in &all {
        if planned + l.object.size_bytes > budget_bytes {
            continue;
        }
        planned += l.object.size_bytes;
        wanted.insert(dir.join(t.timeline_id.to_string()).join(warm_file_name(&l.name, l.object.generation)));
    }
    let mut out = WarmOutcome::default();
    // Removals first, so that the budget holds while downloading.
    if let Ok(timelines) = std::fs::read_dir(dir) {
        for t in timelines.flatten() {
            for f in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
                if !wanted.contains(&f.path()) {
                    std::fs::remove_file(f.path()).with_context(|| format!("remove {}", f.path().display()))?;
                    out.removed_layers += 1;
                }
            }
        }
    }
    for (t, l) in &all {
        let path = dir.join(t.timeline_id.to_string()).join(warm_file_name(&l.name, l.object.generation));
        if !wanted.contains(&path) {
            continue;
        }
        if !path.exists() {
            if !keep_going() {
                break;
            }
            let parent = path.parent().expect("under dir");
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
            let key = layer_object_key(tenant, t.timeline_id, &l.name, l.object.generation);
            let bytes = match storage.get(&key) {
                Ok(bytes) => super::check_object(&key, bytes, &l.object)?,
                Err(RemoteError::NotFound { .. }) => {
                    out.gone_layers += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            crashsafe::write_file_atomic(&path, &bytes).with_context(|| format!("write {}", path.display()))?;
            out.downloaded_layers += 1;
            out.downloaded_bytes += l.object.size_bytes;
        }
        out.layers += 1;
        out.bytes += l.object.size_bytes;
    }
    Ok(out)
}

/// The warm copy of the layer `name` that `object` describes, moved to `dest` if `dir`
/// (`<warm dir>/<timeline>`) holds it with the size the index records: true if it did.
pub fn adopt(dir: &Path, name: &str, object: &IndexLayer, dest: &Path) -> bool {
    let path = dir.join(warm_file_name(name, object.generation));
    match std::fs::metadata(&path) {
        Ok(m) if m.len() == object.size_bytes => std::fs::rename(&path, dest).is_ok(),
        _ => false,
    }
}

/// Every layer of every timeline in `layers` (name, object, when last read), as a heatmap.
pub fn build(generation: Generation, layers: BTreeMap<TimelineId, Vec<(String, IndexLayer, Option<u64>)>>) -> Heatmap {
    let timelines = layers
        .into_iter()
        .map(|(timeline_id, mut layers)| {
            layers.sort_by_key(|(name, _, idle)| (idle.unwrap_or(u64::MAX), name.clone()));
            HeatmapTimeline {
                timeline_id,
                layers: layers.into_iter().map(|(name, object, idle_ms)| HeatmapLayer { name, object, idle_ms }).collect(),
            }
        })
        .collect();
    Heatmap { format_version: HEATMAP_FORMAT_VERSION, generation, timelines }
}
