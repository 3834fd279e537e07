//! The test kit's app, database and clock (`blazar-testkit`), under the names these tests use.

pub use blazar_testkit::{Response, TestApp, TestDatabase, Transcript, t};
