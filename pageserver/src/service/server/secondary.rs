//! Warm secondaries, under a storage controller: the attached pageserver publishes each
//! tenant's heatmap to object storage every `heatmap_period_ms`, and a pageserver that
//! holds a tenant as secondary downloads the hottest layers it names, within
//! `secondary_disk_budget_bytes` per tenant, every `secondary_download_period_ms`, into
//! `<workdir>/secondary/<tenant>/<timeline>/<layer>-<generation>`. A secondary ingests
//! nothing: it only copies objects. When the controller attaches the tenant here (a
//! failover or a migration), the attach takes the copies that are the very objects the
//! loaded index names (`layerstore::remote::heatmap::adopt`), so reads find them on local
//! disk instead of downloading them one by one; what is left is removed. The format and
//! the rules for trusting a copy are in `layerstore::remote::heatmap`.
//!
//! The same thread flushes a newly attached tenant once it has caught up with its
//! safekeepers ([`Pageserver::flush_caught_up_attachments`]).
//!
//! One thread does both, for every tenant in turn. A tenant's sync runs under
//! `warming`, and checks before each download that the tenant is still held as secondary,
//! so an attach (which first takes the tenant out of the secondaries, then waits for
//! `warming`) waits for at most one layer's download.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerstore::remote::heatmap::{self, WarmOutcome};
use proto::TenantId;

use super::Pageserver;

/// Under the work directory: one directory of warm copies per tenant held as secondary.
pub const SECONDARY_DIR: &str = "secondary";

/// How often the set-aside copies of detached tenants are looked at again.
const SET_ASIDE_CHECK: Duration = Duration::from_secs(60);

/// How long after an attach the flush of what it replayed waits for the catch-up.
const CATCH_UP_WATCH: Duration = Duration::from_secs(600);

/// What the warm secondaries have done since the process started, for `/metrics`.
#[derive(Debug, Default)]
pub struct SecondaryStats {
    pub heatmaps_uploaded: std::sync::atomic::AtomicU64,
    pub layers_downloaded: std::sync::atomic::AtomicU64,
    pub bytes_downloaded: std::sync::atomic::AtomicU64,
    pub failures: std::sync::atomic::AtomicU64,
}

impl Pageserver {
    /// Where the warm copies of every tenant held as secondary are kept.
    pub fn warm_root(&self) -> std::path::PathBuf {
        self.conf.workdir.join(SECONDARY_DIR)
    }

    /// Where the warm copies of `tenant`'s layers are kept while this node is its secondary.
    pub fn warm_dir(&self, tenant: TenantId) -> std::path::PathBuf {
        self.warm_root().join(tenant.to_string())
    }

    /// What the warm copies of a tenant held as secondary come to, as of its last sync.
    pub fn warm_state(&self, tenant: TenantId) -> Option<WarmOutcome> {
        self.warm_state.lock().unwrap_or_else(|p| p.into_inner()).get(&tenant).copied()
    }

