//! The ingest gate of a timeline: what the WAL receiver and a basebackup at the newest LSN
//! share, beside the engine's own state.
//!
//! Two facts live here rather than in the engine, because they are about PostgreSQL and
//! about the service, not about storing versions:
//! - The gate itself. The WAL receiver holds it from confirming a batch of WAL as flushed
//!   (to the safekeepers, or to the compute it follows) until that batch is ingested, and a
//!   basebackup at the newest LSN holds it while it picks that LSN. A compute started from
//!   such a basebackup therefore starts after every commit that was confirmed: the newest
//!   LSN never falls between a confirmation and its ingest.
//! - Where the last ingested WAL record starts. A server started at the end of that record
//!   needs it as its previous-record pointer (`pg_control`). It is known only while the
//!   record is still the last one ingested, and only in memory: after a restart, an import
//!   or a branch it is unknown, and basebackup writes none.

use std::sync::{Mutex, MutexGuard};

use proto::Lsn;

use crate::pgdata::walingest::LastRecord;

#[derive(Debug, Default)]
pub struct IngestGate {
    gate: Mutex<()>,
    last_record: Mutex<Option<LastRecord>>,
}

impl IngestGate {
    /// Holds the gate until the guard is dropped. See the module documentation.
    pub fn hold(&self) -> MutexGuard<'_, ()> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the last WAL record the receiver ingested (called under the gate).
    pub fn set_last_record(&self, record: Option<LastRecord>) {
        *self.last_record.lock().unwrap_or_else(|e| e.into_inner()) = record;
    }

    /// Where the record ending at `end` starts, if it is the last one ingested here.
    pub fn prev_record_lsn(&self, end: Lsn) -> Option<Lsn> {
        self.last_record.lock().unwrap_or_else(|e| e.into_inner()).filter(|r| r.end == end).map(|r| r.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_record_is_known_only_at_the_last_records_end() {
        let gate = IngestGate::default();
        assert_eq!(gate.prev_record_lsn(Lsn(100)), None);
        gate.set_last_record(Some(LastRecord { start: Lsn(60), end: Lsn(100) }));
        assert_eq!(gate.prev_record_lsn(Lsn(100)), Some(Lsn(60)));
        assert_eq!(gate.prev_record_lsn(Lsn(99)), None);
        gate.set_last_record(None);
        assert_eq!(gate.prev_record_lsn(Lsn(100)), None);
    }
}
