//! What the store holds under a `(Key, Lsn)`, and what a read hands back.
//!
//! A [`Value`] is either a whole image (a page, or any other blob) or one log record that modifies
//! the value as of the previous version. A read collects, newest first, every version of a
//! key down to the first one that stands on its own (an image, or a record flagged
//! `will_init`), and returns them oldest first as [`ReconstructData`]. Turning that into
//! bytes is redo, which is not this crate's business: it is behind the [`Reconstructor`]
//! trait. [`ModelReconstructor`] is the deterministic stand-in the tests use. A listing of
//! changes gathers only keys and LSNs, in a `ChangeCollector`.
//!
//! Invariant: the collector never looks past a version that stands on its own, so
//! `ReconstructData::records` never contains a version older than `image`, and at most its
//! first record has `will_init` set.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use proto::{Key, Lsn};

/// One version of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A whole value: it needs no older version.
    Image(Bytes),
    /// A log record to apply to the previous version. With `will_init` the record builds
    /// the value from nothing (the caller knows which records do), so no older version is
    /// needed.
    Record { will_init: bool, rec: Bytes },
}

/// A log record as handed to the reconstructor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub will_init: bool,
    pub rec: Bytes,
}

// Value tags, persisted in layer files and ephemeral files: never renumber.
pub(crate) const TAG_IMAGE: u8 = 0;
pub(crate) const TAG_RECORD: u8 = 1;
pub(crate) const TAG_RECORD_WILL_INIT: u8 = 2;

/// The largest value the store accepts. Layer blocks are sized for it; a page is 8 KiB.
pub const VALUE_SIZE_BYTES_MAX: usize = 16 * 1024 * 1024;

impl Value {
    /// Whether this version stands on its own, ending the search for older versions.
    pub fn will_init(&self) -> bool {
        matches!(self, Value::Image(_) | Value::Record { will_init: true, .. })
    }

    /// Whether a version with this persisted tag stands on its own (`will_init`).
    pub(crate) fn tag_stands_alone(tag: u8) -> bool {
        tag != TAG_RECORD
    }

    pub(crate) fn tag(&self) -> u8 {
        match self {
            Value::Image(_) => TAG_IMAGE,
            Value::Record { will_init: false, .. } => TAG_RECORD,
            Value::Record { will_init: true, .. } => TAG_RECORD_WILL_INIT,
        }
    }

    pub(crate) fn payload(&self) -> &Bytes {
        match self {
            Value::Image(img) => img,
            Value::Record { rec, .. } => rec,
        }
    }

    /// Rebuilds a value from its persisted tag and payload; `None` for an unknown tag.
    pub(crate) fn from_parts(tag: u8, payload: Bytes) -> Option<Value> {
        match tag {
            TAG_IMAGE => Some(Value::Image(payload)),
            TAG_RECORD => Some(Value::Record { will_init: false, rec: payload }),
            TAG_RECORD_WILL_INIT => Some(Value::Record { will_init: true, rec: payload }),
            _ => None,
        }
    }
}

/// Everything needed to rebuild one key at one LSN: the newest image at or below it (if the
/// search ended at an image), and the records after that image, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconstructData {
    pub image: Option<(Lsn, Bytes)>,
    pub records: Vec<(Lsn, Record)>,
    /// How many layers (in-memory and files, across ancestors) the read searched: with
    /// `records.len()`, what the read cost. Reconstructors ignore it.
    pub layers_visited: usize,
}

impl ReconstructData {
    /// True when the key has no version at or below the requested LSN.
    pub fn is_empty(&self) -> bool {
        self.image.is_none() && self.records.is_empty()
    }
}

/// Accumulates versions newest first while a read walks layers from newer to older.
#[derive(Debug, Default)]
pub(crate) struct ValueCollector {
    image: Option<(Lsn, Bytes)>,
    /// Newest first; reversed by `finish`.
    records: Vec<(Lsn, Record)>,
    complete: bool,
}

impl ValueCollector {
    /// Adds the next older version. Returns true once the collection is complete, after
    /// which callers must stop offering versions.
    pub(crate) fn push(&mut self, lsn: Lsn, value: Value) -> bool {
        assert!(!self.complete, "version offered to a complete collector");
        if let Some((newest, _)) = self.records.last() {
            assert!(lsn < *newest, "versions must be offered newest first: {lsn} after {newest}");
        }
        match value {
            Value::Image(img) => {
                self.image = Some((lsn, img));
                self.complete = true;
            }
            Value::Record { will_init, rec } => {
                self.records.push((lsn, Record { will_init, rec }));
                self.complete = will_init;
            }
        }
        self.complete
    }

    /// Marks the collection complete without a version: an image layer covering the key
    /// says the key had no value at its LSN, so there is nothing older to find.
    pub(crate) fn mark_complete(&mut self) {
        self.complete = true;
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.complete
    }

    pub(crate) fn finish(mut self) -> ReconstructData {
        self.records.reverse();
        ReconstructData { image: self.image, records: self.records, layers_visited: 0 }
    }
}

/// Gathers, for a listing of changes (`Timeline::changed_keys`), the newest LSN of each key
/// that has a version in the requested LSN range, across layers offered in any order, and
/// stops taking keys once more than `limit` distinct ones were offered.
///
/// Invariant: it never holds more than `limit + 1` keys, so the memory a listing takes is
/// bounded by the caller's limit whatever the layers hold.
#[derive(Debug)]
pub(crate) struct ChangeCollector {
    keys: BTreeMap<Key, Lsn>,
    limit: usize,
}

