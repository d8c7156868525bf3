//! Tests of the key encoding: a golden table that pins the byte layout (keys are persisted in
//! layer files, so changing it is a format change), error cases, an exhaustive check of
//! `Key::next` over a small domain of boundary values, and property tests of the order.

use super::*;
use proptest::prelude::*;

const VM: ForkNumber = ForkNumber::VisibilityMap;

fn rel(spcnode: Oid, dbnode: Oid, relnode: Oid, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode, dbnode, relnode, forknum }
}

/// Bytes from hex written with spaces between the fields, as in the layout table.
fn bytes_of(spaced_hex: &str) -> Vec<u8> {
    let hex: String = spaced_hex.split_whitespace().collect();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// One key of every kind, in key order, with its byte form and description.
fn golden() -> Vec<(Key, &'static str, &'static str)> {
    vec![
        (Key::db_dir(), "00 00000000 00000000 00000000 00 00000000", "database directory"),
        (Key::rel_dir(1663, 5), "01 0000067F 00000005 00000000 01 00000000", "relation directory of spc 1663 db 5"),
        (Key::rel_size(rel(1663, 5, 16384, ForkNumber::Main)), "01 0000067F 00000005 00004000 00 FFFFFFFF", "base/5/16384 size"),
        (Key::rel_block(rel(1663, 5, 16384, VM), BlockNumber(7)), "01 0000067F 00000005 00004000 02 00000007", "base/5/16384_vm block 7"),
        (Key::relmap_file(1664, 0), "01 00000680 00000000 00000000 00 00000000", "pg_filenode.map of spc 1664 db 0"),
        (
            Key::rel_block(rel(1664, 0, 1262, ForkNumber::Main), BlockNumber(0xFFFF_FFFE)),
            "01 00000680 00000000 000004EE 00 FFFFFFFE",
            "global/1262 block 4294967294",
        ),
        (Key::slru_block(SlruKind::Clog, 3, BlockNumber(31)), "02 00000000 00000001 00000003 00 0000001F", "pg_xact/0003 block 31"),
        (
            Key::slru_segment_size(SlruKind::MultiXactOffsets, 0x1234),
            "02 00000001 00000001 00001234 00 FFFFFFFF",
            "pg_multixact/offsets/1234 size",
        ),
        (Key::slru_dir(SlruKind::MultiXactMembers), "02 00000002 00000000 00000000 00 00000000", "pg_multixact/members directory"),
        (Key::twophase_dir(), "03 00000000 00000000 00000000 00 00000000", "pg_twophase directory"),
        (Key::twophase_file(1234), "03 00000001 00000000 00000000 00 000004D2", "pg_twophase/000004D2"),
        (Key::checkpoint(), "04 00000000 00000000 00000000 00 00000000", "checkpoint record"),
        (Key::control_file(), "05 00000000 00000000 00000000 00 00000000", "global/pg_control"),
        (Key::last_commit_timestamp(), "06 00000000 00000000 00000000 00 00000000", "last commit timestamp"),
        (Key::last_running_xacts(), "07 00000000 00000000 00000000 00 00000000", "last running-transactions record"),
        (Key::MAX, "FF FFFFFFFF FFFFFFFF FFFFFFFF FF FFFFFFFF", "end of key space"),
    ]
}

#[test]
fn layout_is_pinned() {
    for (key, spaced_hex, description) in golden() {
        let bytes = bytes_of(spaced_hex);
        assert_eq!(key.to_bytes().to_vec(), bytes, "{description}");
        assert_eq!(Key::from_bytes(&bytes), Ok(key), "{description}");
        assert_eq!(key.to_string(), spaced_hex.split_whitespace().collect::<String>());
        assert_eq!(key.kind().to_string(), description);
        assert_eq!(Key::try_from(key.kind()), Ok(key), "{description}");
    }
}

#[test]
fn golden_keys_are_in_table_order() {
    let keys: Vec<Key> = golden().into_iter().map(|(key, _, _)| key).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:#?}");
    assert_eq!(keys[0], Key::MIN);
}

#[test]
fn accessors_classify_keys() {
    let vm = rel(1663, 5, 16384, VM);
    let block = Key::rel_block(vm, BlockNumber(7));
    assert!(block.is_rel_block() && !block.is_rel_size() && block.is_block());
    assert_eq!(block.rel_tag(), Some(vm));
    assert_eq!(block.block_number(), Some(BlockNumber(7)));
    assert_eq!(block.database(), Some((1663, 5)));
    assert_eq!(block.slru(), None);

    let size = Key::rel_size(vm);
    assert!(size.is_rel_size() && !size.is_rel_block() && !size.is_block());
    assert_eq!(size.rel_tag(), Some(vm));
    assert_eq!(size.block_number(), None);

    let clog = Key::slru_block(SlruKind::Clog, 2, BlockNumber(5));
    assert!(clog.is_block() && !clog.is_rel_block());
    assert_eq!(clog.slru(), Some(SlruKind::Clog));
    assert_eq!(clog.block_number(), Some(BlockNumber(5)));
    assert_eq!(clog.rel_tag(), None);
    assert_eq!(Key::slru_segment_size(SlruKind::Clog, 2).slru(), Some(SlruKind::Clog));

    assert_eq!(Key::relmap_file(1664, 0).database(), Some((1664, 0)));
    assert_eq!(Key::rel_dir(1663, 5).kind(), KeyKind::RelDir { spcnode: 1663, dbnode: 5 });
    assert_eq!(Key::twophase_file(9).kind(), KeyKind::TwoPhaseFile { xid: 9 });
    for key in [
        Key::db_dir(),
        Key::twophase_dir(),
        Key::checkpoint(),
        Key::control_file(),
        Key::last_commit_timestamp(),
        Key::last_running_xacts(),
        Key::MAX,
    ] {
        assert_eq!((key.rel_tag(), key.slru(), key.database(), key.is_block()), (None, None, None, false));
    }
}

#[test]
fn rejects_malformed_bytes() {
    use KeyError::*;
    let cases: &[(&str, KeyError)] = &[
        ("00 00000001 00000000 00000000 00 00000000", UnusedFieldsSet { kind: "database directory", bytes: [0; 18] }),
        ("08 00000000 00000000 00000000 00 00000000", UnknownTag { tag: 0x08 }),
        ("80 00000000 00000000 00000000 00 00000000", UnknownTag { tag: 0x80 }),
        ("01 0000067F 00000005 00004000 04 00000007", InvalidForkNumber { forknum: 4 }),
        ("01 0000067F 00000005 00004000 FF FFFFFFFF", InvalidForkNumber { forknum: 0xff }),
        ("01 0000067F 00000005 00000000 02 00000000", UnknownSubkind { space: "database metadata", value: 2 }),
        ("01 0000067F 00000005 00000000 00 00000001", UnusedFieldsSet { kind: "relmapper file", bytes: [0; 18] }),
        ("01 0000067F 00000005 00000000 01 FFFFFFFF", UnusedFieldsSet { kind: "relation directory", bytes: [0; 18] }),
        ("02 00000003 00000000 00000000 00 00000000", UnknownSlruKind { value: 3 }),
        ("02 FFFFFFFF 00000001 00000000 00 00000000", UnknownSlruKind { value: u32::MAX }),
        ("02 00000000 00000002 00000000 00 00000000", UnknownSubkind { space: "SLRU", value: 2 }),
        ("02 00000000 00000000 00000003 00 00000000", UnusedFieldsSet { kind: "SLRU directory", bytes: [0; 18] }),
        ("02 00000000 00000001 00000003 01 00000000", UnusedFieldsSet { kind: "SLRU block", bytes: [0; 18] }),
        ("02 00000000 00000001 00000003 01 FFFFFFFF", UnusedFieldsSet { kind: "SLRU segment size", bytes: [0; 18] }),
        ("03 00000002 00000000 00000000 00 00000000", UnknownSubkind { space: "two-phase", value: 2 }),
        ("03 00000001 00000001 00000000 00 00000007", UnusedFieldsSet { kind: "two-phase state file", bytes: [0; 18] }),
        ("04 00000000 00000000 00000000 00 00000001", UnusedFieldsSet { kind: "checkpoint", bytes: [0; 18] }),
        ("05 00000000 00000000 00000000 01 00000000", UnusedFieldsSet { kind: "control file", bytes: [0; 18] }),
        ("FF FFFFFFFF FFFFFFFF FFFFFFFF FF FFFFFF00", NotMax { bytes: [0; 18] }),
    ];
    for (spaced_hex, expected) in cases {
        let bytes = bytes_of(spaced_hex);
        // The malformed-key variants carry the offending bytes, which the table leaves out.
        let expected = match expected.clone() {
            UnusedFieldsSet { kind, .. } => UnusedFieldsSet { kind, bytes: bytes.clone().try_into().unwrap() },
            NotMax { .. } => NotMax { bytes: bytes.clone().try_into().unwrap() },
            other => other,
        };
        assert_eq!(Key::from_bytes(&bytes), Err(expected), "{spaced_hex}");
    }
    for len in [0, 1, 17, 19, 36] {
        assert_eq!(Key::from_bytes(&vec![0; len]), Err(WrongLength { len }));
    }
}

#[test]
fn error_messages_name_the_value() {
    let msg = |hex: &str| Key::from_bytes(&bytes_of(hex)).unwrap_err().to_string();
    assert_eq!(Key::from_bytes(&[0; 17]).unwrap_err().to_string(), "invalid key length: 17 bytes (expected 18)");
    assert_eq!(msg("08 00000000 00000000 00000000 00 00000000"), "unrecognized key kind tag: 0x08");
    assert_eq!(msg("01 0000067F 00000005 00004000 09 00000007"), "invalid fork number in relation key: 9");
    assert_eq!(msg("02 00000005 00000000 00000000 00 00000000"), "unrecognized SLRU kind in key: 5");
    assert_eq!(
        msg("04 00000000 00000000 00000000 00 00000001"),
        "malformed checkpoint key: 040000000000000000000000000000000001 (its unused fields must be zero)"
    );
    assert_eq!("xyz".parse::<Key>().unwrap_err().to_string(), "invalid key: \"xyz\" (expected 36 hexadecimal digits)");
    let err = Key::try_from(KeyKind::RelBlock { rel: rel(1663, 5, 0, VM), blkno: BlockNumber(1) }).unwrap_err();
    assert_eq!(err.to_string(), "cannot make a relation block key for relnode 0 (InvalidOid): base/5/0_vm");
}

#[test]
fn reserved_values_cannot_become_keys() {
    let main = rel(1663, 5, 16384, ForkNumber::Main);
    let invalid = BlockNumber::INVALID;
    assert!(matches!(
        Key::try_from(KeyKind::RelBlock { rel: main, blkno: invalid }),
        Err(KeyError::ReservedBlockNumber { kind: "relation block", .. })
    ));
    assert!(matches!(
        Key::try_from(KeyKind::SlruBlock { slru: SlruKind::Clog, segno: 0, blkno: invalid }),
        Err(KeyError::ReservedBlockNumber { kind: "SLRU block", .. })
    ));
    assert!(matches!(
        Key::try_from(KeyKind::RelSize { rel: RelTag { relnode: 0, ..main } }),
        Err(KeyError::InvalidRelNode { kind: "relation size", .. })
    ));
    assert!(std::panic::catch_unwind(|| Key::rel_block(main, invalid)).is_err());
    assert!(std::panic::catch_unwind(|| Key::rel_size(RelTag { relnode: 0, ..main })).is_err());
    assert!(std::panic::catch_unwind(|| Key::slru_block(SlruKind::Clog, 0, invalid)).is_err());
}

#[test]
fn text_form_round_trips_in_either_case() {
    let key = Key::rel_block(rel(1663, 5, 16384, VM), BlockNumber(0xAB));
    assert_eq!(key.to_string(), "010000067F000000050000400002000000AB");
    assert_eq!("010000067f000000050000400002000000ab".parse::<Key>(), Ok(key));
    assert_eq!(format!("{key:?}"), "Key(010000067F000000050000400002000000AB: base/5/16384_vm block 171)");
    for bad in ["", "01", &"0".repeat(35), &"0".repeat(37), &"g".repeat(36), &format!("+{}", "0".repeat(35))] {
        assert_eq!(bad.parse::<Key>(), Err(KeyError::InvalidText { text: bad.to_string() }));
    }
    // Well-formed hex that is not a key reports why, not just "invalid text".
    assert_eq!(format!("08{}", "0".repeat(34)).parse::<Key>(), Err(KeyError::UnknownTag { tag: 8 }));
}

#[test]
fn next_crosses_every_boundary() {
    let r = |relnode, forknum| rel(7, 9, relnode, forknum);
    let cases = [
        (Key::db_dir(), Key::relmap_file(0, 0)),
        (Key::relmap_file(7, 9), Key::rel_dir(7, 9)),
        (Key::rel_dir(7, 9), Key::rel_block(r(1, ForkNumber::Main), BlockNumber(0))),
        (Key::rel_block(r(1, VM), BlockNumber(41)), Key::rel_block(r(1, VM), BlockNumber(42))),
        (Key::rel_block(r(1, VM), BlockNumber(MAX_BLOCK)), Key::rel_size(r(1, VM))),
        (Key::rel_size(r(1, ForkNumber::Main)), Key::rel_block(r(1, ForkNumber::Fsm), BlockNumber(0))),
        (Key::rel_size(r(1, ForkNumber::Init)), Key::rel_block(r(2, ForkNumber::Main), BlockNumber(0))),
        (Key::rel_size(r(u32::MAX, ForkNumber::Init)), Key::relmap_file(7, 10)),
        (Key::rel_size(rel(7, u32::MAX, u32::MAX, ForkNumber::Init)), Key::relmap_file(8, 0)),
        (Key::rel_size(rel(u32::MAX, u32::MAX, u32::MAX, ForkNumber::Init)), Key::slru_dir(SlruKind::Clog)),
        (Key::slru_dir(SlruKind::Clog), Key::slru_block(SlruKind::Clog, 0, BlockNumber(0))),
        (Key::slru_block(SlruKind::Clog, 4, BlockNumber(31)), Key::slru_block(SlruKind::Clog, 4, BlockNumber(32))),
        (Key::slru_block(SlruKind::Clog, 4, BlockNumber(MAX_BLOCK)), Key::slru_segment_size(SlruKind::Clog, 4)),
        (Key::slru_segment_size(SlruKind::Clog, 4), Key::slru_block(SlruKind::Clog, 5, BlockNumber(0))),
        (Key::slru_segment_size(SlruKind::Clog, u32::MAX), Key::slru_dir(SlruKind::MultiXactOffsets)),
        (Key::slru_segment_size(SlruKind::MultiXactMembers, u32::MAX), Key::twophase_dir()),
        (Key::twophase_dir(), Key::twophase_file(0)),
        (Key::twophase_file(41), Key::twophase_file(42)),
        (Key::twophase_file(u32::MAX), Key::checkpoint()),
        (Key::checkpoint(), Key::control_file()),
        (Key::control_file(), Key::last_commit_timestamp()),
        (Key::last_commit_timestamp(), Key::last_running_xacts()),
        (Key::last_running_xacts(), Key::MAX),
        (Key::MAX, Key::MAX),
    ];
    for (key, next) in cases {
        assert_eq!(key.next(), next, "{key:?}");
    }
}

/// Every key whose fields come from small sets of boundary values. Each numeric set holds
/// runs of consecutive values at both ends of its range, so the true successor of most of
/// these keys is in the set too, and a `next` that skips a key or carries wrongly is caught.
fn boundary_keys() -> Vec<Key> {
    let oids = [0, 1, 2, u32::MAX - 1, u32::MAX];
    let relnodes = [1, 2, 3, u32::MAX - 1, u32::MAX];
    let blocks = [0, 1, 2, MAX_BLOCK - 1, MAX_BLOCK].map(BlockNumber);
    let mut keys = vec![
        Key::db_dir(),
        Key::twophase_dir(),
        Key::checkpoint(),
        Key::control_file(),
        Key::last_commit_timestamp(),
        Key::last_running_xacts(),
        Key::MAX,
    ];
    for spcnode in oids {
        for dbnode in oids {
            keys.push(Key::relmap_file(spcnode, dbnode));
            keys.push(Key::rel_dir(spcnode, dbnode));
            for relnode in relnodes {
                for forknum in ForkNumber::ALL {
                    let rel = RelTag { spcnode, dbnode, relnode, forknum };
                    keys.push(Key::rel_size(rel));
                    keys.extend(blocks.map(|blkno| Key::rel_block(rel, blkno)));
                }
            }
        }
    }
    for slru in SlruKind::ALL {
        keys.push(Key::slru_dir(slru));
        for segno in oids {
            keys.push(Key::slru_segment_size(slru, segno));
            keys.extend(blocks.map(|blkno| Key::slru_block(slru, segno, blkno)));
        }
    }
    keys.extend(oids.map(Key::twophase_file));
    keys
}

#[test]
fn next_is_the_smallest_greater_key_on_boundary_values() {
    let mut keys = boundary_keys();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.first(), Some(&Key::MIN));
    assert_eq!(keys.last(), Some(&Key::MAX));
    for pair in keys.windows(2) {
        let (key, following) = (pair[0], pair[1]);
        let next = key.next();
        assert!(key < next, "{key:?} -> {next:?}");
        assert!(next <= following, "{key:?}.next() = {next:?} skips {following:?}");
        assert_eq!(Key::from_bytes(&next.to_bytes()), Ok(next));
    }
}

