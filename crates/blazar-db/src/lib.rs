//! Storage for blazar-rs: one [`Store`] over SQLite (the embedded default) and PostgreSQL
//! (production), with versioned migrations per backend applied at start.
//!
//! Both backends run the same SQL through sqlx's `Any` driver; the few dialect differences
//! (row locks, the write lock, the schema) are explicit branches on [`Backend`]. Allocation
//! overlap is refused by the database itself: an exclusion constraint on PostgreSQL, a
//! trigger plus `BEGIN IMMEDIATE` single-writer transactions on SQLite.

mod actions;
mod allocations;
mod claims;
mod events;
mod feeds;
mod gauges;
mod hosts;
mod inventory;
mod leases;
mod notifications;
mod peers;
mod presence;
mod properties;
mod quotas;
mod repairs;
mod timeline;
mod tokens;
mod webhooks;

#[cfg(test)]
mod plans;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{Any, AnyPool, Connection, Executor};
use tokio::sync::{Mutex, OwnedMutexGuard};

pub use actions::{ActionOutcome, NewAction};
pub use allocations::{AllocationFilter, AllocationUsage, AllocationView, GrantRow, NewAllocation};
pub use claims::{TaskClaim, TaskTerm};
pub use gauges::ActionCounts;
pub use hosts::NewHost;
pub use leases::LeaseTree;
pub use peers::PeerListener;
pub use presence::Presence;
pub use properties::PropertyWithValues;
pub use quotas::{ProjectAllocation, ProjectShortfall, QuotaRow};
pub use repairs::{ActionsSeen, RECONCILE_TASK, RepairItem};
pub use timeline::TimelineRow;
pub use webhooks::{ClaimedDelivery, DeliveryCounts};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Two allocations of one resource would overlap: the database refused the write.
    #[error("an allocation overlaps an existing one")]
    Overlap,
    /// A uniqueness constraint refused the write.
    #[error("a unique constraint was violated: {0}")]
    Duplicate(String),
    /// A value of a unique resource property is already held by another resource.
    #[error("{0}")]
    NotUnique(String),
    /// The transaction lost a race (deadlock, serialization failure, busy database) and may be
    /// retried as a whole.
    #[error("the transaction conflicted with a concurrent one: {0}")]
    Retryable(String),
    /// Rows this transaction would share-lock are being changed by another transaction
    /// (an inventory change): retry once that one has ended ([`Store::wait_for_rows`]).
    #[error("rows of {table} are being changed by a concurrent transaction")]
    RowsBusy { table: &'static str, ids: Vec<i64> },
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The database could not be reached or could not do any work just now (connection
    /// refused or lost, pool exhausted, disk full, I/O error): neither the request nor the
    /// stored data is at fault, and the same work may succeed later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The database refused a value given to it: a NUL character or bytes PostgreSQL cannot
    /// store as text, or a value too long for an index entry. The caller's input, not a fault.
    #[error("{0}")]
    Rejected(String),
    #[error(transparent)]
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        if matches!(
            e,
            sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
        ) {
            return DbError::Unavailable(e.to_string());
        }
        if let sqlx::Error::Database(db) = &e {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            let message = db.message();
            if code == "23P01" || message.contains("allocation_overlap") {
                return DbError::Overlap;
            }
            if code == "23505" || message.contains("UNIQUE constraint failed") {
                return DbError::Duplicate(message.to_string());
            }
            // PostgreSQL: a character its text cannot hold (NUL among them), a string too long
            // for its column or for an index entry.
            if matches!(code.as_str(), "22021" | "22P05" | "22001" | "54000") {
                return DbError::Rejected(message.to_string());
            }
            // PostgreSQL serialization failure and deadlock; SQLite busy or locked (any of
            // their extended codes: the primary code is the low byte).
            let sqlite_busy = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_none()
                && code.parse::<u32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6));
            if code == "40001" || code == "40P01" || sqlite_busy {
                return DbError::Retryable(message.to_string());
            }
            if outage(db.as_ref(), &code) {
                return DbError::Unavailable(message.to_string());
            }
        }
        DbError::Sql(e)
    }
}

/// Whether an error says the connection it came on is gone: its socket failed, or the
/// server ended its session (an operator, a shutdown: PostgreSQL's 57P01 and 57P02, or a
/// connection exception, class 08).
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P02"),
        _ => false,
    }
}

/// Whether a database error says the server cannot work just now rather than that the
/// statement or its data is wrong. PostgreSQL: connection exceptions (class 08), shutting
/// down or starting up (57P01-57P03), a statement timed out or cancelled (57014), a lock
/// not granted in time (55P03), insufficient resources (class 53: disk full, out of
/// memory, too many connections), system and I/O errors (class 58). SQLite (primary code
/// in the low byte of the extended one): out of memory, I/O error, disk full, cannot open.
fn outage(db: &dyn sqlx::error::DatabaseError, code: &str) -> bool {
    if db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        // A statement cancelled or timed out (57014) and a lock not granted in time (55P03)
        // say the server is busy, not that the statement is wrong.
        return code.starts_with("08")
            || matches!(code, "57P01" | "57P02" | "57P03" | "57014" | "55P03")
            || code.starts_with("53")
            || code.starts_with("58");
    }
    code.parse::<u32>()
        .is_ok_and(|c| matches!(c & 0xff, 7 | 10 | 13 | 14))
}

pub type DbResult<T> = Result<T, DbError>;

static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Connection settings.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `sqlite://path` or `postgres://...`. A bare path is taken as a SQLite file.
    pub url: String,
    pub max_connections: u32,
    /// How SQLite syncs commits to disk (ignored on PostgreSQL).
    pub sqlite_sync: SqliteSync,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            url: "blazar.db".into(),
            max_connections: 16,
            sqlite_sync: SqliteSync::default(),
        }
    }
}

/// SQLite's `synchronous` setting in WAL mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SqliteSync {
    /// Each commit is synced to disk before it returns: an acknowledged change survives a
    /// power loss. Group commit of lease creates amortises the sync.
    #[default]
    Full,
    /// The log is synced at checkpoints only: commits survive a crash of the process but the
    /// last ones can be lost with the machine's power.
    Normal,
}

impl SqliteSync {
    fn pragma(self) -> &'static str {
        match self {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        }
    }
}

/// Connections of a store's pools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUse {
    /// Open, idle or in use.
    pub open: u32,
    pub idle: u32,
    /// The most that may be open.
    pub max: u32,
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    /// SQLite's write transactions (see `Store::connect`); always set on SQLite, never on
    /// PostgreSQL, whose writes use `pool`.
    writer: Option<AnyPool>,
    backend: Backend,
    /// Where this store's PostgreSQL advisory locks live (see [`LockSpace`]).
    locks: LockSpace,
    /// SQLite has one writer at a time; queueing writers here avoids busy-waiting inside
    /// SQLite. Other processes on the same file are still serialised by BEGIN IMMEDIATE.
    write_lock: Arc<Mutex<()>>,
    /// Each resource type's longest allocation span known to be committed (see
    /// [`KnownSpans`]).
    spans: KnownSpans,
    /// Where a peer listener connects (PostgreSQL only; see `peers.rs`).
    listen_url: Option<String>,
    /// The SQLite database's file (none in memory): workers' lock files go beside it
    /// (`presence.rs`).
    sqlite_file: Option<PathBuf>,
    /// When a PostgreSQL connection of the pool was last found cut (see [`CutWatch`]).
    cuts: CutWatch,
    _checkpointer: Option<Arc<Checkpointer>>,
}

