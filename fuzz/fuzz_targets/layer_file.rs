//! A pageserver layer file with arbitrary contents: opening, verifying, reading and
//! iterating it return errors for anything malformed, and never panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use layerstore::layer::{LayerDesc, LayerReader};
use proto::{Key, KeyRange, Lsn};

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"));
    // A delta layer over all keys and LSNs 0/10-0/FFFF, as its file name says.
    let name = LayerDesc::delta(KeyRange { start: Key::MIN, end: Key::MAX }, Lsn(0x10)..Lsn(0x10000)).file_name();
    let path = dir.path().join(name);
    std::fs::write(&path, data).expect("write layer file");
    if let Ok(layer) = LayerReader::open(&path) {
        let _ = layer.verify();
        for key in layer.keys(&KeyRange { start: Key::MIN, end: Key::MAX }, Lsn(0x10000)) {
            let _ = layer.get(key);
        }
        for item in layer.iter() {
            if item.is_err() {
                break;
            }
        }
    }
});
