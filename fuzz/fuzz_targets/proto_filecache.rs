//! A saved file cache index with arbitrary contents: decoding never panics, and an accepted
//! index re-encodes to exactly the bytes it was decoded from (so nothing was guessed). A
//! version 1 index (read, no longer written) re-encodes as version 2 and decodes back to the
//! same index.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::filecache::{SavedIndex, MAGIC_V1};

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = SavedIndex::decode(data) {
        let encoded = index.encode();
        if data.starts_with(&MAGIC_V1) {
            assert_eq!(SavedIndex::decode(&encoded).as_ref(), Ok(&index));
        } else {
            assert_eq!(encoded, data);
        }
    }
});
