//! The seed inputs of the fuzz target `compute_caches` (`fuzz/seeds/compute_caches/`):
//! scenarios that reach each cache's interesting states in a few operations, so that
//! libFuzzer starts from them instead of from random bytes.
//!
//! `committed_seeds_run` checks that every committed seed is still the encoding of its
//! scenario and passes the checker (a change of the input format makes them stale and
//! fails it); `cargo test -p compute_caches --test fuzz_seeds -- --ignored write_fuzz_seeds`
//! writes them again (run it after such a change and commit the files).

use std::path::{Path, PathBuf};

use compute_caches::check::{code, run_input, Input, Op, FILE_CACHE_SLOTS};

fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/compute_caches")
}

fn op(code: u8, args: [u8; 4]) -> Op {
    Op::new(code, args)
}

/// The configuration byte for a file cache of `slots` and a relation-size table of the
/// `relsize`-th capacity.
fn config(slots: usize, relsize: usize) -> u8 {
    let s = FILE_CACHE_SLOTS.iter().position(|&n| n == slots).expect("a configured size");
    (s + relsize * FILE_CACHE_SLOTS.len()) as u8
}

fn seeds() -> Vec<(&'static str, Input)> {
    let mut seeds = Vec::new();

    // A bulk load of fork 0 at high LSNs, then reads of another fork's blocks and sizes.
    let mut ops: Vec<Op> = (0..40).map(|b| op(code::SET_LAST_WRITTEN, [0, b, b, 0x40])).collect();
    ops.push(op(code::SET_LAST_WRITTEN, [5, 3, 0x10, 0]));
    ops.push(op(code::SET_LAST_WRITTEN, [5, 255, 0x11, 0]));
    ops.extend([op(code::LAST_WRITTEN, [5, 3, 0, 0]), op(code::LAST_WRITTEN, [5, 255, 0, 0]), op(code::LAST_WRITTEN, [0, 39, 0, 0])]);
    seeds.push(("lwlsn-bulk-load", Input { config: 0, ops }));

    // A table of 8 filled to its limit, refused, emptied in the middle, refilled.
    let mut ops: Vec<Op> = (0..8).map(|r| op(code::UPDATE_SIZE, [0, r, 1, r + 1])).collect();
    ops.extend([op(code::FORGET_SIZE, [2, 0, 0, 0]), op(code::FORGET_SIZE, [4, 0, 0, 0]), op(code::UPDATE_SIZE, [1, 9, 0, 3])]);
    ops.extend((0..8).map(|r| op(code::CACHED_SIZE, [2, r, 0, 0])));
    seeds.push(("relsize-fill-forget", Input { config: config(1, 2), ops }));

    // Sizes kept by backends 0 and 1 and changed by backend 2: truncation, raise, unlink,
    // DROP DATABASE, and an unlogged build's images.
    let ops = vec![
        op(code::UPDATE_SIZE, [2, 1, 0, 10]),
        op(code::UPDATE_SIZE, [2, 5, 3, 4]),
        op(code::CACHED_SIZE, [0, 1, 0, 0]),
        op(code::CACHED_SIZE, [1, 5, 0, 0]),
        op(code::UPDATE_SIZE, [2, 1, 0, 2]),
        op(code::CACHED_SIZE, [0, 1, 0, 0]),
        op(code::UPDATE_SIZE, [0, 1, 1, 6]),
        op(code::UPDATE_SIZE, [1, 1, 2, 4]),
        op(code::NOTE_BUILD_IMAGE, [5, 7, 100, 0]),
        op(code::NOTE_BUILD_IMAGE, [5, 8, 90, 0]),
        op(code::FORGET_SIZE, [1, 0, 0, 0]),
        op(code::CACHED_SIZE, [0, 1, 0, 0]),
        op(code::FORGET_DATABASE, [1, 0, 0, 0]),
        op(code::CACHED_SIZE, [1, 5, 0, 0]),
    ];
    seeds.push(("relsize-generations", Input { config: config(1, 3), ops }));

    // One stripe of 5 filled, read, and made to evict: the clock gives what was read a
    // second chance.
    let mut ops: Vec<Op> = (0..5).map(|b| op(code::STORE, [0, b, 0, 0])).collect();
    ops.extend([op(code::STORE, [0, 5, 0, 0]), op(code::READ, [0, 2, 0, 0]), op(code::READ, [0, 3, 0, 0])]);
    ops.extend((6..10).map(|b| op(code::STORE, [0, b, 0, 0])));
    ops.extend((0..10).map(|b| op(code::READ, [0, b, 0, 0])));
    seeds.push(("file-cache-evict", Input { config: config(5, 0), ops }));

    // Three stripes: stores over two databases, then every kind of invalidation.
    let mut ops: Vec<Op> = (0..24).map(|i| op(code::STORE, [i % 8, i, 0, 0])).collect();
    ops.extend([
        op(code::INVALIDATE, [0, 0, 0, 0]),
        op(code::INVALIDATE_BLOCKS, [1, 0, 10, 0]),
        op(code::INVALIDATE_BLOCKS, [2, 0, 200, 0]),
        op(code::INVALIDATE_FORK, [3, 0, 0, 0]),
        op(code::INVALIDATE_FORK, [15, 0, 0, 0]),
        op(code::INVALIDATE_DATABASE, [4, 0, 0, 0]),
        op(code::CONTAINS, [5, 5, 0, 0]),
    ]);
    seeds.push(("file-cache-invalidate", Input { config: config(100, 0), ops }));

    // A failed write (of a cached block and of a new one) and a failed read.
    let ops = vec![
        op(code::STORE, [0, 1, 0, 0]),
        op(code::FAIL_NEXT_IO, [0, 0, 0, 0]),
        op(code::STORE, [0, 1, 0, 0]),
        op(code::FAIL_NEXT_IO, [0, 0, 0, 0]),
        op(code::STORE, [0, 2, 0, 0]),
        op(code::STORE, [0, 3, 0, 0]),
        op(code::FAIL_NEXT_IO, [0, 0, 0, 0]),
        op(code::READ, [0, 3, 0, 0]),
        op(code::READ, [0, 3, 0, 0]),
    ];
    seeds.push(("file-cache-io-failures", Input { config: config(32, 0), ops }));

    // Restarts: one clean, one with slot 0 damaged, one with a stray entry in a free slot;
    // then everything read back.
    let mut ops: Vec<Op> = (0..6).map(|b| op(code::STORE, [1, b, 0, 0])).collect();
    ops.push(op(code::RESTART, [0, 200, 0, 0]));
    ops.push(op(code::READ, [1, 0, 0, 0]));
    ops.push(op(code::RESTART, [1, 200, 0, 0]));
    ops.push(op(code::RESTART, [0, 20, 2, 9]));
    ops.extend((0..6).map(|b| op(code::READ, [1, b, 0, 0])));
    ops.push(op(code::READ, [2, 9, 0, 0]));
    seeds.push(("file-cache-restart", Input { config: config(32, 0), ops }));

    seeds
}

#[test]
#[ignore = "writes fuzz/seeds/compute_caches/; run by hand after a format change"]
fn write_fuzz_seeds() {
    let dir = seeds_dir();
    std::fs::create_dir_all(&dir).expect("create seeds dir");
    for (name, input) in seeds() {
        run_input(&input);
        std::fs::write(dir.join(name), input.encode()).expect("write seed");
    }
}

#[test]
fn committed_seeds_run() {
    for (name, input) in seeds() {
        let path = seeds_dir().join(name);
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (write_fuzz_seeds writes it)", path.display()));
        assert_eq!(Input::decode(&data), input, "{} is stale: run write_fuzz_seeds", path.display());
        compute_caches::check::run(&data);
    }
}
