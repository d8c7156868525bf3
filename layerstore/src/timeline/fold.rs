//! Folds: bounding the records a read of a hot key replays from in-memory layers.
//!
//! `Timeline::put` counts, per key and in-memory layer, the records since the key's newest
//! standalone version (an image or an initializing record); when the count crosses a
//! multiple of `fold_after_records`, or their bytes a multiple of `fold_after_bytes`, the
//! key goes into a bounded queue. The caller (which knows what records mean) takes keys
//! with `take_long_chains`, rebuilds each at its newest version `L` and hands the image to
//! `replace_with_image(key, L, image)`, which replaces the record version at `L` by the
//! image in place. No new LSN appears and every read returns what it returned before,
//! while reads at or above `L` start from the image; the L0 flush writes the image, so
//! layer files keep the bound too. Reads need no change.
//!
//! Invariant: a published version's value never changes; an in-memory record version may
//! be replaced by an image of the value it denotes. A replace lands in the layer before its
//! flush reads it, or is refused (`InMemoryLayer`); it never touches a layer file.

use proto::{Key, Lsn};

use super::{lock, Timeline};
use crate::error::WriteError;
use crate::layer::LayerReplace;
use crate::value::VALUE_SIZE_BYTES_MAX;

/// The most keys the queue of long chains holds; a key crossing a threshold while it is
/// full is dropped and counted (`long_chains_dropped`), and queued again at its next
/// crossing.
pub const LONG_CHAINS_MAX: usize = 4096;

/// What `Timeline::replace_with_image` did. Everything but `Replaced` leaves the timeline
/// as it was; `reason` names the outcome for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplaceOutcome {
    Replaced,
    /// The version at that LSN is an image already.
    AlreadyImage,
    /// No in-memory layer covers the LSN any more (flushed, or being flushed): the layer
    /// file keeps the records.
    NotInMemory,
    /// The key has no version at exactly that LSN.
    NoSuchVersion,
    /// The LSN is above the last record LSN: its versions may still be replaced by puts,
    /// so no image of them can be trusted.
    Unpublished,
    /// The LSN is below the GC cutoff: reads there are refused, so no image is needed.
    BelowGcCutoff,
    /// The version's layer lock was taken (a frozen layer's, or an open layer's for about
    /// 10 ms): not waited for (a flush holds it for the whole file write, and a waiting
    /// fold would stall every reader behind it).
    Busy,
}

impl ReplaceOutcome {
    pub fn reason(self) -> &'static str {
        match self {
            ReplaceOutcome::Replaced => "replaced",
            ReplaceOutcome::AlreadyImage => "already_image",
            ReplaceOutcome::NotInMemory => "not_in_memory",
            ReplaceOutcome::NoSuchVersion => "no_such_version",
            ReplaceOutcome::Unpublished => "unpublished",
            ReplaceOutcome::BelowGcCutoff => "below_gc_cutoff",
            ReplaceOutcome::Busy => "busy",
        }
    }
}

/// Keys whose in-memory chains crossed a fold threshold, with their chain lengths.
#[derive(Debug, Default)]
pub(super) struct LongChains {
    keys: std::collections::BTreeMap<Key, u32>,
    dropped: u64,
}

impl Timeline {
    pub(super) fn queue_long_chain(&self, key: Key, chain: u32) {
        let mut q = lock(&self.long_chains);
        if let Some(queued) = q.keys.get_mut(&key) {
            *queued = (*queued).max(chain);
        } else if q.keys.len() < LONG_CHAINS_MAX {
            q.keys.insert(key, chain);
        } else {
            q.dropped += 1;
        }
    }

    /// Takes up to `max` keys from the queue of keys to fold, longest chains first, each
    /// with the chain length it was queued at.
    pub fn take_long_chains(&self, max: usize) -> Vec<(Key, u32)> {
        let mut q = lock(&self.long_chains);
        if max == 0 {
            return Vec::new();
        }
        // Callers take a few keys at a time, so that a key whose chain keeps growing is
        // seen again soon: a selection, not a sort of the whole queue.
        let longest_first = |a: &(Key, u32), b: &(Key, u32)| b.1.cmp(&a.1).then(a.0.cmp(&b.0));
        let mut all: Vec<(Key, u32)> = q.keys.iter().map(|(k, n)| (*k, *n)).collect();
        if all.len() > max {
            all.select_nth_unstable_by(max - 1, longest_first);
            all.truncate(max);
        }
        all.sort_by(longest_first);
        for (key, _) in &all {
            q.keys.remove(key);
        }
        all
    }

    /// Keys waiting in the queue of keys to fold.
    pub fn long_chains_len(&self) -> usize {
        lock(&self.long_chains).keys.len()
    }

    /// Keys not queued because the queue was full, since the timeline was loaded.
    pub fn long_chains_dropped(&self) -> u64 {
        lock(&self.long_chains).dropped
    }

    /// The records since the newest standalone version of `key` in the open layer (0
    /// without an open layer): what a fold would save the next read from memory.
    pub fn open_chain_len(&self, key: Key) -> u32 {
        self.layer_map().open.as_ref().map_or(0, |l| l.records_since_standalone(key))
    }

    /// Folds: replaces the record version of `key` at `lsn` in an in-memory layer (open or
    /// frozen) by `image`, which must be the value that version denotes, i.e. this
    /// timeline's value of `key` at `lsn` as the caller's reconstructor builds it. Reads at
    /// every LSN then return what they returned before, and the flush writes the image to
    /// the layer file, so later reads start from it instead of the records before it.
    ///
    /// Refused, changing nothing: an unpublished LSN (a put may still replace the version),
    /// an LSN below the GC cutoff, a version that is an image already or does not exist, and
    /// a layer already flushed or being flushed. A fold racing a flush either lands in the
    /// layer before the flush reads it or not at all (`InMemoryLayer`).
    pub fn replace_with_image(&self, key: Key, lsn: Lsn, image: &[u8]) -> Result<ReplaceOutcome, WriteError> {
        let _entered = self.span.enter();
        if image.len() > VALUE_SIZE_BYTES_MAX {
            return Err(WriteError::ValueTooLarge { key, len: image.len(), max: VALUE_SIZE_BYTES_MAX });
        }
        if lsn > self.last_record_lsn() || lsn == Lsn::MAX {
            return Ok(ReplaceOutcome::Unpublished);
        }
        if lsn < self.gc_cutoff_lsn() {
            return Ok(ReplaceOutcome::BelowGcCutoff);
        }
        let map = self.layer_map();
        let covering = map.open.iter().chain(&map.frozen).find(|l| l.start_lsn() <= lsn && l.end_lsn().is_none_or(|end| lsn < end));
        let Some(layer) = covering else {
            return Ok(ReplaceOutcome::NotInMemory);
        };
        Ok(match layer.replace_with_image(key, lsn, image)? {
            LayerReplace::Replaced => ReplaceOutcome::Replaced,
            LayerReplace::AlreadyImage => ReplaceOutcome::AlreadyImage,
            LayerReplace::NoSuchVersion => ReplaceOutcome::NoSuchVersion,
            LayerReplace::Flushing => ReplaceOutcome::NotInMemory,
            LayerReplace::Busy => ReplaceOutcome::Busy,
        })
    }
}

#[cfg(test)]
mod tests;
