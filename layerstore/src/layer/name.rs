//! Layer file names: what a layer covers, readable from its name alone.
//!
//! ```text
//! delta: <key start>-<key end>__<LSN start>-<LSN end>
//! image: <key start>-<key end>__<LSN>
//! ```
//! Keys are printed as `Key` prints them (36 uppercase hex digits), LSNs as 16 uppercase hex
//! digits. Ranges are half-open: a delta layer holds versions with `start <= lsn < end`;
//! an image layer at LSN `L` holds every key's value as of `L` and is described by the LSN
//! range `L..L+1`. A delta layer whose key range is the whole key space
//! (`000000…-FFFFFF…`) is an L0 layer: a flushed in-memory layer. Compaction never writes
//! an L1 layer with that range, so the name alone tells the level.
//!
//! Invariants: names are canonical, `parse(print(d)) == d` and `print(parse(s)) == s`, so
//! that the same layer never appears under two names; ranges are non-empty. A name that
//! does not parse is not a layer file. The header inside the file repeats the ranges, and
//! the reader checks that they agree with the name, so a renamed file is refused.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use proto::{Key, KeyRange, Lsn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerKind {
    Delta,
    Image,
}

/// What a layer covers: its kind, key range and LSN range. It is also the layer's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LayerDesc {
    pub kind: LayerKind,
    pub key_range: KeyRange,
    pub lsn_range: Range<Lsn>,
}

/// Text that is not a layer file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid layer file name: {0:?}")]
pub struct LayerNameError(pub String);

impl LayerDesc {
    pub fn delta(key_range: KeyRange, lsn_range: Range<Lsn>) -> LayerDesc {
        assert!(!key_range.is_empty() && lsn_range.start < lsn_range.end, "empty delta layer range");
        LayerDesc { kind: LayerKind::Delta, key_range, lsn_range }
    }

    pub fn image(key_range: KeyRange, lsn: Lsn) -> LayerDesc {
        assert!(!key_range.is_empty() && lsn < Lsn::MAX, "invalid image layer range");
        LayerDesc { kind: LayerKind::Image, key_range, lsn_range: lsn..Lsn(lsn.0 + 1) }
    }

    /// An L0 delta layer: one flushed in-memory layer, covering every key.
    pub fn is_l0(&self) -> bool {
        self.kind == LayerKind::Delta && self.key_range == KeyRange::ALL
    }

    /// The file name.
    pub fn file_name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for LayerDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}__{:016X}", self.key_range.start, self.key_range.end, self.lsn_range.start.0)?;
        if self.kind == LayerKind::Delta {
            write!(f, "-{:016X}", self.lsn_range.end.0)?;
        }
        Ok(())
    }
}

fn parse_lsn(s: &str) -> Option<Lsn> {
    if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)) {
        return None;
    }
    u64::from_str_radix(s, 16).ok().map(Lsn)
}

fn parse_key(s: &str) -> Option<Key> {
    let key: Key = s.parse().ok()?;
    // `Key` also accepts lowercase; only the printed form is a canonical name.
    (key.to_string() == s).then_some(key)
}

impl FromStr for LayerDesc {
    type Err = LayerNameError;

    fn from_str(s: &str) -> Result<LayerDesc, LayerNameError> {
        let err = || LayerNameError(s.to_string());
        let (keys, lsns) = s.split_once("__").ok_or_else(err)?;
        let (key_start, key_end) = keys.split_once('-').ok_or_else(err)?;
        let key_range = KeyRange { start: parse_key(key_start).ok_or_else(err)?, end: parse_key(key_end).ok_or_else(err)? };
        if key_range.is_empty() {
            return Err(err());
        }
        match lsns.split_once('-') {
            None => {
                let lsn = parse_lsn(lsns).ok_or_else(err)?;
                if lsn == Lsn::MAX {
                    return Err(err());
                }
                Ok(LayerDesc::image(key_range, lsn))
            }
            Some((start, end)) => {
                let lsn_range = parse_lsn(start).ok_or_else(err)?..parse_lsn(end).ok_or_else(err)?;
                if lsn_range.start >= lsn_range.end {
                    return Err(err());
                }
                Ok(LayerDesc::delta(key_range, lsn_range))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proto::{BlockNumber, ForkNumber, RelTag};

    fn rel_key(blk: u32) -> Key {
        Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
    }

    #[test]
    fn prints_and_parses_golden_names() {
        let d = LayerDesc::delta(KeyRange::ALL, Lsn(0x10)..Lsn(0x1_0000_0020));
        let name = "000000000000000000000000000000000000-FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF__0000000000000010-0000000100000020";
        assert_eq!(d.to_string(), name);
        assert_eq!(name.parse::<LayerDesc>().unwrap(), d);
        assert!(d.is_l0());

        let i = LayerDesc::image(KeyRange { start: rel_key(0), end: rel_key(7) }, Lsn(0xAB));
        let name = "010000067F00000005000040000000000000-010000067F00000005000040000000000007__00000000000000AB";
        assert_eq!(i.to_string(), name);
        assert_eq!(name.parse::<LayerDesc>().unwrap(), i);
        assert_eq!(i.lsn_range, Lsn(0xAB)..Lsn(0xAC));
        assert!(!i.is_l0());
    }

    #[test]
    fn rejects_malformed_names() {
        let good_keys = format!("{}-{}", rel_key(0), rel_key(5));
        let bad = [
            String::new(),
            "metadata".to_string(),
            format!("{good_keys}__"),
            format!("{good_keys}__0000000000000010-0000000000000010"), // empty LSN range
            format!("{good_keys}__0000000000000020-0000000000000010"), // backwards LSN range
            format!("{good_keys}__000000000000001"),                   // short LSN
            format!("{good_keys}__00000000000000ab"),                  // lowercase LSN
            format!("{good_keys}__FFFFFFFFFFFFFFFF"),                  // image at Lsn::MAX
            format!("{good_keys}__0000000000000010.___temp"),
            format!("{}-{}__0000000000000010", rel_key(5), rel_key(0)), // backwards keys
            format!("{}-{}__0000000000000010", rel_key(5), rel_key(5)), // empty keys
            format!("{}-{}__0000000000000010", rel_key(0).to_string().to_lowercase(), rel_key(5)),
            format!("{}__0000000000000010", rel_key(0)),
        ];
        for name in bad {
            let err = name.parse::<LayerDesc>().unwrap_err();
            assert_eq!(err.to_string(), format!("invalid layer file name: {name:?}"));
        }
    }

    proptest! {
        #[test]
        fn names_round_trip(a in 0u32..1000, b in 1u32..1000, s in 0u64..u64::MAX - 1, len in 1u64..1000, image in any::<bool>()) {
            let key_range = KeyRange { start: rel_key(a), end: rel_key(a + b) };
            let d = if image {
                LayerDesc::image(key_range, Lsn(s))
            } else {
                LayerDesc::delta(key_range, Lsn(s)..Lsn(s.saturating_add(len)).max(Lsn(s + 1)))
            };
            let name = d.to_string();
            prop_assert_eq!(name.parse::<LayerDesc>().unwrap(), d);
            prop_assert_eq!(name.parse::<LayerDesc>().unwrap().to_string(), name);
        }

        #[test]
        fn parse_never_panics(s in "[0-9A-Fa-f_.-]{0,120}") {
            if let Ok(d) = s.parse::<LayerDesc>() {
                prop_assert_eq!(d.to_string(), s);
            }
        }
    }
}
