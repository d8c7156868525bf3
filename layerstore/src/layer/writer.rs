//! Writes one layer file, crash-safely.
//!
//! Values arrive in strictly increasing `(key, lsn)` order and are packed into blocks of
//! about `block_size_bytes`, each compressed with zstd and framed with its CRC. The index
//! grows as keys arrive (one entry per key, pointing at the block of its oldest version).
//! `finish` appends the index, writes the header over the placeholder at offset 0, fsyncs,
//! renames the temporary file to the layer's name, fsyncs the directory, and reopens the
//! file through the reader, so that what was written is checked once before anyone uses it.
//!
//! Invariants (checked, an error on violation): `(key, lsn)` strictly increasing, every LSN
//! inside the layer's LSN range, every key inside the key range given to `finish`; an image
//! layer holds only images at its own LSN. A writer dropped before `finish` removes its
//! temporary file; one left by a crash is removed when the timeline loads.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{ensure, Context};
use proto::{Key, KeyRange, Lsn};

use super::file::LayerFile;
use super::format::{self, Header, IndexEntry, HEADER_SIZE_BYTES};
use super::name::{LayerDesc, LayerKind};
use crate::config::StorageConfig;
use crate::value::Value;

/// Distinguishes temporary files of concurrent writers in one directory.
static TEMP_FILE_SEQ: AtomicU64 = AtomicU64::new(0);

pub struct LayerWriter {
    dir: PathBuf,
    tmp_path: PathBuf,
    file: Option<BufWriter<File>>,
    kind: LayerKind,
    lsn_start: Lsn,
    lsn_end: Lsn,
    block_size_bytes: usize,
    compression_level: i32,
    /// Entries not yet compressed into a block.
    block_buf: Vec<u8>,
    /// File offset where the next block frame goes.
    data_end: u64,
    index: Vec<IndexEntry>,
    last: Option<(Key, Lsn)>,
    value_count: u64,
    block_count: u32,
    /// Set once the file has its final name; until then `Drop` removes the temporary file.
    renamed: bool,
}

impl LayerWriter {
    /// Starts a delta layer for versions in `lsn_range`, or an image layer at `lsn_range.start`
    /// (then `lsn_range` must be `lsn..lsn+1`).
    pub fn new(dir: &Path, kind: LayerKind, lsn_range: std::ops::Range<Lsn>, conf: &StorageConfig) -> anyhow::Result<Self> {
        ensure!(lsn_range.start < lsn_range.end, "empty LSN range {}..{}", lsn_range.start, lsn_range.end);
        ensure!(kind == LayerKind::Delta || lsn_range.end.0 == lsn_range.start.0 + 1, "image layer LSN range must be one LSN");
        let seq = TEMP_FILE_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp_path = dir.join(format!("layer-{}-{seq}{}", std::process::id(), crashsafe::TEMP_SUFFIX));
        let file =
            OpenOptions::new().write(true).create_new(true).open(&tmp_path).with_context(|| format!("create {}", tmp_path.display()))?;
        let mut file = BufWriter::new(file);
        // Placeholder, overwritten by `finish` once the index position is known.
        file.write_all(&[0u8; HEADER_SIZE_BYTES]).with_context(|| format!("write {}", tmp_path.display()))?;
        Ok(LayerWriter {
            dir: dir.to_path_buf(),
            tmp_path,
            file: Some(file),
            kind,
            lsn_start: lsn_range.start,
            lsn_end: lsn_range.end,
            block_size_bytes: conf.block_size_bytes,
            compression_level: conf.compression_level,
            block_buf: Vec::new(),
            data_end: HEADER_SIZE_BYTES as u64,
            index: Vec::new(),
            last: None,
            value_count: 0,
            block_count: 0,
            renamed: false,
        })
    }

    /// Appends one version.
    pub fn put(&mut self, key: Key, lsn: Lsn, value: &Value) -> anyhow::Result<()> {
        ensure!(key != Key::MAX, "Key::MAX holds no value");
        // `None` sorts first, so the first put always passes.
        ensure!(self.last < Some((key, lsn)), "out of order: {key} at {lsn} after {:?}", self.last);
        ensure!((self.lsn_start..self.lsn_end).contains(&lsn), "LSN {lsn} outside {}..{}", self.lsn_start, self.lsn_end);
        if self.kind == LayerKind::Image {
            ensure!(matches!(value, Value::Image(_)), "image layer can only hold images, got a record for {key}");
        }
        match self.index.last_mut() {
            Some(entry) if entry.key == key => {
                entry.value_count = entry.value_count.checked_add(1).context("too many versions of one key")?;
                entry.last_lsn = Some(lsn);
            }
            _ => self.index.push(IndexEntry { key, first_lsn: lsn, last_lsn: Some(lsn), block_offset: self.data_end, value_count: 1 }),
        }
        format::encode_entry(&mut self.block_buf, key, lsn, value.tag(), value.payload());
        self.last = Some((key, lsn));
        self.value_count += 1;
        if self.block_buf.len() >= self.block_size_bytes {
            self.write_block()?;
        }
        Ok(())
    }

