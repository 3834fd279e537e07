//! Which processes are alive, so that what a process that died had claimed (actions,
//! notifications, webhook deliveries, tasks) is taken over at once instead of when its
//! claims run out (a minute for an action, the webhook timeout and more for a delivery).
//!
//! Each process that claims work registers in `workers` and holds a lock of its own for as
//! long as it runs: on PostgreSQL a session advisory lock on a connection outside the pool,
//! on SQLite an exclusive lock on a file beside the database (processes that share a SQLite
//! file share a machine). The database or the operating system drops the lock when the
//! process ends, however it ends, so a process that can take a registered worker's lock
//! knows that worker is gone. A live process whose lock is lost (its connection dropped)
//! may see its claims taken over: every claimed piece of work is safe to run twice, and
//! only a claim's holder records its outcome.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::{Backend, DbError, DbResult, Store, fnv1a};

/// What keeps a registered worker's lock.
enum Hold {
    Postgres(PgConnection),
    Sqlite(std::fs::File),
}

/// This process's registration, held while it runs.
pub struct Presence {
    id: String,
    hold: Hold,
}

impl Store {
    /// The lock of worker `id` on PostgreSQL: the two-key space of this installation's
    /// workers, and the id's hash (two workers that share one only look alive to each other
    /// while either lives: their claims then run out as before).
    fn worker_lock(&self, id: &str) -> (i64, i64) {
        (
            i64::from(self.locks.claims("workers")),
            i64::from(i32::from_ne_bytes(fnv1a(id).to_ne_bytes())),
        )
    }

    /// The directory of the SQLite workers' lock files, beside the database file; `None`
    /// for a database in memory (one process) or on PostgreSQL.
    fn worker_dir(&self) -> Option<PathBuf> {
        let file = self.sqlite_file.as_deref()?;
        let mut dir = file.as_os_str().to_owned();
        dir.push("-workers");
        Some(PathBuf::from(dir))
    }

    /// Worker `id`'s lock file on SQLite (see `worker_dir`).
    fn worker_file(&self, id: &str) -> Option<PathBuf> {
        Some(self.worker_dir()?.join(format!("{id}.lock")))
    }