// Strategies: field values lean towards the boundaries, where encodings go wrong, and
// towards small values, so that two generated keys often share a prefix.

fn arb_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0), Just(1), Just(u32::MAX - 1), Just(u32::MAX), 0..4u32, any::<u32>()]
}

fn arb_relnode() -> impl Strategy<Value = u32> {
    prop_oneof![Just(1), Just(u32::MAX), 1..4u32, 1..=u32::MAX]
}

fn arb_blkno() -> impl Strategy<Value = BlockNumber> {
    prop_oneof![Just(0), Just(MAX_BLOCK), 0..4u32, 0..=MAX_BLOCK].prop_map(BlockNumber)
}

fn arb_fork() -> impl Strategy<Value = ForkNumber> {
    prop::sample::select(ForkNumber::ALL.to_vec())
}

fn arb_slru() -> impl Strategy<Value = SlruKind> {
    prop::sample::select(SlruKind::ALL.to_vec())
}

fn arb_rel() -> impl Strategy<Value = RelTag> {
    (arb_u32(), arb_u32(), arb_relnode(), arb_fork()).prop_map(|(spcnode, dbnode, relnode, forknum)| RelTag {
        spcnode,
        dbnode,
        relnode,
        forknum,
    })
}

fn arb_key_kind() -> impl Strategy<Value = KeyKind> {
    prop_oneof![
        1 => Just(KeyKind::DbDir),
        1 => (arb_u32(), arb_u32()).prop_map(|(spcnode, dbnode)| KeyKind::RelMapFile { spcnode, dbnode }),
        1 => (arb_u32(), arb_u32()).prop_map(|(spcnode, dbnode)| KeyKind::RelDir { spcnode, dbnode }),
        // Relation blocks are most of the key space in practice; weight them likewise.
        4 => (arb_rel(), arb_blkno()).prop_map(|(rel, blkno)| KeyKind::RelBlock { rel, blkno }),
        2 => arb_rel().prop_map(|rel| KeyKind::RelSize { rel }),
        1 => arb_slru().prop_map(|slru| KeyKind::SlruDir { slru }),
        1 => (arb_slru(), arb_u32(), arb_blkno())
            .prop_map(|(slru, segno, blkno)| KeyKind::SlruBlock { slru, segno, blkno }),
        1 => (arb_slru(), arb_u32()).prop_map(|(slru, segno)| KeyKind::SlruSegmentSize { slru, segno }),
        1 => Just(KeyKind::TwoPhaseDir),
        1 => arb_u32().prop_map(|xid| KeyKind::TwoPhaseFile { xid }),
        1 => Just(KeyKind::Checkpoint),
        1 => Just(KeyKind::ControlFile),
        1 => Just(KeyKind::LastCommitTimestamp),
        1 => Just(KeyKind::LastRunningXacts),
        1 => Just(KeyKind::Max),
    ]
}

