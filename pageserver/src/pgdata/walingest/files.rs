//! Ingest from PostgreSQL's own WAL files (`pg_wal/`), for imports, tests and benchmarks:
//! read the segments in order from a start LSN and ingest every record until the WAL ends,
//! or until a stop LSN (`ingest_pg_wal_until`), after which a later call continues from the
//! timeline's last record LSN.
//!
//! The end of WAL is found as PostgreSQL's recovery finds it: the first record that fails
//! to decode (zeros after the last record, or a recycled segment whose page addresses are
//! from the past), or a missing segment file. That is not an error here; it is reported
//! in `WalFilesIngested::stopped_by`, so a caller that knows where the WAL should end can
//! check it got there.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Context;
use pgwal::{DecoderConfig, WalStreamDecoder};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::Lsn;

use super::WalIngest;

/// Bytes read from a segment file at a time.
const READ_CHUNK_BYTES: usize = 1024 * 1024;

/// What `ingest_pg_wal` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalFilesIngested {
    pub start_lsn: Lsn,
    /// The end of the last record ingested (the last record LSN), or `start_lsn`.
    pub end_lsn: Lsn,
    pub records: u64,
    /// Why reading stopped: the decoder's message at the end of WAL, a missing file, or
    /// the stop LSN.
    pub stopped_by: String,
}

/// The name of the 16 MiB WAL segment file holding `lsn` on PostgreSQL timeline `tli`.
pub fn wal_segment_file_name(tli: u32, lsn: Lsn) -> String {
    pgwal::segment::segment_file_name(tli, lsn.segment_number(), WAL_SEGMENT_SIZE_BYTES)
}

impl WalIngest {
    /// Ingests the WAL in `pg_wal` (PostgreSQL timeline `tli`) from `start`, a record
    /// start or page boundary, to its end. Errors are failures to read files or to ingest;
    /// the end of WAL is not one (see the module documentation).
    pub fn ingest_pg_wal(&mut self, pg_wal: &Path, tli: u32, start: Lsn) -> anyhow::Result<WalFilesIngested> {
        self.ingest_pg_wal_until(pg_wal, tli, start, Lsn::MAX)
    }

    /// As `ingest_pg_wal`, but stops before the first record that ends after `stop`: the
    /// timeline then stands at the last record ending at or before `stop`, which is where
    /// the next call starts (`timeline().last_record_lsn()`, the start of the next record).
    pub fn ingest_pg_wal_until(&mut self, pg_wal: &Path, tli: u32, start: Lsn, stop: Lsn) -> anyhow::Result<WalFilesIngested> {
        let span = tracing::info_span!("wal_ingest", tenant_id = %self.timeline.tenant_id(), timeline_id = %self.timeline.timeline_id());
        let _entered = span.enter();
        let mut decoder = WalStreamDecoder::new(start, DecoderConfig::default())?;
        let mut records = 0u64;
        let mut buf = vec![0u8; READ_CHUNK_BYTES];
        let stopped_by = 'segments: loop {
            let at = decoder.next_feed_lsn();
            let name = wal_segment_file_name(tli, at);
            let path = pg_wal.join(&name);
            let mut file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::NotFound => break format!("WAL segment {name} does not exist"),
                Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
            };
            file.seek(SeekFrom::Start(at.segment_offset())).with_context(|| format!("seek in {}", path.display()))?;
            loop {
                let n = read_full(&mut file, &mut buf).with_context(|| format!("read {}", path.display()))?;
                if n == 0 {
                    break;
                }
                decoder.feed_bytes(&buf[..n]);
                loop {
                    match decoder.poll_decode() {
                        Ok(Some(record)) if record.end_lsn() > stop => {
                            break 'segments format!("the record at {} ends after the stop LSN {stop}", record.start_lsn());
                        }
                        Ok(Some(record)) => {
                            let decoded = record.decode()?;
                            self.ingest_record(&decoded, record.end_lsn())?;
                            records += 1;
                        }
                        Ok(None) => break,
                        Err(end) => break 'segments end.to_string(),
                    }
                }
            }
            if decoder.next_feed_lsn().segment_offset() != 0 {
                break format!("WAL segment {name} is shorter than {WAL_SEGMENT_SIZE_BYTES} bytes");
            }
        };
        let end_lsn = self.timeline.last_record_lsn().max(start);
        // Every streaming session starts with this replay; one that found nothing (a
        // receiver waiting for a new branch's first WAL asks every few seconds) is no news.
        if records > 0 {
            tracing::info!("ingested {records} WAL records from {start} to {end_lsn}; stopped: {stopped_by}");
        } else {
            tracing::debug!("ingested no WAL records from {start}; stopped: {stopped_by}");
        }
        Ok(WalFilesIngested { start_lsn: start, end_lsn, records, stopped_by })
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_file_names_follow_postgres() {
        assert_eq!(wal_segment_file_name(1, Lsn(0x0100_0028)), "000000010000000000000001");
        assert_eq!(wal_segment_file_name(2, Lsn(0x1_FF00_0000)), "0000000200000001000000FF");
    }
}
