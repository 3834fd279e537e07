//! Turns at periodic work among replicas. Every scheduler replica runs the monitor's and the
//! reconciler's timers, but each reads the whole cloud: N replicas asking Nova N times an
//! interval would only multiply the load. A timer that fires takes the cluster's turn (a
//! `task_claims` row held for one interval, never released) or skips, so the work runs
//! about once an interval whichever replicas are up, and goes on in another replica within
//! an interval of the one that took the turns stopping.

use blazar_db::TaskTerm;

use crate::{Service, ServiceResult};

/// The monitor's turns.
pub const MONITOR_TURN: &str = "monitor.turn";
/// The reconciler timer's turns (a repairing pass also holds `reconcile` while it runs).
pub const RECONCILE_TURN: &str = "reconcile.turn";

impl Service {
    /// Whether this replica takes the turn at `task` now: yes when no replica took one in
    /// the last `every`. The turn is held for `every` from now.
    pub async fn take_turn(&self, task: &str, every: std::time::Duration) -> ServiceResult<bool> {
        let now = self.now();
        let every = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::days(1));
        Ok(in_tx!(self, write, |tx| {
            let term = TaskTerm {
                task,
                holder: &self.worker_id,
                now,
                until: now + every,
            };
            Ok(tx.claim_task(&term).await?)
        })?)
    }
}
