//! Racing real HTTP requests: no resource is ever granted twice.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

fn lease_body(name: &str, start: &str, end: &str, min: i64, max: i64) -> Value {
    json!({
        "name": name, "start_date": start, "end_date": end, "events": [],
        "reservations": [{"resource_type": "physical:host", "min": min, "max": max,
                          "hypervisor_properties": "", "resource_properties": ""}],
    })
}

/// Fifty concurrent creates for the only host and the same window: exactly one wins, the
/// others get a 409 that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_creates_for_one_host_grant_exactly_one() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let requests = (0..50).map(|i| {
        app.post(
            "/v1/leases",
            lease_body(
                &format!("race-{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
            ),
        )
    });
    let responses = join_all(requests).await;
    let created = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    let refused: Vec<_> = responses
        .iter()
        .filter(|r| r.status == StatusCode::CONFLICT)
        .collect();
    assert_eq!(
        created,
        1,
        "{:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), 49);
    for r in refused {
        assert!(
            r.message().contains("Not enough hosts available"),
            "{}",
            r.message()
        );
        assert!(r.message().contains("0 of them free"), "{}", r.message());
    }
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Many overlapping requests over a few hosts: afterwards no host carries two leases at one
/// instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_overlapping_leases_never_share_a_host() {
    let app = TestApp::spawn().await;
    for i in 0..4 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let requests = (0..40).map(|i| {
        let start_hour = 1 + (i % 6);
        let length = 1 + (i % 3);
        let min = 1 + (i % 2);
        app.post(
            "/v1/leases",
            lease_body(
                &format!("mix-{i}"),
                &format!("2030-01-01 {start_hour:02}:00"),
                &format!("2030-01-01 {:02}:00", start_hour + length),
                min,
                min + 1,
            ),
        )
    });
    let responses = join_all(requests).await;
    assert!(
        responses
            .iter()
            .all(|r| r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT)
    );
    assert!(responses.iter().any(|r| r.status == StatusCode::CREATED));
    assert_no_overlaps(&app).await;
}

/// Reads every allocation back through the API and checks the invariant.
pub async fn assert_no_overlaps(app: &TestApp) {
    let allocations = app.get("/v1/os-hosts/allocations").await.body["allocations"].clone();
    for entry in allocations.as_array().unwrap() {
        let mut windows: Vec<(String, String)> = entry["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["start_date"].as_str().unwrap().into(),
                    r["end_date"].as_str().unwrap().into(),
                )
            })
            .collect();
        windows.sort();
        for pair in windows.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "host {} double-booked: {:?}",
                entry["resource_id"],
                pair
            );
        }
    }
}
