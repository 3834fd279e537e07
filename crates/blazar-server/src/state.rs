//! What every handler can reach.

use std::sync::Arc;

use blazar_service::Service;

use crate::auth::Auth;

#[derive(Clone)]
pub struct AppState {
    pub service: Service,
    pub auth: Arc<Auth>,
}
