//! Standalone API tokens (auth mode `tokens`), for sites without Keystone: issuing, checking
//! and revoking them.
//!
//! A token is `blz_<id>_<secret>`: `id` (16 hex digits) finds the row, `secret` (64 hex
//! digits, 256 random bits from the operating system) proves possession. Only the SHA-256
//! digest of the secret is stored. A fast digest is enough because the secret is random and
//! long, not a password a person chose: there is nothing to guess from the digest. The
//! digests are compared in constant time, and a token whose id is unknown costs the same
//! comparison, so timing tells nothing about the secret.

use std::fmt::Write as _;
use std::sync::Arc;

use blazar_core::ApiToken;
use blazar_db::Store;

use crate::{Clock, Identity, ServiceError, ServiceResult};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What every token starts with, so a leaked one is recognisable (and scanners can find it).
pub const TOKEN_PREFIX: &str = "blz_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

pub(crate) fn random_hex(len: usize) -> ServiceResult<String> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| {
        ServiceError::Unavailable(format!("the operating system gave no random bytes: {e}"))
    })?;
    Ok(hex(&bytes))
}

/// Hex SHA-256 digest of a token's secret.
pub fn digest(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

/// Splits a token into its id and secret, if it has the token shape.
pub fn split(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    split_id_secret(rest, ID_BYTES, SECRET_BYTES)
}

/// Splits `<id>_<secret>` whose parts are hex of `id_bytes` and `secret_bytes` bytes (the
/// shape of API tokens and of calendar feed URLs).
pub(crate) fn split_id_secret(
    text: &str,
    id_bytes: usize,
    secret_bytes: usize,
) -> Option<(&str, &str)> {
    let (id, secret) = text.split_once('_')?;
    let is_hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (is_hex(id, id_bytes * 2) && is_hex(secret, secret_bytes * 2)).then_some((id, secret))
}

/// A token just issued: the only moment its secret exists outside the caller's hands.
pub struct IssuedToken {
    pub row: ApiToken,
    pub token: String,
}

/// What a new token acts as.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub project_id: String,
    pub user_id: Option<String>,
    pub roles: Vec<String>,
    pub description: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Creates a token and stores its digest.
pub async fn issue(store: &Store, new: NewToken, now: DateTime<Utc>) -> ServiceResult<IssuedToken> {
    let project_id = new.project_id.trim().to_string();
    if project_id.is_empty() {
        return Err(ServiceError::BadRequest(
            "a token needs a project (--project)".into(),
        ));
    }
    let roles: Vec<String> = new
        .roles
        .iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect();
    if roles.is_empty() {
        return Err(ServiceError::BadRequest(
            "a token needs at least one role (--role member, say)".into(),
        ));
    }
    if let Some(expires_at) = new.expires_at
        && expires_at <= now
    {
        return Err(ServiceError::BadRequest(
            "the token would expire before it is created".into(),
        ));
    }
    let id = random_hex(ID_BYTES)?;
    let secret = random_hex(SECRET_BYTES)?;
    let row = ApiToken {
        user_id: new
            .user_id
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| format!("token-{id}")),
        secret_sha256: digest(&secret),
        project_id,
        roles,
        description: new.description,
        created_at: now,
        expires_at: new.expires_at,
        revoked_at: None,
        id,
    };
    let mut tx = store.write().await?;
    tx.insert_api_token(&row).await?;
    tx.commit().await?;
    let token = format!("{TOKEN_PREFIX}{}_{secret}", row.id);
    Ok(IssuedToken { row, token })
}

/// Every token, oldest first (digests included; they reveal nothing).
pub async fn list(store: &Store) -> ServiceResult<Vec<ApiToken>> {
    let mut tx = store.read().await?;
    let rows = tx.list_api_tokens().await?;
    tx.commit().await?;
    Ok(rows)
}

/// Revokes a token by id (or by the whole token). False if there is no such active token.
pub async fn revoke(store: &Store, id_or_token: &str, now: DateTime<Utc>) -> ServiceResult<bool> {
    let id = split(id_or_token).map_or(id_or_token, |(id, _)| id);
    let mut tx = store.write().await?;
    let done = tx.revoke_api_token(id, now).await?;
    tx.commit().await?;
    Ok(done)
}

/// Whether a token row may be used at `now`.
pub fn status(row: &ApiToken, now: DateTime<Utc>) -> &'static str {
    if row.revoked_at.is_some() {
        "revoked"
    } else if row.expires_at.is_some_and(|t| t <= now) {
        "expired"
    } else {
        "active"
    }
}

/// Checks tokens against the store. Every request reads the token's row, so a revocation
/// takes effect at once, in every server process sharing the database.
#[derive(Clone)]
pub struct TokenAuth {
    store: Store,
    clock: Arc<dyn Clock>,
}

impl TokenAuth {
    pub fn new(store: Store, clock: Arc<dyn Clock>) -> Self {
        TokenAuth { store, clock }
    }

    /// The identity a token acts as, or None if it is not a valid, active token.
    pub async fn identify(&self, token: &str) -> ServiceResult<Option<Identity>> {
        let Some((id, secret)) = split(token) else {
            return Ok(None);
        };
        let mut tx = self.store.read().await?;
        let row = tx.api_token(id).await?;
        tx.commit().await?;
        let presented = digest(secret);
        // An unknown id is compared against a digest of nothing, so it costs the same.
        let stored = row
            .as_ref()
            .map_or_else(|| digest(""), |r| r.secret_sha256.clone());
        let matches: bool = presented.as_bytes().ct_eq(stored.as_bytes()).into();
        let Some(row) = row.filter(|_| matches) else {
            tracing::debug!(token.id = id, "unknown token or wrong secret");
            return Ok(None);
        };
        if status(&row, self.clock.now()) != "active" {
            tracing::debug!(
                token.id = id,
                status = status(&row, self.clock.now()),
                "token refused"
            );
            return Ok(None);
        }
        Ok(Some(Identity {
            user_id: row.user_id,
            project_id: row.project_id,
            roles: row.roles,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_only_when_well_formed() {
        let id = "0123456789abcdef";
        let secret = "ab".repeat(32);
        let token = format!("blz_{id}_{secret}");
        assert_eq!(split(&token), Some((id, secret.as_str())));
        for bad in [
            "".to_string(),
            "blz_".to_string(),
            format!("blz_{id}"),
            format!("xyz_{id}_{secret}"),
            format!("blz_{id}_{}", &secret[1..]),
            format!("blz_{}_{secret}", &id[1..]),
            format!("blz_{id}_{}zz", &secret[2..]),
            format!("blz_{id}_{secret}_extra"),
        ] {
            assert_eq!(split(&bad), None, "{bad}");
        }
    }

    #[test]
    fn the_digest_is_sha256_in_hex() {
        assert_eq!(
            digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
