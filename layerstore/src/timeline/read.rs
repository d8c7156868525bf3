//! Reads: the versions of a key at an LSN, and listing the keys that exist at an LSN.
//!
//! A read at `lsn` first takes a snapshot of the layer map, then checks the LSN (published,
//! and not below the GC cutoff; checking after the snapshot is what makes concurrent GC
//! safe, see `timeline`). It then walks this timeline's layers from newer to older (see
//! `layer_map`). If that ends without a version standing on its own, it continues in the
//! ancestor at `min(lsn, ancestor_lsn)`, and so on up the chain. The ancestor refuses
//! an LSN below its own GC cutoff unless it is exactly the branch point, which GC keeps
//! readable for the child.
//!
//! Invariant: every version collected is at or below the requested LSN and, within one
//! timeline, at or above the branch point it was entered at; versions are offered newest
//! first, so `ReconstructData::records` comes out oldest first.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use proto::{Key, KeyRange, Lsn};

use super::Timeline;
use crate::error::{LayerError, ReadError};
use crate::layer_map::LayerMap;
use crate::value::{ReconstructData, Reconstructor, ValueCollector};

impl Timeline {
    /// Everything needed to rebuild `key` at `lsn`: the newest image at or below it and the
    /// records after it, oldest first. Empty if the key has no version at or below `lsn`.
    pub fn get_reconstruct_data(&self, key: Key, lsn: Lsn) -> Result<ReconstructData, ReadError> {
        let _entered = self.span.enter();
        let map = self.layer_map();
        self.check_read_lsn(lsn)?;
        let mut collector = ValueCollector::default();
        let mut layers_visited = 0;
        if collect_in(&map, key, lsn, &mut collector, &mut layers_visited)? {
            return Ok(ReconstructData { layers_visited, ..collector.finish() });
        }
        let mut timeline = self;
        let mut lsn = lsn;
        while let Some(next) = timeline.enter_ancestor(lsn)? {
            (timeline, lsn) = (next.timeline, next.lsn);
            if collect_in(&next.map, key, lsn, &mut collector, &mut layers_visited)? {
                break;
            }
        }
        Ok(ReconstructData { layers_visited, ..collector.finish() })
    }

    /// The value of `key` at `lsn`, rebuilt by `reconstructor`; `None` if the key has no
    /// version at or below `lsn`.
    pub fn get(&self, key: Key, lsn: Lsn, reconstructor: &dyn Reconstructor) -> Result<Option<Bytes>, ReadError> {
        let data = self.get_reconstruct_data(key, lsn)?;
        if data.is_empty() {
            return Ok(None);
        }
        reconstructor.reconstruct(key, lsn, data).map(Some).map_err(|error| ReadError::Reconstruct { key, lsn, error })
    }

    /// The keys in `range` that have a value at `lsn`, in order, including those inherited
    /// from ancestors. Versions are never deleted, so a key exists at `lsn` exactly when it
    /// has a version at or below it.
    pub fn keys_in_range(&self, range: &KeyRange, lsn: Lsn) -> Result<Vec<Key>, ReadError> {
        let _entered = self.span.enter();
        let map = self.layer_map();
        self.check_read_lsn(lsn)?;
        let mut keys = BTreeSet::new();
        add_keys(&map, range, lsn, &mut keys)?;
        let mut timeline = self;
        let mut lsn = lsn;
        while let Some(next) = timeline.enter_ancestor(lsn)? {
            (timeline, lsn) = (next.timeline, next.lsn);
            add_keys(&next.map, range, lsn, &mut keys)?;
        }
        Ok(keys.into_iter().collect())
    }

    fn check_read_lsn(&self, lsn: Lsn) -> Result<(), ReadError> {
        let last_record = self.last_record_lsn();
        if lsn > last_record {
            return Err(ReadError::NotYetIngested { requested: lsn, last_record });
        }
        let horizon = self.gc_cutoff_lsn();
        if lsn < horizon {
            return Err(ReadError::BelowGcHorizon { requested: lsn, horizon });
        }
        Ok(())
    }

    /// Moves a read at `lsn` that this timeline could not finish to the ancestor.
    fn enter_ancestor(&self, lsn: Lsn) -> Result<Option<AncestorRead<'_>>, ReadError> {
        let Some(ancestor) = &self.ancestor else {
            return Ok(None);
        };
        let timeline = &*ancestor.timeline;
        let lsn = lsn.min(ancestor.lsn);
        let map = timeline.layer_map();
        let last_record = timeline.last_record_lsn();
        if lsn > last_record {
            // Only after a crash, until the ancestor has ingested its log up to the branch
            // point again.
            return Err(ReadError::NotYetIngested { requested: lsn, last_record });
        }
        let horizon = timeline.gc_cutoff_lsn();
        if lsn < horizon && lsn != ancestor.lsn {
            return Err(ReadError::BelowGcHorizon { requested: lsn, horizon });
        }
        Ok(Some(AncestorRead { timeline, lsn, map }))
    }
}

/// Where a read continues: the ancestor, the LSN to read it at, and a snapshot of its layer
/// map taken before its LSN checks.
struct AncestorRead<'a> {
    timeline: &'a Timeline,
    lsn: Lsn,
    map: Arc<LayerMap>,
}

/// Collects versions of `key` at or below `lsn` from one timeline's layers, newest first,
/// counting the layers searched in `layers_visited`. Returns whether the collection is
/// complete.
fn collect_in(map: &LayerMap, key: Key, lsn: Lsn, collector: &mut ValueCollector, layers_visited: &mut usize) -> Result<bool, LayerError> {
    let mut cont_lsn = Lsn(lsn.0 + 1);
    while let Some(found) = map.search(key, cont_lsn) {
        // Progress: `search` only returns layers starting below `cont_lsn`, and floors
        // at or above their start.
        assert!(found.lsn_floor < cont_lsn, "layer search did not make progress at {cont_lsn}");
        *layers_visited += 1;
        if found.layer.collect(key, found.lsn_floor..cont_lsn, collector)? {
            return Ok(true);
        }
        cont_lsn = found.lsn_floor;
    }
    Ok(false)
}

fn add_keys(map: &LayerMap, range: &KeyRange, lsn: Lsn, keys: &mut BTreeSet<Key>) -> Result<(), LayerError> {
    for layer in map.all() {
        let desc = layer.desc();
        if desc.lsn_range.start <= lsn && desc.key_range.overlaps(range) {
            keys.extend(layer.keys(range, lsn)?);
        }
    }
    Ok(())
}
