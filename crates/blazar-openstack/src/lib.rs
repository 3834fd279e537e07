//! blazar-rs's OpenStack backend: what Blazar's plugins do to Nova and Placement, carried out
//! as actions after commit (see blazar-service's `actions.rs`).
//!
//! * `session`: a Keystone v3 service session and its catalog.
//! * `nova`, `placement`: the calls Blazar's host plugin makes, each made idempotent (an
//!   action can run twice).
//! * `backend`: [`OpenStackBackend`], the `Backend` that maps actions onto those calls.

pub mod backend;
pub mod error;
pub mod nova;
pub mod placement;
pub mod session;

pub use backend::{OpenStackBackend, OpenStackSettings};
pub use error::{Error, Result};
pub use session::{Credentials, Session, SessionConfig};

/// One session with per-call request ids: the entry point to Nova and Placement.
pub struct Cloud {
    pub session: Session,
}

impl Cloud {
    pub fn new(config: SessionConfig) -> Result<Cloud> {
        Ok(Cloud {
            session: Session::new(config)?,
        })
    }

    pub fn nova<'a>(&'a self, request_id: Option<&'a str>) -> nova::Nova<'a> {
        nova::Nova {
            session: &self.session,
            request_id,
        }
    }

    /// Whether Glance has an image named `name` made from server `server_id`.
    pub async fn image_of_server_exists(&self, name: &str, server_id: &str) -> Result<bool> {
        let found = self
            .session
            .call(
                "image",
                reqwest::Method::GET,
                &format!("/v2/images?name={}", placement::urlencode(name)),
                session::Call::default(),
            )
            .await?
            .body;
        Ok(found["images"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|i| i["instance_uuid"].as_str() == Some(server_id)))
    }

    pub fn placement<'a>(&'a self, request_id: Option<&'a str>) -> placement::Placement<'a> {
        placement::Placement {
            session: &self.session,
            request_id,
        }
    }
}
