//! Delta depth: where reads walk many delta layers, and image layers for just those ranges.
//!
//! A read of a key walks the timeline's delta layers from newer to older until it reaches an
//! image layer covering the key (see `layer_map`). The **delta depth** of a key is the number
//! of delta layer files with versions newer than the newest image layer covering it: how
//! many layers a read at the disk-consistent LSN may have to search in this timeline, and
//! so, roughly, how many records it may have to replay. Compaction keeps the number of L0
//! layers down, but it does not shorten that walk: only an image layer does.
//!
//! `create_image_layers_where_needed` bounds it: the key space is cut into partitions of a
//! bounded number of keys (`partition_keys`, so that one image layer creation has a bounded
//! cost), and a partition whose depth is at least `image_creation_threshold` is rebuilt as
//! image layers at the disk-consistent LSN, deepest first, at most `ranges_max` partitions
//! per call. A partition's depth is the greatest depth of any key range in it: the layers'
//! key boundaries cut it into pieces each of which a layer covers wholly or not at all, and
//! each piece's depth is counted exactly.
//!
//! Only this timeline's layer files count: in-memory layers are above the disk-consistent
//! LSN, where no image can be made yet, and a read that falls through to an ancestor at the
//! branch point walks the ancestor's layers below it, which images at the ancestor's newer
//! disk-consistent LSN do not shorten (a known limitation).
//!
//! Cost: O(partitions × layers × boundaries) for the depths, from the in-memory layer map;
//! `partition_keys` lists every key from the layers' in-memory indexes.

use std::sync::Arc;

use proto::{Key, KeyRange, Lsn};

use super::{lock, Timeline};
use crate::error::ReadError;
use crate::layer::{LayerDesc, LayerFile, LayerKind};
use crate::layer_map::LayerMap;
use crate::value::Reconstructor;

/// A key range and its delta depth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDepth {
    pub key_range: KeyRange,
    pub depth: usize,
}

/// What one `create_image_layers_where_needed` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageCreationResult {
    /// The LSN the images were created at (the disk-consistent LSN); `Lsn::INVALID` if
    /// none could be (an empty timeline, or a GC cutoff above the disk-consistent LSN).
    pub lsn: Lsn,
    /// The partitions rebuilt, with the depth each had, deepest first.
    pub ranges: Vec<RangeDepth>,
    /// Partitions deep enough that were left for a later call by `ranges_max`.
    pub ranges_deferred: usize,
    pub layers_created: Vec<LayerDesc>,
    /// The size of the image layer files written.
    pub bytes_written: u64,
}

impl Timeline {
    /// Cuts the whole key space into consecutive ranges that each hold at most
    /// `keys_per_partition` of the keys that exist at `lsn` (this timeline's and its
    /// ancestors'). The ranges tile `KeyRange::ALL` in order; each starts at one of its keys
    /// (the first at `Key::MIN`), so each holds at least one key unless none exists at all.
    pub fn partition_keys(&self, lsn: Lsn, keys_per_partition: usize) -> Result<Vec<KeyRange>, ReadError> {
        let keys = self.keys_in_range(&KeyRange::ALL, lsn)?;
        let starts: Vec<Key> = keys.iter().step_by(keys_per_partition.max(1)).skip(1).copied().collect();
        let mut partitions = Vec::with_capacity(starts.len() + 1);
        let mut start = Key::MIN;
        for next in starts {
            partitions.push(KeyRange { start, end: next });
            start = next;
        }
        partitions.push(KeyRange { start, end: Key::MAX });
        Ok(partitions)
    }

    /// The delta depth of `key_range`: the most delta layer files that a read of any key in
    /// it searches above the newest image layer covering that key (see the module doc).
    pub fn delta_depth(&self, key_range: &KeyRange) -> usize {
        delta_depth(&self.layer_map(), key_range)
    }

    /// The ranges of `partitions` whose delta depth is at least `min_depth`, deepest first
    /// (in key order among equals).
    pub fn deep_ranges(&self, partitions: &[KeyRange], min_depth: usize) -> Vec<RangeDepth> {
        let map = self.layer_map();
        let mut deep: Vec<RangeDepth> =
            partitions.iter().map(|r| RangeDepth { key_range: *r, depth: delta_depth(&map, r) }).filter(|r| r.depth >= min_depth).collect();
        deep.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.key_range.start.cmp(&b.key_range.start)));
        deep
    }

    /// Creates image layers at the disk-consistent LSN for the partitions whose delta depth
    /// is at least `min_depth` (the configured `image_creation_threshold` normally; 0
    /// rebuilds every partition), deepest first, at most `ranges_max` of them. Holds
    /// `layer_removal_lock` throughout, like `create_image_layers`; reads and ingest go on.
    pub fn create_image_layers_where_needed(
        &self,
        partitions: &[KeyRange],
        min_depth: usize,
        ranges_max: usize,
        reconstructor: &dyn Reconstructor,
    ) -> anyhow::Result<ImageCreationResult> {
        let _entered = self.span.enter();
        let _exclusive = lock(&self.layer_removal_lock);
        let lsn = self.disk_consistent_lsn();
        if !lsn.is_valid() || lsn < self.gc_cutoff_lsn() {
            return Ok(ImageCreationResult::default());
        }
        let mut deep = self.deep_ranges(partitions, min_depth);
        let ranges_deferred = deep.len().saturating_sub(ranges_max);
        deep.truncate(ranges_max);
        let mut result = ImageCreationResult { lsn, ranges_deferred, ..ImageCreationResult::default() };
        for range in deep {
            let created: Vec<Arc<LayerFile>> = self.write_image_layers(&range.key_range, lsn, reconstructor)?;
            result.bytes_written += created.iter().map(|l| l.file_size_bytes()).sum::<u64>();
            result.layers_created.extend(created.iter().map(|l| l.desc().clone()));
            result.ranges.push(range);
        }
        Ok(result)
    }
}

/// See `Timeline::delta_depth`.
fn delta_depth(map: &LayerMap, key_range: &KeyRange) -> usize {
    let overlapping: Vec<&LayerDesc> = map.files.iter().map(|f| f.desc()).filter(|d| d.key_range.overlaps(key_range)).collect();
    // Pieces of `key_range` that every layer covers wholly or not at all.
    let mut bounds: Vec<Key> = vec![key_range.start, key_range.end];
    for d in &overlapping {
        for b in [d.key_range.start, d.key_range.end] {
            if key_range.start < b && b < key_range.end {
                bounds.push(b);
            }
        }
    }
    bounds.sort();
    bounds.dedup();
    let mut deepest = 0;
    for piece in bounds.windows(2) {
        let (start, end) = (piece[0], piece[1]);
        let covers = |d: &&&LayerDesc| d.key_range.start <= start && d.key_range.end >= end;
        let newest_image = overlapping.iter().filter(|d| d.kind == LayerKind::Image).filter(covers).map(|d| d.lsn_range.start).max();
        // A delta layer ending at `e` holds versions up to `e - 1`: newer than an image at
        // `i` when `e - 1 > i`.
        let depth = overlapping
            .iter()
            .filter(|d| d.kind == LayerKind::Delta)
            .filter(covers)
            .filter(|d| newest_image.is_none_or(|i| d.lsn_range.end.0 > i.0 + 1))
            .count();
        deepest = deepest.max(depth);
    }
    deepest
}

#[cfg(test)]
mod tests;
