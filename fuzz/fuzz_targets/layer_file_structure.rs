//! A well-formed layer file, written by the layer writer from versions the input chooses,
//! then damaged where the input says with every checksum recomputed afterwards, so that the
//! damage gets past the checksums to the structural checks behind them (offsets, counts,
//! key and LSN order and ranges, the index against the blocks). Opening, verifying,
//! listing, reading and iterating must return errors for anything inconsistent and never
//! panic; an undamaged file must read back exactly what was written.
//!
//! Input: byte 0 picks the kind (bit 0) and the number of damages (bits 1-3); then five
//! bytes per damage (a little-endian position, taken modulo the file's length, and a byte to
//! XOR there); the rest are versions of three bytes each plus a payload: block number,
//! LSN offset, payload length (the payload follows, cut short at the end of the input).
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use layerstore::layer::format::{BLOCK_FRAME_SIZE_BYTES, HEADER_SIZE_BYTES};
use layerstore::layer::{LayerKind, LayerReader, LayerWriter};
use layerstore::value::Value;
use layerstore::StorageConfig;
use libfuzzer_sys::fuzz_target;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag};

const LSN_START: u64 = 0x100;

fn key(blk: u8) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(u32::from(blk)))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Recomputes every checksum of `file` whose structure can still be found: each block
/// frame's (walking the frames from the header to the index as their lengths now say), the
/// index's and the header's, in that order.
fn fix_checksums(file: &mut [u8], index_offset: usize) {
    let mut off = HEADER_SIZE_BYTES;
    while off + BLOCK_FRAME_SIZE_BYTES <= index_offset.min(file.len()) {
        let payload_end = off + BLOCK_FRAME_SIZE_BYTES + u32_at(file, off) as usize;
        if payload_end > file.len() {
            break;
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&file[off..off + 8]), &file[off + BLOCK_FRAME_SIZE_BYTES..payload_end]);
        file[off + 8..off + 12].copy_from_slice(&crc.to_le_bytes());
        off = payload_end;
    }
    if index_offset <= file.len() {
        let crc = crc32c::crc32c(&file[index_offset..]);
        file[84..88].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&file[..HEADER_SIZE_BYTES - 4]);
    file[HEADER_SIZE_BYTES - 4..HEADER_SIZE_BYTES].copy_from_slice(&crc.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"));
    let Some((&first, rest)) = data.split_first() else { return };
    let kind = if first & 1 == 0 { LayerKind::Delta } else { LayerKind::Image };
    let damages = usize::from((first >> 1) & 7);
    if rest.len() < damages * 5 {
        return;
    }
    let (damage_bytes, mut rest) = rest.split_at(damages * 5);

    // The versions, in (key, LSN) order; an image layer holds one image per key at its LSN.
    let mut versions: BTreeMap<(Key, Lsn), Value> = BTreeMap::new();
    while rest.len() >= 3 {
        let (blk, lsn_off, len) = (rest[0], rest[1], usize::from(rest[2]));
        let payload = Bytes::copy_from_slice(&rest[3..(3 + len).min(rest.len())]);
        rest = &rest[(3 + len).min(rest.len())..];
        let (lsn, value) = match kind {
            LayerKind::Image => (Lsn(LSN_START), Value::Image(payload)),
            LayerKind::Delta if lsn_off % 3 == 0 => (Lsn(LSN_START + u64::from(lsn_off)), Value::Image(payload)),
            LayerKind::Delta => (Lsn(LSN_START + u64::from(lsn_off)), Value::Record { will_init: lsn_off % 3 == 1, rec: payload }),
        };
        versions.insert((key(blk), lsn), value);
    }
    let lsn_end = if kind == LayerKind::Image { LSN_START + 1 } else { LSN_START + 0x100 };
    let conf = StorageConfig { block_size_bytes: 64, ..StorageConfig::default() };
    let mut writer = LayerWriter::new(dir.path(), kind, Lsn(LSN_START)..Lsn(lsn_end), &conf).expect("layer writer");
    for ((k, lsn), value) in &versions {
        writer.put(*k, *lsn, value).expect("versions in order, inside the layer");
    }
    let layer = writer.finish(KeyRange { start: Key::MIN, end: Key::MAX }).expect("finish the layer file");
    let path = layer.path().to_path_buf();
    drop(layer);

    let mut file = std::fs::read(&path).expect("read the layer file");
    let index_offset = usize::try_from(u64_at(&file, 68)).expect("index offset");
    for d in damage_bytes.chunks_exact(5) {
        let pos = u32_at(d, 0) as usize % file.len();
        file[pos] ^= d[4];
    }
    fix_checksums(&mut file, index_offset);
    std::fs::write(&path, &file).expect("write the damaged layer file");

    let opened = LayerReader::open(&path);
    if damages == 0 {
        // Undamaged: everything written reads back.
        let layer = opened.expect("an undamaged layer file opens");
        layer.verify().expect("an undamaged layer file verifies");
        let mut by_key: BTreeMap<Key, Vec<(Lsn, Value)>> = BTreeMap::new();
        for ((k, lsn), value) in versions {
            by_key.entry(k).or_default().push((lsn, value));
        }
        for (k, expected) in &by_key {
            assert_eq!(&layer.get(*k).expect("read an undamaged key"), expected);
        }
        assert_eq!(layer.iter().count(), by_key.values().map(Vec::len).sum::<usize>());
    } else if let Ok(layer) = opened {
        let _ = layer.verify();
        for k in layer.keys(&KeyRange { start: Key::MIN, end: Key::MAX }, Lsn(u64::MAX)) {
            let _ = layer.get(k);
        }
        for item in layer.iter() {
            if item.is_err() {
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
