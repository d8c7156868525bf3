//! Garbage collection: removing layer files no permitted read can need.
//!
//! The caller chooses the cutoff (from a retention window in LSN distance or time; see
//! `Tenant::gc_iteration`) and passes the branch points of this timeline's children. GC
//! first raises the timeline's GC cutoff and persists it, so reads below it are refused
//! from then on, even after a crash. Then it removes every layer file `X` such that:
//!
//! 1. for reads at or above the cutoff: image layers other than `X`, at LSNs from
//!    `X`'s newest possible version up to the cutoff, together cover `X`'s whole key range
//!    (for a delta layer `start..end` that means image LSNs in `end-1..=cutoff`; for an
//!    image layer at `i`, in `i+1..=cutoff`). Every such read then finds a newer image
//!    before it could need `X`, and no version of `X` is newer than the cutoff;
//! 2. for each child branch point `r` below the cutoff that `X` has versions at or below
//!    (`start <= r`): the same holds with `r` in place of the cutoff, so the child's reads
//!    at `r` never need `X` either.
//!
//! In-memory layers are never removed. Reads at a child's branch point are exempt from
//! the cutoff check (`read.rs`), which rule 2 makes safe. Removing an image that covers
//! another removed layer is safe too: it is removed only when newer images within the same
//! bounds cover it, so the chain ends at an image that stays.
//!
//! Cost: O(layers² + layers × branch points × layers) per run; fine for now.

use anyhow::ensure;
use proto::Lsn;

use super::{lock, Timeline};
use crate::layer::{Layer, LayerDesc, LayerKind};
use crate::layer_map::LayerMap;

/// What one GC run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcResult {
    /// The timeline's GC cutoff after the run (never lower than before).
    pub cutoff: Lsn,
    pub layers_removed: Vec<LayerDesc>,
    /// The size of the layer files removed.
    pub bytes_removed: u64,
}

impl Timeline {
    /// Raises the GC cutoff to `cutoff` and removes the layer files that neither reads at
    /// or above it nor reads at any of `retain_lsns` (the children's branch points) need.
    pub fn gc(&self, cutoff: Lsn, retain_lsns: &[Lsn]) -> anyhow::Result<GcResult> {
        let _entered = self.span.enter();
        let _exclusive = lock(&self.layer_removal_lock);
        let last_record = self.last_record_lsn();
        ensure!(cutoff <= last_record, "cannot set the GC cutoff to {cutoff}: beyond the last record LSN {last_record}");
        let cutoff = self.raise_gc_cutoff(cutoff)?;
        let map = self.layer_map();
        let removable: Vec<Layer> =
            map.files.iter().filter(|f| removable(&map, f.desc(), cutoff, retain_lsns)).map(|f| Layer::File(f.clone())).collect();
        let layers_removed: Vec<LayerDesc> = removable.iter().map(Layer::desc).collect();
        let bytes_removed = removable.iter().map(|l| if let Layer::File(f) = l { f.file_size_bytes() } else { 0 }).sum();
        self.modify_layer_map(|m| m.remove_files(&layers_removed));
        self.schedule_remote(&[], &layers_removed, Lsn::INVALID, cutoff);
        self.delete_layer_files(&removable)?;
        if !layers_removed.is_empty() {
            tracing::info!("gc at cutoff {cutoff} removed {} layers", layers_removed.len());
        }
        Ok(GcResult { cutoff, layers_removed, bytes_removed })
    }
}

fn removable(map: &LayerMap, desc: &LayerDesc, cutoff: Lsn, retain_lsns: &[Lsn]) -> bool {
    // The lowest image LSN that supersedes every version in the layer.
    let lowest_covering = match desc.kind {
        LayerKind::Delta => Lsn(desc.lsn_range.end.0 - 1),
        LayerKind::Image => Lsn(desc.lsn_range.start.0 + 1),
    };
    let covered_at = |bound: Lsn| map.covered_by_images(&desc.key_range, lowest_covering, bound, desc);
    covered_at(cutoff) && retain_lsns.iter().filter(|r| **r < cutoff && **r >= desc.lsn_range.start).all(|r| covered_at(*r))
}
