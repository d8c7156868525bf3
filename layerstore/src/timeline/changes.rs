//! Listing changes: which keys have a version between two LSNs, and the newest such LSN.
//!
//! `changed_keys(range, from, to, limit)` answers with every key in `range` that has a
//! version (an image or a record, as put) with LSN in `from+1..=to`, each with the newest
//! such LSN, in key order. A caller that holds copies of values as of some LSN `d` in
//! `from..=to` uses it to find the copies that may be stale at `to`: those whose key is
//! listed with an LSN above `d`. The answer must therefore be complete; it is exact.
//!
//! Why this timeline's delta layers and in-memory layers are enough:
//! - Every put lands in the open in-memory layer, which is frozen and flushed to an L0
//!   delta layer file; compaction rewrites L0 layers as L1 layers with the same versions
//!   (a crash in between can leave both: a key's LSN is then offered twice, harmlessly).
//!   Image layers are never put into: they are rebuilt from reads and hold states, not
//!   changes, so they are skipped and never needed.
//! - GC removes a delta layer only when image layers at LSNs from its newest version up to
//!   the cutoff cover it (`gc.rs`), so every version it held is at or below the cutoff.
//!   With `from` at or above the cutoff, none of them is in the range. Below the cutoff the
//!   answer could be incomplete, so it is refused. The cutoff is checked after the layer
//!   map snapshot is taken, as reads do: GC raises it before it changes the map, so the
//!   check either sees the raise or the snapshot predates the removal.
//! - Versions at or below the branch point are the ancestor's; a `from` below it is
//!   refused rather than answered from the ancestor, whose GC keeps only what reads at the
//!   branch point need, not its history below.
//! - Versions above the last record LSN are unpublished (and may be put again after a
//!   crash); `to` above it is refused, so an answer never changes once given.
//!
//! Cost: no lock is held while layer files are read (the layer map is a snapshot; an
//! in-memory layer's index is locked a chunk of keys at a time). Layer files outside the
//! LSN range or the key range are not opened (evicted ones are not downloaded); inside it,
//! the index answers for keys with one version, and the blocks of the others are read once
//! each, their values neither copied nor decoded. Memory is bounded by `limit`: past it the
//! listing stops with `TooManyChanges`.

use std::ops::Range;

use proto::{Key, KeyRange, Lsn};

use super::Timeline;
use crate::error::ChangedKeysError;
use crate::layer::LayerKind;
use crate::value::ChangeCollector;

impl Timeline {
    /// Every key in `key_range` with a version whose LSN is above `from` and at or below
    /// `to`, with the newest such LSN, in key order. Refused when `from > to`, when `to` is
    /// not published yet, when `from` is below the GC cutoff or the branch point, and when
    /// more than `limit` keys changed. See the module documentation.
    pub fn changed_keys(&self, key_range: &KeyRange, from: Lsn, to: Lsn, limit: usize) -> Result<Vec<(Key, Lsn)>, ChangedKeysError> {
        let _entered = self.span.enter();
        let map = self.layer_map();
        if from > to {
            return Err(ChangedKeysError::InvalidRange { from, to });
        }
        let last_record = self.last_record_lsn();
        if to > last_record {
            return Err(ChangedKeysError::NotYetIngested { to, last_record });
        }
        let horizon = self.gc_cutoff_lsn();
        if from < horizon {
            return Err(ChangedKeysError::BelowGcHorizon { from, horizon });
        }
        if let Some(branch_lsn) = self.ancestor_lsn().filter(|b| from < *b) {
            return Err(ChangedKeysError::BeforeBranchPoint { from, branch_lsn });
        }
        // `to` is at most the last record LSN, which is never `Lsn::MAX`.
        let lsn_range: Range<Lsn> = Lsn(from.0 + 1)..Lsn(to.0 + 1);
        let mut changes = ChangeCollector::new(limit);
        for layer in map.all() {
            let desc = layer.desc();
            let holds_range = desc.lsn_range.start < lsn_range.end && lsn_range.start < desc.lsn_range.end;
            if desc.kind == LayerKind::Image || !holds_range || !desc.key_range.overlaps(key_range) {
                continue;
            }
            layer.collect_changes(key_range, &lsn_range, &mut changes)?;
            if changes.is_over_limit() {
                return Err(ChangedKeysError::TooManyChanges { limit, from, to });
            }
        }
        Ok(changes.finish())
    }
}

#[cfg(test)]
mod tests;