fn arb_key() -> impl Strategy<Value = Key> {
    arb_key_kind().prop_map(|kind| Key::try_from(kind).expect("strategy makes only encodable kinds"))
}

/// Ranges between two arbitrary keys; about half are empty or backwards.
fn arb_range() -> impl Strategy<Value = KeyRange> {
    (arb_key(), arb_key()).prop_map(|(start, end)| KeyRange { start, end })
}

/// Byte strings that often get past the tag check, to reach the deeper validation.
fn arb_key_like_bytes() -> impl Strategy<Value = [u8; KEY_SIZE_BYTES]> {
    let tag = prop_oneof![0..6u8, Just(TAG_MAX), any::<u8>()];
    let field = prop_oneof![Just(0u8), Just(1), Just(0xff), any::<u8>()];
    (tag, prop::array::uniform17(field)).prop_map(|(tag, rest)| {
        let mut bytes = [tag; KEY_SIZE_BYTES];
        bytes[1..].copy_from_slice(&rest);
        bytes
    })
}

/// Where a relation key sorts among its relation's keys: blocks by number, then the size.
fn rel_sort_tuple(key: Key) -> (Oid, Oid, Oid, ForkNumber, u64) {
    match key.kind() {
        KeyKind::RelBlock { rel, blkno } => (rel.spcnode, rel.dbnode, rel.relnode, rel.forknum, blkno.0.into()),
        KeyKind::RelSize { rel } => (rel.spcnode, rel.dbnode, rel.relnode, rel.forknum, u64::MAX),
        other => panic!("not a relation key: {other}"),
    }
}