impl ChangeCollector {
    pub(crate) fn new(limit: usize) -> ChangeCollector {
        ChangeCollector { keys: BTreeMap::new(), limit }
    }

    /// Records that `key` has a version at `lsn`, keeping the newest LSN per key. Returns
    /// false once more than `limit` distinct keys were recorded: the caller stops offering.
    pub(crate) fn add(&mut self, key: Key, lsn: Lsn) -> bool {
        if self.is_over_limit() {
            return false;
        }
        let newest = self.keys.entry(key).or_insert(lsn);
        *newest = (*newest).max(lsn);
        !self.is_over_limit()
    }

    pub(crate) fn is_over_limit(&self) -> bool {
        self.keys.len() > self.limit
    }

    /// The keys in order, each with its newest LSN.
    pub(crate) fn finish(self) -> Vec<(Key, Lsn)> {
        self.keys.into_iter().collect()
    }
}

/// Redo: rebuilds a key's value at an LSN from an older image and the records since.
/// The caller's implementation knows what records mean (the pageserver's runs its database's own redo routines); the engine only
/// needs it to create image layers.
pub trait Reconstructor: Send + Sync {
    fn reconstruct(&self, key: Key, lsn: Lsn, data: ReconstructData) -> anyhow::Result<Bytes>;
}

/// A deterministic model of redo for tests: a value is the image's bytes (or nothing),
/// with each record's bytes appended in LSN order; a `will_init` record starts again from
/// nothing. Appending is associative, so reconstructing from a materialized image gives the
/// same bytes as reconstructing from the original records.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelReconstructor;

impl ModelReconstructor {
    /// The model's value after applying `versions` (oldest first), without the store.
    pub fn apply<'a>(versions: impl IntoIterator<Item = &'a Value>) -> Bytes {
        let mut out = BytesMut::new();
        for value in versions {
            match value {
                Value::Image(img) => {
                    out.clear();
                    out.extend_from_slice(img);
                }
                Value::Record { will_init, rec } => {
                    if *will_init {
                        out.clear();
                    }
                    out.extend_from_slice(rec);
                }
            }
        }
        out.freeze()
    }
}

impl Reconstructor for ModelReconstructor {
    fn reconstruct(&self, _key: Key, _lsn: Lsn, data: ReconstructData) -> anyhow::Result<Bytes> {
        let image = data.image.map(|(_, img)| Value::Image(img));
        let records = data.records.into_iter().map(|(_, r)| Value::Record { will_init: r.will_init, rec: r.rec });
        let versions: Vec<Value> = image.into_iter().chain(records).collect();
        Ok(ModelReconstructor::apply(&versions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(will_init: bool, b: &'static [u8]) -> Value {
        Value::Record { will_init, rec: Bytes::from_static(b) }
    }

    #[test]
    fn tags_round_trip() {
        for v in [Value::Image(Bytes::from_static(b"i")), rec(false, b"r"), rec(true, b"w")] {
            assert_eq!(Value::from_parts(v.tag(), v.payload().clone()), Some(v));
        }
        assert_eq!(Value::from_parts(3, Bytes::new()), None);
    }

    #[test]
    fn collector_stops_at_will_init_and_returns_oldest_first() {
        let mut c = ValueCollector::default();
        assert!(!c.push(Lsn(30), rec(false, b"c")));
        assert!(!c.push(Lsn(20), rec(false, b"b")));
        assert!(c.push(Lsn(10), rec(true, b"a")));
        let data = c.finish();
        assert_eq!(data.image, None);
        let lsns: Vec<Lsn> = data.records.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, vec![Lsn(10), Lsn(20), Lsn(30)]);
        assert_eq!(ModelReconstructor.reconstruct(Key::MIN, Lsn(30), data).unwrap(), Bytes::from_static(b"abc"));
    }

    #[test]
    fn collector_stops_at_image() {
        let mut c = ValueCollector::default();
        assert!(!c.push(Lsn(30), rec(false, b"z")));
        assert!(c.push(Lsn(20), Value::Image(Bytes::from_static(b"xy"))));
        let data = c.finish();
        assert_eq!(data.image, Some((Lsn(20), Bytes::from_static(b"xy"))));
        assert_eq!(ModelReconstructor.reconstruct(Key::MIN, Lsn(30), data).unwrap(), Bytes::from_static(b"xyz"));
    }

    #[test]
    fn change_collector_keeps_the_newest_lsn_and_stops_past_the_limit() {
        let mut c = ChangeCollector::new(2);
        let (a, b) = (Key::MIN, Key::checkpoint());
        assert!(c.add(b, Lsn(20)));
        assert!(c.add(b, Lsn(10)), "an older version of a known key is not a new key");
        assert!(c.add(a, Lsn(5)));
        assert!(c.add(a, Lsn(7)));
        assert_eq!(c.finish(), vec![(a, Lsn(7)), (b, Lsn(20))]);
        let mut c = ChangeCollector::new(1);
        assert!(c.add(a, Lsn(1)));
        assert!(!c.add(b, Lsn(1)), "a second key is over the limit of one");
        assert!(c.is_over_limit());
        assert!(!c.add(Key::control_file(), Lsn(1)), "nothing is taken once over the limit");
        assert_eq!(c.finish().len(), 2);
    }

    #[test]
    fn model_restarts_at_will_init() {
        let versions = [rec(false, b"a"), rec(true, b"b"), rec(false, b"c")];
        assert_eq!(ModelReconstructor::apply(&versions), Bytes::from_static(b"bc"));
    }
}
