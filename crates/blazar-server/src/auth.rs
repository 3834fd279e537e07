//! Authentication: who a request acts as.

use axum::http::request::Parts;
use blazar_service::Identity;

use crate::error::ApiError;

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Development mode: every request acts as an admin of a default project unless the
    /// `X-Project-Id`, `X-User-Id` and `X-Roles` headers say otherwise.
    NoAuth { default: Identity },
}

fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Namespace of the deterministic ids below.
const ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5c4b0c3e_6b1f_4b57_9d7e_000000b1a2a7);

/// A Keystone-shaped id (32 hex digits) derived from a name, so a noauth server shows ids of
/// the shape clients and dashboards expect. The derivation (UUIDv5 of `kind:name`) is the one
/// the reference Blazar test bed uses, so transcripts of both compare equal.
pub fn keystone_like_id(kind: &str, name: &str) -> String {
    uuid::Uuid::new_v5(&ID_NAMESPACE, format!("{kind}:{name}").as_bytes())
        .simple()
        .to_string()
}

/// In noauth mode a token `noauth:<user>:<project>:<role>[,<role>...]` (or `peer:...`, the
/// spelling of the reference test bed) acts as that user and project, for clients that cannot
/// send identity headers. Any other token (such as keystoneauth's `notused`) is ignored.
fn identity_from_token(token: &str) -> Option<Identity> {
    let parts: Vec<&str> = token.split(':').collect();
    match parts.as_slice() {
        ["noauth" | "peer", user, project, roles] if !user.is_empty() && !project.is_empty() => {
            Some(Identity {
                user_id: keystone_like_id("user", user),
                project_id: keystone_like_id("project", project),
                roles: roles
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        }
        _ => None,
    }
}

impl Auth {
    pub fn noauth(project_id: &str, user_id: &str) -> Auth {
        Auth::NoAuth {
            default: Identity {
                user_id: user_id.to_string(),
                project_id: project_id.to_string(),
                roles: vec!["admin".into(), "member".into(), "reader".into()],
            },
        }
    }

    pub fn identify(&self, parts: &Parts) -> Result<Identity, ApiError> {
        match self {
            Auth::NoAuth { default } => {
                let mut identity = header(parts, "x-auth-token")
                    .and_then(|token| identity_from_token(&token))
                    .unwrap_or_else(|| default.clone());
                if let Some(project) = header(parts, "x-project-id") {
                    identity.project_id = project;
                }
                if let Some(user) = header(parts, "x-user-id") {
                    identity.user_id = user;
                }
                if let Some(roles) = header(parts, "x-roles") {
                    identity.roles = roles
                        .split(',')
                        .map(|r| r.trim().to_string())
                        .filter(|r| !r.is_empty())
                        .collect();
                }
                Ok(identity)
            }
        }
    }
}
