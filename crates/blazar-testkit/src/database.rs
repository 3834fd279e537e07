//! A database only one test uses.

use sqlx::Connection;

/// `BLAZAR_TEST_DATABASE_URL`, when set: tests then run on PostgreSQL.
pub fn postgres_url() -> Option<String> {
    std::env::var("BLAZAR_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

/// A temporary SQLite file, or a schema of its own in the PostgreSQL database of
/// `BLAZAR_TEST_DATABASE_URL` (dropped with this value). Migrations are applied by the
/// first `Store::connect` on [`TestDatabase::url`].
pub struct TestDatabase {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    schema: Option<(String, String)>,
}

impl TestDatabase {
    /// On PostgreSQL when `BLAZAR_TEST_DATABASE_URL` is set, else on SQLite.
    pub async fn new() -> TestDatabase {
        match postgres_url() {
            Some(base) => Self::postgres(base).await,
            None => Self::sqlite(),
        }
    }

    /// A temporary SQLite file, whatever the environment says.
    pub fn sqlite() -> TestDatabase {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("blazar.db").display());
        TestDatabase {
            url,
            _dir: Some(dir),
            schema: None,
        }
    }

    /// A fresh schema in the PostgreSQL database at `base`.
    pub async fn postgres(base: String) -> TestDatabase {
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&base)
            .await
            .expect("connect to PostgreSQL");
        // Database-wide and idempotent; tests create it concurrently, so a lost race (a
        // duplicate key) is fine.
        let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS btree_gist WITH SCHEMA public")
            .execute(&mut conn)
            .await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut conn)
            .await
            .expect("create schema");
        conn.close().await.ok();
        let sep = if base.contains('?') { '&' } else { '?' };
        // Every connection made for this test names the schema, so that the cleanup can end
        // the ones still open (see `Drop`).
        let url = format!(
            "{base}{sep}options=-c%20search_path%3D{schema}%2Cpublic&application_name={schema}"
        );
        TestDatabase {
            url,
            _dir: None,
            schema: Some((base, schema)),
        }
    }

    /// Runs `sql` on a connection of its own, beside the application's: for tests that put
    /// the stored rows in a state no request can, e.g. one that does not read back.
    pub async fn execute(&self, sql: &str) -> u64 {
        let done = if self.is_postgres() {
            let mut conn = sqlx::PgConnection::connect(&self.url)
                .await
                .expect("connect to PostgreSQL");
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .map(|d| d.rows_affected())
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url)
                .await
                .expect("open the SQLite file");
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .map(|d| d.rows_affected())
        };
        done.expect("the statement runs")
    }

    /// Whether this database is a PostgreSQL schema.
    pub fn is_postgres(&self) -> bool {
        self.schema.is_some()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Some((base, schema)) = self.schema.take() {
            // Drop runs outside any runtime guarantee, so the cleanup gets its own.
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    let Ok(mut conn) = sqlx::PgConnection::connect(&base).await else {
                        return;
                    };
                    // The test's own server may still hold a transaction open on the schema's
                    // tables (an event stream's read, say) on the runtime this drop is
                    // blocking: DROP would wait for it forever. End those connections first,
                    // and never wait long for a lock.
                    let _ = sqlx::query("SET lock_timeout = '5s'")
                        .execute(&mut conn)
                        .await;
                    for _ in 0..5 {
                        let _ = sqlx::query(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE application_name = $1 AND pid <> pg_backend_pid()",
                        )
                        .bind(&schema)
                        .execute(&mut conn)
                        .await;
                        let dropped =
                            sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                                .execute(&mut conn)
                                .await;
                        if dropped.is_ok() {
                            break;
                        }
                    }
                    let _ = conn.close().await;
                });
            })
            .join();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A test whose server still holds a transaction on its schema when the database is
    /// dropped (on the runtime the drop blocks) must not hang the suite.
    #[tokio::test]
    async fn dropping_a_schema_ends_the_transactions_still_open_on_it() {
        let Some(base) = postgres_url() else {
            return;
        };
        let db = TestDatabase::postgres(base).await;
        let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("CREATE TABLE held (x INT)")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
        sqlx::query("SELECT * FROM held")
            .execute(&mut holder)
            .await
            .unwrap();
        // `holder` keeps its lock while this thread blocks in the drop.
        let (done, finished) = std::sync::mpsc::channel();
        let dropper = std::thread::spawn(move || {
            drop(db);
            let _ = done.send(());
        });
        assert!(
            finished
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_ok(),
            "the schema's drop waited on an open transaction"
        );
        dropper.join().unwrap();
        drop(holder);
    }
}
