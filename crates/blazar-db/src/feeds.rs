//! Calendar feeds: which project each feed shows, and a digest of its secret (never the
//! secret itself).

use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::IcalFeed;

use crate::{DbResult, Tx, from_secs, to_secs};

const COLUMNS: &str = "id, secret_sha256, project_id, description, created_by, created_at";

fn feed_from_row(row: &AnyRow) -> DbResult<IcalFeed> {
    Ok(IcalFeed {
        id: row.try_get("id")?,
        secret_sha256: row.try_get("secret_sha256")?,
        project_id: row.try_get("project_id")?,
        description: row.try_get("description")?,
        created_by: row.try_get("created_by")?,
        created_at: from_secs(row.try_get("created_at")?)?,
    })
}

impl Tx {
    pub async fn insert_ical_feed(&mut self, feed: &IcalFeed) -> DbResult<()> {
        sqlx::query(&format!(
            "INSERT INTO ical_feeds ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(&feed.id)
        .bind(&feed.secret_sha256)
        .bind(&feed.project_id)
        .bind(&feed.description)
        .bind(&feed.created_by)
        .bind(to_secs(feed.created_at))
        .execute(self.conn().await?)
        .await?;
        Ok(())
    }

    pub async fn ical_feed(&mut self, id: &str) -> DbResult<Option<IcalFeed>> {
        let sql = format!("SELECT {COLUMNS} FROM ical_feeds WHERE id = $1");
        self.fetch_optional_as(&sql, vec![id.into()], feed_from_row)
            .await
    }

    /// The feeds of one project, or of every project, oldest first.
    pub async fn list_ical_feeds(&mut self, project_id: Option<&str>) -> DbResult<Vec<IcalFeed>> {
        match project_id {
            Some(project) => {
                let sql = format!(
                    "SELECT {COLUMNS} FROM ical_feeds WHERE project_id = $1 \
                     ORDER BY created_at, id"
                );
                self.fetch_all_as(&sql, vec![project.into()], feed_from_row)
                    .await
            }
            None => {
                let sql = format!("SELECT {COLUMNS} FROM ical_feeds ORDER BY created_at, id");
                self.fetch_all_as(&sql, Vec::new(), feed_from_row).await
            }
        }
    }

    /// How many feeds project `project_id` has.
    pub async fn count_ical_feeds(&mut self, project_id: &str) -> DbResult<i64> {
        self.fetch_optional_as(
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM ical_feeds WHERE project_id = $1",
            vec![project_id.into()],
            |row| Ok(row.try_get("n")?),
        )
        .await
        .map(|n| n.unwrap_or(0))
    }

    /// Deletes a feed; false if there was none.
    pub async fn delete_ical_feed(&mut self, id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM ical_feeds WHERE id = $1")
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
