//! The remote index of a timeline (`index_part.json-<generation>`): the layers remote
//! storage holds for it and the metadata needed to load it from there alone.
//!
//! JSON, so that an operator can read it, wrapped with a CRC-32C of the canonical encoding
//! of its body: `{"crc32c": N, "index": {...}}`. Decoding re-encodes the body and compares,
//! so a flipped digit that still parses is caught as surely as a truncation.
//!
//! Invariants: every layer named is in remote storage under the generation given for it
//! (the index is uploaded only after those layers); `disk_consistent_lsn` is covered by the
//! layers named; the GC cutoff and the disk-consistent LSN never decrease from one index
//! to the next of a timeline.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use proto::{Lsn, TimelineId};
use serde::{Deserialize, Serialize};

use super::Generation;

pub const INDEX_FORMAT_VERSION: u32 = 1;

/// One layer as remote storage holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexLayer {
    pub size_bytes: u64,
    /// CRC-32C of the whole object.
    pub crc32c: u32,
    /// The generation of the pageserver that uploaded it: part of its object key.
    pub generation: Generation,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexPart {
    pub format_version: u32,
    pub timeline_id: TimelineId,
    /// The generation that wrote this index.
    pub generation: Generation,
    pub disk_consistent_lsn: Lsn,
    pub ancestor_timeline_id: Option<TimelineId>,
    pub ancestor_lsn: Option<Lsn>,
    pub gc_cutoff_lsn: Lsn,
    /// Layer file name → where and what it is.
    pub layers: BTreeMap<String, IndexLayer>,
    /// What the service above the engine keeps with the timeline, by name: stored with
    /// each index and given to the next attachment, never read by the engine. Absent from
    /// the JSON when empty (indexes written before it read the same).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub service_data: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    crc32c: u32,
    index: IndexPart,
}

impl IndexPart {
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).expect("an index always encodes");
        let envelope = Envelope { crc32c: crc32c::crc32c(&body), index: self.clone() };
        serde_json::to_vec_pretty(&envelope).expect("an index always encodes")
    }

    /// Decodes and checks an index object; `what` names it for errors.
    pub fn decode(bytes: &[u8], what: &str) -> anyhow::Result<IndexPart> {
        let envelope: Envelope = serde_json::from_slice(bytes).with_context(|| format!("remote index {what} is corrupt"))?;
        let body = serde_json::to_vec(&envelope.index).expect("an index always encodes");
        let computed = crc32c::crc32c(&body);
        if computed != envelope.crc32c {
            bail!("remote index {what} is corrupt: checksum mismatch: stored {:08X}, computed {computed:08X}", envelope.crc32c);
        }
        let index = envelope.index;
        if index.format_version != INDEX_FORMAT_VERSION {
            bail!("remote index {what} has format version {}, this build reads only version {INDEX_FORMAT_VERSION}", index.format_version);
        }
        if index.ancestor_timeline_id.is_some() != index.ancestor_lsn.is_some() {
            bail!("remote index {what} is corrupt: an ancestor needs both an id and an LSN");
        }
        Ok(index)
    }

    pub fn ancestor(&self) -> Option<(TimelineId, Lsn)> {
        self.ancestor_timeline_id.zip(self.ancestor_lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IndexPart {
        let mut layers = BTreeMap::new();
        layers.insert("some-layer".to_string(), IndexLayer { size_bytes: 10, crc32c: 0xDEADBEEF, generation: Generation(3) });
        IndexPart {
            format_version: INDEX_FORMAT_VERSION,
            timeline_id: TimelineId::from_bytes([7; 16]),
            generation: Generation(4),
            disk_consistent_lsn: Lsn(0x1000),
            ancestor_timeline_id: Some(TimelineId::from_bytes([1; 16])),
            ancestor_lsn: Some(Lsn(0x800)),
            gc_cutoff_lsn: Lsn(0x10),
            layers,
            service_data: BTreeMap::from([("sources".to_string(), "[1, 2]".to_string())]),
        }
    }

    #[test]
    fn an_index_without_service_data_reads_as_before() {
        let mut index = sample();
        index.service_data.clear();
        let bytes = index.encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("service_data"));
        assert_eq!(IndexPart::decode(&bytes, "x").unwrap(), index);
    }

    #[test]
    fn round_trip_and_every_flipped_byte_is_refused_or_harmless() {
        let index = sample();
        let bytes = index.encode();
        assert_eq!(IndexPart::decode(&bytes, "x").unwrap(), index);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            // A flip may only survive where it changes nothing (whitespace that stays
            // whitespace does not exist here: a flipped space is a control character).
            if let Ok(decoded) = IndexPart::decode(&bad, "x") {
                assert_eq!(decoded, index, "flip at {i} changed the index");
            }
        }
        for len in 0..bytes.len() {
            assert!(IndexPart::decode(&bytes[..len], "x").is_err(), "truncated to {len}");
        }
    }

    #[test]
    fn a_newer_format_and_half_an_ancestor_are_refused() {
        let mut index = sample();
        index.format_version = 2;
        let err = IndexPart::decode(&index.encode(), "x").unwrap_err();
        assert!(err.to_string().contains("format version 2"), "{err}");
        let mut index = sample();
        index.ancestor_lsn = None;
        assert!(IndexPart::decode(&index.encode(), "x").unwrap_err().to_string().contains("ancestor"));
    }
}
