//! Standalone API tokens: who each token acts as, and a digest of its secret (never the
//! secret itself).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::ApiToken;

use crate::{Columns, DbError, DbResult, Tx, from_opt_secs, from_secs, to_secs};

const COLUMNS: &str = "id, secret_sha256, user_id, project_id, roles, description, created_at, \
    expires_at, revoked_at";

fn token_from_row(row: &AnyRow) -> DbResult<ApiToken> {
    let id: String = row.try_get("id")?;
    let roles_text: String = row.try_get("roles")?;
    let roles = serde_json::from_str::<Vec<String>>(&roles_text).map_err(|e| {
        DbError::Corrupt(format!("roles of API token {id} are not a JSON list: {e}"))
    })?;
    Ok(ApiToken {
        secret_sha256: row.try_get("secret_sha256")?,
        user_id: row.try_get("user_id")?,
        project_id: row.try_get("project_id")?,
        roles,
        description: row.try_get("description")?,
        created_at: from_secs(row.try_get("created_at")?)?,
        expires_at: from_opt_secs(row.try_get("expires_at")?)?,
        revoked_at: from_opt_secs(row.try_get("revoked_at")?)?,
        id,
    })
}

impl Tx {
    pub async fn insert_api_token(&mut self, token: &ApiToken) -> DbResult<()> {
        let (sql, args) = Columns::default()
            .set("id", &token.id)
            .set("secret_sha256", &token.secret_sha256)
            .set("user_id", &token.user_id)
            .set("project_id", &token.project_id)
            .set(
                "roles",
                serde_json::Value::from(token.roles.clone()).to_string(),
            )
            .set("description", &token.description)
            .set("created_at", token.created_at)
            .set("expires_at", token.expires_at)
            .set("revoked_at", token.revoked_at)
            .insert("api_tokens");
        self.execute(&sql, args).await?;
        Ok(())
    }

    pub async fn api_token(&mut self, id: &str) -> DbResult<Option<ApiToken>> {
        let sql = format!("SELECT {COLUMNS} FROM api_tokens WHERE id = $1");
        self.fetch_optional_as(&sql, vec![id.into()], token_from_row)
            .await
    }

    /// Every token, oldest first.
    pub async fn list_api_tokens(&mut self) -> DbResult<Vec<ApiToken>> {
        let sql = format!("SELECT {COLUMNS} FROM api_tokens ORDER BY created_at, id");
        self.fetch_all_as(&sql, Vec::new(), token_from_row).await
    }

    /// Marks a token revoked at `at`. False if there is no such token or it was revoked
    /// already.
    pub async fn revoke_api_token(&mut self, id: &str, at: DateTime<Utc>) -> DbResult<bool> {
        let done = sqlx::query(
            "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
        )
        .bind(to_secs(at))
        .bind(id)
        .execute(self.conn().await?)
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
