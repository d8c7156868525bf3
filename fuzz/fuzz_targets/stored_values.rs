//! The pageserver's value encodings read back from layer files: stored WAL records and
//! the data directory's directories, sizes and checkpoint. Arbitrary bytes give errors,
//! never panics; whatever decodes re-encodes to the same bytes where the encoding is
//! canonical.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pageserver::pgdata::datadir::codec;
use pageserver::pgdata::reconstruct::StoredRecord;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    if let Ok(rec) = StoredRecord::decode(&bytes) {
        let again = StoredRecord::decode(&rec.encode()).expect("a re-encoded record decodes");
        assert_eq!(again.encode(), rec.encode());
    }
    let _ = codec::decode_db_dir(data);
    let _ = codec::decode_rel_dir(data);
    let _ = codec::decode_slru_dir(data);
    let _ = codec::decode_twophase_dir(data);
    let _ = codec::decode_block_count(data);
    let _ = codec::decode_checkpoint(&bytes);
});
