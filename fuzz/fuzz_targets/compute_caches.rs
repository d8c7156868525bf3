//! The compute's caches (`compute_caches`) driven by arbitrary operation sequences and
//! checked against their reference models at every step (`compute_caches::check`: the input
//! is a configuration byte, then 5-byte operations; every input is valid). A panic is a
//! difference between a cache and its model: an under-estimated last-written LSN, a wrong
//! size or generation, a wrong page, eviction or count in the file-cache index, or a saved
//! entry reused against the rule. The seeds (`fuzz/seeds/compute_caches/`) are the scenarios
//! of `compute_caches/tests/fuzz_seeds.rs`: a bulk load, a table filled and emptied, sizes
//! changed under other backends' copies, a stripe evicting, invalidations, failed reads and
//! writes, and restarts with damaged pages and stray entries.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    compute_caches::check::run(data);
});
