//! What the storage's syncs did, for metrics: a leaf that the WAL store, its journal's
//! writer and the control file's writes all count into.

/// What one sync did, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncStats {
    pub fsyncs: u64,
    pub fsync_seconds: f64,
}

impl SyncStats {
    pub(super) fn timed<T>(&mut self, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let t = std::time::Instant::now();
        let r = f();
        self.fsyncs += 1;
        self.fsync_seconds += t.elapsed().as_secs_f64();
        r
    }
}
