//! Compaction (L0 delta layers into L1 delta layers) and image layer creation.
//!
//! **L0 → L1.** Every flush adds an L0 layer covering all keys, so every read has to
//! look into every L0 layer. Once `compaction_l0_threshold` of them have piled up,
//! compaction merges all of them (a k-way merge in `(key, lsn)` order, streaming one
//! block per input at a time; gaps between them hold no versions, see `compact_level0`) and cuts the output into L1 layers
//! at key boundaries whenever a layer reaches `compaction_target_size_bytes`. All L1 layers
//! of one run share the run's LSN range and have disjoint key ranges, so a read looks
//! into one of them. An L1 layer never covers the whole key space: that is how an L0 layer
//! is recognized by its name. The new layers replace the old ones in one layer map change;
//! then the old files are deleted.
//!
//! **Image layers.** For a key range at an LSN, every key that exists there is rebuilt by
//! the `Reconstructor` (redo) and written to image layers, cut at
//! `image_layer_target_size_bytes` with contiguous key ranges covering exactly the
//! requested range: an image layer is authoritative for its key range, which is what lets
//! reads stop there and GC remove what is below it. Images are only created at or below
//! the disk-consistent LSN, so a crash never leaves one above it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use anyhow::{bail, ensure, Context};
use proto::{Key, KeyRange, Lsn};

use super::{lock, Timeline};
use crate::layer::reader::LayerIter;
use crate::layer::{Layer, LayerDesc, LayerFile, LayerKind, LayerReader, LayerWriter};
use crate::value::{Reconstructor, Value};

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionResult {
    pub l0_removed: Vec<LayerDesc>,
    pub l1_created: Vec<LayerDesc>,
    /// The size of the L1 layer files written.
    pub bytes_written: u64,
}

/// Merges several layers' entries into one `(key, lsn)` order.
struct MergeIter<'a> {
    iters: Vec<LayerIter<'a>>,
    heads: BinaryHeap<Reverse<(Key, Lsn, usize)>>,
    values: Vec<Option<Value>>,
}

impl<'a> MergeIter<'a> {
    fn new(layers: &'a [Arc<LayerReader>]) -> anyhow::Result<Self> {
        let mut merge = MergeIter { iters: layers.iter().map(|l| l.iter()).collect(), heads: BinaryHeap::new(), values: Vec::new() };
        merge.values.resize(layers.len(), None);
        for i in 0..layers.len() {
            merge.refill(i)?;
        }
        Ok(merge)
    }

    fn refill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(item) = self.iters[i].next() {
            let (key, lsn, value) = item?;
            self.heads.push(Reverse((key, lsn, i)));
            self.values[i] = Some(value);
        }
        Ok(())
    }

    fn next(&mut self) -> anyhow::Result<Option<(Key, Lsn, Value)>> {
        let Some(Reverse((key, lsn, i))) = self.heads.pop() else {
            return Ok(None);
        };
        let value = self.values[i].take().context("merge head without a value")?;
        self.refill(i)?;
        if let Some(Reverse((k, l, _))) = self.heads.peek() {
            // L0 layers have disjoint LSN ranges, so no version can come twice.
            ensure!((*k, *l) != (key, lsn), "version of {key} at {lsn} appears in two layers");
        }
        Ok(Some((key, lsn, value)))
    }
}

impl Timeline {
    /// Compacts L0 layers once `compaction_l0_threshold` of them exist.
    pub fn compact(&self) -> anyhow::Result<CompactionResult> {
        self.compact_level0(false)
    }

