//! The compute's shared caches, without PostgreSQL: the data structures and their rules,
//! over memory and locks the caller provides.
//!
//! - [`lwlsn`]: the last-written LSN cache, block-level and fork-level slots of the highest
//!   LSN written; a read uses the smaller of its two slots, an over-estimate, never an
//!   under-estimate.
//! - [`relsize`]: the relation-size cache, an open-addressing table under one lock, with a
//!   generation that lets each backend keep the sizes it looked up ([`relsize::LocalSizes`]).
//! - [`file_cache`]: the local file cache's index, striped with a lock per stripe, clock
//!   eviction, per-fork counts, and the rule which pages of a saved index are reused.
//!
//! The extension (`extension/`) is the shell: it lays these structures out in PostgreSQL's
//! shared memory, implements [`Locks`] with LWLocks, does the cache file's I/O (the file
//! cache's reads and writes are closures it passes in, called under the stripe's lock),
//! reads the settings and logs. Tests lay them out in ordinary memory and lock with std or
//! shuttle locks. Nothing here does I/O, reads a clock or starts a thread.
//!
//! Every shared structure is valid as all-zero bytes (after its header is set), because
//! PostgreSQL hands out shared memory as bytes.

pub mod file_cache;
pub mod lock;
pub mod lwlsn;
pub mod relsize;

#[cfg(any(test, feature = "check"))]
pub mod check;

pub use lock::Locks;

use std::sync::atomic::AtomicU64;

/// A relation fork: (tablespace, database, relfilenode, fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelFork {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
    pub forknum: i32,
}

/// A block of a relation fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockTag {
    pub rel: RelFork,
    pub blkno: u32,
}

/// splitmix64's finalizer: cheap, and every input bit reaches every output bit.
#[inline]
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The hash of a fork. Where an entry lives follows from it, including the slots of a
/// saved file-cache index, so it never changes.
#[inline]
pub fn hash_fork(r: &RelFork) -> u64 {
    let a = (u64::from(r.spcnode) << 32) | u64::from(r.dbnode);
    let b = (u64::from(r.relnode) << 32) | (r.forknum as u32 as u64);
    mix(mix(a) ^ b)
}

/// The slot of `r` in a per-fork array of `slots` entries (a power of two): the last-written
/// LSN's fork level, the file cache's per-fork entry counts.
#[inline]
pub fn fork_slot(r: &RelFork, slots: usize) -> usize {
    debug_assert!(slots.is_power_of_two());
    (hash_fork(r) as usize) & (slots - 1)
}

/// A value alone in its cache lines (PostgreSQL's `PG_CACHE_LINE_SIZE`, 128 bytes; shared
/// memory allocations are aligned to it).
#[repr(C, align(128))]
#[derive(Default)]
pub struct Padded<T>(pub T);

/// How many copies of each counter set exist (see [`PerProcess`]).
pub const COUNTER_SHARDS: usize = 64;

/// Counters that every process bumps on its hot paths, kept in [`COUNTER_SHARDS`] copies,
/// each in cache lines of its own: a process adds to the copy of its number (the extension
/// uses the `PGPROC` number), so two processes on two cores do not pass the same cache line
/// back and forth at every read. Readers add the copies up. All-zero bytes are the initial
/// state.
#[repr(C)]
pub struct PerProcess<T> {
    shards: [Padded<T>; COUNTER_SHARDS],
}

impl<T> PerProcess<T> {
    /// The copy of process number `process`.
    #[inline]
    pub fn get(&self, process: usize) -> &T {
        &self.shards[process % COUNTER_SHARDS].0
    }

    /// The total of one counter over every process.
    pub fn sum(&self, field: impl Fn(&T) -> &AtomicU64) -> u64 {
        self.shards.iter().fold(0, |total, s| total.wrapping_add(field(&s.0).load(std::sync::atomic::Ordering::Relaxed)))
    }
}

impl<T: Default> Default for PerProcess<T> {
    fn default() -> Self {
        PerProcess { shards: std::array::from_fn(|_| Padded(T::default())) }
    }
}