proptest! {
    #[test]
    fn bytes_round_trip(kind in arb_key_kind()) {
        let key = Key::try_from(kind).unwrap();
        prop_assert_eq!(key.kind(), kind);
        prop_assert_eq!(Key::from_bytes(&key.to_bytes()), Ok(key));
    }

    #[test]
    fn text_round_trips(key in arb_key()) {
        let text = key.to_string();
        prop_assert_eq!(text.len(), 2 * KEY_SIZE_BYTES);
        prop_assert_eq!(text.parse::<Key>(), Ok(key));
        prop_assert_eq!(text.to_lowercase().parse::<Key>(), Ok(key));
    }

    #[test]
    fn byte_order_is_key_order(a in arb_key(), b in arb_key()) {
        prop_assert_eq!(a.cmp(&b), a.to_bytes().cmp(&b.to_bytes()));
        // The hex text sorts the same way, so sorted log lines and file names agree.
        prop_assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
        prop_assert!(Key::MIN <= a && a <= Key::MAX);
    }

    #[test]
    fn relation_keys_order_by_spc_db_rel_fork_block(
        a in arb_rel(), blk_a in arb_blkno(), b in arb_rel(), blk_b in arb_blkno(), sizes in any::<(bool, bool)>(),
    ) {
        let key_a = if sizes.0 { Key::rel_size(a) } else { Key::rel_block(a, blk_a) };
        let key_b = if sizes.1 { Key::rel_size(b) } else { Key::rel_block(b, blk_b) };
        prop_assert_eq!(key_a.cmp(&key_b), rel_sort_tuple(key_a).cmp(&rel_sort_tuple(key_b)));
    }

    #[test]
    fn size_key_is_adjacent_to_its_blocks(rel in arb_rel(), other in arb_key()) {
        let last_block = Key::rel_block(rel, BlockNumber(MAX_BLOCK));
        let size = Key::rel_size(rel);
        prop_assert_eq!(last_block.next(), size);
        prop_assert!(!(last_block < other && other < size), "{:?} sorts between {:?} and its size", other, last_block);
        // No key of another relation fork, nor any other kind, sorts among this fork's keys.
        let first_block = Key::rel_block(rel, BlockNumber(0));
        let inside = first_block <= other && other <= size;
        prop_assert_eq!(inside, other.rel_tag() == Some(rel));
        prop_assert_eq!(KeyRange::rel_fork(rel).contains(&other), inside);
    }

    #[test]
    fn database_range_holds_exactly_its_keys(spcnode in arb_u32(), dbnode in arb_u32(), key in arb_key()) {
        let range = KeyRange::database(spcnode, dbnode);
        prop_assert_eq!(range.contains(&key), key.database() == Some((spcnode, dbnode)));
    }

    #[test]
    fn slru_range_holds_exactly_its_keys(slru in arb_slru(), key in arb_key()) {
        prop_assert_eq!(KeyRange::slru(slru).contains(&key), key.slru() == Some(slru));
    }

    #[test]
    fn next_is_greater_and_leaves_no_gap(key in arb_key(), other in arb_key()) {
        let next = key.next();
        prop_assert_eq!(Key::from_bytes(&next.to_bytes()), Ok(next));
        if key == Key::MAX {
            prop_assert_eq!(next, Key::MAX);
        } else {
            prop_assert!(key < next);
            prop_assert!(!(key < other && other < next), "{:?} sorts between {:?} and its next {:?}", other, key, next);
            prop_assert_eq!(KeyRange::single(key).contains(&other), other == key);
        }
    }

    #[test]
    fn from_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        if let Ok(key) = Key::from_bytes(&bytes) {
            prop_assert_eq!(key.to_bytes().to_vec(), bytes);
        }
    }

    #[test]
    fn accepted_bytes_are_canonical(bytes in arb_key_like_bytes()) {
        // Whatever is accepted is exactly the encoding of what it decodes to, so no key has
        // two byte forms and every accessor works on it.
        if let Ok(key) = Key::from_bytes(&bytes) {
            prop_assert_eq!(key.to_bytes(), bytes);
            prop_assert_eq!(Key::try_from(key.kind()), Ok(key));
            let _ = (key.next(), key.rel_tag(), key.block_number(), key.slru(), key.database(), format!("{key:?}"));
        }
    }

    #[test]
    fn from_str_never_panics(text in ".{0,40}", hex in "[0-9a-fA-F]{36}") {
        let _ = text.parse::<Key>();
        if let Ok(key) = hex.parse::<Key>() {
            prop_assert_eq!(key.to_string(), hex.to_uppercase());
        }
    }

    #[test]
    fn overlaps_matches_a_shared_key(x in arb_range(), y in arb_range(), probe in arb_key()) {
        prop_assert_eq!(x.overlaps(&y), y.overlaps(&x));
        if x.contains(&probe) && y.contains(&probe) {
            prop_assert!(x.overlaps(&y));
        }
        // When they overlap, the larger start is a key in both.
        if x.overlaps(&y) {
            let witness = x.start.max(y.start);
            prop_assert!(x.contains(&witness) && y.contains(&witness));
        }
        prop_assert_eq!(x.is_empty(), !x.contains(&x.start));
    }
}

