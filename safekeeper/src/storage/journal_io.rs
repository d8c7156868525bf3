//! How `wal.end`'s journal records reach the disk: one `pwrite` of whole aligned blocks on a
//! descriptor opened `O_DIRECT | O_DSYNC`, which returns once the bytes are durable.
//!
//! Why: a journal record is a commit's few KiB. Written through the page cache, each one was
//! a copy into a page, the page marked dirty, and then the `fdatasync`'s writeback (ext4's
//! `writepages`: finding the dirty page, mapping its blocks, building the request), all to
//! send one block to the device and flush its cache. A profile of pgbench read-write put a
//! quarter of the safekeepers' CPU in that writeback. A direct write builds the request from
//! the caller's buffer; the `O_DSYNC` makes the kernel flush the device's cache before the
//! call returns, as the `fdatasync` did. The journal area is zero-filled when `wal.end` is
//! made, so these writes never allocate blocks or change the file's size: no metadata to
//! write with them.
//!
//! Direct I/O writes whole blocks at aligned offsets from aligned memory. A record starts
//! wherever the previous one ended, so the write starts at the block holding the record's
//! first byte and repeats the bytes already in that block before it: they are the previous
//! records' bytes, unchanged. The journal relies on the same sector atomicity as `wal.end`'s
//! header: a write torn at a sector boundary leaves each sector either as it was or as it
//! was meant to be, and in both, the bytes of records already acknowledged are the same.
//! The block is padded with zeros after the record; what lies after the last record of the
//! header's generation is never read as a record (its generation or its LSN does not match).
//!
//! Where direct I/O is not available (`tmpfs` refuses `O_DIRECT`), the record is written
//! through the page cache and `wal.end` is `fdatasync`ed, as before.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::sync_stats::SyncStats;

/// The unit of a direct write: offsets, lengths and memory are aligned to it. 4 KiB covers
/// devices with 512-byte and 4 KiB logical blocks alike.
pub const BLOCK: usize = 4096;

#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; BLOCK]);

/// A growable buffer of whole blocks, aligned to [`BLOCK`] in memory.
struct AlignedBuf {
    blocks: Vec<Block>,
}

impl AlignedBuf {
    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let blocks = len.div_ceil(BLOCK);
        if self.blocks.len() < blocks {
            self.blocks.resize(blocks, Block([0; BLOCK]));
        }
        // SAFETY: `Block` is `repr(C)` around a byte array with no padding (its size equals
        // its alignment), so `blocks` is `blocks.len() * BLOCK` initialised bytes, and the
        // slice borrows `self.blocks` mutably for its lifetime.
        let all = unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.blocks.len() * BLOCK) };
        &mut all[..len]
    }
}

/// Writes journal records into `wal.end` durably.
pub struct JournalWriter {
    /// `wal.end` opened `O_DIRECT | O_DSYNC`, or `None` to write through `buffered`.
    direct: Option<File>,
    /// The bytes of the journal's last, partly written block before the next record's
    /// offset: `[align_down(next), next)`.
    tail: Vec<u8>,
    buf: AlignedBuf,
}

impl JournalWriter {
    /// Opens `path` (`wal.end`) for direct writes; falls back to the page cache where the
    /// file system refuses `O_DIRECT`, with a log line saying so.
    pub fn open(path: &Path) -> JournalWriter {
        let direct = match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(path) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::info!(
                    "{}: direct I/O is not available ({e}); its journal is written through the page cache and fdatasynced",
                    path.display()
                );
                None
            }
        };
        JournalWriter { direct, tail: Vec::new(), buf: AlignedBuf { blocks: Vec::new() } }
    }

    /// A writer that always goes through the page cache (tests of that path).
    #[cfg(test)]
    pub fn buffered() -> JournalWriter {
        JournalWriter { direct: None, tail: Vec::new(), buf: AlignedBuf { blocks: Vec::new() } }
    }

    /// The journal restarts at its (block-aligned) beginning: no bytes before the next
    /// record are kept.
    pub fn restart(&mut self) {
        self.tail.clear();
    }

    /// Writes `record` at `offset` in `wal.end` and returns once it is durable: directly, or
    /// through `buffered` (the page cache) and its `fdatasync`; the call that waits for the
    /// device counts as an fsync in `stats`. `offset` must be where the previous
    /// record ended (or a block boundary after [`JournalWriter::restart`]), and the journal's
    /// end must be block-aligned.
    pub fn write(&mut self, buffered: &File, offset: u64, record: &[u8], stats: &mut SyncStats) -> std::io::Result<()> {
        let block = BLOCK as u64;
        let start = offset - offset % block;
        debug_assert_eq!(self.tail.len() as u64, offset - start, "a journal record must follow the last one");
        let Some(direct) = &self.direct else {
            buffered.write_all_at(record, offset)?;
            self.keep_tail(start, offset, record);
            return stats.timed(|| buffered.sync_data());
        };
        let used = self.tail.len() + record.len();
        let len = used.div_ceil(BLOCK) * BLOCK;
        let buf = self.buf.bytes_mut(len);
        buf[..self.tail.len()].copy_from_slice(&self.tail);
        buf[self.tail.len()..used].copy_from_slice(record);
        buf[used..].fill(0);
        let buf = &*buf;
        stats.timed(|| direct.write_all_at(buf, start))?;
        self.keep_tail(start, offset, record);
        Ok(())
    }

    /// After `record` went to `offset` (in the block at `start`): keeps the bytes of the new
    /// last block before the next record's offset.
    fn keep_tail(&mut self, start: u64, offset: u64, record: &[u8]) {
        let end = offset + record.len() as u64;
        let new_start = end - end % BLOCK as u64;
        if new_start == start {
            self.tail.extend_from_slice(record);
        } else {
            let from = (new_start - offset) as usize;
            self.tail.clear();
            self.tail.extend_from_slice(&record[from..]);
        }
    }
}