    /// Removes the warm copies of `tenant` (attached here now, or no longer held here).
    pub fn drop_warm_copies(&self, tenant: TenantId) {
        self.warm_state.lock().unwrap_or_else(|p| p.into_inner()).remove(&tenant);
        let dir = self.warm_dir(tenant);
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(tenant = %tenant, "could not remove the warm copies in {}: {e}", dir.display());
            }
        }
    }

    /// Starts the thread of heatmaps and warm secondaries (only under a controller).
    pub fn start_secondaries(self: &Arc<Self>) {
        if self.conf.controller_url.is_none() || self.remote.is_none() {
            return;
        }
        let ps = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("secondaries".into())
            .spawn(move || ps.secondaries_loop())
            .expect("spawn the secondaries thread");
        *self.warmer.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    fn secondaries_loop(&self) {
        let heatmap_period = Duration::from_millis(self.conf.heatmap_period_ms);
        let download_period = Duration::from_millis(self.conf.secondary_download_period_ms);
        let (mut heatmaps_due, mut downloads_due) = (Instant::now(), Instant::now());
        let mut cleaning_due = Instant::now() + SET_ASIDE_CHECK;
        while !self.stopping.load(Ordering::SeqCst) {
            if Instant::now() >= heatmaps_due {
                self.upload_heatmaps();
                heatmaps_due = Instant::now() + heatmap_period;
            }
            if Instant::now() >= downloads_due {
                self.warm_secondaries();
                downloads_due = Instant::now() + download_period;
            }
            self.flush_caught_up_attachments();
            if Instant::now() >= cleaning_due {
                // Copies set aside at a detach (a migration's end) while the new attachment
                // had not uploaded all they hold yet: removed once it has.
                if let Some(remote) = &self.remote {
                    super::placement::clean_set_aside(remote, &self.conf.workdir);
                }
                cleaning_due = Instant::now() + SET_ASIDE_CHECK;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A tenant attached here by the controller (a failover, a migration) replays the WAL
    /// since its last uploaded layers; once every timeline it follows has caught up with
    /// its safekeeper, what it replayed is flushed (and so uploaded), so that the next
    /// attachment after this one does not replay it all again. Without it, failovers
    /// closer together than the checkpoint timeout replay more and more WAL each time.
    fn flush_caught_up_attachments(&self) {
        let pending: Vec<(TenantId, Instant)> =
            self.catching_up.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (*k, *v)).collect();
        for (id, since) in pending {
            let forget = || {
                self.catching_up.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            };
            let Some(tenant) = self.tenants.get(id) else {
                forget();
                continue;
            };
            if since.elapsed() > CATCH_UP_WATCH {
                tracing::info!(tenant = %id, "not caught up with the safekeepers {CATCH_UP_WATCH:?} after the attach; the usual checkpoints take over");
                forget();
                continue;
            }
            // Only the timelines that follow their safekeepers replayed anything; one without
            // a receiver (being created or imported right now) is left alone.
            let followed: Vec<_> =
                tenant.timelines().into_iter().filter_map(|t| self.wal_receiver_status(id, t.timeline_id()).map(|s| (t, s))).collect();
            let caught_up = followed
                .iter()
                .all(|(t, s)| s.server_wal_end_lsn.is_some_and(|end| t.last_record_lsn() >= end && t.last_record_lsn().is_valid()));
            if !caught_up {
                continue;
            }
            forget();
            for (t, _) in followed {
                match self.checkpoint(id, t.timeline_id()) {
                    Ok(done) => tracing::info!(
                        tenant = %id,
                        timeline = %t.timeline_id(),
                        "caught up {:.1} s after the attach: flushed {} bytes of what was replayed, for upload",
                        since.elapsed().as_secs_f64(),
                        done.bytes_written
                    ),
                    Err(e) => tracing::warn!(tenant = %id, timeline = %t.timeline_id(), "flush after catching up failed: {e}"),
                }
            }
        }
    }

    fn upload_heatmaps(&self) {
        for id in self.tenants.ids() {
            let Some(tenant) = self.tenants.get(id) else { continue };
            let (Some(remote), Some(map)) = (tenant.remote(), tenant.heatmap()) else { continue };
            match remote.upload_heatmap(&map) {
                Ok(()) => {
                    self.secondary_stats.heatmaps_uploaded.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.secondary_stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(tenant = %id, "could not publish the heatmap: {e:#}");
                }
            }
        }
    }

    fn is_secondary(&self, tenant: TenantId) -> bool {
        self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).contains(&tenant)
    }

    fn warm_secondaries(&self) {
        let remote = self.remote.as_ref().expect("started only with remote storage");
        let held: Vec<TenantId> = self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        for id in held {
            let _warming = self.warming.lock().unwrap_or_else(|p| p.into_inner());
            if !self.is_secondary(id) || self.stopping.load(Ordering::SeqCst) {
                continue;
            }
            let map = match heatmap::download_heatmap(remote, id) {
                Ok(Some(map)) => map,
                Ok(None) => continue,
                Err(e) => {
                    self.secondary_stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(tenant = %id, "could not read the heatmap: {e:#}");
                    continue;
                }
            };
            let keep_going = || self.is_secondary(id) && !self.stopping.load(Ordering::SeqCst);
            match heatmap::warm(remote, id, &map, &self.warm_dir(id), self.conf.secondary_disk_budget_bytes, &keep_going) {
                Ok(done) => {
                    self.secondary_stats.layers_downloaded.fetch_add(done.downloaded_layers, Ordering::Relaxed);
                    self.secondary_stats.bytes_downloaded.fetch_add(done.downloaded_bytes, Ordering::Relaxed);
                    if done.downloaded_layers > 0 || done.removed_layers > 0 {
                        tracing::info!(
                            tenant = %id,
                            "warm secondary: downloaded {} layers ({} bytes), removed {}; holds {} layers ({} bytes)",
                            done.downloaded_layers,
                            done.downloaded_bytes,
                            done.removed_layers,
                            done.layers,
                            done.bytes
                        );
                    }
                    if self.is_secondary(id) {
                        self.warm_state.lock().unwrap_or_else(|p| p.into_inner()).insert(id, done);
                    }
                }
                Err(e) => {
                    self.secondary_stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(tenant = %id, "warming the secondary failed (tried again in the next round): {e:#}");
                }
            }
        }
    }
}
