//! Reads one layer file: opened once, its header and index checked and kept in memory,
//! blocks read and checked on demand.
//!
//! Opening reads the 128-byte header and the index; a read of one key binary-searches the
//! index and decompresses only the blocks holding that key's versions. Nothing read from
//! the file is trusted: every length, offset, count, key and LSN is checked against the
//! header, the index and the file's size before it is used, and a failed check becomes
//! `LayerError::Corrupt` naming the file and the offset of the structure that failed. No
//! data read from disk can make the reader panic or allocate more than
//! `BLOCK_SIZE_BYTES_MAX` for a block.
//!
//! A key with many versions in one layer (a relation's size during a bulk load: one version
//! per block added) is read newest first through a **version index**, built on its first
//! read: where each version lies (block and position). Without it, every read of such a key
//! decoded all its versions to find the newest, and a scan of a freshly loaded table, which
//! checks the relation's size at each page, took time quadratic in its size (about 80% of
//! the pageserver's CPU in a scan of 16,000 pages right after their load). At most
//! [`VERSION_INDEX_KEYS`] keys are indexed per reader, and only keys of at least
//! [`VERSION_INDEX_MIN`] versions.
//!
//! The file stays open for the life of the `LayerReader`, so a reader holding it keeps
//! working after compaction or GC unlinks the file, or eviction (`file.rs`) drops it from
//! local disk.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use proto::{Key, KeyRange, Lsn};

use super::format::{self, FormatError, Header, IndexEntry, BLOCK_FRAME_SIZE_BYTES, HEADER_SIZE_BYTES};
use super::name::{LayerDesc, LayerKind};
use crate::error::LayerError;
use crate::value::{ChangeCollector, Value, ValueCollector, TAG_IMAGE};

/// A key needs at least this many versions in the layer to get a version index.
pub const VERSION_INDEX_MIN: u32 = 256;
/// At most this many keys' version indexes are kept per reader (all are dropped to make
/// room): at most this many times the largest key's version count, 24 bytes each.
pub const VERSION_INDEX_KEYS: usize = 8;

/// Where one version of a key lies: its LSN, the file offset of its block, and its
/// position in the decompressed block.
#[derive(Clone, Copy, Debug)]
struct VersionAt {
    lsn: Lsn,
    block: u64,
    pos: usize,
}

#[derive(Debug)]
pub struct LayerReader {
    /// This reader's id in the block cache (`block_cache.rs`).
    id: u64,
    path: PathBuf,
    file: File,
    desc: LayerDesc,
    header: Header,
    index: Vec<IndexEntry>,
    /// Version indexes of keys with many versions, by their position in `index`.
    version_index: Mutex<HashMap<usize, Arc<Vec<VersionAt>>>>,
}

