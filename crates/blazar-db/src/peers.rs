//! Processes on one PostgreSQL database telling each other that work is waiting.
//!
//! Each process's loops (scheduler, action workers, publisher, webhook senders, long polls
//! and event streams) are woken at once by commits of their own process and otherwise look
//! at the database every poll. A lease created through a `--role api` replica to start now
//! would wait for the scheduler's next poll (a second by default): PostgreSQL's
//! LISTEN/NOTIFY carries the same wake-ups between processes. A signal is only a hint,
//! never state: a process that misses one (it was reconnecting) finds the work at its
//! next poll, as before. SQLite has no such channel and needs none (one process).

use sqlx::postgres::PgListener;

use crate::{Backend, DbResult, Store};

impl Store {
    /// The channel of this installation: installations in other schemas of the same
    /// database have channels of their own, as they have advisory locks of their own.
    fn peer_channel(&self) -> String {
        match self.locks.0 {
            0 => "blazar_wake".to_string(),
            space => format!("blazar_wake_{space:08x}"),
        }
    }

    /// Sends `payload` to every process listening on this installation's channel
    /// (this one's listener included); nothing on SQLite.
    pub async fn signal_peers(&self, payload: &str) -> DbResult<()> {
        if self.backend != Backend::Postgres {
            return Ok(());
        }
        // pg_notify returns void, which the Any driver cannot decode: count it instead.
        sqlx::query("SELECT COUNT(*) FROM (SELECT pg_notify($1, $2)) AS sent")
            .bind(self.peer_channel())
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A listener on this installation's channel, on a connection of its own (outside the
    /// pool); `None` on SQLite.
    pub async fn peer_listener(&self) -> DbResult<Option<PeerListener>> {
        let Some(url) = self.listen_url.as_deref() else {
            return Ok(None);
        };
        let mut listener = PgListener::connect(url).await?;
        listener.listen(&self.peer_channel()).await?;
        Ok(Some(PeerListener(listener)))
    }
}

/// Signals from the processes on this installation's channel.
pub struct PeerListener(PgListener);

impl PeerListener {
    /// The next signal's payload. A lost connection is made again by the next call (signals
    /// sent meanwhile are lost; the pollers find their work anyway).
    pub async fn recv(&mut self) -> DbResult<String> {
        let notification = self.0.recv().await?;
        Ok(notification.payload().to_string())
    }
}
