//! What tests of SQLite's query plans share: a scratch database and the plan of a statement.

use sqlx::Row;

use crate::{Arg, Store, StoreOptions, Tx, bind_all};

/// A migrated SQLite database in a directory of its own, removed with the directory.
pub(crate) async fn scratch_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&StoreOptions {
        url: dir.path().join("t.db").display().to_string(),
        ..StoreOptions::default()
    })
    .await
    .unwrap();
    (dir, store)
}

/// The lines of SQLite's `EXPLAIN QUERY PLAN` of `sql` with `args`.
pub(crate) async fn plan(tx: &mut Tx, sql: &str, args: Vec<Arg>) -> Vec<String> {
    let rows = bind_all(sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}")), args)
        .fetch_all(tx.conn().await.unwrap())
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.try_get::<String, _>("detail").unwrap())
        .collect()
}
