//! Layers: the units a timeline's versions are stored in.
//!
//! A layer holds versions for a key range over an LSN range. Three kinds exist:
//!
//! - the **in-memory layer** (`inmemory`): open for puts, then frozen, then flushed;
//! - **delta layers** (files): every version in their key range with LSN in
//!   `start..end`, records and images alike. L0 delta layers are flushed in-memory
//!   layers and cover every key; L1 delta layers come out of compaction and are
//!   partitioned by key;
//! - **image layers** (files): the value of every key in their key range as of one LSN.
//!   An image layer is authoritative for its whole key range: a key it does not hold had
//!   no value at its LSN.
//!
//! Delta and image layer files share one format (`format`, `writer`, `reader`) and differ in
//! what the reader accepts. `name` prints and parses their self-describing file names.
//! [`Layer`] is the handle the layer map and reads use for all three.

pub mod block_cache;
pub mod file;
pub mod format;
pub mod inmemory;
pub mod name;
pub mod reader;
pub mod writer;

#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use proto::{Key, KeyRange, Lsn};

use crate::error::LayerError;
use crate::value::{ChangeCollector, ValueCollector};
pub use file::{DiskBudget, LayerDownload, LayerFile, RemoteCopy};
pub use inmemory::{FoldThresholds, InMemoryLayer, LayerReplace};
pub use name::{LayerDesc, LayerKind, LayerNameError};
pub use reader::LayerReader;
pub use writer::LayerWriter;

/// A handle to any layer. Cloning is cheap; a handle keeps the layer (and its open file)
/// alive after it is removed from the layer map, so readers holding one are unaffected.
#[derive(Clone, Debug)]
pub enum Layer {
    InMemory(Arc<InMemoryLayer>),
    File(Arc<LayerFile>),
}

impl Layer {
    pub fn desc(&self) -> LayerDesc {
        match self {
            Layer::InMemory(l) => l.desc(),
            Layer::File(l) => l.desc().clone(),
        }
    }

    /// Offers the key's versions with LSN in `lsn_range` to `collector`, newest first.
    /// Returns whether the collection is complete (nothing older is needed).
    pub(crate) fn collect(&self, key: Key, lsn_range: Range<Lsn>, collector: &mut ValueCollector) -> Result<bool, LayerError> {
        match self {
            Layer::InMemory(l) => l.collect(key, lsn_range, collector),
            Layer::File(l) => l.collect(key, lsn_range, collector),
        }
    }

    /// Offers `changes` the newest LSN in `lsn_range` of each key in `key_range` that has
    /// a version there; an image layer offers nothing (it holds states, not changes).
    pub(crate) fn collect_changes(
        &self,
        key_range: &KeyRange,
        lsn_range: &Range<Lsn>,
        changes: &mut ChangeCollector,
    ) -> Result<(), LayerError> {
        match self {
            Layer::InMemory(l) => {
                l.collect_changes(key_range, lsn_range, changes);
                Ok(())
            }
            Layer::File(l) => l.collect_changes(key_range, lsn_range, changes),
        }
    }

    /// The keys in `range` with a version at or below `lsn`.
    pub fn keys(&self, range: &KeyRange, lsn: Lsn) -> Result<Vec<Key>, LayerError> {
        match self {
            Layer::InMemory(l) => Ok(l.keys(range, lsn)),
            Layer::File(l) => l.keys(range, lsn),
        }
    }
}
