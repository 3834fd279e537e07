//! What the tests of blazar-rs share:
//!
//! - [`TestDatabase`]: a database only one test uses, a temporary SQLite file or, when
//!   `BLAZAR_TEST_DATABASE_URL` is set, a fresh PostgreSQL schema dropped afterwards;
//! - [`TestApp`]: the real router on a loopback port, its state built by the server's own
//!   [`blazar_server::StateBuilder`] (so tests run the production policy engine), on a
//!   [`ManualClock`](blazar_service::ManualClock) that starts at [`epoch`] and moves only when
//!   a test moves it, with request helpers and the scheduler's tick;
//! - [`Transcript`] and [`Redactor`]: responses as text for snapshots, with ids, request ids
//!   and record timestamps replaced by placeholders.
//!
//! A dev-dependency only.

// Test-only code: a test fails loudly on anything unexpected, which is what unwrap and expect
// are for here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod app;
mod database;
mod redact;

use chrono::{DateTime, TimeZone, Utc};

pub use app::{Response, TestApp, TestAppBuilder};
pub use database::{TestDatabase, postgres_url};
pub use redact::{Redactor, Transcript};

/// A minute in UTC.
pub fn t(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

/// The time the clock starts at in every test: leases in 2030 are in its future.
pub fn epoch() -> DateTime<Utc> {
    t(2029, 12, 31, 8, 0)
}