    /// Bytes written so far, plus the pending block uncompressed: what target sizes compare.
    pub fn size_bytes(&self) -> u64 {
        self.data_end + self.block_buf.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.value_count == 0
    }

    /// The last key put, if any.
    pub fn last_key(&self) -> Option<Key> {
        self.last.map(|(k, _)| k)
    }

    fn write_block(&mut self) -> anyhow::Result<()> {
        if self.block_buf.is_empty() {
            return Ok(());
        }
        let uncompressed_len = u32::try_from(self.block_buf.len()).context("block exceeds 4 GiB")?;
        ensure!(self.block_buf.len() <= format::BLOCK_SIZE_BYTES_MAX, "block of {} bytes is too large", self.block_buf.len());
        let payload = compress(&self.block_buf, self.compression_level).context("compress block")?;
        let frame = format::encode_block_frame(&payload, uncompressed_len);
        let file = self.file.as_mut().context("layer writer already finished")?;
        file.write_all(&frame).and_then(|()| file.write_all(&payload)).with_context(|| format!("write {}", self.tmp_path.display()))?;
        self.data_end += (frame.len() + payload.len()) as u64;
        self.block_count += 1;
        self.block_buf.clear();
        Ok(())
    }

    /// Completes the file as the layer covering `key_range` and returns it opened.
    pub fn finish(mut self, key_range: KeyRange) -> anyhow::Result<LayerFile> {
        ensure!(!key_range.is_empty(), "empty key range {key_range}");
        if let (Some(first), Some(last)) = (self.index.first(), self.index.last()) {
            ensure!(
                key_range.contains(&first.key) && key_range.contains(&last.key),
                "keys {}..={} outside the layer's key range {key_range}",
                first.key,
                last.key
            );
        }
        let desc = match self.kind {
            LayerKind::Delta => LayerDesc::delta(key_range, self.lsn_start..self.lsn_end),
            LayerKind::Image => LayerDesc::image(key_range, self.lsn_start),
        };
        self.write_block()?;
        let mut index_bytes = Vec::with_capacity(self.index.len() * format::INDEX_ENTRY_SIZE_BYTES);
        for entry in &self.index {
            entry.encode(&mut index_bytes);
        }
        let header = Header {
            version: format::FORMAT_VERSION,
            kind: self.kind,
            key_range,
            lsn_start: self.lsn_start,
            lsn_end: self.lsn_end,
            index_offset: self.data_end,
            index_len: index_bytes.len() as u64,
            index_crc: crc32c::crc32c(&index_bytes),
            key_count: u32::try_from(self.index.len()).context("too many keys in one layer")?,
            value_count: self.value_count,
            block_count: self.block_count,
        };
        let mut writer = self.file.take().context("layer writer already finished")?;
        let tmp = self.tmp_path.clone();
        let io = |e: std::io::Error| anyhow::Error::new(e).context(format!("write {}", tmp.display()));
        writer.write_all(&index_bytes).map_err(io)?;
        let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
        file.write_all_at(&header.encode(), 0).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        let path = self.dir.join(desc.file_name());
        crashsafe::durable_rename(&self.tmp_path, &path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
        self.renamed = true;
        LayerFile::open(&path).context("reopen the layer file just written")
    }
}

impl Drop for LayerWriter {
    fn drop(&mut self) {
        // Not renamed means `finish` did not complete: the temporary file is junk.
        if !self.renamed {
            drop(self.file.take());
            match fs::remove_file(&self.tmp_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("could not remove unfinished layer file {}: {e}", self.tmp_path.display()),
            }
        }
    }
}

thread_local! {
    /// One zstd compression context per thread and level, reused: creating one (tables sized
    /// for the level) costs about as much as compressing a block, and a flush of the open
    /// layer compresses one every `block_size_bytes` of values.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { std::cell::RefCell::new(None) };
}

fn compress(block: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        c.as_mut().expect("set above").1.compress(block)
    })
}
