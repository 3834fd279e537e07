//! Acting for the user through Keystone trusts (`act_for_user = trust`), as Blazar does: a
//! lease create makes a trust from the caller to the service's user with the caller's own
//! token, before its write transaction; the lease keeps the trust's id; the backend acts in
//! the user's project through it; deleting the lease deletes it, as an action after the
//! lease's others. The Keystone calls themselves are a [`Trusts`] (blazar-openstack's
//! `KeystoneTrusts`); this module decides when they happen.

use std::fmt;

use async_trait::async_trait;
use blazar_core::{ActionKind, ActionPurpose, Lease};
use blazar_db::Tx;
use serde_json::json;

use crate::backend::{Action, ActionError, ActionOutput};
use crate::{Identity, Service, ServiceError, ServiceResult};

/// The caller's own Keystone token, which a trust is made with. Kept only for the request:
/// never stored, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct UserToken(String);

impl UserToken {
    pub fn new(token: impl Into<String>) -> UserToken {
        UserToken(token.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for UserToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserToken(***)")
    }
}

/// Why Keystone did not do what was asked of a trust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// Keystone answered no (4xx): the caller's token may not delegate (an application
    /// credential's, a trust's), a role cannot be delegated, the service may not delete.
    #[error("{0}")]
    Refused(String),
    /// Keystone could not be asked just now (unreachable, 5xx): worth trying again.
    #[error("{0}")]
    Unavailable(String),
}

/// Keystone's trust API, as the service needs it.
#[async_trait]
pub trait Trusts: Send + Sync {
    /// Makes a trust from the holder of `token` (who is `identity`) to the service's own
    /// user: in `identity`'s project, with the token's roles, impersonating the trustor.
    /// Answers the trust's id.
    async fn create(&self, identity: &Identity, token: &UserToken) -> Result<String, TrustError>;

    /// Deletes a trust with the token that made it (a create that did not go through: the
    /// trustor may always delete its own trust). Already gone is fine.
    async fn delete_as_trustor(&self, trust_id: &str, token: &UserToken) -> Result<(), TrustError>;

    /// Deletes a trust with the service's own credentials (Keystone lets an admin or the
    /// trustor delete a trust). Already gone is fine.
    async fn delete(&self, trust_id: &str) -> Result<(), TrustError>;
}

/// How the service reaches Keystone's trusts, and whether new leases get one.
#[derive(Clone)]
pub(crate) struct TrustSettings {
    pub(crate) keystone: std::sync::Arc<dyn Trusts>,
    /// `act_for_user = trust`: every lease create makes a trust. Otherwise trusts of leases
    /// made in that mode are still deleted with them.
    pub(crate) make: bool,
}

/// A trust made for a create that then did not happen, or whose outcome is not known.
fn trust_refused(e: TrustError) -> ServiceError {
    match e {
        TrustError::Refused(m) => ServiceError::Forbidden(format!(
            "Keystone refused the trust that lets Blazar act for you in your project: {m}"
        )),
        TrustError::Unavailable(m) => ServiceError::Unavailable(format!(
            "Keystone could not be asked for the trust that lets Blazar act for you: {m}"
        )),
    }
}

impl Service {
    /// Uses `keystone` for trusts; `make` (`act_for_user = trust`) makes one at every lease
    /// create. Without it, leases get an id that names no trust.
    pub fn with_trusts(mut self, keystone: std::sync::Arc<dyn Trusts>, make: bool) -> Self {
        self.trusts = Some(TrustSettings { keystone, make });
        self
    }

    /// Whether lease creates make Keystone trusts.
    pub fn makes_trusts(&self) -> bool {
        self.trusts.as_ref().is_some_and(|t| t.make)
    }