impl LayerReader {
    /// Opens the layer file at `path`, whose file name must be its `LayerDesc`.
    pub fn open(path: &Path) -> Result<LayerReader, LayerError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let desc: LayerDesc = name.parse().map_err(|e: super::name::LayerNameError| LayerError::corrupt(path, 0, e.to_string()))?;
        let file = File::open(path).map_err(|e| LayerError::io("open", path, e))?;
        let file_len = file.metadata().map_err(|e| LayerError::io("stat", path, e))?.len();
        if file_len < HEADER_SIZE_BYTES as u64 {
            return Err(LayerError::corrupt(path, 0, format!("file of {file_len} bytes is shorter than the header")));
        }
        let mut hbuf = [0u8; HEADER_SIZE_BYTES];
        file.read_exact_at(&mut hbuf, 0).map_err(|e| LayerError::io("read", path, e))?;
        let header = Header::decode(&hbuf, file_len).map_err(|e| format_error(path, e))?;
        if header.kind != desc.kind || header.key_range != desc.key_range || (header.lsn_start..header.lsn_end) != desc.lsn_range {
            return Err(LayerError::corrupt(
                path,
                16,
                format!(
                    "header describes {:?} {}..{} {}, the file name another layer",
                    header.kind, header.lsn_start, header.lsn_end, header.key_range
                ),
            ));
        }
        let index_len = usize::try_from(header.index_len).map_err(|_| LayerError::corrupt(path, 76, "index too large"))?;
        let mut ibuf = vec![0u8; index_len];
        file.read_exact_at(&mut ibuf, header.index_offset).map_err(|e| LayerError::io("read", path, e))?;
        let crc = crc32c::crc32c(&ibuf);
        if crc != header.index_crc {
            return Err(LayerError::corrupt(
                path,
                header.index_offset,
                format!("index checksum mismatch: stored {:08X}, computed {crc:08X}", header.index_crc),
            ));
        }
        let index = decode_index(&header, &ibuf).map_err(|e| format_error(path, e))?;
        Ok(LayerReader {
            id: super::block_cache::next_reader_id(),
            path: path.to_path_buf(),
            file,
            desc,
            header,
            index,
            version_index: Mutex::new(HashMap::new()),
        })
    }

    pub fn desc(&self) -> &LayerDesc {
        &self.desc
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_size_bytes(&self) -> u64 {
        self.header.index_offset + self.header.index_len
    }

    /// The whole file, for an upload. Reads through the open descriptor, so it works after
    /// the file was unlinked.
    pub fn read_all(&self) -> Result<Vec<u8>, LayerError> {
        let len = usize::try_from(self.file_size_bytes()).map_err(|_| self.corrupt(0, "file too large to read whole"))?;
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, 0).map_err(|e| LayerError::io("read", &self.path, e))?;
        Ok(buf)
    }

    pub fn value_count(&self) -> u64 {
        self.header.value_count
    }

    /// Offers the key's versions with LSN in `lsn_range` to `collector`, newest first.
    /// Returns whether the collection is complete. An image layer always completes it: a key
    /// inside its key range but absent from it had no value at the layer's LSN.
    pub(crate) fn collect(&self, key: Key, lsn_range: std::ops::Range<Lsn>, collector: &mut ValueCollector) -> Result<bool, LayerError> {
        let (i, entry) = match self.index.binary_search_by_key(&key, |e| e.key) {
            Ok(i) => (i, self.index[i]),
            Err(_) if self.desc.kind == LayerKind::Image => {
                collector.mark_complete();
                return Ok(true);
            }
            Err(_) => return Ok(false),
        };
        if entry.first_lsn >= lsn_range.end {
            return Ok(false);
        }
        // A delta layer reaching above an image layer is searched only for the versions above
        // the image: a key changed only below them needs none of its blocks read.
        if self.desc.kind == LayerKind::Delta && entry.last_lsn.is_some_and(|last| last < lsn_range.start) {
            return Ok(false);
        }
        if entry.value_count >= VERSION_INDEX_MIN {
            let versions = self.versions_of(i, &entry)?;
            let below_end = versions.partition_point(|v| v.lsn < lsn_range.end);
            for v in versions[..below_end].iter().rev().take_while(|v| v.lsn >= lsn_range.start) {
                let (block, _) = super::block_cache::get_or_read(self.id, v.block, || self.read_block(v.block))?;
                let raw = match format::decode_entry(&block, v.pos).map_err(|e| self.corrupt(v.block, e))? {
                    Some((raw, _)) if raw.key == entry.key && raw.lsn == v.lsn => raw,
                    _ => return Err(self.corrupt(v.block, format!("version {} of {} moved inside its block", v.lsn, entry.key))),
                };
                let (_, lsn, value) = self.entry_value(&block, v.block, raw)?;
                if collector.push(lsn, value) {
                    return Ok(true);
                }
            }
        } else {
            for (lsn, value) in self.read_versions(&entry)?.into_iter().rev() {
                if lsn_range.contains(&lsn) && collector.push(lsn, value) {
                    return Ok(true);
                }
            }
        }
        if self.desc.kind == LayerKind::Image {
            collector.mark_complete();
        }
        Ok(collector.is_complete())
    }

    /// All versions of one key, oldest first.
    pub fn get(&self, key: Key) -> Result<Vec<(Lsn, Value)>, LayerError> {
        match self.index.binary_search_by_key(&key, |e| e.key) {
            Ok(i) => self.read_versions(&self.index[i]),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// The keys in `range` with a version at or below `lsn`, in order.
    pub fn keys(&self, range: &KeyRange, lsn: Lsn) -> Vec<Key> {
        let from = self.index.partition_point(|e| e.key < range.start);
        self.index[from..].iter().take_while(|e| e.key < range.end).filter(|e| e.first_lsn <= lsn).map(|e| e.key).collect()
    }

    /// Offers `changes` the newest LSN in `lsn_range` of every key in `key_range` that has
    /// a version there, in key order, until it is over its limit.
    ///
    /// The index answers for a key whose first version is at or after the range's end and
    /// for one whose newest version is before it (in version 1 files, which lack the newest
    /// LSN, only for a key with one version); only the other keys' blocks are read, each
    /// block once (index entries point at blocks in file order, so the last
    /// block read is kept for the next key), and of each entry only its header is looked
    /// at: values are neither copied nor decoded. An image layer holds states, not changes,
    /// and offers nothing.
    pub(crate) fn collect_changes(
        &self,
        key_range: &KeyRange,
        lsn_range: &std::ops::Range<Lsn>,
        changes: &mut ChangeCollector,
    ) -> Result<(), LayerError> {
        if self.desc.kind == LayerKind::Image {
            return Ok(());
        }
        let from = self.index.partition_point(|e| e.key < key_range.start);
        let mut cache: Option<CachedBlock> = None;
        for entry in self.index[from..].iter().take_while(|e| e.key < key_range.end) {
            if entry.first_lsn >= lsn_range.end {
                continue;
            }
            let newest = match entry.last_lsn {
                // The newest version is below the range's end: the index answers.
                Some(last) if last < lsn_range.end => Some(last).filter(|lsn| lsn_range.contains(lsn)),
                _ => self.newest_version_in(entry, lsn_range, &mut cache)?,
            };
            if let Some(lsn) = newest {
                if !changes.add(entry.key, lsn) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The newest LSN in `lsn_range` among the versions of `entry`'s key, reading its
    /// blocks (through `cache`) with the same checks as `read_versions`. Stops at the first
    /// version at or after the range's end, since versions are in LSN order.
    fn newest_version_in(
        &self,
        entry: &IndexEntry,
        lsn_range: &std::ops::Range<Lsn>,
        cache: &mut Option<CachedBlock>,
    ) -> Result<Option<Lsn>, LayerError> {
        let short = |found: u32| {
            self.corrupt(entry.block_offset, format!("key {}: the index promises {} versions, found {found}", entry.key, entry.value_count))
        };
        let mut newest = None;
        let mut seen: u32 = 0;
        let mut prev: Option<Lsn> = None;
        let mut offset = entry.block_offset;
        while seen < entry.value_count {
            if offset >= self.header.index_offset {
                return Err(short(seen));
            }
            let block = match cache.take() {
                Some(cached) if cached.offset == offset => cached,
                _ => {
                    let (data, next) = self.read_block(offset)?;
                    CachedBlock { offset, data, next }
                }
            };
            let mut pos = 0;
            let mut seen_here = false;
            while let Some((raw, next_pos)) = format::decode_entry(&block.data, pos).map_err(|e| self.corrupt(offset, e))? {
                pos = next_pos;
                if raw.key < entry.key && seen == 0 {
                    continue;
                }
                if raw.key != entry.key {
                    return Err(short(seen));
                }
                // The same checks a read makes; the value is a slice of the block, not a copy.
                let (_, lsn, _) = self.entry_value(&block.data, offset, raw)?;
                if (seen == 0 && lsn != entry.first_lsn) || prev.is_some_and(|p| p >= lsn) {
                    return Err(self.corrupt(offset, format!("versions of {} out of order at LSN {lsn}", entry.key)));
                }
                seen += 1;
                seen_here = true;
                prev = Some(lsn);
                if lsn_range.contains(&lsn) {
                    newest = Some(lsn);
                }
                if lsn >= lsn_range.end || seen == entry.value_count {
                    *cache = Some(block);
                    return Ok(newest);
                }
            }
            if !seen_here {
                return Err(self.corrupt(offset, format!("the index points key {} at a block that does not hold it", entry.key)));
            }
            offset = block.next;
            *cache = Some(block);
        }
        Ok(newest)
    }

    /// Every version in the file in `(key, lsn)` order, read block by block.
    pub fn iter(&self) -> LayerIter<'_> {
        LayerIter { layer: self, next_block: HEADER_SIZE_BYTES as u64, block: None, last: None, values: 0, blocks: 0, done: false }
    }

    /// Reads every block and checks it against the header and the index. Opening checks
    /// only the header and the index; this is the full scrub.
    pub fn verify(&self) -> Result<(), LayerError> {
        let mut iter = self.iter();
        let mut index = self.index.iter();
        let mut current: Option<(IndexEntry, u32, Lsn)> = None;
        while let Some(item) = iter.next() {
            let (key, lsn, _) = item?;
            let block_offset = iter.current_block_offset();
            match &mut current {
                Some((entry, seen, newest)) if entry.key == key => {
                    *seen += 1;
                    *newest = lsn;
                }
                _ => {
                    if let Some((entry, seen, newest)) = current {
                        self.check_entry(&entry, seen, newest)?;
                    }
                    let Some(entry) = index.next().copied() else {
                        return Err(self.corrupt(self.header.index_offset, format!("key {key} is missing from the index")));
                    };
                    if entry.key != key || entry.first_lsn != lsn || entry.block_offset != block_offset {
                        return Err(self.corrupt(
                            block_offset,
                            format!(
                                "found {key} at LSN {lsn} here, the index says {} at LSN {} in block {}",
                                entry.key, entry.first_lsn, entry.block_offset
                            ),
                        ));
                    }
                    current = Some((entry, 1, lsn));
                }
            }
        }
        if let Some((entry, seen, newest)) = current {
            self.check_entry(&entry, seen, newest)?;
        }
        if let Some(entry) = index.next() {
            return Err(self.corrupt(self.header.index_offset, format!("index lists key {} that no block holds", entry.key)));
        }
        Ok(())
    }

    /// Checks what the scrub found of one key (`seen` versions, the newest at `newest`)
    /// against its index entry.
    fn check_entry(&self, entry: &IndexEntry, seen: u32, newest: Lsn) -> Result<(), LayerError> {
        if seen != entry.value_count {
            return Err(
                self.corrupt(entry.block_offset, format!("key {} has {seen} versions, the index says {}", entry.key, entry.value_count))
            );
        }
        self.check_newest(entry, newest, entry.block_offset)
    }

    /// The index entry's newest LSN, when it has one, must be where the key's versions end.
    fn check_newest(&self, entry: &IndexEntry, newest: Lsn, offset: u64) -> Result<(), LayerError> {
        if entry.last_lsn.is_some_and(|last| last != newest) {
            return Err(self.corrupt(offset, format!("key {}: the newest version is at LSN {newest}, the index says otherwise", entry.key)));
        }
        Ok(())
    }

    fn corrupt(&self, offset: u64, reason: impl Into<String>) -> LayerError {
        LayerError::corrupt(&self.path, offset, reason)
    }

    /// Reads and checks the block frame at `offset`; returns its decompressed bytes and the
    /// offset of the next block.
    fn read_block(&self, offset: u64) -> Result<(Bytes, u64), LayerError> {
        let data_end = self.header.index_offset;
        if offset.checked_add(BLOCK_FRAME_SIZE_BYTES as u64).is_none_or(|e| e > data_end) {
            return Err(self.corrupt(offset, format!("block frame runs past the data area ending at {data_end}")));
        }
        let mut frame = [0u8; BLOCK_FRAME_SIZE_BYTES];
        self.file.read_exact_at(&mut frame, offset).map_err(|e| LayerError::io("read", &self.path, e))?;
        let (compressed_len, uncompressed_len, crc) = format::decode_block_frame(&frame);
        let payload_start = offset + BLOCK_FRAME_SIZE_BYTES as u64;
        let end = payload_start + u64::from(compressed_len);
        if end > data_end {
            return Err(self.corrupt(offset, format!("block of {compressed_len} bytes runs past the data area ending at {data_end}")));
        }
        let mut payload = vec![0u8; compressed_len as usize];
        self.file.read_exact_at(&mut payload, payload_start).map_err(|e| LayerError::io("read", &self.path, e))?;
        let computed = format::block_crc(&frame, &payload);
        if computed != crc {
            return Err(self.corrupt(offset, format!("block checksum mismatch: stored {crc:08X}, computed {computed:08X}")));
        }
        if uncompressed_len as usize > format::BLOCK_SIZE_BYTES_MAX {
            return Err(self.corrupt(offset, format!("block claims {uncompressed_len} uncompressed bytes")));
        }
        let data = decompress(&payload, uncompressed_len as usize)
            .map_err(|e| self.corrupt(offset, format!("could not decompress block: {e}")))?;
        if data.len() != uncompressed_len as usize {
            return Err(self.corrupt(offset, format!("block decompressed to {} bytes, not {uncompressed_len}", data.len())));
        }
        Ok((Bytes::from(data), end))
    }

    /// Checks one decoded entry against the layer's ranges and turns it into a value.
    fn entry_value(&self, block: &Bytes, block_offset: u64, e: format::RawEntry) -> Result<(Key, Lsn, Value), LayerError> {
        if !self.desc.key_range.contains(&e.key) || !self.desc.lsn_range.contains(&e.lsn) {
            return Err(self.corrupt(block_offset, format!("{} at LSN {} lies outside the layer", e.key, e.lsn)));
        }
        if self.desc.kind == LayerKind::Image && e.tag != TAG_IMAGE {
            return Err(self.corrupt(block_offset, format!("image layer holds a value with tag {} for {}", e.tag, e.key)));
        }
        let value = Value::from_parts(e.tag, block.slice(e.payload))
            .ok_or_else(|| self.corrupt(block_offset, format!("unknown value tag {} for {}", e.tag, e.key)))?;
        Ok((e.key, e.lsn, value))
    }

    /// All versions of the key of `entry`, oldest first, checked against the index entry.
    fn read_versions(&self, entry: &IndexEntry) -> Result<Vec<(Lsn, Value)>, LayerError> {
        let mut out: Vec<(Lsn, Value)> = Vec::with_capacity(entry.value_count as usize);
        self.walk_versions(entry, |block, offset, _, raw| {
            let (_, lsn, value) = self.entry_value(block, offset, raw)?;
            out.push((lsn, value));
            Ok(())
        })?;
        Ok(out)
    }

    /// The version index of the key of `entry`, at position `i` of the index: built by one
    /// walk over its versions on first use, then kept (see the module documentation).
    fn versions_of(&self, i: usize, entry: &IndexEntry) -> Result<Arc<Vec<VersionAt>>, LayerError> {
        if let Some(v) = self.version_index.lock().unwrap_or_else(|e| e.into_inner()).get(&i) {
            return Ok(Arc::clone(v));
        }
        let mut versions = Vec::with_capacity(entry.value_count as usize);
        self.walk_versions(entry, |_, block_offset, pos, raw| {
            versions.push(VersionAt { lsn: raw.lsn, block: block_offset, pos });
            Ok(())
        })?;
        let versions = Arc::new(versions);
        let mut map = self.version_index.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= VERSION_INDEX_KEYS {
            map.clear();
        }
        map.insert(i, Arc::clone(&versions));
        Ok(versions)
    }

    /// Calls `f` with each version of the key of `entry`, oldest first: its block, the
    /// block's file offset, its position in the block and the entry. Checks them against
    /// the index entry: as many as it promises, the first at its first LSN, the newest at
    /// its last, in increasing LSN order, in consecutive blocks.
    fn walk_versions(
        &self,
        entry: &IndexEntry,
        mut f: impl FnMut(&Bytes, u64, usize, format::RawEntry) -> Result<(), LayerError>,
    ) -> Result<(), LayerError> {
        let want = entry.value_count as usize;
        let mut found = 0usize;
        let mut previous: Option<Lsn> = None;
        let mut offset = entry.block_offset;
        let short = |found: usize| {
            self.corrupt(entry.block_offset, format!("key {}: the index promises {} versions, found {found}", entry.key, entry.value_count))
        };
        'blocks: while found < want {
            if offset >= self.header.index_offset {
                return Err(short(found));
            }
            let (block, next) = super::block_cache::get_or_read(self.id, offset, || self.read_block(offset))?;
            let mut pos = 0;
            while let Some((raw, next_pos)) = format::decode_entry(&block, pos).map_err(|e| self.corrupt(offset, e))? {
                let at = pos;
                pos = next_pos;
                if raw.key < entry.key && found == 0 {
                    continue;
                }
                if raw.key != entry.key {
                    return Err(short(found));
                }
                let lsn = raw.lsn;
                let wrong_first = found == 0 && lsn != entry.first_lsn;
                if wrong_first || previous.is_some_and(|prev| prev >= lsn) {
                    return Err(self.corrupt(offset, format!("versions of {} out of order at LSN {lsn}", entry.key)));
                }
                f(&block, offset, at, raw)?;
                previous = Some(lsn);
                found += 1;
                if found == want {
                    self.check_newest(entry, lsn, offset)?;
                    break 'blocks;
                }
            }
            if found == 0 {
                return Err(self.corrupt(offset, format!("the index points key {} at a block that does not hold it", entry.key)));
            }
            offset = next;
        }
        Ok(())
    }
}

/// A decompressed block kept between keys by `collect_changes`: its file offset, its bytes
/// and the offset of the block after it.
struct CachedBlock {
    offset: u64,
    data: Bytes,
    next: u64,
}

/// Converts a format check failure into the error callers see.
fn format_error(path: &Path, e: FormatError) -> LayerError {
    match e.unsupported_version {
        Some(version) => LayerError::UnsupportedVersion {
            path: path.to_path_buf(),
            offset: e.offset,
            version,
            supported: format::FORMAT_VERSION_OLDEST..=format::FORMAT_VERSION,
        },
        None => LayerError::corrupt(path, e.offset, e.reason),
    }
}

/// Decodes the index and checks it against the header.
fn decode_index(header: &Header, bytes: &[u8]) -> Result<Vec<IndexEntry>, FormatError> {
    let mut index: Vec<IndexEntry> = Vec::with_capacity(header.key_count as usize);
    let mut total: u64 = 0;
    let entry_size = format::index_entry_size(header.version);
    for (i, chunk) in bytes.chunks_exact(entry_size).enumerate() {
        let offset = header.index_offset + (i * entry_size) as u64;
        let e = IndexEntry::decode(chunk, header.version, offset)?;
        let bad = |reason: String| Err(FormatError::new(offset, reason));
        if index.last().is_some_and(|prev| prev.key >= e.key || prev.block_offset > e.block_offset) {
            return bad(format!("index entry for {} out of order", e.key));
        }
        if !header.key_range.contains(&e.key) || !(header.lsn_start..header.lsn_end).contains(&e.first_lsn) {
            return bad(format!("index entry {} at LSN {} lies outside the layer", e.key, e.first_lsn));
        }
        if !(HEADER_SIZE_BYTES as u64..header.index_offset).contains(&e.block_offset) || e.value_count == 0 {
            return bad(format!("index entry {} points at block {} with {} versions", e.key, e.block_offset, e.value_count));
        }
        // The newest version: inside the layer, after the oldest if there are several, the
        // oldest itself if there is one.
        if e.last_lsn.is_some_and(|last| !(header.lsn_start..header.lsn_end).contains(&last) || (last > e.first_lsn) != (e.value_count > 1))
        {
            return bad(format!(
                "index entry {} has versions from LSN {} to {:?}, {} of them",
                e.key, e.first_lsn, e.last_lsn, e.value_count
            ));
        }
        if header.kind == LayerKind::Image && e.value_count != 1 {
            return bad(format!("image layer has {} versions of {}", e.value_count, e.key));
        }
        total += u64::from(e.value_count);
        index.push(e);
    }
    if total != header.value_count {
        return Err(FormatError::new(92, format!("header says {} values, the index {total}", header.value_count)));
    }
    Ok(index)
}

/// Iterates over every version of a layer file in `(key, lsn)` order, checking order,
/// ranges and the header's counts as it goes.
pub struct LayerIter<'a> {
    layer: &'a LayerReader,
    next_block: u64,
    /// The current block: its offset, bytes, and the position of the next entry.
    block: Option<(u64, Bytes, usize)>,
    last: Option<(Key, Lsn)>,
    values: u64,
    blocks: u32,
    done: bool,
}

impl LayerIter<'_> {
    /// File offset of the block that held the entry returned last.
    pub fn current_block_offset(&self) -> u64 {
        self.block.as_ref().map_or(0, |(offset, _, _)| *offset)
    }

    fn advance(&mut self) -> Result<Option<(Key, Lsn, Value)>, LayerError> {
        let layer = self.layer;
        loop {
            if let Some((offset, block, pos)) = &mut self.block {
                if let Some((raw, next)) = format::decode_entry(block, *pos).map_err(|e| layer.corrupt(*offset, e))? {
                    *pos = next;
                    let (key, lsn, value) = layer.entry_value(block, *offset, raw)?;
                    if self.last >= Some((key, lsn)) {
                        return Err(layer.corrupt(*offset, format!("{key} at LSN {lsn} out of order")));
                    }
                    self.last = Some((key, lsn));
                    self.values += 1;
                    return Ok(Some((key, lsn, value)));
                }
                if *pos == 0 {
                    return Err(layer.corrupt(*offset, "empty block"));
                }
            }
            if self.next_block == layer.header.index_offset {
                if self.values != layer.header.value_count || self.blocks != layer.header.block_count {
                    return Err(layer.corrupt(
                        layer.header.index_offset,
                        format!(
                            "blocks hold {} values in {} blocks, the header says {} in {}",
                            self.values, self.blocks, layer.header.value_count, layer.header.block_count
                        ),
                    ));
                }
                return Ok(None);
            }
            let offset = self.next_block;
            let (block, next) = layer.read_block(offset)?;
            self.blocks += 1;
            self.next_block = next;
            self.block = Some((offset, block, 0));
        }
    }
}

impl Iterator for LayerIter<'_> {
    type Item = Result<(Key, Lsn, Value), LayerError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.advance().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

thread_local! {
    /// One zstd decompression context per thread, reused: creating one costs more than
    /// decompressing a 64 KiB block.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

fn decompress(payload: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        d.as_mut().expect("set above").decompress(payload, capacity)
    })
}