#[test]
fn ranges() {
    let main = rel(1663, 5, 16384, ForkNumber::Main);
    let fork = KeyRange::rel_fork(main);
    assert!(fork.contains(&Key::rel_block(main, BlockNumber(0))));
    assert!(fork.contains(&Key::rel_size(main)));
    assert!(!fork.contains(&Key::rel_block(RelTag { forknum: ForkNumber::Fsm, ..main }, BlockNumber(0))));
    assert_eq!(fork.end, Key::rel_block(RelTag { forknum: ForkNumber::Fsm, ..main }, BlockNumber(0)));

    let db = KeyRange::database(1663, 5);
    assert!(db.contains(&Key::relmap_file(1663, 5)) && db.contains(&Key::rel_dir(1663, 5)));
    assert!(db.contains(&Key::rel_size(rel(1663, 5, u32::MAX, ForkNumber::Init))));
    assert!(!db.contains(&Key::relmap_file(1663, 6)) && !db.contains(&Key::db_dir()));
    assert!(db.overlaps(&fork) && !db.overlaps(&KeyRange::database(1664, 0)));

    let empty = KeyRange { start: Key::checkpoint(), end: Key::checkpoint() };
    assert!(empty.is_empty() && !empty.overlaps(&KeyRange::ALL) && !KeyRange::ALL.overlaps(&empty));
    assert!(KeyRange::single(Key::MAX).is_empty());
    assert!(KeyRange::ALL.contains(&Key::MIN) && KeyRange::ALL.contains(&Key::control_file()));
    assert!(!KeyRange::ALL.contains(&Key::MAX));
    let backwards = KeyRange { start: Key::control_file(), end: Key::checkpoint() };
    assert!(backwards.is_empty() && !backwards.contains(&Key::checkpoint()) && !backwards.overlaps(&KeyRange::ALL));
    assert_eq!(
        KeyRange::single(Key::checkpoint()).to_string(),
        "040000000000000000000000000000000000-050000000000000000000000000000000000"
    );
}