    /// Makes the trust of a new lease, outside any transaction: `None` when this service
    /// makes none. A refusal is the create's answer.
    pub(crate) async fn make_trust(
        &self,
        identity: &Identity,
        token: Option<&UserToken>,
    ) -> ServiceResult<Option<String>> {
        let Some(trusts) = self.trusts.as_ref().filter(|t| t.make) else {
            return Ok(None);
        };
        // Only auth mode keystone is allowed with trusts, and it always has a token.
        let token = token.ok_or_else(|| {
            ServiceError::Internal("act_for_user = trust, but the request has no token".into())
        })?;
        let id = trusts
            .keystone
            .create(identity, token)
            .await
            .map_err(trust_refused)?;
        tracing::info!(trust.id = %id, user.id = %identity.user_id,
            project.id = %identity.project_id, "trust made for a new lease");
        Ok(Some(id))
    }

    /// Deletes the trust of a create that did not go through, with the caller's token: best
    /// effort, so that a refused create leaves nothing behind in Keystone.
    pub(crate) async fn forget_trust(&self, trust_id: &str, token: Option<&UserToken>) {
        let (Some(trusts), Some(token)) = (&self.trusts, token) else {
            return;
        };
        match trusts.keystone.delete_as_trustor(trust_id, token).await {
            Ok(()) => tracing::info!(trust.id = %trust_id, "trust of a refused create deleted"),
            Err(e) => tracing::warn!(trust.id = %trust_id, error = %e,
                "the trust of a refused create could not be deleted; it is left in Keystone"),
        }
    }

    /// Records that the Keystone trust of `lease`, which is being deleted, is to be deleted
    /// after commit. Recorded last, so it runs once the lease's earlier actions (which may
    /// act through it) are done.
    pub(crate) async fn record_trust_deletion(
        &self,
        tx: &mut Tx,
        lease: &Lease,
    ) -> ServiceResult<()> {
        if !lease.keystone_trust {
            return Ok(());
        }
        let action = self.whole_lease_action(
            lease,
            (ActionKind::DeleteTrust, ActionPurpose::Delete),
            json!({ "trust_id": lease.trust_id }),
        );
        let seq = tx.insert_action(&action).await?;
        tracing::debug!(action.seq = seq, lease.id = %lease.id, "trust to be deleted");
        Ok(())
    }

    /// Carries out a `delete_trust` action, bounded by the action timeout.
    pub(crate) async fn delete_trust(&self, action: &Action) -> Result<ActionOutput, ActionError> {
        let Some(trust_id) = action.trust_id.as_deref() else {
            return Ok(ActionOutput::default());
        };
        let Some(trusts) = &self.trusts else {
            return Err(ActionError::Permanent(format!(
                "trust {trust_id} of deleted lease {} is left in Keystone: this server has no \
                 Keystone to delete it with (auth = keystone)",
                action.lease_id
            )));
        };
        let deleted = tokio::time::timeout(
            self.settings.action_timeout,
            trusts.keystone.delete(trust_id),
        )
        .await;
        match deleted {
            Ok(Ok(())) => {
                tracing::info!(trust.id = %trust_id, lease.id = %action.lease_id, "trust deleted");
                Ok(ActionOutput::default())
            }
            Ok(Err(TrustError::Refused(m))) => Err(ActionError::Permanent(format!(
                "Keystone refused to delete trust {trust_id} (the service user needs the \
                 admin role to delete users' trusts): {m}"
            ))),
            Ok(Err(TrustError::Unavailable(m))) => Err(ActionError::Transient(m)),
            Err(_) => Err(ActionError::Transient(format!(
                "no answer within {} s",
                self.settings.action_timeout.as_secs()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_token_is_never_printed() {
        let token = UserToken::new("gAAAAAsecret");
        assert_eq!(format!("{token:?}"), "UserToken(***)");
        assert_eq!(token.expose(), "gAAAAAsecret");
    }

    #[test]
    fn keystone_refusals_are_the_callers_and_outages_are_503() {
        let refused = trust_refused(TrustError::Refused(
            "Delegated tokens cannot manage trusts.".into(),
        ));
        assert!(
            matches!(&refused, ServiceError::Forbidden(m) if m.contains("Delegated tokens")),
            "{refused:?}"
        );
        let away = trust_refused(TrustError::Unavailable("connection refused".into()));
        assert!(matches!(away, ServiceError::Unavailable(_)), "{away:?}");
    }
}
