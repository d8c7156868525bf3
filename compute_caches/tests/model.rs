//! Property tests: random operation sequences run against the caches and their reference
//! models at once (`compute_caches::check`), one sequence per structure and one mixing all.

use compute_caches::check::{code, run_input, Input, Op};
use proptest::prelude::*;

/// Operations with the codes given and small arguments, so that sequences come back to the
/// same forks and blocks (hits, collisions, evictions of entries read since).
fn input(codes: &'static [u8], max_ops: usize) -> impl Strategy<Value = Input> {
    let op = (prop::sample::select(codes), 0u8..16, 0u8..12, any::<u8>(), any::<u8>()).prop_map(|(c, a, b, x, y)| Op::new(c, [a, b, x, y]));
    (any::<u8>(), prop::collection::vec(op, 0..max_ops)).prop_map(|(config, ops)| Input { config, ops })
}

const LWLSN: &[u8] = &[code::SET_LAST_WRITTEN, code::LAST_WRITTEN];
const RELSIZE: &[u8] = &[code::CACHED_SIZE, code::UPDATE_SIZE, code::FORGET_SIZE, code::FORGET_DATABASE, code::NOTE_BUILD_IMAGE];
const FILE_CACHE: &[u8] = &[
    code::STORE,
    code::STORE,
    code::READ,
    code::READ,
    code::CONTAINS,
    code::INVALIDATE,
    code::INVALIDATE_BLOCKS,
    code::INVALIDATE_FORK,
    code::INVALIDATE_DATABASE,
    code::FAIL_NEXT_IO,
    code::RESTART,
];
const ALL: &[u8] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn last_written_lsn_never_under_estimates(input in input(LWLSN, 200)) {
        run_input(&input);
    }

    #[test]
    fn relation_sizes_match_a_map(input in input(RELSIZE, 200)) {
        run_input(&input);
    }

    #[test]
    fn file_cache_index_matches_its_model(input in input(FILE_CACHE, 300)) {
        run_input(&input);
    }

    #[test]
    fn all_three_interleaved(input in input(ALL, 300)) {
        run_input(&input);
    }
}

/// Every byte string is an input, and the checker accepts the empty one and a partial
/// operation.
#[test]
fn any_bytes_decode() {
    compute_caches::check::run(&[]);
    compute_caches::check::run(&[3, code::STORE, 1, 2]);
    let input = Input::decode(&[7, code::STORE, 1, 2, 3, 4, 99]);
    assert_eq!(input.ops, vec![Op::new(code::STORE, [1, 2, 3, 4])]);
    assert_eq!(input.encode(), vec![7, code::STORE, 1, 2, 3, 4]);
}
