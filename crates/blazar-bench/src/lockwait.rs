//! How long the server's PostgreSQL sessions waited for locks during a phase: a convoy
//! (requests queueing behind one lock) shows as lock wait growing with the clients while
//! throughput does not. PostgreSQL keeps no running total of lock wait, so the sessions
//! waiting on a lock (`pg_stat_activity.wait_event_type = 'Lock'`: row, transaction and
//! advisory locks) are counted every few milliseconds and the counts integrated over time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use tokio::task::JoinHandle;

/// Sampling period. A wait shorter than this can be missed or counted whole, so short
/// phases give rough figures; the share of time spent waiting is what compares. Every 5 ms
/// cost the server a seventh of its create throughput on two cores; every 20 ms, a few per
/// cent (within the run-to-run spread).
const PERIOD: Duration = Duration::from_millis(20);

/// Lock wait observed over a phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct LockWait {
    /// Session-milliseconds spent waiting for a lock, all sessions together.
    pub total_ms: f64,
    /// The most sessions seen waiting at once.
    pub most_waiting: i64,
}

/// A running sampler; `stop` ends it and answers what it saw.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: Option<JoinHandle<Result<LockWait, String>>>,
}

impl Sampler {
    /// Starts sampling the sessions of the database at `url` (the server's own database;
    /// the sampler's connection is left out of the count).
    pub async fn start(url: &str) -> Result<Sampler, String> {
        let mut conn = PgConnection::connect(url)
            .await
            .map_err(|e| format!("lock-wait sampler: cannot connect: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = LockWait::default();
            let mut last = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND wait_event_type = 'Lock'",
                )
                .fetch_one(&mut conn)
                .await
                .map_err(|e| format!("lock-wait sampler: {e}"))?;
                let now = Instant::now();
                seen.total_ms += waiting as f64 * (now - last).as_secs_f64() * 1000.0;
                seen.most_waiting = seen.most_waiting.max(waiting);
                last = now;
                tokio::time::sleep(PERIOD).await;
            }
            let _ = conn.close().await;
            Ok(seen)
        });
        Ok(Sampler {
            stop,
            task: Some(task),
        })
    }

    pub async fn stop(mut self) -> Result<LockWait, String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.task.take() {
            Some(task) => task
                .await
                .map_err(|e| format!("lock-wait sampler failed: {e}"))?,
            None => Ok(LockWait::default()),
        }
    }
}

impl Drop for Sampler {
    /// A sampler dropped without `stop` (a phase skipped) ends its task too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
