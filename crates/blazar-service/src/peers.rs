//! Wake-ups between the processes on one PostgreSQL database (see `blazar_db::peers`).
//!
//! A commit rings this process's loops at once (`in_tx!`); it also marks what it wrote
//! here, and one task sends the marks to the other processes, at most one signal per
//! `SEND_GAP` however many commits there were, so a busy replica costs the database a few
//! dozen small statements a second, not one per request. Each process's listener rings
//! its own loops for what the others marked. Polling stays the guarantee: a signal lost
//! while a listener reconnects delays work by a poll at most, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::Service;

/// An event is due soon: the scheduler should look now.
pub(crate) const EVENTS: u8 = 1;
/// Actions were recorded: the action workers should claim them.
pub(crate) const ACTIONS: u8 = 1 << 1;
/// Notifications were written: the publisher should send them.
pub(crate) const NOTIFICATIONS: u8 = 1 << 2;
/// Webhook deliveries were written.
pub(crate) const WEBHOOKS: u8 = 1 << 3;
/// A lease changed: long polls and event streams should look again.
pub(crate) const LEASES: u8 = 1 << 4;

/// The marks of a commit that changed a lease, recorded actions, wrote notifications,
/// and wrote webhook deliveries (each as said).
pub(crate) fn marks(leases: bool, actions: bool, notifications: bool, webhooks: bool) -> u8 {
    [
        (leases, LEASES),
        (actions, ACTIONS),
        (notifications, NOTIFICATIONS),
        (webhooks, WEBHOOKS),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |all, (_, mark)| all | mark)
}

/// The shortest pause between two signals of one process: commits meanwhile are sent
/// together. Short against the pollers' second, long enough that a replica under load
/// sends a few dozen signals a second.
const SEND_GAP: Duration = Duration::from_millis(25);

/// An event due within this long is signalled to the scheduler of another process; one due
/// later is found by that scheduler's own poll in time (polls are at most 10 s apart).
pub(crate) const EVENT_HORIZON: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// What this process has to tell the others, not sent yet.
#[derive(Default)]
pub(crate) struct PeerSignals {
    marks: AtomicU8,
    ring: Notify,
    /// Set once the sender runs: until then (SQLite, or a process that does not run it)
    /// marks are not kept.
    enabled: std::sync::atomic::AtomicBool,
}

impl Service {
    /// Marks what a commit wrote, for the other processes.
    pub(crate) fn signal_peers(&self, marks: u8) {
        let signals = &self.peer_signals;
        if marks != 0 && signals.enabled.load(Ordering::Relaxed) {
            signals.marks.fetch_or(marks, Ordering::SeqCst);
            signals.ring.notify_one();
        }
    }

    /// Sends this process's marks to the others and rings this process's loops for theirs,
    /// until `shutdown`; returns at once on SQLite.
    pub async fn run_peer_signals(&self, shutdown: impl Future<Output = ()>) {
        if self.store.backend() != blazar_db::Backend::Postgres {
            return;
        }
        self.peer_signals.enabled.store(true, Ordering::SeqCst);
        tokio::pin!(shutdown);
        tokio::select! {
            () = self.send_peer_signals() => {}
            () = self.receive_peer_signals() => {}
            () = &mut shutdown => {}
        }
        self.peer_signals.enabled.store(false, Ordering::SeqCst);
    }

    async fn send_peer_signals(&self) {
        let signals = Arc::clone(&self.peer_signals);
        loop {
            signals.ring.notified().await;
            let marks = signals.marks.swap(0, Ordering::SeqCst);
            if marks != 0 {
                let payload = format!("{} {marks}", self.worker_id);
                if let Err(e) = self.store.signal_peers(&payload).await {
                    // The others find the work at their next poll.
                    tracing::debug!(error = %e, "could not signal the other processes");
                }
            }
            tokio::time::sleep(SEND_GAP).await;
        }
    }

    async fn receive_peer_signals(&self) {
        loop {
            let mut listener = match self.store.peer_listener().await {
                Ok(Some(listener)) => listener,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for the other processes' signals; polling only, trying again");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    continue;
                }
            };
            loop {
                match listener.recv().await {
                    Ok(payload) => self.take_peer_signal(&payload),
                    Err(e) => {
                        tracing::warn!(error = %e, "lost the other processes' signals; listening again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        break;
                    }
                }
            }
        }
    }

    /// Rings this process's loops for what another process marked (its own are ignored:
    /// its commits rang them already).
    fn take_peer_signal(&self, payload: &str) {
        let Some((from, marks)) = payload.split_once(' ') else {
            return;
        };
        if from == &*self.worker_id {
            return;
        }
        let Ok(marks) = marks.parse::<u8>() else {
            return;
        };
        if marks & EVENTS != 0 {
            self.wake.notify_one();
        }
        if marks & ACTIONS != 0 {
            self.wake_workers();
        }
        if marks & NOTIFICATIONS != 0 {
            self.wake_publisher();
        }
        if marks & WEBHOOKS != 0 {
            self.wake_webhooks();
        }
        if marks & LEASES != 0 {
            self.announce_lease_change();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_marks_what_it_wrote() {
        assert_eq!(marks(false, false, false, false), 0);
        assert_eq!(marks(true, false, true, false), LEASES | NOTIFICATIONS);
        assert_eq!(
            marks(true, true, true, true),
            LEASES | ACTIONS | NOTIFICATIONS | WEBHOOKS
        );
        assert_eq!(EVENTS & (LEASES | ACTIONS | NOTIFICATIONS | WEBHOOKS), 0);
    }
}
