//! A process-wide cache of decompressed layer file blocks, for point reads.
//!
//! A read of one key decompresses the 64 KiB block that holds it (`reader.rs`). The next
//! read often needs the same block: the next block of a relation in a scan, or the same
//! relation directory and size keys that every page read looks up. Blocks are cached by
//! (reader id, file offset) with their decompressed length as weight, least recently used
//! out first (`quick_cache`). A reader's id is never reused, so a block of a deleted or
//! rewritten file can never be returned for another; such entries simply age out.
//!
//! Scans (compaction, image creation, verification) read through `LayerIter` and bypass
//! the cache, so they do not push out what reads use.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::Weighter;

/// The default capacity: 256 MiB of decompressed blocks.
pub const DEFAULT_CAPACITY_BYTES: usize = 256 << 20;

static CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_CAPACITY_BYTES);
static NEXT_READER_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Clone)]
struct ByLength;

impl Weighter<(u64, u64), (Bytes, u64)> for ByLength {
    fn weight(&self, _key: &(u64, u64), value: &(Bytes, u64)) -> u64 {
        value.0.len().max(1) as u64
    }
}

type BlockCache = Cache<(u64, u64), (Bytes, u64), ByLength>;

/// Sets the capacity, before the first read (later calls change nothing). 0 disables it.
pub fn set_capacity_bytes(bytes: usize) {
    CAPACITY.store(bytes, Ordering::Relaxed);
}

fn cache() -> Option<&'static BlockCache> {
    static CACHE: OnceLock<Option<BlockCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let capacity = CAPACITY.load(Ordering::Relaxed);
            // quick_cache sizes its shards by an item count estimate: blocks are about 64 KiB.
            (capacity > 0).then(|| Cache::with_weighter((capacity / (64 << 10)).max(16), capacity as u64, ByLength))
        })
        .as_ref()
}

/// A new reader's id.
pub fn next_reader_id() -> u64 {
    NEXT_READER_ID.fetch_add(1, Ordering::Relaxed)
}

/// The cached block at `offset` of reader `id`, or `read()` it and cache it.
pub fn get_or_read<E>(id: u64, offset: u64, read: impl FnOnce() -> Result<(Bytes, u64), E>) -> Result<(Bytes, u64), E> {
    let Some(cache) = cache() else { return read() };
    if let Some(hit) = cache.get(&(id, offset)) {
        return Ok(hit);
    }
    let block = read()?;
    cache.insert((id, offset), block.clone());
    Ok(block)
}
