//! The test kit's app, database and clock (`blazar-testkit`), under the names these tests use,
//! and checks several test files share.

pub use blazar_testkit::{Response, TestApp, TestDatabase, Transcript, t};

use reqwest::StatusCode;

/// After a change of a property raced bookings filtering on its old value: either the
/// change was refused (409, and a booking holds the resource) or it went through (200, and
/// no booking holds it), never both. `held` is the resource's allocation as listed.
pub fn assert_refused_or_missed(round: u64, changed: &Response, held: &Response, key: &str) {
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    let holders = held.body[key]["reservations"]
        .as_array()
        .map_or(0, Vec::len);
    match changed.status {
        StatusCode::OK => assert_eq!(
            holders, 0,
            "round {round}: the property changed under bookings filtering on it: {}",
            held.body
        ),
        StatusCode::CONFLICT => assert!(holders > 0, "round {round}: refused for nothing"),
        other => panic!("round {round}: {other} {}", changed.body),
    }
}
