//! A saved file cache index with arbitrary contents: decoding never panics, and an accepted
//! index re-encodes to exactly the bytes it was decoded from (so nothing was guessed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::filecache::SavedIndex;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = SavedIndex::decode(data) {
        assert_eq!(index.encode(), data);
    }
});
