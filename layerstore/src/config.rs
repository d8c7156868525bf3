//! The storage engine's tunables, one typed struct with defaults that work on a laptop.
//!
//! Every tunable has a hostile value in the tests (tiny blocks, tiny layers, compaction
//! after every flush) so that the code paths that only large databases reach by size are
//! exercised on a few kilobytes. `validate` rejects values the engine cannot work with,
//! so a bad configuration fails at startup instead of in the middle of a flush.

use serde::{Deserialize, Serialize};

use crate::value::VALUE_SIZE_BYTES_MAX;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Uncompressed size at which a layer file block is cut and compressed. Smaller blocks
    /// mean less to decompress per read and a worse compression ratio.
    pub block_size_bytes: usize,
    /// zstd level for layer file blocks; 1 favours ingest and compaction speed.
    pub compression_level: i32,
    /// Open layer size at which `maybe_freeze_and_flush` freezes and flushes it. Bounds the
    /// log to re-ingest after a crash and the size of an L0 delta layer.
    pub checkpoint_distance_bytes: u64,
    /// Age (since its first put) at which `maybe_freeze_and_flush` freezes and flushes the
    /// open layer whatever its size. Under a steady trickle of writes the distance alone
    /// may take hours to fill; this bounds how long new versions stay only in memory, so
    /// the disk-consistent and remote-consistent LSNs move (and the caller can drop its
    /// log below them) at least this often. The price is smaller L0 layers, which
    /// compaction merges. 0 turns it off.
    pub checkpoint_timeout_ms: u64,
    /// Number of L0 delta layers at which `compact` merges them into L1 layers.
    pub compaction_l0_threshold: usize,
    /// Size at which compaction starts a new L1 delta layer (at a key boundary).
    pub compaction_target_size_bytes: u64,
    /// Size at which image layer creation starts a new image layer (at a key boundary).
    pub image_layer_target_size_bytes: u64,
    /// Retention window in LSN distance: `Tenant::gc_iteration` keeps every version needed
    /// to read any LSN within this many bytes of log below each timeline's last record.
    pub gc_horizon_bytes: u64,
    /// Delta depth at which `create_image_layers_where_needed` rebuilds a key range: the
    /// number of delta layer files a read of a key there may search above the newest
    /// image layer. Bounds how many layers (and so how many records) a read walks.
    pub image_creation_threshold: usize,
    /// How long a newer generation of a tenant may stay claimed without becoming active (an
    /// attach uploads an index of its own at once) before the live attachment takes the
    /// claim for dead and claims the next generation itself (`remote` module). Meanwhile its
    /// deletions wait and its remote-consistent LSN holds. Longer than an attach takes.
    pub generation_claim_grace_ms: u64,
    /// A key whose in-memory versions since its newest standalone version (an image or an
    /// initializing record) reach a multiple of this many records is queued for a fold
    /// (`Timeline::take_long_chains`): the caller rebuilds its value and replaces the newest
    /// record with that image (`Timeline::replace_with_image`), so that no read replays more
    /// than about this many records from memory. 0 turns the queue off.
    pub fold_after_records: u32,
    /// The same trigger by the records' bytes: a key whose records since its newest
    /// standalone version cross a multiple of this many bytes is queued too. 0 turns it off.
    pub fold_after_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            block_size_bytes: 64 * 1024,
            compression_level: 1,
            checkpoint_distance_bytes: 256 * 1024 * 1024,
            checkpoint_timeout_ms: 60_000,
            compaction_l0_threshold: 10,
            compaction_target_size_bytes: 128 * 1024 * 1024,
            image_layer_target_size_bytes: 128 * 1024 * 1024,
            gc_horizon_bytes: 64 * 1024 * 1024,
            image_creation_threshold: 3,
            generation_claim_grace_ms: 10_000,
            fold_after_records: 128,
            fold_after_bytes: 1024 * 1024,
        }
    }
}

impl StorageConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=VALUE_SIZE_BYTES_MAX).contains(&self.block_size_bytes),
            "block_size_bytes must be between 1 and {VALUE_SIZE_BYTES_MAX}, not {}",
            self.block_size_bytes
        );
        anyhow::ensure!(
            zstd::compression_level_range().contains(&self.compression_level),
            "compression_level {} is not a zstd level",
            self.compression_level
        );
        anyhow::ensure!(self.compaction_l0_threshold >= 1, "compaction_l0_threshold must be at least 1");
        anyhow::ensure!(self.image_creation_threshold >= 1, "image_creation_threshold must be at least 1");
        // A chain of one record is never worth an image; 2 is the hostile test value.
        anyhow::ensure!(self.fold_after_records != 1, "fold_after_records must be 0 (off) or at least 2, not 1");
        anyhow::ensure!(
            self.fold_after_bytes == 0 || self.fold_after_bytes >= 1024,
            "fold_after_bytes must be 0 (off) or at least 1024, not {}",
            self.fold_after_bytes
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_rejected() {
        StorageConfig::default().validate().unwrap();
        let bad = StorageConfig { block_size_bytes: 0, ..StorageConfig::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("block_size_bytes"));
        let bad = StorageConfig { compaction_l0_threshold: 0, ..StorageConfig::default() };
        assert!(bad.validate().is_err());
        let bad = StorageConfig { image_creation_threshold: 0, ..StorageConfig::default() };
        assert_eq!(bad.validate().unwrap_err().to_string(), "image_creation_threshold must be at least 1");
        let bad = StorageConfig { fold_after_records: 1, ..StorageConfig::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("fold_after_records"));
        let bad = StorageConfig { fold_after_bytes: 100, ..StorageConfig::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("fold_after_bytes"));
        let off = StorageConfig { fold_after_records: 0, fold_after_bytes: 0, ..StorageConfig::default() };
        off.validate().unwrap();
    }
}
