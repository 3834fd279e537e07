//! A typed client for Blazar's v1 reservation API: connection settings resolved like every
//! OpenStack client (flags, `OS_*` variables, clouds.yaml), Keystone v3 authentication with
//! catalog lookup, one method per endpoint, and waiting for a lease to start or end.
//!
//! ```no_run
//! # async fn demo() -> Result<(), blazar_client::Error> {
//! use blazar_client::{Client, ConnectOptions};
//!
//! // A noauth server, as `blazar-server` runs by default:
//! let client = Client::new("http://127.0.0.1:1234", None)?;
//! for lease in client.list_leases().await? {
//!     println!("{} {} {}", lease.id, lease.name, lease.status);
//! }
//!
//! // Or whatever OS_CLOUD / OS_AUTH_URL / BLAZAR_URL say:
//! let client = ConnectOptions::from_env().with_clouds_yaml()?.connect().await?;
//! # let _ = client;
//! # Ok(())
//! # }
//! ```

pub mod auth;
pub mod client;
pub mod config;
pub mod error;
pub mod time;
pub mod wait;

pub use blazar_api as api;
pub use client::{Client, NewLease};
pub use config::{AuthType, ConnectOptions};
pub use error::{Error, Result};
