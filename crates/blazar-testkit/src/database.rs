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
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}%2Cpublic");
        TestDatabase {
            url,
            _dir: None,
            schema: Some((base, schema)),
        }
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
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&base).await {
                        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                            .execute(&mut conn)
                            .await;
                        let _ = conn.close().await;
                    }
                });
            })
            .join();
        }
    }
}
