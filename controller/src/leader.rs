//! The leader lease: a row in the database that one instance holds until it expires by the
//! database's clock. The holder renews it every third of its length. This instance believes
//! it leads only until (the moment it *sent* its last successful renewal) + lease, which is
//! before the database's expiry; a renewal that fails or is late ends the belief, and every
//! change is fenced in the database anyway ([`crate::persistence`]).

use std::sync::Arc;
use std::time::Instant;

use crate::{Controller, LeaseView};

/// Renews or takes the lease forever; returns only if the task is cancelled.
pub async fn run(ctl: Arc<Controller>) {
    let period = ctl.config.lease / 3;
    let mut was_leader = false;
    loop {
        let sent = Instant::now();
        let outcome = ctl.lease_db.acquire_lease(&ctl.instance, &ctl.config.advertise, ctl.config.lease).await;
        if let Err(e @ crate::persistence::DbError::SchemaChanged(_)) = &outcome {
            // Another controller upgraded the schema: this one must not lead with it, and
            // ends (the process stops, its lease left to lapse).
            tracing::error!("{e}: this controller stops");
            ctl.leadership.lock().expect("not poisoned").until = None;
            return;
        }
        // Who leads, for /v1/status and refusals: this instance, or the holder of a live lease.
        let view = match &outcome {
            Ok(true) => LeaseView { leader_address: Some(ctl.config.advertise.clone()), database: "ok".into() },
            Ok(false) => match ctl.lease_db.lease().await {
                Ok(l) => LeaseView { leader_address: l.live.then_some(l.address), database: "ok".into() },
                Err(e) => LeaseView { leader_address: None, database: e.to_string() },
            },
            Err(e) => LeaseView { leader_address: None, database: e.to_string() },
        };
        *ctl.lease_view.lock().expect("not poisoned") = view;
        {
            let mut l = ctl.leadership.lock().expect("not poisoned");
            match outcome {
                Ok(true) => l.until = Some(sent + ctl.config.lease),
                // Another instance holds a live lease.
                Ok(false) => l.until = None,
                // Unknown: the belief lasts until its own end, no longer.
                Err(e) => {
                    ctl.metrics.database_errors.inc();
                    tracing::warn!("could not renew or take the leader lease: {e}");
                    if l.until.is_some_and(|t| Instant::now() >= t) {
                        l.until = None;
                    }
                }
            }
        }
        let leader = ctl.is_leader();
        if leader != was_leader {
            if leader {
                tracing::info!("this controller ({}) now leads: it heartbeats every pageserver and fails tenants over", ctl.instance);
                // Health is observed afresh: no node is offline before this leader has
                // waited the whole grace for it; so are migrations' catch-up marks.
                ctl.health.lock().expect("not poisoned").clear();
                ctl.migration_marks.lock().expect("not poisoned").clear();
            } else {
                tracing::warn!("this controller ({}) no longer leads", ctl.instance);
                ctl.health.lock().expect("not poisoned").clear();
                for a in ["online", "offline", "unknown"] {
                    ctl.metrics.nodes.with_label_values(&[a]).set(0);
                }
            }
            was_leader = leader;
        }
        ctl.metrics.leader.set(i64::from(leader));
        tokio::time::sleep(period).await;
    }
}
