//! Damaged layer files, seen through the public API: a tenant whose layer file has a
//! flipped byte in its header or index refuses to load, naming the file and offset; one
//! with a flipped byte in a data block loads, and every read that touches the block fails
//! with an error naming the file and offset. Nothing is ever served from a damaged file.

use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use layerstore::layer::format::HEADER_SIZE_BYTES;
use layerstore::{ModelReconstructor, ReadError, StorageConfig, Tenant, Value};
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};

const TENANT: TenantId = TenantId([1; 16]);
const TIMELINE: TimelineId = TimelineId([2; 16]);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 1259, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn page(blk: u32) -> Bytes {
    Bytes::from((0..8192u32).map(|i| (i * 7 + blk) as u8).collect::<Vec<u8>>())
}

/// A tenant with one flushed L0 layer of 16 pages; returns the layer file's path.
fn setup(dir: &Path) -> PathBuf {
    let conf = StorageConfig { block_size_bytes: 16 * 1024, ..StorageConfig::default() };
    let tenant = Tenant::create(dir, TENANT, conf, &[]).unwrap();
    let t = tenant.create_timeline(TIMELINE).unwrap();
    for blk in 0..16 {
        t.put(key(blk), Lsn(100), &Value::Image(page(blk))).unwrap();
    }
    t.advance_last_record_lsn(Lsn(100)).unwrap();
    t.freeze_and_flush().unwrap();
    let layer = t.layers().into_iter().next().unwrap();
    t.path().join(layer.file_name())
}

fn flip(path: &Path, pos: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[pos as usize] ^= 0x04;
    fs::write(path, bytes).unwrap();
}

fn load(dir: &Path) -> anyhow::Result<Tenant> {
    Tenant::load(dir, TENANT, StorageConfig::default(), &[])
}

#[test]
fn flipped_header_or_index_byte_refuses_to_load() {
    for pos_from_end in [None, Some(1u64), Some(30)] {
        let dir = tempfile::tempdir().unwrap();
        let path = setup(dir.path());
        let len = fs::metadata(&path).unwrap().len();
        let pos = pos_from_end.map_or(40, |back| len - back); // header key range, or index
        flip(&path, pos);
        let err = format!("{:#}", load(dir.path()).err().expect("damaged layer loaded"));
        assert!(err.contains(&format!("file {} is corrupt at offset", path.display())), "{err}");
    }
}

#[test]
fn flipped_block_byte_is_reported_by_every_read_of_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = setup(dir.path());
    flip(&path, HEADER_SIZE_BYTES as u64 + 20);
    let tenant = load(dir.path()).unwrap();
    let t = tenant.get_timeline(TIMELINE).unwrap();
    let mut failed = 0;
    for blk in 0..16 {
        match t.get(key(blk), Lsn(100), &ModelReconstructor) {
            Ok(got) => assert_eq!(got, Some(page(blk)), "wrong page served for block {blk}"),
            Err(ReadError::Layer(e)) => {
                assert!(e.is_corruption());
                let prefix = format!("file {} is corrupt at offset 128: block checksum mismatch", path.display());
                assert!(e.to_string().starts_with(&prefix), "{e}");
                failed += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(failed > 0, "no read touched the damaged block");
    assert!(failed < 16, "the damage should be confined to one block");
}
