//! The WAL stream decoder, record decoder, image restore and metadata parsers on arbitrary
//! bytes presented as the start of a WAL segment: errors are fine, panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwal::{parse_metadata, DecoderConfig, WalStreamDecoder};
use proto::Lsn;

fuzz_target!(|data: &[u8]| {
    // Start where the first page says it is (xlp_pageaddr, bytes 8..16), rounded down to a
    // segment start, so that real WAL seeds decode and mutations explore from there.
    let pageaddr = data.get(8..16).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let start = Lsn(pageaddr - pageaddr % proto::lsn::WAL_SEGMENT_SIZE_BYTES);
    let Ok(mut decoder) = WalStreamDecoder::new(start, DecoderConfig::default()) else { return };
    // Feed in two pieces so that reassembly across feeds is exercised too.
    let half = data.len() / 2;
    decoder.feed_bytes(&data[..half]);
    let mut fed_rest = false;
    loop {
        match decoder.poll_decode() {
            Ok(Some(rec)) => {
                if let Ok(decoded) = rec.decode() {
                    for blk in &decoded.blocks {
                        let _ = decoded.restore_page(blk.block_id);
                    }
                    let _ = parse_metadata(&decoded);
                }
            }
            Ok(None) if !fed_rest => {
                decoder.feed_bytes(&data[half..]);
                fed_rest = true;
            }
            Ok(None) | Err(_) => break,
        }
    }
});
