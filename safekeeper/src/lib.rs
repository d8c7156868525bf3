//! fjord's safekeeper (being built).

pub mod replication;

use std::sync::Arc;

use proto::{TenantId, TimelineId};

/// PLACEHOLDER so that `replication::serve` compiles on this branch: the safekeeper service
/// (timelines, storage, the listener) is being written on another branch and replaces this
/// type when the branches are merged. It has no timelines: every lookup fails.
#[derive(Debug, Default)]
pub struct Safekeeper {
    _private: (),
}

impl Safekeeper {
    /// PLACEHOLDER: the real one returns the timeline (which implements
    /// [`replication::WalSource`]); this one knows no timelines.
    pub fn replication_source(&self, tenant: TenantId, timeline: TimelineId) -> anyhow::Result<Arc<dyn replication::WalSource>> {
        anyhow::bail!("timeline {tenant}/{timeline} is unknown (this build has no timeline storage yet)")
    }
}
