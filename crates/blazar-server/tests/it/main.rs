//! Integration tests: the real router over a real socket, on SQLite by default and on
//! PostgreSQL when `BLAZAR_TEST_DATABASE_URL` is set.

// Tests fail loudly on anything unexpected; that is what unwrap and expect are for here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod actions;
mod auth_modes;
mod basics;
mod calendar;
mod concurrency;
mod connections;
mod dry_run;
mod enforcement;
mod harness;
mod hosts;
mod ical;
mod instances;
mod inventory;
mod keystone;
mod leases;
mod lifecycle;
mod matrix;
mod notifications;
mod observe;
mod offers;
mod openstack;
mod policy_file;
mod processes;
mod quotas;
mod reconciler;
mod responses;
mod support;
mod timeline;
mod tokens;
mod trusts;
mod webhooks;
