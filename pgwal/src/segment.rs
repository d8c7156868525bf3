//! WAL segment file names (`XLogFileName` and `IsXLogFileName` in `xlog_internal.h`): the
//! one home for them in the tree. The safekeeper names its segments like PostgreSQL so that
//! `pg_receivewal` and `pg_waldump` work on them; the WAL proposer reads the compute's
//! `pg_wal`; the pageserver reads `pg_wal` at import, keeps its local WAL in such files and
//! writes one into every basebackup.
//!
//! A name is 24 upper-case hex digits: the PostgreSQL timeline, then the segment number split
//! into "log id" (the high 32 bits of the LSN) and the segment within it, both as 8 digits.

/// PostgreSQL's file name for segment `segno` of timeline `tli`, with segments of
/// `segment_size` bytes (a power of two from 1 MiB to 1 GiB).
pub fn segment_file_name(tli: u32, segno: u64, segment_size: u64) -> String {
    let per_xlogid = segments_per_xlogid(segment_size);
    format!("{tli:08X}{:08X}{:08X}", segno / per_xlogid, segno % per_xlogid)
}

/// The timeline and segment number a file name stands for, if it is a WAL segment's name
/// for segments of `segment_size` bytes (`None` for anything else, such as a `.partial` or
/// `.history` file, lower-case hex, or a segment number out of range).
pub fn parse_segment_file_name(name: &str, segment_size: u64) -> Option<(u32, u64)> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)) {
        return None;
    }
    let tli = u32::from_str_radix(&name[0..8], 16).ok()?;
    let hi = u64::from_str_radix(&name[8..16], 16).ok()?;
    let lo = u64::from_str_radix(&name[16..24], 16).ok()?;
    let per_xlogid = segments_per_xlogid(segment_size);
    (lo < per_xlogid).then_some((tli, hi * per_xlogid + lo))
}

fn segments_per_xlogid(segment_size: u64) -> u64 {
    assert!(segment_size.is_power_of_two() && segment_size <= 1 << 32, "invalid WAL segment size {segment_size}");
    0x1_0000_0000 / segment_size
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEG_16M: u64 = 16 << 20;

    #[test]
    fn names_follow_postgres() {
        assert_eq!(segment_file_name(1, 0, SEG_16M), "000000010000000000000000");
        assert_eq!(segment_file_name(1, 1, SEG_16M), "000000010000000000000001");
        // 256 segments of 16 MiB per log id.
        assert_eq!(segment_file_name(1, 256, SEG_16M), "000000010000000100000000");
        assert_eq!(segment_file_name(2, 0x1FF, SEG_16M), "0000000200000001000000FF");
        assert_eq!(segment_file_name(1, 5, 1 << 30), "000000010000000100000001");
    }

    #[test]
    fn other_names_are_not_segments() {
        for name in ["000000010000000000000001.partial", "00000002.history", "000000010000000000000a01", "0000000100000000000001FF", ""] {
            assert_eq!(parse_segment_file_name(name, SEG_16M), None, "{name}");
        }
    }

    proptest! {
        #[test]
        fn names_round_trip(tli in 1u32.., segno in 0u64..(1 << 40), shift in 20u32..=30) {
            let size = 1u64 << shift;
            let segno = segno % ((1u64 << 32) * (0x1_0000_0000 / size));
            let name = segment_file_name(tli, segno, size);
            prop_assert_eq!(parse_segment_file_name(&name, size), Some((tli, segno)));
        }
    }
}