    /// Merges every L0 layer into L1 layers covering their LSN range, from the first
    /// one's start to the last one's end; with `force`, even below the threshold (a single
    /// L0 layer is then just partitioned by key).
    ///
    /// L0 layers never overlap, but there can be gaps between them, and a gap holds no
    /// versions: either nothing was put there (a freeze with no open layer, as when the log
    /// carried no page changes before an idle flush, moves where the next layer starts)
    /// or GC removed the layer because image layers at or below the cutoff answer every
    /// read it allows. An L1 layer spanning a gap is therefore as complete as the L0
    /// layers: a read never asks a delta layer for versions below a newer image (the
    /// search's floor, see `layer_map`). Merging only a gapless run, as this once did,
    /// left every L0 layer after the first gap uncompacted forever.
    pub fn compact_level0(&self, force: bool) -> anyhow::Result<CompactionResult> {
        let _entered = self.span.enter();
        let _exclusive = lock(&self.layer_removal_lock);
        let l0 = self.layer_map().l0_layers();
        if l0.is_empty() || (!force && l0.len() < self.conf.compaction_l0_threshold) {
            return Ok(CompactionResult::default());
        }
        for w in l0.windows(2) {
            let (a, b) = (w[0].desc(), w[1].desc());
            ensure!(a.lsn_range.end <= b.lsn_range.start, "L0 layers {a} and {b} overlap");
        }
        let lsn_range = l0[0].desc().lsn_range.start..l0[l0.len() - 1].desc().lsn_range.end;
        // Evicted L0 layers are downloaded first; the readers stay open during the merge.
        let readers = l0.iter().map(|l| l.reader()).collect::<Result<Vec<_>, _>>()?;
        let mut merge = MergeIter::new(&readers)?;
        let mut created: Vec<Arc<LayerFile>> = Vec::new();
        let mut current: Option<(Key, LayerWriter)> = None;
        while let Some((key, lsn, value)) = merge.next()? {
            if let Some((first_key, writer)) = &current {
                let last_key = writer.last_key().context("open L1 writer without a key")?;
                let full = writer.size_bytes() >= self.conf.compaction_target_size_bytes;
                // [Key::MIN, Key::MAX) is what marks an L0 layer; never write an L1 like it.
                let would_cover_all = *first_key == Key::MIN && key.next() == Key::MAX;
                if key != last_key && (full || would_cover_all) {
                    let (first_key, writer) = current.take().context("checked above")?;
                    created.push(Arc::new(writer.finish(KeyRange { start: first_key, end: last_key.next() })?));
                }
            }
            if current.is_none() {
                current = Some((key, LayerWriter::new(&self.path, LayerKind::Delta, lsn_range.clone(), &self.conf)?));
            }
            if let Some((_, writer)) = &mut current {
                writer.put(key, lsn, &value)?;
            }
        }
        if let Some((first_key, writer)) = current {
            let last_key = writer.last_key().context("open L1 writer without a key")?;
            created.push(Arc::new(writer.finish(KeyRange { start: first_key, end: last_key.next() })?));
        }
        let result = CompactionResult {
            l0_removed: l0.iter().map(|l| l.desc().clone()).collect(),
            l1_created: created.iter().map(|l| l.desc().clone()).collect(),
            bytes_written: created.iter().map(|l| l.file_size_bytes()).sum(),
        };
        for desc in &result.l1_created {
            assert!(!desc.is_l0(), "compaction produced an L1 layer that looks like L0: {desc}");
        }
        self.modify_layer_map(|m| {
            m.remove_files(&result.l0_removed);
            for layer in &created {
                m.insert_file(Arc::clone(layer));
            }
        });
        self.schedule_remote(&created, &result.l0_removed, Lsn::INVALID, Lsn::INVALID);
        let removed: Vec<Layer> = l0.into_iter().map(Layer::File).collect();
        self.delete_layer_files(&removed)?;
        tracing::info!("compacted {} L0 layers into {} L1 layers", result.l0_removed.len(), result.l1_created.len());
        Ok(result)
    }

    /// Writes image layers covering `key_range` at `lsn`, rebuilding every key that exists
    /// there with `reconstructor`. `lsn` must be at or below the disk-consistent LSN, at or
    /// above the GC cutoff and at or above the branch point.
    pub fn create_image_layers(&self, key_range: &KeyRange, lsn: Lsn, reconstructor: &dyn Reconstructor) -> anyhow::Result<Vec<LayerDesc>> {
        let _entered = self.span.enter();
        let _exclusive = lock(&self.layer_removal_lock);
        let created = self.write_image_layers(key_range, lsn, reconstructor)?;
        Ok(created.iter().map(|l| l.desc().clone()).collect())
    }

    /// `create_image_layers` without taking `layer_removal_lock`, which the caller holds;
    /// returns the files written.
    pub(super) fn write_image_layers(
        &self,
        key_range: &KeyRange,
        lsn: Lsn,
        reconstructor: &dyn Reconstructor,
    ) -> anyhow::Result<Vec<Arc<LayerFile>>> {
        ensure!(!key_range.is_empty(), "cannot create image layers for the empty key range {key_range}");
        let disk_consistent_lsn = self.disk_consistent_lsn();
        if lsn > disk_consistent_lsn {
            bail!("cannot create image layers at LSN {lsn}: above the disk-consistent LSN {disk_consistent_lsn}");
        }
        if let Some(ancestor_lsn) = self.ancestor_lsn().filter(|a| lsn < *a) {
            bail!("cannot create image layers at LSN {lsn}: below the branch point {ancestor_lsn}");
        }
        let keys = self.keys_in_range(key_range, lsn)?;
        let new_writer = || LayerWriter::new(&self.path, LayerKind::Image, lsn..Lsn(lsn.0 + 1), &self.conf);
        let mut created = Vec::new();
        let mut part_start = key_range.start;
        let mut writer = new_writer()?;
        for key in keys {
            if !writer.is_empty() && writer.size_bytes() >= self.conf.image_layer_target_size_bytes {
                let full = std::mem::replace(&mut writer, new_writer()?);
                created.push(Arc::new(full.finish(KeyRange { start: part_start, end: key })?));
                part_start = key;
            }
            let data = self.get_reconstruct_data(key, lsn)?;
            ensure!(!data.is_empty(), "key {key} listed at {lsn} has no version");
            let image = reconstructor.reconstruct(key, lsn, data).with_context(|| format!("reconstruct {key} at {lsn}"))?;
            writer.put(key, lsn, &Value::Image(image))?;
        }
        created.push(Arc::new(writer.finish(KeyRange { start: part_start, end: key_range.end })?));
        self.modify_layer_map(|m| {
            for layer in &created {
                m.insert_file(Arc::clone(layer));
            }
        });
        self.schedule_remote(&created, &[], Lsn::INVALID, Lsn::INVALID);
        tracing::info!("created {} image layers for {key_range} at {lsn}", created.len());
        Ok(created)
    }
}
