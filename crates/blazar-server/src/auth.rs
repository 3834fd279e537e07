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
                let mut identity = default.clone();
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
