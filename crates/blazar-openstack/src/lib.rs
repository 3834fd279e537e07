//! blazar-rs's OpenStack backend: what Blazar's plugins do to Nova and Placement, carried out
//! as actions after commit (see blazar-service's `actions.rs`).
//!
//! * `session`: a Keystone v3 service session and its catalog.
//! * `nova`, `placement`, `neutron`: the calls Blazar's plugins make, each made idempotent
//!   (an action can run twice).
//! * `backend`: [`OpenStackBackend`], the `Backend` that maps actions onto those calls.
//! * `external_filter`: Blazar's `ExternalServiceFilter`, usage enforcement asked of a
//!   site's own service (accounting) over HTTP.
//! * `notifier`: [`RabbitNotifier`], oslo.messaging notifications over RabbitMQ.
//! * `nova_events`: Nova's notifications, read to wake the host monitor (a compute service
//!   changed) and the reconciler (an aggregate, flavor or server group changed by others).
//! * `trusts`: [`KeystoneTrusts`], the Keystone trusts leases are made with
//!   (`act_for_user = trust`).

pub mod backend;
pub mod error;
pub mod external_filter;
mod instances;
mod mirror;
pub mod neutron;
pub mod notifier;
pub mod nova;
pub mod nova_events;
pub mod placement;
mod pools;
mod repair;
pub mod session;
pub mod trusts;
pub mod webhook;

pub use backend::{OpenStackBackend, OpenStackSettings};
pub use error::{Error, Result};
pub use external_filter::{ExternalServiceConfig, ExternalServiceFilter};
pub use notifier::{NotifierSettings, RabbitNotifier};
pub use nova_events::NovaEventSettings;
pub use session::{Credentials, Session, SessionConfig};
pub use trusts::KeystoneTrusts;
pub use webhook::WebhookPoster;

/// One session with per-call request ids: the entry point to Nova and Placement.
pub struct Cloud {
    pub session: Session,
    /// Sessions scoped to users' projects, made on first use.
    projects: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Session>>>,
    /// Sessions acting through users' trusts, by trust id, each keeping its token until
    /// near its expiry.
    trusts: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Session>>>,
}

/// Most trust sessions kept: one per lease acting now; beyond it the cache starts again
/// (a dropped session only costs a login).
const MAX_TRUST_SESSIONS: usize = 1024;

/// The session of `sessions` kept under `key`, made by `make` the first time; the cache is
/// emptied first when it holds `bound` sessions (each keeps a token until it expires).
fn cached(
    sessions: &std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Session>>>,
    key: &str,
    bound: Option<usize>,
    make: impl FnOnce() -> Result<Session>,
) -> Result<std::sync::Arc<Session>> {
    let mut sessions = sessions
        .lock()
        .map_err(|_| Error::Config("cached sessions poisoned".into()))?;
    if let Some(s) = sessions.get(key) {
        return Ok(s.clone());
    }
    if bound.is_some_and(|bound| sessions.len() >= bound) {
        sessions.clear();
    }
    let made = std::sync::Arc::new(make()?);
    sessions.insert(key.to_string(), made.clone());
    Ok(made)
}

impl Cloud {
    pub fn new(config: SessionConfig) -> Result<Cloud> {
        Ok(Cloud {
            session: Session::new(config)?,
            projects: std::sync::Mutex::new(std::collections::HashMap::new()),
            trusts: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// The service user acting through trust `trust_id` (see [`Session::for_trust`]).
    pub fn in_trust(&self, trust_id: &str) -> Result<std::sync::Arc<Session>> {
        cached(&self.trusts, trust_id, Some(MAX_TRUST_SESSIONS), || {
            self.session.for_trust(trust_id)
        })
    }

    /// The session a user's own things are made with: through the lease's trust when it
    /// has one, else the service user scoped to the user's project.
    pub fn for_user(
        &self,
        trust_id: Option<&str>,
        project_id: &str,
    ) -> Result<std::sync::Arc<Session>> {
        match trust_id {
            Some(trust) => self.in_trust(trust),
            None => self.in_project(project_id),
        }
    }

    /// The service user's session in project `project_id` (see [`Session::for_project`]).
    pub fn in_project(&self, project_id: &str) -> Result<std::sync::Arc<Session>> {
        cached(&self.projects, project_id, None, || {
            self.session.for_project(project_id)
        })
    }

    pub fn nova<'a>(&'a self, request_id: Option<&'a str>) -> nova::Nova<'a> {
        nova::Nova::new(&self.session, request_id)
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
        Ok(
            session::items(&found, "images")
                .any(|i| i["instance_uuid"].as_str() == Some(server_id)),
        )
    }

    pub fn neutron<'a>(&'a self, request_id: Option<&'a str>) -> neutron::Neutron<'a> {
        neutron::Neutron::new(&self.session, request_id)
    }

    pub fn placement<'a>(&'a self, request_id: Option<&'a str>) -> placement::Placement<'a> {
        placement::Placement::new(&self.session, request_id)
    }
}
