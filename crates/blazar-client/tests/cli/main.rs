//! The `blazar` binary, run as a user runs it, against a real blazar-server started by each
//! test (and a fake Keystone where authentication is the subject).

// Tests fail loudly on anything unexpected; that is what unwrap and expect are for here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod actions;
mod config;
mod feeds;
mod formats;
mod harness;
mod hosts;
mod leases;
mod offers;
mod quotas;
mod timeline;
mod waiting;
mod webhooks;