    /// Removes worker `id`'s lock file on SQLite (another process may have removed it
    /// already), and the directory with the last one (removing one that is not empty fails,
    /// and a worker starting meanwhile makes it again: `lock_file`).
    fn forget_worker_file(&self, id: &str) {
        if let Some(path) = self.worker_file(id) {
            let _ = std::fs::remove_file(path);
        }
        if let Some(dir) = self.worker_dir() {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Removes what a registration of worker `id` that never completed left on disk (a
    /// shutdown during the registration: the lock file, made before the row is written).
    pub fn forget_unregistered_worker(&self, id: &str) {
        self.forget_worker_file(id);
    }

    /// Registers worker `id` as alive for as long as the returned presence is kept; `None`
    /// where there is nothing to register (a database in memory). A lock still held (by a
    /// session of an earlier try that the database has not seen end yet) is an error, to
    /// be tried again.
    pub async fn register_worker(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> DbResult<Option<Presence>> {
        // The lock first, then the row: a worker listed is always one whose lock was held.
        let hold = match self.backend {
            Backend::Postgres => {
                let Some(url) = self.listen_url.as_deref() else {
                    return Ok(None);
                };
                let mut conn = PgConnection::connect(url).await?;
                let (space, key) = self.worker_lock(id);
                let held: bool = sqlx::query_scalar(
                    "SELECT pg_try_advisory_lock(CAST($1 AS INTEGER), CAST($2 AS INTEGER))",
                )
                .bind(space)
                .bind(key)
                .fetch_one(&mut conn)
                .await?;
                if !held {
                    let _ = conn.close().await;
                    return Err(DbError::Unavailable(format!(
                        "worker {id}'s lock is held by another session"
                    )));
                }
                Hold::Postgres(conn)
            }
            Backend::Sqlite => {
                let Some(dir) = self.worker_dir() else {
                    return Ok(None);
                };
                let file = lock_file(&dir, id)?;
                if file.try_lock().is_err() {
                    return Err(DbError::Unavailable(format!(
                        "worker {id}'s lock file is locked by another process"
                    )));
                }
                Hold::Sqlite(file)
            }
        };
        let listed = async {
            let mut tx = self.write().await?;
            tx.execute(
                "INSERT INTO workers (id, started_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                vec![id.into(), now.into()],
            )
            .await?;
            tx.commit().await
        }
        .await;
        if let Err(e) = listed {
            // Given back at once rather than when the database notices a dropped socket,
            // so that the next try can take it.
            if let Hold::Postgres(conn) = hold {
                let _ = conn.close().await;
            }
            return Err(e);
        }
        Ok(Some(Presence {
            id: id.to_string(),
            hold,
        }))
    }

    /// The registered workers other than `me` whose lock nobody holds: they are gone.
    pub async fn gone_workers(&self, me: &str) -> DbResult<Vec<String>> {
        let mut tx = self.read().await?;
        let listed: Vec<String> = tx
            .fetch_rows("SELECT id FROM workers WHERE id <> $1", vec![me.into()])
            .await?
            .iter()
            .map(|row| sqlx::Row::try_get(row, "id"))
            .collect::<Result<_, _>>()?;
        tx.commit().await?;
        let mut gone = Vec::new();
        for id in listed {
            let free = match self.backend {
                Backend::Postgres => {
                    // Taken and given back in one statement, on one connection.
                    let (space, key) = self.worker_lock(&id);
                    sqlx::query_scalar::<_, bool>(
                        "SELECT CASE WHEN pg_try_advisory_lock(CAST($1 AS INTEGER), \
                         CAST($2 AS INTEGER)) THEN pg_advisory_unlock(CAST($1 AS INTEGER), \
                         CAST($2 AS INTEGER)) ELSE FALSE END",
                    )
                    .bind(space)
                    .bind(key)
                    .fetch_one(&self.pool)
                    .await?
                }
                Backend::Sqlite => match self.worker_file(&id) {
                    Some(path) => match std::fs::File::open(path) {
                        // Dropped at once, which gives the lock back.
                        Ok(file) => file.try_lock().is_ok(),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                        // Unreadable: not known to be gone.
                        Err(_) => false,
                    },
                    None => false,
                },
            };
            if free {
                gone.push(id);
            }
        }
        Ok(gone)
    }

    /// Ends the claims of gone worker `id` (they run out now, for any worker to take what
    /// they held) and forgets it. Returns how many claims it held.
    pub async fn release_worker(&self, id: &str) -> DbResult<u64> {
        let mut tx = self.write().await?;
        let mut released = 0;
        for sql in [
            "UPDATE actions SET claimed_until = 0 WHERE claimed_by = $1 AND status = 'running'",
            "UPDATE notifications SET claimed_until = 0 \
             WHERE claimed_by = $1 AND sent_at IS NULL AND claimed_until > 0",
            "UPDATE webhook_deliveries SET claimed_until = 0 \
             WHERE claimed_by = $1 AND claimed_until > 0",
            // A reconciler pass holds its claim as "<worker> <pass>" (two passes of one
            // worker are told apart); its repair holds count only under that claim.
            "UPDATE task_claims SET held_until = 0 \
             WHERE (holder = $1 OR substr(holder, 1, length($1) + 1) = $1 || ' ') \
             AND held_until > 0",
        ] {
            released += tx.execute(sql, vec![id.into()]).await?;
        }
        tx.execute("DELETE FROM workers WHERE id = $1", vec![id.into()])
            .await?;
        tx.commit().await?;
        self.forget_worker_file(id);
        Ok(released)
    }
}

impl Presence {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Checks that the lock is still held, and takes it again on a new connection if the
    /// old one dropped (PostgreSQL); the row is written again in case another process found
    /// this one gone meanwhile and forgot it.
    pub async fn keep(&mut self, store: &Store, now: DateTime<Utc>) -> DbResult<()> {
        let Hold::Postgres(conn) = &mut self.hold else {
            return Ok(());
        };
        if conn.ping().await.is_ok() {
            return Ok(());
        }
        if let Some(Presence { hold, .. }) = store.register_worker(&self.id, now).await? {
            self.hold = hold;
        }
        Ok(())
    }

    /// Leaves: forgets this worker and gives its lock back (a clean shutdown).
    pub async fn leave(self, store: &Store) -> DbResult<()> {
        let unlisted = async {
            let mut tx = store.write().await?;
            tx.execute(
                "DELETE FROM workers WHERE id = $1",
                vec![self.id.as_str().into()],
            )
            .await?;
            tx.commit().await
        }
        .await;
        // The lock goes whatever became of the row: a row left behind is a worker the
        // others find gone (its lock is free) and forget; a lock file left behind was a
        // stopped server's litter beside the database.
        match self.hold {
            Hold::Postgres(conn) => {
                let _ = conn.close().await;
            }
            Hold::Sqlite(file) => {
                drop(file);
                store.forget_worker_file(&self.id);
            }
        }
        unlisted
    }
}

/// Worker `id`'s lock file in `dir`, made if need be.
fn lock_file(dir: &Path, id: &str) -> DbResult<std::fs::File> {
    let io =
        |e: std::io::Error| DbError::Unavailable(format!("worker lock in {}: {e}", dir.display()));
    let open = || {
        std::fs::create_dir_all(dir)?;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{id}.lock")))
    };
    match open() {
        // The last worker that left removed the directory between the two steps.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => open().map_err(io),
        other => other.map_err(io),
    }
}
