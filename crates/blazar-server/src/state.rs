//! What every handler can reach.

use std::sync::Arc;

use blazar_service::Service;

use crate::auth::Auth;
use crate::lease_cache::LeaseCache;

#[derive(Clone)]
pub struct AppState {
    pub service: Service,
    pub auth: Arc<Auth>,
    /// Rendered leases, reused by lease lists while their revision stands.
    pub leases: Arc<LeaseCache>,
}

impl AppState {
    pub fn new(service: Service, auth: Auth) -> AppState {
        AppState {
            service,
            auth: Arc::new(auth),
            leases: Arc::new(LeaseCache::default()),
        }
    }
}
