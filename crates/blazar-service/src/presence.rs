//! This process's presence among the workers of its database, and the hand-over of what a
//! gone worker had claimed (see `blazar_db::presence`): a process killed while it carried
//! out an action, published a notification or delivered a webhook leaves claims that would
//! hold that work, and the later work of its leases and resources, until they run out. The
//! process that restarts it, or any other, ends them at once.

use std::time::Duration;

use crate::Service;

/// How often registered workers are looked at: a worker that dies while others run is
/// found this long later at most (a restarted one finds its predecessor at its start).
const LOOK_EVERY: Duration = Duration::from_secs(5);

impl Service {
    /// Registers this process as a worker, ends the claims of workers found gone, at once
    /// and then every `LOOK_EVERY`, and leaves at `shutdown`. Without a registration (a
    /// database in memory) there is nobody else to look for; a registration that fails (the
    /// database away at start) is tried again each time.
    pub async fn run_presence(&self, shutdown: impl Future<Output = ()>) {
        let mut presence = None;
        let mut warned = false;
        tokio::pin!(shutdown);
        loop {
            // Each step gives way to the shutdown: a registration may wait on a database
            // that is away.
            let step = async {
                match &mut presence {
                    None => match self
                        .store
                        .register_worker(&self.worker_id, self.now())
                        .await
                    {
                        Ok(Some(held)) => {
                            if warned {
                                tracing::info!("this worker is registered");
                            }
                            presence = Some(held);
                        }
                        Ok(None) => return false,
                        Err(e) => {
                            if !warned {
                                tracing::warn!(error = %e, "cannot register this worker yet: \
                                    until it is, the claims of a worker that dies run out \
                                    instead of being taken over at once");
                                warned = true;
                            }
                        }
                    },
                    Some(held) => {
                        if let Err(e) = held.keep(&self.store, self.now()).await {
                            tracing::warn!(error = %e, "cannot hold this worker's presence");
                        }
                    }
                }
                self.release_gone_workers().await;
                true
            };
            tokio::select! {
                () = &mut shutdown => break,
                go_on = step => if !go_on { return },
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
        match presence {
            Some(held) => {
                if let Err(e) = held.leave(&self.store).await {
                    tracing::warn!(error = %e, "cannot unregister this worker");
                }
            }
            // Stopped before (or while) registering: a lock file may have been made.
            None => self.store.forget_unregistered_worker(&self.worker_id),
        }
    }

    /// Ends the claims of every worker found gone, and wakes this process's loops for what
    /// they held. Returns how many claims were ended.
    pub async fn release_gone_workers(&self) -> u64 {
        let gone = match self.store.gone_workers(&self.worker_id).await {
            Ok(gone) => gone,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for gone workers");
                return 0;
            }
        };
        let mut released = 0;
        for worker in gone {
            match self.store.release_worker(&worker).await {
                Ok(claims) => {
                    tracing::info!(worker = %worker, claims, "worker gone: its claims ended");
                    released += claims;
                }
                Err(e) => {
                    tracing::warn!(worker = %worker, error = %e, "cannot end a gone worker's claims")
                }
            }
        }
        if released > 0 {
            self.wake_workers();
            self.wake_publisher();
            self.wake_webhooks();
            self.reconcile_wake.notify_one();
        }
        released
    }
}