/// How long a pooled PostgreSQL connection may have been idle and still be handed out
/// without a ping.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// When a pooled PostgreSQL connection was last found cut. A cut (a restart, an operator
/// ending sessions) usually ends every connection at once: from then on, a connection that
/// was already idle at that moment is pinged before it is handed out, however briefly it
/// has been idle, so the next `BEGIN` gets a live one instead of trying the dead ones in turn.
#[derive(Clone, Default)]
struct CutWatch(Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl CutWatch {
    fn seen(&self) {
        if let Ok(mut last) = self.0.lock() {
            *last = Some(std::time::Instant::now());
        }
    }

    /// Whether a connection idle for `idle_for` must be pinged before use.
    fn needs_ping(&self, idle_for: Duration) -> bool {
        if idle_for >= PING_AFTER_IDLE {
            return true;
        }
        let idle_since = std::time::Instant::now().checked_sub(idle_for);
        match (self.0.lock().ok().and_then(|last| *last), idle_since) {
            (Some(cut), Some(since)) => since <= cut,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// The longest allocation span per resource type that this process has seen committed.
/// `allocation_spans` only ever grows, so each is a lower bound of the stored value, and an
/// allocation no longer than it needs no write there (one statement less per create on
/// PostgreSQL, where statements are round trips). A span enters only once the transaction
/// that wrote it has committed: a rolled-back one never makes another skip its write.
#[derive(Clone, Default)]
struct KnownSpans(Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>);

impl KnownSpans {
    fn covers(&self, resource_type: &str, span: i64) -> bool {
        self.0
            .lock()
            .map(|known| known.get(resource_type).is_some_and(|&k| k >= span))
            .unwrap_or(false)
    }

    fn learn(&self, written: Vec<(String, i64)>) {
        if let Ok(mut known) = self.0.lock() {
            for (resource_type, span) in written {
                let k = known.entry(resource_type).or_insert(span);
                *k = (*k).max(span);
            }
        }
    }
}

/// Copies SQLite's write-ahead log back into the database file every half second, on a
/// connection of its own. Left to SQLite, the commit that crosses the log's size limit does it
/// (with an fsync) while holding the write lock, and every writer queued behind it waits.
/// Passive checkpoints never wait for readers or writers. Stops when the last clone of the
/// store is dropped.
struct Checkpointer(tokio::task::JoinHandle<()>);

impl Checkpointer {
    fn start(pool: AnyPool) -> Checkpointer {
        Checkpointer(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !pool.is_closed() {
                every.tick().await;
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(&pool)
                    .await
                {
                    tracing::debug!(error = %e, "background checkpoint failed; retrying");
                }
            }
        }))
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The settings of every SQLite connection, with a page cache of `cache_kib` KiB. WAL lets
/// readers proceed while one writer commits; `sync` says whether a commit waits for the
/// disk (see [`SqliteSync`]); the busy timeout makes other processes wait for the write lock
/// instead of failing. No memory-mapped reads: every connection maps the file separately,
/// and a pool scanning a large history held the file many times over in resident memory.
/// Checkpoints run in the background (see `Checkpointer`); the in-line one is a safety net.
fn sqlite_pragmas(cache_kib: u32, sync: SqliteSync) -> String {
    format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {}; PRAGMA busy_timeout = 30000; \
         PRAGMA foreign_keys = ON; PRAGMA cache_size = -{cache_kib}; PRAGMA mmap_size = 0; \
         PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 4000;",
        sync.pragma()
    )
}

/// Turns the configured database into a URL sqlx understands.
pub fn normalise_url(url: &str) -> String {
    if url.starts_with("sqlite:") || url.starts_with("postgres:") || url.starts_with("postgresql:")
    {
        url.to_string()
    } else {
        format!("sqlite://{url}")
    }
}

impl Store {
    /// Connects, creating the SQLite file on first use, and applies pending migrations.
    pub async fn connect(options: &StoreOptions) -> DbResult<Store> {
        sqlx::any::install_default_drivers();
        let url = normalise_url(&options.url);
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url,
        };
        let connect_options = AnyConnectOptions::from_str(&url)?;
        let sync = options.sqlite_sync;
        let cuts = CutWatch::default();
        let mut pool_options = AnyPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(Duration::from_secs(30))
            // A ping before each use costs SQLite a round trip to its worker thread and finds
            // nothing a local file could lose.
            .test_before_acquire(false);
        if backend == Backend::Postgres {
            // A PostgreSQL connection can drop, but one handed back a moment ago (sqlx pings
            // each as it comes back) is as good as pinged: only one idle for longer, or idle
            // since before the last cut, is pinged again; a round trip every transaction of
            // a busy server would otherwise pay. One that died unpinged fails its `BEGIN`,
            // which runs again (`Store::begin`); a query sent straight to the pool (the
            // background tasks' few) fails once and is tried again at their next turn.
            let cuts = cuts.clone();
            pool_options = pool_options.before_acquire(move |conn, meta| {
                let ping = cuts.needs_ping(meta.idle_for);
                Box::pin(async move {
                    if ping {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            });
        }
        let pool = pool_options
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // Each connection keeps a page cache of its own, so its size is
                        // multiplied by the pool (16 readers): 1 MiB holds the hot index
                        // pages, and the OS page cache holds the rest once for everyone
                        // (larger caches measured no faster for readers, and SQLite's
                        // default 2 MiB made eight clients reading the whole allocation
                        // list grow the server by 30 MB).
                        conn.execute(sqlite_pragmas(1_024, sync).as_str()).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect_options)
            .await?;
        let checkpointer = match backend {
            Backend::Sqlite => Some(Arc::new(Checkpointer::start(pool.clone()))),
            Backend::Postgres => None,
        };
        // SQLite writes one transaction at a time anyway; giving them a connection of their
        // own keeps the pages writes touch (the allocation indexes) in one warm cache,
        // larger than the readers' and held once. 48 MiB: with years of history (a million
        // allocations) a 16 MiB cache slowed creates by a quarter to a half. Since row ids
        // are time-ordered (new rows go to the end of the id indexes, not anywhere in them)
        // 48 MiB creates as fast as 64 did at a million, for 16 MiB less resident memory
        // (docs/performance.md).
        let writer = match backend {
            Backend::Sqlite => Some(
                AnyPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    .test_before_acquire(false)
                    .after_connect(move |conn, _meta| {
                        Box::pin(async move {
                            conn.execute(sqlite_pragmas(49_152, sync).as_str()).await?;
                            Ok(())
                        })
                    })
                    .connect_with(AnyConnectOptions::from_str(&url)?)
                    .await?,
            ),
            Backend::Postgres => None,
        };
        let locks = match backend {
            Backend::Postgres => {
                let schema: Option<String> =
                    sqlx::query_scalar("SELECT CAST(current_schema() AS TEXT)")
                        .fetch_one(&pool)
                        .await?;
                LockSpace::of_schema(schema.as_deref())
            }
            Backend::Sqlite => LockSpace::default(),
        };
        let sqlite_file = match backend {
            Backend::Sqlite => {
                let file: Option<String> =
                    sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                        .fetch_optional(&pool)
                        .await?;
                file.filter(|f| !f.is_empty()).map(PathBuf::from)
            }
            Backend::Postgres => None,
        };
        let store = Store {
            pool,
            writer,
            backend,
            locks,
            write_lock: Arc::new(Mutex::new(())),
            spans: KnownSpans::default(),
            listen_url: (backend == Backend::Postgres).then(|| url.clone()),
            sqlite_file,
            cuts,
            _checkpointer: checkpointer,
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> DbResult<()> {
        let migrator = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATOR,
            Backend::Postgres => &POSTGRES_MIGRATOR,
        };
        // PostgreSQL's migrator holds an advisory lock; SQLite's holds none, so processes
        // started together on a new file would each create the tables. They take turns
        // by a lock file beside the database, held until the migrations are applied.
        let _turn = match &self.sqlite_file {
            Some(file) => Some(migration_turn(file).await?),
            None => None,
        };
        migrator
            .run(&self.pool)
            .await
            .map_err(|e| DbError::Sql(sqlx::Error::Migrate(Box::new(e))))
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether every connection of the pool that serves reads (and PostgreSQL's writes) is
    /// open and in use: the database answers, the process waits its turn.
    pub fn pool_saturated(&self) -> bool {
        self.pool.num_idle() == 0 && self.pool.size() >= self.pool.options().get_max_connections()
    }

    /// How the connection pools are used now (SQLite's writer connection included).
    pub fn pool_use(&self) -> PoolUse {
        let pools = std::iter::once(&self.pool).chain(self.writer.as_ref());
        let mut usage = PoolUse::default();
        for pool in pools {
            usage.open += pool.size();
            usage.idle += u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
            usage.max += pool.options().get_max_connections();
        }
        usage
    }

    /// The migrations this build knows that the database has not applied (successfully):
    /// empty when the schema is what this build expects. Fails when the database cannot be
    /// reached.
    pub async fn pending_migrations(&self) -> DbResult<Vec<i64>> {
        let migrator = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATOR,
            Backend::Postgres => &POSTGRES_MIGRATOR,
        };
        let mut tx = self.read().await?;
        // A database that never ran the migrator has no table: every migration is pending.
        let applied: Vec<i64> = match tx
            .fetch_rows(
                "SELECT CAST(version AS BIGINT) AS version FROM _sqlx_migrations \
                 WHERE success = TRUE",
                vec![],
            )
            .await
        {
            Ok(rows) => rows
                .iter()
                .map(|row| sqlx::Row::try_get::<i64, _>(row, "version"))
                .collect::<Result<_, _>>()?,
            Err(DbError::Sql(sqlx::Error::Database(e))) => {
                tracing::debug!(error = %e, "no migration table");
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let _ = tx.commit().await;
        Ok(migrator
            .iter()
            .map(|m| m.version)
            .filter(|v| !applied.contains(v))
            .collect())
    }

    /// A transaction that may write. On SQLite it holds the database write lock from the
    /// start, so what it reads stays true until it commits.
    pub async fn write(&self) -> DbResult<Tx> {
        let guard = match self.backend {
            Backend::Sqlite => Some(self.write_lock.clone().lock_owned().await),
            Backend::Postgres => None,
        };
        let inner = match &self.writer {
            Some(writer) => writer.begin_with("BEGIN IMMEDIATE").await?,
            None => self.begin().await?,
        };
        Ok(Tx::new(inner, self, true, guard))
    }

    /// Waits, holding nothing else, until no transaction is changing the rows `ids` of
    /// `table` (see [`DbError::RowsBusy`]).
    pub async fn wait_for_rows(&self, table: &'static str, ids: &[i64]) -> DbResult<()> {
        if self.backend != Backend::Postgres || ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        let (list, bound) = in_list(self.backend, 1, ids);
        let sql = format!("SELECT id FROM {table} WHERE id IN ({list}) FOR SHARE");
        let mut query = sqlx::query(&sql);
        for id in bound {
            query = query.bind(id);
        }
        query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A read-only transaction: a consistent snapshot for composing a response.
    pub async fn read(&self) -> DbResult<Tx> {
        let inner = self.begin().await?;
        Ok(Tx::new(inner, self, false, None))
    }

    /// A transaction of the pool. On PostgreSQL its `BEGIN` runs in a task of its own: sqlx
    /// (0.8.6 and 0.9.0) arms a transaction's rollback-on-drop only once `BEGIN` has
    /// answered, so a caller dropped while it is on the wire (a client that hung up) would
    /// return the connection to the pool inside a transaction nobody ends, and the next
    /// caller's statements would run, and hold their locks, in it (transact-rs/sqlx#4393).
    /// The task always sees `BEGIN` through; a transaction nobody is left to take is dropped
    /// there, armed, and rolled back as the connection goes back to the pool.
    async fn begin(&self) -> DbResult<sqlx::Transaction<'static, sqlx::Any>> {
        if self.backend != Backend::Postgres {
            // SQLite's driver runs `BEGIN` to the end whatever happens to its caller.
            return Ok(self.pool.begin().await?);
        }
        let pool = self.pool.clone();
        let cuts = self.cuts.clone();
        let begun = tokio::spawn(async move {
            // A pooled connection is not pinged when it was handed back a moment ago: if it
            // died meanwhile, `BEGIN` fails on it and it is closed. Every connection idle
            // since then is pinged before use, so `BEGIN` runs again on a live one, as if
            // the first had never been tried (the session that failed is gone, and with it
            // anything it began).
            let mut tries = 0;
            loop {
                match pool.begin().await {
                    Err(e) if tries < 2 && connection_lost(&e) => {
                        cuts.seen();
                        tries += 1;
                    }
                    begun => break begun,
                }
            }
        });
        match begun.await {
            Ok(begun) => Ok(begun?),
            Err(e) => Err(DbError::Unavailable(format!(
                "could not begin a transaction: {e}"
            ))),
        }
    }

    pub async fn close(&self) {
        if let Some(writer) = &self.writer {
            writer.close().await;
        }
        self.pool.close().await;
    }

    /// Vacuums and re-analyzes the tables whose planner statistics have gone stale
    /// (PostgreSQL; SQLite's plans come from its indexes alone). Returns the tables it asked
    /// to vacuum, including one PostgreSQL skipped because another session was vacuuming it.
    ///
    /// The availability probe is only fast with the covering index, and the planner only
    /// picks that index once it knows the allocation table is large: right after a burst of
    /// allocations (a site importing its history, a busy hour) autovacuum may not look for a
    /// minute, and until then every create scans the window index instead (3-8 ms instead of
    /// under 1 ms per probe at 100,000 allocations). The vacuum marks the new rows' pages
    /// all-visible, so that the allocation list reads them from the index alone instead of
    /// one table row per allocation. Neither blocks readers or writers; any replica may call
    /// this, and one that finds a table being vacuumed by another skips it (`SKIP_LOCKED`).
    /// It may take a while on a large table: run it off any latency-sensitive loop.
    pub async fn refresh_statistics(&self) -> DbResult<Vec<&'static str>> {
        if self.backend != Backend::Postgres {
            return Ok(Vec::new());
        }
        let mut analyzed = Vec::new();
        for table in STATISTICS_TABLES {
            // `to_regclass` resolves through the search path, so each schema (a test's, say)
            // looks at its own table.
            let row = sqlx::query(
                "SELECT CAST(n_mod_since_analyze AS BIGINT) AS changed, \
                 CAST(n_live_tup AS BIGINT) AS live FROM pg_stat_user_tables \
                 WHERE relid = to_regclass($1)",
            )
            .bind(table)
            .fetch_optional(&self.pool)
            .await?;
            let Some(row) = row else { continue };
            let changed: i64 = sqlx::Row::try_get(&row, "changed")?;
            let live: i64 = sqlx::Row::try_get(&row, "live")?;
            if stale_statistics(changed, live) {
                // Outside a transaction (the pool's autocommit), as VACUUM must be. Without
                // giving empty pages at the table's end back to the system, which would take
                // a lock that stops readers and writers for a moment.
                sqlx::query(&format!(
                    "VACUUM (ANALYZE, SKIP_LOCKED, TRUNCATE false) {table}"
                ))
                .execute(&self.pool)
                .await?;
                analyzed.push(table);
            }
        }
        Ok(analyzed)
    }
}

/// Tables whose plans depend on their size: allocation probes and lease reads, and the
/// queues that workers claim from (statistics taken while a queue was empty would have its
/// claims scan a backlog row by row; autovacuum may be off or slow to come).
const STATISTICS_TABLES: [&str; 7] = [
    "allocations",
    "reservations",
    "events",
    "leases",
    "notifications",
    "actions",
    "webhook_deliveries",
];

/// Whether a table changed enough since its last ANALYZE for its plans to be wrong: a tenth
/// of its rows (autovacuum's default), and at least a thousand, so small tables never churn.
fn stale_statistics(changed: i64, live: i64) -> bool {
    changed >= 1_000 && changed * 10 >= live
}

/// One database transaction. Dropping it without [`Tx::commit`] rolls it back.
pub struct Tx {
    inner: sqlx::Transaction<'static, Any>,
    backend: Backend,
    locks: LockSpace,
    /// Writes not sent yet (SQLite): they go out together before the next read or the commit.
    pending: Deferred,
    /// How many times queued writes were sent.
    flushes: u64,
    /// Inventory versions read by this transaction, kept while it holds SQLite's write lock
    /// (nobody else can move them then).
    versions: std::collections::HashMap<String, i64>,
    /// Inventory kinds this transaction changed.
    bumped: std::collections::HashSet<String>,
    /// The count of changes (`inventory_versions.changes`: not new resources) of each
    /// inventory kind when this transaction first read its version, moved by its own
    /// changes: what it chose from that inventory was chosen as of this count.
    first_changes: std::collections::HashMap<String, i64>,
    /// Leases whose revision must move when this transaction commits, because it changed
    /// them or their reservations or events.
    revise: std::collections::HashSet<String>,
    /// Leases whose revision this transaction moved already, or that it created: either
    /// way, no reader has seen the state it commits.
    revised: std::collections::HashSet<String>,
    /// Whether this transaction recorded outside-world actions (workers are woken after commit).
    recorded_actions: bool,
    /// Whether this transaction wrote notifications (the publisher is woken after commit).
    recorded_notifications: bool,
    /// The process's committed spans, and the spans this transaction wrote (learnt when it
    /// commits).
    known_spans: KnownSpans,
    spans_written: Vec<(String, i64)>,
    /// Whether this transaction has claimed, locked or allocated a resource (or taken the
    /// allocation lock): from then on it must not wait for another writer's claim.
    holds_resources: bool,
    /// Whether this transaction may have written webhook deliveries (on SQLite, whenever it
    /// wrote a notification: its writes are queued, their counts unknown).
    wrote_deliveries: bool,
    /// What to do once the transaction has committed (log lines saying what it changed: a
    /// transaction that is rolled back and run again must not log its first try's).
    after_commit: Vec<Box<dyn FnOnce() + Send>>,
    writer: bool,
    _guard: Option<OwnedMutexGuard<()>>,
}

/// A point in a transaction that [`Tx::rollback_to`] returns to.
#[derive(Debug, Clone, Copy)]
pub struct Savepoint {
    script: usize,
    args: usize,
    flushes: u64,
}

/// A value bound to a deferred statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Arg {
        Arg::Int(v)
    }
}

impl From<bool> for Arg {
    fn from(v: bool) -> Arg {
        Arg::Int(Some(i64::from(v)))
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Text(Some(v.to_string()))
    }
}

impl From<&String> for Arg {
    fn from(v: &String) -> Arg {
        Arg::Text(Some(v.clone()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Arg {
        Arg::Text(Some(v))
    }
}

impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Arg {
        Arg::Text(v.map(String::from))
    }
}

impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Arg {
        Arg::Text(v)
    }
}

/// Statuses and event types are stored in their wire spelling.
macro_rules! wire_args {
    ($($t:ty),+) => {$(
        impl From<$t> for Arg {
            fn from(v: $t) -> Arg {
                Arg::Text(Some(v.as_str().to_string()))
            }
        }
    )+};
}

wire_args!(
    blazar_core::LeaseStatus,
    blazar_core::ReservationStatus,
    blazar_core::EventStatus,
    blazar_core::EventType,
    blazar_core::ActionKind,
    blazar_core::ActionPurpose
);

/// A stored status or type in its wire spelling; anything else means the row is corrupt.
pub(crate) fn wire<T: std::str::FromStr>(text: &str, what: &str) -> DbResult<T> {
    text.parse()
        .map_err(|_| DbError::Corrupt(format!("{what} {text:?}")))
}

impl From<DateTime<Utc>> for Arg {
    fn from(v: DateTime<Utc>) -> Arg {
        Arg::Int(Some(to_secs(v)))
    }
}

impl From<Option<DateTime<Utc>>> for Arg {
    fn from(v: Option<DateTime<Utc>>) -> Arg {
        Arg::Int(v.map(to_secs))
    }
}

fn bind_all<'q>(
    mut query: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    args: Vec<Arg>,
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
    for arg in args {
        query = match arg {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
        };
    }
    query
}

/// Statements that return nothing, queued to be sent as one multi-statement script.
///
/// sqlx runs each SQLite statement on the connection's worker thread and hands the result
/// back to the async task: every statement costs two thread wake-ups, which dominate a lease
/// create (a few dozen statements of a few microseconds each). Queued writes cost one round
/// trip in all. SQLite binds `$N` by number in every statement of a script, so each queued
/// statement's placeholders are shifted past those before it.
#[derive(Default)]
struct Deferred {
    script: String,
    args: Vec<Arg>,
}

/// SQLite's default limit on bound values in one script is 32766; stay well below it.
const MAX_DEFERRED_ARGS: usize = 16_000;

impl Deferred {
    fn push(&mut self, sql: &str, args: Vec<Arg>) {
        let offset = self.args.len();
        let mut chars = sql.char_indices().peekable();
        while let Some((_, c)) = chars.next() {
            self.script.push(c);
            if c != '$' {
                continue;
            }
            let mut number = String::new();
            while let Some((_, d)) = chars.peek().filter(|(_, d)| d.is_ascii_digit()) {
                number.push(*d);
                chars.next();
            }
            match number.parse::<usize>() {
                Ok(n) => self.script.push_str(&(n + offset).to_string()),
                Err(_) => self.script.push_str(&number),
            }
        }
        self.script.push_str(";\n");
        self.args.extend(args);
    }

    fn is_empty(&self) -> bool {
        self.script.is_empty()
    }
}

impl Tx {
    /// A transaction just begun, with nothing read, queued or changed yet.
    fn new(
        inner: sqlx::Transaction<'static, Any>,
        store: &Store,
        writer: bool,
        guard: Option<OwnedMutexGuard<()>>,
    ) -> Tx {
        Tx {
            inner,
            backend: store.backend,
            locks: store.locks,
            known_spans: store.spans.clone(),
            spans_written: Vec::new(),
            holds_resources: false,
            pending: Deferred::default(),
            flushes: 0,
            versions: Default::default(),
            bumped: Default::default(),
            first_changes: Default::default(),
            revise: Default::default(),
            revised: Default::default(),
            recorded_actions: false,
            recorded_notifications: false,
            wrote_deliveries: false,
            after_commit: Vec::new(),
            writer,
            _guard: guard,
        }
    }

    /// Runs `f` once this transaction has committed; never if it is rolled back or dropped.
    pub fn after_commit(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after_commit.push(Box::new(f));
    }

    /// What [`Tx::after_commit`] gathered, for the caller to run once the commit succeeded.
    pub fn take_after_commit(&mut self) -> Vec<Box<dyn FnOnce() + Send>> {
        std::mem::take(&mut self.after_commit)
    }

    pub async fn commit(mut self) -> DbResult<()> {
        self.write_revisions().await?;
        self.flush().await?;
        self.inner.commit().await?;
        self.known_spans.learn(self.spans_written);
        Ok(())
    }

    /// Sends every queued write, so that what the database would refuse at commit (an
    /// overlap, say) fails here as it would there, then undoes the whole transaction: a
    /// dry run answers what a commit would have answered and keeps nothing.
    pub async fn rollback(mut self) -> DbResult<()> {
        self.flush().await?;
        self.inner.rollback().await?;
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether this transaction was opened by [`Store::write`]: on SQLite it then holds the
    /// database's write lock, so nothing it read can change before it commits.
    pub fn is_writer(&self) -> bool {
        self.writer
    }

    /// Whether this transaction recorded actions for the workers.
    pub fn recorded_actions(&self) -> bool {
        self.recorded_actions
    }

    /// Whether this transaction changed a lease (itself, its reservations or its events):
    /// whoever waits on a lease may look again once it commits.
    pub fn changed_leases(&self) -> bool {
        !self.revise.is_empty() || !self.revised.is_empty()
    }

    /// Whether this transaction wrote notifications for the publisher.
    pub fn recorded_notifications(&self) -> bool {
        self.recorded_notifications
    }

    /// Whether this transaction has claimed, locked or allocated any resource, locked a
    /// lease, or taken the allocation lock: anything another writer could be waiting for. One that has not can
    /// wait for another writer's claim without closing a circle of waits.
    pub fn holds_resource_locks(&self) -> bool {
        self.holds_resources
    }

    /// Whether this transaction may have written webhook deliveries (the webhook workers
    /// are woken after commit): most notifications go to no webhook.
    pub fn wrote_webhook_deliveries(&self) -> bool {
        self.wrote_deliveries
    }

    /// The connection, with every queued write sent: reads see what this transaction wrote.
    async fn conn(&mut self) -> DbResult<&mut sqlx::AnyConnection> {
        self.flush().await?;
        Ok(&mut self.inner)
    }

    /// A write whose outcome nobody waits for (an insert or update that returns nothing): on
    /// SQLite it is queued until the next read or the commit; a failure (a refused overlap,
    /// say) surfaces there and fails the transaction as a whole.
    pub(crate) async fn write(&mut self, sql: &str, args: Vec<Arg>) -> DbResult<()> {
        match self.backend {
            Backend::Postgres => {
                bind_all(sqlx::query(sql), args)
                    .execute(&mut *self.inner)
                    .await?;
            }
            Backend::Sqlite => {
                self.pending.push(sql, args);
                if self.pending.args.len() > MAX_DEFERRED_ARGS {
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }

    /// Runs a write at once, not queued, and answers how many rows it changed: for a write
    /// whose failure or count the caller looks at, or that must fail where it is made.
    pub(crate) async fn execute(&mut self, sql: &str, args: Vec<Arg>) -> DbResult<u64> {
        let done = bind_all(sqlx::query(sql), args)
            .execute(self.conn().await?)
            .await?;
        Ok(done.rows_affected())
    }

    /// Inserts `columns` into `table` at once and answers the id the database gave the row.
    pub(crate) async fn insert_returning_id(
        &mut self,
        table: &str,
        columns: Columns,
    ) -> DbResult<i64> {
        let (sql, args) = columns.insert(table);
        let row = bind_all(sqlx::query(&format!("{sql} RETURNING id")), args)
            .fetch_one(self.conn().await?)
            .await?;
        Ok(sqlx::Row::try_get(&row, "id")?)
    }

    /// Runs a query that returns rows. On SQLite the queued writes travel in front of it in
    /// the same script: one round trip for both.
    pub(crate) async fn fetch_rows(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
    ) -> DbResult<Vec<sqlx::any::AnyRow>> {
        if self.pending.is_empty() {
            return Ok(bind_all(sqlx::query(sql), args)
                .fetch_all(&mut *self.inner)
                .await?);
        }
        self.flushes += 1;
        let mut script = std::mem::take(&mut self.pending);
        script.push(sql, args);
        // Scripts are rarely the same twice: kept prepared, they would fill every
        // connection's statement cache (and the process's memory) with one-offs.
        Ok(bind_all(sqlx::query(&script.script), script.args)
            .persistent(false)
            .fetch_all(&mut *self.inner)
            .await?)
    }

    /// [`Tx::fetch_rows`] planned afresh for its arguments at every run, never from a plan
    /// cached on the connection: for claims on a queue, whose best plan changes with the
    /// backlog (a plan made while it was empty scans a large one row by row).
    pub(crate) async fn fetch_rows_replanned(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
    ) -> DbResult<Vec<sqlx::any::AnyRow>> {
        if !self.pending.is_empty() {
            // Written with the queued writes as one script, which is never kept prepared.
            return self.fetch_rows(sql, args).await;
        }
        Ok(bind_all(sqlx::query(sql), args)
            .persistent(false)
            .fetch_all(&mut *self.inner)
            .await?)
    }

    /// Runs a query and converts every row it answers.
    pub(crate) async fn fetch_all_as<T>(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
        from_row: impl Fn(&sqlx::any::AnyRow) -> DbResult<T>,
    ) -> DbResult<Vec<T>> {
        let rows = bind_all(sqlx::query(sql), args)
            .fetch_all(self.conn().await?)
            .await?;
        rows.iter().map(from_row).collect()
    }

    /// Runs `sql(list)` for `ids` in chunks, `list` being the chunk's placeholders (from
    /// `$1`), and converts every row: what a burst of leases reads in a few queries
    /// instead of one per lease. Rows come chunk after chunk, each in the query's order.
    pub(crate) async fn fetch_all_in<T>(
        &mut self,
        ids: &[&str],
        sql: impl Fn(&str) -> String,
        from_row: impl Fn(&sqlx::any::AnyRow) -> DbResult<T>,
    ) -> DbResult<Vec<T>> {
        let mut all = Vec::new();
        for chunk in ids.chunks(IDS_PER_QUERY) {
            let (list, chunk) = in_list(self.backend, 1, chunk);
            let sql = sql(&list);
            let args = chunk.into_iter().map(Arg::from).collect();
            all.extend(self.fetch_all_as(&sql, args, &from_row).await?);
        }
        Ok(all)
    }

    /// Runs a query and converts the row it answers, if any.
    pub(crate) async fn fetch_optional_as<T>(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
        from_row: impl Fn(&sqlx::any::AnyRow) -> DbResult<T>,
    ) -> DbResult<Option<T>> {
        let row = bind_all(sqlx::query(sql), args)
            .fetch_optional(self.conn().await?)
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// The backend's JSON functions: (the aggregate, the array constructor).
    pub(crate) fn json_functions(&self) -> (&'static str, &'static str) {
        match self.backend {
            Backend::Sqlite => ("json_group_array", "json_array"),
            Backend::Postgres => ("json_agg", "json_build_array"),
        }
    }

    /// Runs `sql`, which answers one row whose column `json` is a JSON array aggregated by
    /// the database (NULL when nothing matched; on PostgreSQL cast to TEXT, which is how
    /// the Any driver reads it), and parses its elements. Reading many items as one row
    /// spares a thread hand-off per row: sqlx passes each SQLite row over on its own.
    pub(crate) async fn fetch_json_array<T: serde::de::DeserializeOwned>(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
        what: &str,
    ) -> DbResult<Vec<T>> {
        let rows = self.fetch_rows(sql, args).await?;
        let text: Option<String> = match rows.first() {
            Some(row) => sqlx::Row::try_get(row, "json")?,
            None => None,
        };
        match text {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| DbError::Corrupt(format!("{what}: {e}")))
            }
            None => Ok(Vec::new()),
        }
    }

    /// Opens a savepoint (queued like a write). Savepoints do not nest.
    pub async fn savepoint(&mut self) -> DbResult<Savepoint> {
        let mark = Savepoint {
            script: self.pending.script.len(),
            args: self.pending.args.len(),
            flushes: self.flushes,
        };
        self.write("SAVEPOINT batch_item", Vec::new()).await?;
        Ok(mark)
    }

    /// Ends `savepoint`, keeping its writes (queued like a write: a write the database
    /// refuses may then fail in whatever is sent next).
    pub async fn release(&mut self, _savepoint: Savepoint) -> DbResult<()> {
        self.write("RELEASE batch_item", Vec::new()).await
    }

    /// Undoes everything written since `savepoint` and ends it.
    pub async fn rollback_to(&mut self, savepoint: Savepoint) -> DbResult<()> {
        self.versions.clear();
        // Whichever were undone are written again by whoever needs them.
        self.spans_written.clear();
        // A revision moved after the savepoint is moved no more; what changed before it
        // still needs one. Extra moves are harmless, missing ones are not.
        let revised = std::mem::take(&mut self.revised);
        self.revise.extend(revised);
        if self.flushes == savepoint.flushes {
            // Nothing since the savepoint reached the database: forget the queued writes.
            self.pending.script.truncate(savepoint.script);
            self.pending.args.truncate(savepoint.args);
            return Ok(());
        }
        // Everything queued now came after the savepoint.
        self.pending = Deferred::default();
        sqlx::query("ROLLBACK TO batch_item")
            .execute(&mut *self.inner)
            .await?;
        sqlx::query("RELEASE batch_item")
            .execute(&mut *self.inner)
            .await?;
        Ok(())
    }

    async fn flush(&mut self) -> DbResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flushes += 1;
        let Deferred { script, args } = std::mem::take(&mut self.pending);
        bind_all(sqlx::query(&script), args)
            .persistent(false)
            .execute(&mut *self.inner)
            .await?;
        Ok(())
    }

    /// Serialises the event scheduler across processes on PostgreSQL (SQLite writers are
    /// serialised already), so events run one at a time in time order everywhere.
    pub async fn lock_scheduler(&mut self) -> DbResult<()> {
        self.advisory_lock(7_355_608).await
    }

    /// Serialises notification claims on PostgreSQL (SQLite writers are serialised
    /// already), so each claim sees the ones committed before it.
    pub async fn lock_notification_claims(&mut self) -> DbResult<()> {
        self.advisory_lock(7_355_610).await
    }

    /// Serialises, on PostgreSQL, the transactions that decide from a view of many resources
    /// at once (an `earliest` search and the window it books, the healing of a pool
    /// reservation); SQLite writers are serialised already. Ordinary allocations claim
    /// only what they pick ([`Tx::try_claim_resources`]). Transaction-scoped, re-entrant.
    pub async fn lock_allocations(&mut self) -> DbResult<()> {
        self.holds_resources = true;
        self.advisory_lock(7_355_609).await
    }

    /// Claims, for this transaction, up to `want` of the resources of `ids` of a type that no
    /// concurrent transaction has claimed, trying them in the order given and without
    /// waiting, and answers (claimed, contended): those it got and those it passed over
    /// because another transaction holds them, both in the order given. Candidates after
    /// the `want`-th claimed one are not tried. On PostgreSQL a claim is a
    /// transaction-scoped advisory lock per resource: writers picking among the same
    /// candidates pass over each other's picks instead of queueing behind one lock or
    /// colliding on the exclusion constraint (which stays the guarantee), and one statement
    /// walks past any number of them. On SQLite, whose writers are serialised, the first
    /// `want` are claimed.
    pub async fn try_claim_resources(
        &mut self,
        kind: &str,
        ids: &[i64],
        want: usize,
    ) -> DbResult<(Vec<i64>, Vec<i64>)> {
        let want = want.min(ids.len());
        if self.backend != Backend::Postgres || want == 0 {
            return Ok((ids[..want].to_vec(), Vec::new()));
        }
        // VALUES is scanned in order and the filter runs row by row under the LIMIT, so the
        // claims are tried in preference order and stop at the `want`-th taken (no sort or
        // aggregate sits between them to make PostgreSQL try them all first). The list is
        // padded with NULLs to a few lengths and the limit is bound, so that a connection
        // keeps a few of these statements, not one per length and limit: the lock function
        // is strict, so a NULL row is never claimed, and it comes after every real one.
        let mut rows_of: Vec<Option<i64>> = ids.iter().copied().map(Some).collect();
        rows_of.resize(padded_len(ids.len()), None);
        let (sql, mut args) = claim_statement("v.id AS id", self.locks.claims(kind), &rows_of);
        let limit = args.len() + 1;
        args.push(Arg::from(i64::try_from(want).unwrap_or(i64::MAX)));
        let sql =
            format!("{sql} WHERE pg_try_advisory_xact_lock(KEY) LIMIT CAST(${limit} AS BIGINT)")
                .replace(
                    "KEY",
                    "CAST($1 AS INTEGER), CAST(v.id & 2147483647 AS INTEGER)",
                );
        let rows = self.fetch_rows(&sql, args).await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            claimed.push(sqlx::Row::try_get::<i64, _>(&row, "id")?);
        }
        // Every candidate up to the last one claimed was tried (all of them, if fewer than
        // `want` were claimed): those not claimed are held by others.
        let tried = if claimed.len() < want {
            ids.len()
        } else {
            claimed
                .last()
                .and_then(|last| ids.iter().position(|id| id == last))
                .map_or(ids.len(), |i| i + 1)
        };
        let taken: std::collections::HashSet<i64> = claimed.iter().copied().collect();
        let contended = ids[..tried]
            .iter()
            .copied()
            .filter(|id| !taken.contains(id))
            .collect();
        self.holds_resources |= !claimed.is_empty();
        Ok((claimed, contended))
    }

    /// Claims the resources of `ids`, waiting for the transactions that hold them, in
    /// ascending id order (two waiters then never wait for each other in a circle within
    /// one call; PostgreSQL breaks any wider cycle, and the transaction is retried).
    pub async fn claim_resources(&mut self, kind: &str, ids: &[i64]) -> DbResult<()> {
        if self.backend != Backend::Postgres || ids.is_empty() {
            return Ok(());
        }
        self.holds_resources = true;
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let (sql, args) = claim_statement(
            "pg_advisory_xact_lock(KEY)",
            self.locks.claims(kind),
            &sorted,
        );
        // Executed, not fetched: the function answers `void`, which the Any driver cannot read.
        bind_all(sqlx::query(&sql), args)
            .execute(self.conn().await?)
            .await?;
        Ok(())
    }

    /// Serialises, on PostgreSQL, the transactions that check and write one project's
    /// usage against its quotas (SQLite writers are serialised already).
    pub async fn lock_project_usage(&mut self, project_id: &str) -> DbResult<()> {
        self.lock_project("project usage", project_id).await
    }

    /// Serialises, on PostgreSQL, the transactions that count and add one project's webhooks
    /// (or the site-wide ones, `None`), so that concurrent registrations cannot pass its cap.
    pub async fn lock_project_webhooks(&mut self, project_id: Option<&str>) -> DbResult<()> {
        self.lock_project("project webhooks", project_id.unwrap_or(""))
            .await
    }

    /// Serialises, on PostgreSQL, the transactions that count and add one project's calendar
    /// feeds, so that concurrent creates cannot pass its cap.
    pub async fn lock_project_feeds(&mut self, project_id: &str) -> DbResult<()> {
        self.lock_project("project feeds", project_id).await
    }

    /// The transaction-scoped lock of `project_id` among the locks of `kind` (PostgreSQL).
    async fn lock_project(&mut self, kind: &str, project_id: &str) -> DbResult<()> {
        if self.backend != Backend::Postgres {
            return Ok(());
        }
        sqlx::query("SELECT pg_advisory_xact_lock(CAST($1 AS INTEGER), hashtext($2))")
            .bind(i64::from(self.locks.claims(kind)))
            .bind(project_id)
            .execute(self.conn().await?)
            .await?;
        Ok(())
    }

    /// Takes the transaction-scoped PostgreSQL advisory lock `key`; nothing on SQLite, whose
    /// writers are serialised already.
    async fn advisory_lock(&mut self, key: i64) -> DbResult<()> {
        self.take_advisory_lock("pg_advisory_xact_lock", key).await
    }

    /// Takes the transaction-scoped PostgreSQL advisory lock `key` shared: shared holders
    /// pass each other, and wait for (and are waited for by) an exclusive one.
    async fn advisory_lock_shared(&mut self, key: i64) -> DbResult<()> {
        self.take_advisory_lock("pg_advisory_xact_lock_shared", key)
            .await
    }

    async fn take_advisory_lock(&mut self, function: &str, key: i64) -> DbResult<()> {
        if self.backend == Backend::Postgres {
            let key = self.locks.single(key);
            sqlx::query(&format!("SELECT {function}({key})"))
                .execute(self.conn().await?)
                .await?;
        }
        Ok(())
    }

    /// Moves the version of an inventory kind and its count of changes; called by every
    /// write to that inventory but the registration of a new resource.
    pub(crate) async fn bump_inventory(&mut self, kind: &str) -> DbResult<()> {
        self.bump(kind, true).await
    }

    /// Moves the version of an inventory kind for a new resource: what a booking chose
    /// among the others is as good as it was (see [`Tx::inventory_unchanged`]).
    pub(crate) async fn bump_inventory_added(&mut self, kind: &str) -> DbResult<()> {
        self.bump(kind, false).await
    }

    async fn bump(&mut self, kind: &str, change: bool) -> DbResult<()> {
        self.versions.remove(kind);
        self.bumped.insert(kind.to_string());
        if change && let Some(first) = self.first_changes.get_mut(kind) {
            *first += 1;
        }
        sqlx::query(
            "INSERT INTO inventory_versions (kind, version, changes) VALUES ($1, 1, $2) \
             ON CONFLICT (kind) DO UPDATE SET version = inventory_versions.version + 1, \
             changes = inventory_versions.changes + $2",
        )
        .bind(kind)
        .bind(i64::from(change))
        .execute(self.conn().await?)
        .await?;
        Ok(())
    }

    /// Records that this transaction changed lease `id` (or its reservations or events):
    /// its revision moves at commit.
    pub(crate) fn revise_lease(&mut self, id: &str) {
        if !self.revised.contains(id) {
            self.revise.insert(id.to_string());
        }
    }

    /// Records that lease `id` is new, or that the statement just queued moved its revision.
    pub(crate) fn lease_revised(&mut self, id: &str) {
        self.revise.remove(id);
        self.revised.insert(id.to_string());
    }

    /// Moves the revision of every lease this transaction changed without moving it yet: one
    /// statement, queued in front of the commit on SQLite.
    async fn write_revisions(&mut self) -> DbResult<()> {
        if self.revise.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<String> = std::mem::take(&mut self.revise).into_iter().collect();
        ids.sort();
        for chunk in ids.chunks(1_000) {
            let sql = format!(
                "UPDATE leases SET revision = revision + 1 WHERE id IN ({})",
                placeholders(1, chunk.len())
            );
            self.write(&sql, chunk.iter().map(Arg::from).collect())
                .await?;
        }
        Ok(())
    }

    /// Whether this transaction changed the inventory of `kind`: what it reads of that kind
    /// is not committed, so nothing may keep it beyond the transaction.
    pub fn changed_inventory(&self, kind: &str) -> bool {
        self.bumped.contains(kind)
    }

    /// The current version of an inventory kind (0 before any change).
    pub async fn inventory_version(&mut self, kind: &str) -> DbResult<i64> {
        if let Some(version) = self.versions.get(kind) {
            return Ok(*version);
        }
        let (version, changes) = self.read_inventory_version(kind).await?;
        if self.writer && self.backend == Backend::Sqlite {
            self.versions.insert(kind.to_string(), version);
        }
        self.first_changes
            .entry(kind.to_string())
            .or_insert(changes);
        Ok(version)
    }

    /// The version of an inventory kind and its count of changes (0 and 0 before any).
    async fn read_inventory_version(&mut self, kind: &str) -> DbResult<(i64, i64)> {
        let row = sqlx::query("SELECT version, changes FROM inventory_versions WHERE kind = $1")
            .bind(kind)
            .fetch_optional(self.conn().await?)
            .await?;
        Ok(match row {
            Some(r) => (
                sqlx::Row::try_get(&r, "version")?,
                sqlx::Row::try_get(&r, "changes")?,
            ),
            None => (0, 0),
        })
    }

    /// Whether the inventory of `kind` is still as this transaction first read it (its own
    /// changes aside). Asked once the resources chosen from it are locked: on PostgreSQL a
    /// change of their capacity or properties committed while this transaction decided (the
    /// change holds the row until it commits, so the lock waited for it) makes the choice
    /// stale, and the transaction must choose again. New resources do not count: they
    /// change nothing of those chosen, and a site registering hosts one after the other
    /// sent every slow booking round again until it gave up. A SQLite writer holds the only
    /// write lock from its first statement: nothing can have changed.
    pub async fn inventory_unchanged(&mut self, kind: &str) -> DbResult<bool> {
        if self.writer && self.backend == Backend::Sqlite {
            return Ok(true);
        }
        let Some(first) = self.first_changes.get(kind).copied() else {
            return Ok(true);
        };
        Ok(self.read_inventory_version(kind).await?.1 == first)
    }

    /// Locks one row of `table` by id (PostgreSQL) and tells whether it exists.
    pub(crate) async fn lock_row(&mut self, table: &'static str, id: i64) -> DbResult<bool> {
        self.holds_resources = true;
        let sql = format!("SELECT id FROM {table} WHERE id = $1{}", self.for_update());
        Ok(sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.conn().await?)
            .await?
            .is_some())
    }

    /// Of `ids`, the rows of `table` that still exist and are reservable, share-locked on
    /// PostgreSQL so that a concurrent delete or maintenance switch waits for this transaction.
    pub(crate) async fn lock_reservable_rows(
        &mut self,
        table: &'static str,
        ids: &[i64],
    ) -> DbResult<Vec<i64>> {
        self.holds_resources = true;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Without waiting: only an inventory change holds these rows exclusively, and it
        // goes on to claim other resources and lock leases, which this transaction may hold
        // (a circle PostgreSQL breaks only after `deadlock_timeout`, a second each, which
        // under a stream of bookings kept a capacity change and the bookings of its host
        // going round for tens of seconds). This transaction gives way instead: it ends,
        // waits for the change holding nothing, and runs again.
        let lock = match self.backend {
            Backend::Postgres => " FOR SHARE NOWAIT",
            Backend::Sqlite => "",
        };
        let (list, bound) = in_list(self.backend, 1, ids);
        let sql = format!("SELECT id FROM {table} WHERE reservable = 1 AND id IN ({list}){lock}");
        let mut query = sqlx::query(&sql);
        for id in bound {
            query = query.bind(id);
        }
        let rows = match query.fetch_all(self.conn().await?).await {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                return Err(DbError::RowsBusy {
                    table,
                    ids: ids.to_vec(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        rows.iter()
            .map(|r| Ok(sqlx::Row::try_get(r, "id")?))
            .collect()
    }

    /// `FOR UPDATE` where the backend has row locks.
    fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        }
    }
}

pub(crate) fn to_secs(t: DateTime<Utc>) -> i64 {
    t.timestamp()
}

pub(crate) fn from_secs(s: i64) -> DbResult<DateTime<Utc>> {
    Utc.timestamp_opt(s, 0)
        .single()
        .ok_or_else(|| DbError::Corrupt(format!("timestamp {s} out of range")))
}

pub(crate) fn from_opt_secs(s: Option<i64>) -> DbResult<Option<DateTime<Utc>>> {
    s.map(from_secs).transpose()
}

/// The namespace of a store's PostgreSQL advisory locks. Advisory locks belong to the
/// database, not to a schema, so two installations in two schemas of one database (or the
/// test suite's schema per test) would otherwise wait for and pass over each other's locks:
/// one scheduler lock for both, and a claim on host 2 of one hiding host 2 of the other.
/// The default schema `public` keeps the plain keys, so replicas of earlier versions still
/// agree with this one on it. The same name gives the same space on every replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LockSpace(u32);

impl LockSpace {
    fn of_schema(schema: Option<&str>) -> LockSpace {
        match schema {
            None | Some("public") => LockSpace(0),
            Some(name) => LockSpace(fnv1a(name) | 1),
        }
    }

    /// The one-key lock for `key` (a small constant) in this space: the space fills the high
    /// half, which the constants leave empty.
    fn single(self, key: i64) -> i64 {
        key ^ (i64::from(self.0) << 32)
    }

    /// The first key of the two-key advisory locks for claims of a kind in this space. The
    /// two-key space never meets the one-key locks.
    fn claims(self, kind: &str) -> i32 {
        i32::from_ne_bytes((fnv1a(kind) ^ self.0).to_ne_bytes())
    }
}

/// FNV-1a of `text`: a fixed hash, so every replica and version agrees on lock keys.
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// `SELECT <select> FROM (VALUES <ids>) AS v(id)`, one row per id in the order given, with
/// `KEY` in `select` standing for the two-key lock of that row's resource: the statement of
/// both kinds of claim, with its arguments.
fn claim_statement<T: Into<Arg> + Copy>(select: &str, space: i32, ids: &[T]) -> (String, Vec<Arg>) {
    let rows = (2..ids.len() + 2)
        .map(|i| format!("(CAST(${i} AS BIGINT))"))
        .collect::<Vec<_>>()
        .join(", ");
    let select = select.replace(
        "KEY",
        "CAST($1 AS INTEGER), CAST(v.id & 2147483647 AS INTEGER)",
    );
    let sql = format!("SELECT {select} FROM (VALUES {rows}) AS v(id)");
    let mut args: Vec<Arg> = vec![Arg::from(i64::from(space))];
    args.extend(ids.iter().map(|id| (*id).into()));
    (sql, args)
}

/// Ids bound in one `IN (...)` list: far below SQLite's limit on variables (32,766), and
/// small enough for PostgreSQL to plan as index look-ups.
const IDS_PER_QUERY: usize = 500;

/// Columns to write and their values, in order: an insert or update is built from it, so a
/// column and its placeholder (`$1` is the first column) can never drift apart.
#[derive(Default)]
pub(crate) struct Columns {
    names: Vec<&'static str>,
    args: Vec<Arg>,
}

impl Columns {
    pub(crate) fn set(mut self, name: &'static str, value: impl Into<Arg>) -> Columns {
        self.names.push(name);
        self.args.push(value.into());
        self
    }

    /// `INSERT INTO <table> (<columns>) VALUES ($1, ..)` and its arguments.
    pub(crate) fn insert(self, table: &str) -> (String, Vec<Arg>) {
        let sql = format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            self.names.join(", "),
            placeholders(1, self.names.len())
        );
        (sql, self.args)
    }

    /// One `INSERT INTO <table> (<columns>) VALUES (..), (..)` of several rows, each set
    /// with the same columns in the same order; `None` for no rows.
    pub(crate) fn insert_rows(table: &str, rows: Vec<Columns>) -> Option<(String, Vec<Arg>)> {
        let mut rows = rows.into_iter();
        let first = rows.next()?;
        let width = first.names.len();
        let mut sql = format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            first.names.join(", "),
            placeholders(1, width)
        );
        let mut args = first.args;
        for row in rows {
            debug_assert_eq!(
                row.names, first.names,
                "rows of one insert differ in columns"
            );
            sql.push_str(&format!(", ({})", placeholders(args.len() + 1, width)));
            args.extend(row.args);
        }
        Some((sql, args))
    }

    /// `UPDATE <table> SET <column> = $1, ..<also> WHERE <key> = $n` and its arguments:
    /// `also` adds assignments that bind nothing (`, revision = revision + 1`).
    pub(crate) fn update(
        mut self,
        table: &str,
        also: &str,
        key: &str,
        id: impl Into<Arg>,
    ) -> (String, Vec<Arg>) {
        let set = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        self.args.push(id.into());
        let sql = format!(
            "UPDATE {table} SET {set}{also} WHERE {key} = ${}",
            self.args.len()
        );
        (sql, self.args)
    }
}

/// `$start, ...` for an `IN (...)` list of `values`, and the values to bind. On SQLite the
/// list is padded to the next power of two (at least 8; past 512, the next multiple of 512,
/// far from the limit on parameters) by repeating the last value, which `IN` ignores: every
/// pooled connection prepares and keeps each distinct statement text it runs, in the
/// server's own memory, and lists of every length from 1 to 500 filled each connection's
/// cache with large, nearly identical statements (eight clients reading the allocation list
/// grew the server by 4 MB more). PostgreSQL keeps its prepared statements in its own
/// processes and plans a statement run often with generic plans, so lists stay as they are
/// there, except where [`padded_list`] says otherwise.
pub(crate) fn in_list<T: Clone>(backend: Backend, start: usize, values: &[T]) -> (String, Vec<T>) {
    padded_list(backend == Backend::Sqlite, start, values)
}

/// [`in_list`], padded on both backends when `pad`: for a statement whose generic plan is
/// the plan PostgreSQL would make for any of its lists.
pub(crate) fn padded_list<T: Clone>(pad: bool, start: usize, values: &[T]) -> (String, Vec<T>) {
    let mut padded = values.to_vec();
    if let (true, Some(last)) = (pad, values.last()) {
        padded.resize(padded_len(values.len()), last.clone());
    }
    (placeholders(start, padded.len()), padded)
}

/// The length a list of `n` values is padded to: the next power of two (at least 8), past
/// 512 the next multiple of 512.
fn padded_len(n: usize) -> usize {
    if n <= 512 {
        n.next_power_of_two().max(8)
    } else {
        n.div_ceil(512) * 512
    }
}

pub(crate) fn placeholders(start: usize, count: usize) -> String {
    (start..start + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lock file of SQLite's migrations (`<database>-migrate.lock`), locked: the turn of
/// this process to apply them, until the file is dropped.
async fn migration_turn(database: &std::path::Path) -> DbResult<std::fs::File> {
    let mut path = database.as_os_str().to_owned();
    path.push("-migrate.lock");
    let path = PathBuf::from(path);
    let unavailable =
        |e: &dyn std::fmt::Display| DbError::Unavailable(format!("{}: {e}", path.display()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| unavailable(&e))?;
    // A blocking wait, for as long as another process migrates: off the async workers.
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| unavailable(&e))?
        .map_err(|e| unavailable(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    /// Processes started together on a new SQLite file (a server and its workers, say)
    /// each find the schema made once, not the tables of another's migration half made.
    #[tokio::test]
    async fn stores_opened_at_once_on_a_new_sqlite_file_migrate_it_once() {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let url = dir.path().join("new.db").display().to_string();
            let opens = (0..4).map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    Store::connect(&StoreOptions {
                        url,
                        ..StoreOptions::default()
                    })
                    .await
                })
            });
            for opened in futures::future::join_all(opens).await {
                let store = opened.unwrap().unwrap();
                assert!(store.pending_migrations().await.unwrap().is_empty());
                store.close().await;
            }
        }
    }

    #[test]
    fn in_lists_come_in_a_few_lengths_and_keep_their_values() {
        for (n, len) in [
            (1, 8),
            (8, 8),
            (9, 16),
            (300, 512),
            (512, 512),
            (513, 1024),
            (1500, 1536),
        ] {
            let values: Vec<usize> = (0..n).collect();
            let (list, padded) = in_list(Backend::Sqlite, 3, &values);
            assert_eq!(padded.len(), len, "{n} values");
            assert_eq!(&padded[..n], &values[..]);
            assert!(padded[n..].iter().all(|v| *v == n - 1));
            assert_eq!(list.split(", ").count(), len);
            assert!(list.starts_with("$3, $4"));
        }
        let (list, padded) = in_list::<i64>(Backend::Sqlite, 1, &[]);
        assert!(list.is_empty() && padded.is_empty());
        let (list, padded) = in_list(Backend::Postgres, 1, &[1, 2, 3]);
        assert_eq!((list.as_str(), padded), ("$1, $2, $3", vec![1, 2, 3]));
        let (list, padded) = padded_list(true, 4, &[1, 2, 3]);
        assert_eq!(list.split(", ").count(), 8);
        assert!(list.starts_with("$4, $5"));
        assert_eq!(padded, vec![1, 2, 3, 3, 3, 3, 3, 3]);
    }

    #[test]
    fn the_default_schema_keeps_the_plain_lock_keys_and_others_get_their_own() {
        let public = LockSpace::of_schema(Some("public"));
        assert_eq!(public, LockSpace::of_schema(None));
        assert_eq!(public.single(7_355_608), 7_355_608);
        assert_eq!(
            public.claims("host"),
            i32::from_ne_bytes(fnv1a("host").to_ne_bytes())
        );
        let (a, b) = (
            LockSpace::of_schema(Some("a")),
            LockSpace::of_schema(Some("b")),
        );
        assert_eq!(a, LockSpace::of_schema(Some("a")), "every replica agrees");
        for space in [a, b] {
            assert_ne!(space, public);
            assert_ne!(space.single(7_355_608), 7_355_608);
            assert_ne!(space.claims("host"), public.claims("host"));
        }
        assert_ne!(a.single(7_355_608), b.single(7_355_608));
        assert_ne!(a.claims("host"), b.claims("host"));
        // The space keeps the keys of one store apart from each other.
        assert_ne!(a.single(7_355_608), a.single(7_355_609));
        assert_ne!(a.claims("host"), a.claims("project usage"));
    }

    /// `PRAGMA synchronous` as every kind of connection of the store sees it.
    async fn synchronous_levels(sqlite_sync: SqliteSync) -> Vec<i64> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&StoreOptions {
            url: dir.path().join("t.db").display().to_string(),
            max_connections: 2,
            sqlite_sync,
        })
        .await
        .unwrap();
        let mut levels = Vec::new();
        for pool in [Some(&store.pool), store.writer.as_ref()]
            .into_iter()
            .flatten()
        {
            let row = sqlx::query("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .unwrap();
            levels.push(row.try_get::<i64, _>(0).unwrap());
        }
        store.close().await;
        levels
    }

    #[tokio::test]
    async fn sqlite_commits_are_durable_unless_configured_otherwise() {
        // FULL is 2 and NORMAL 1, on the readers' and the writer's connections alike.
        assert_eq!(synchronous_levels(SqliteSync::default()).await, vec![2, 2]);
        assert_eq!(synchronous_levels(SqliteSync::Normal).await, vec![1, 1]);
    }

    #[test]
    fn columns_are_numbered_in_the_order_they_are_set() {
        let columns = || Columns::default().set("a", 1_i64).set("b", "x");
        let (sql, args) = columns().insert("t");
        assert_eq!(sql, "INSERT INTO t (a, b) VALUES ($1, $2)");
        assert_eq!(args, vec![Arg::from(1_i64), Arg::from("x")]);
        let (sql, args) = columns().update("t", ", n = n + 1", "id", "k");
        assert_eq!(sql, "UPDATE t SET a = $1, b = $2, n = n + 1 WHERE id = $3");
        assert_eq!(args, vec![Arg::from(1_i64), Arg::from("x"), Arg::from("k")]);
    }

    #[test]
    fn statistics_go_stale_after_a_tenth_and_a_thousand_changes() {
        assert!(!stale_statistics(0, 0));
        assert!(!stale_statistics(999, 0), "small tables never churn");
        assert!(stale_statistics(1_000, 0));
        assert!(
            stale_statistics(90_000, 10_000),
            "a burst into a small table"
        );
        assert!(!stale_statistics(5_000, 100_000));
        assert!(stale_statistics(10_000, 100_000));
    }
}
