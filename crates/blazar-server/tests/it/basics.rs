//! Version discovery, headers, error envelopes, request hygiene.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::TestApp;

#[tokio::test]
async fn version_document_lists_v1() {
    let app = TestApp::spawn().await;
    for path in ["/", "/versions"] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::MULTIPLE_CHOICES);
        let v = &r.body["versions"][0];
        assert_eq!(v["id"], "v1.0");
        assert_eq!(v["status"], "CURRENT");
        assert!(v["links"][0]["href"].as_str().unwrap().ends_with("/v1"));
        assert_eq!(v["min_version"], "1.0");
        assert_eq!(v["max_version"], "1.0");
    }
}

#[tokio::test]
async fn v1_responses_carry_version_and_request_id_headers() {
    let app = TestApp::spawn().await;
    let r = app.get("/v1/leases").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["openstack-api-version"], "reservation 1.0");
    assert_eq!(r.headers["vary"], "OpenStack-API-Version");
    let id = r.headers["x-openstack-request-id"].to_str().unwrap();
    assert!(id.starts_with("req-") && id.len() == 40, "{id}");
    // Errors carry them too.
    let r = app
        .get("/v1/leases/00000000-0000-0000-0000-000000000000")
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.headers["openstack-api-version"], "reservation 1.0");
    assert!(r.headers.contains_key("x-openstack-request-id"));
}

#[tokio::test]
async fn microversion_header_is_checked() {
    let app = TestApp::spawn().await;
    let send = |value: &'static str| {
        app.client
            .get(format!("{}/v1/leases", app.base))
            .header("OpenStack-API-Version", value)
            .send()
    };
    let ok = send("reservation 1.0").await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let latest = send("reservation latest").await.unwrap();
    assert_eq!(latest.headers()["openstack-api-version"], "reservation 1.0");
    let other_service = send("compute 2.1").await.unwrap();
    assert_eq!(other_service.status(), StatusCode::OK);
    let bad = send("reservation 1.x").await.unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(body["error"], 400);
    assert!(
        body["error_message"]
            .as_str()
            .unwrap()
            .contains("invalid format")
    );
    let unsupported = send("reservation 1.5").await.unwrap();
    assert_eq!(unsupported.status(), StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn unknown_routes_and_methods_use_the_framework_shape() {
    let app = TestApp::spawn().await;
    let r = app.get("/v1/nothing-here").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.body["error"], 404);
    assert!(r.message().contains("requested URL was not found"));
    let r = app
        .request(Method::PATCH, "/v1/leases", Some(json!({})))
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.body["error"], 405);
    let r = app.get("/v1/os-hosts/").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn json_suffix_routes_work() {
    let app = TestApp::spawn().await;
    let id = app.create_host("compute-1", json!({})).await;
    assert_eq!(app.get("/v1/leases.json").await.status, StatusCode::OK);
    let r = app.get(&format!("/v1/os-hosts/{id}.json")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["host"]["hypervisor_hostname"], "compute-1");
}

#[tokio::test]
async fn malformed_bodies_get_a_400_in_blazar_format() {
    let app = TestApp::spawn().await;
    let cases: [(&str, &'static str, &str); 3] = [
        ("application/json", "{bad", "not valid JSON"),
        ("application/json", "[1, 2]", "must be a JSON object"),
        ("application/json", "\"text\"", "must be a JSON object"),
    ];
    for (content_type, body, expected) in cases {
        let r = app
            .raw(Method::POST, "/v1/leases", content_type, body)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{content_type} {body}");
        assert_eq!(r.body["error_code"], 400);
        assert_eq!(r.body["error_name"], 400);
        assert!(r.message().contains(expected), "{body}: {}", r.message());
    }
    // A content type other than JSON is refused by Blazar's web layer, in its own shape.
    for (content_type, body) in [
        ("text/plain", "{}"),
        ("application/x-www-form-urlencoded", "name=x"),
    ] {
        let r = app
            .raw(Method::POST, "/v1/leases", content_type, body)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{content_type}");
        assert_eq!(
            r.body,
            json!({
                "error": 400,
                "error_message": format!("Content type '{content_type}' isn't supported"),
            })
        );
    }
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
}

/// A body the client says it compressed is refused (415) rather than read, and noauth
/// identity headers no lease could carry are refused (400), each in Blazar's error format;
/// nothing is written.
#[tokio::test]
async fn compressed_bodies_and_outsized_noauth_identities_are_refused() {
    let app = TestApp::spawn().await;
    let send = |headers: Vec<(&'static str, String)>| {
        let mut request = app
            .client
            .post(format!("{}/v1/os-hosts", app.base))
            .header("Content-Type", "application/json")
            .body(r#"{"name": "h1"}"#);
        for (k, v) in headers {
            request = request.header(k, v);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }
    };
    for encoding in ["gzip", "deflate, gzip", "br"] {
        let (status, body) = send(vec![("Content-Encoding", encoding.into())]).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{encoding}");
        assert_eq!(body["error_code"], 415);
        assert!(
            body["error_message"]
                .as_str()
                .unwrap()
                .contains("isn't supported"),
            "{body}"
        );
    }
    let long = "p".repeat(256);
    let many = vec!["r"; 65].join(",");
    for (header, value, expected) in [
        (
            "X-Project-Id",
            long.clone(),
            "X-Project-Id is longer than 255",
        ),
        ("X-User-Id", long.clone(), "X-User-Id is longer than 255"),
        (
            "X-Roles",
            format!("admin,{long}"),
            "X-Roles is longer than 255",
        ),
        ("X-Roles", many, "more than 64 roles"),
        ("X-Project-Id", " ".into(), "X-Project-Id is empty"),
        ("X-User-Id", String::new(), "X-User-Id is empty"),
    ] {
        let (status, body) = send(vec![(header, value)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{header}");
        assert_eq!(body["error_code"], 400);
        assert!(
            body["error_message"].as_str().unwrap().contains(expected),
            "{header}: {body}"
        );
    }
    // A header that is not text would leave the caller with the default identity, an
    // admin's: refused, never ignored.
    for value in ["\u{e9}t\u{e9}".as_bytes(), b"\xffprojA".as_slice()] {
        let response = app
            .client
            .post(format!("{}/v1/os-hosts", app.base))
            .header("Content-Type", "application/json")
            .header(
                "X-Project-Id",
                reqwest::header::HeaderValue::from_bytes(value).unwrap(),
            )
            .body(r#"{"name": "h1"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error_message"]
                .as_str()
                .unwrap()
                .contains("X-Project-Id must be printable ASCII"),
            "{body}"
        );
    }
    assert_eq!(app.get("/v1/os-hosts").await.body["hosts"], json!([]));
    // An empty X-Roles means no roles, not the default identity's.
    let response = app
        .client
        .get(format!("{}/v1/notifications", app.base))
        .header("X-Project-Id", "projA")
        .header("X-User-Id", "u")
        .header("X-Roles", "")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Identity (no encoding) is the body as sent; 255 characters are a column's worth.
    let (status, _) = send(vec![
        ("Content-Encoding", "identity".into()),
        ("X-Project-Id", "p".repeat(255)),
    ])
    .await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let app = TestApp::spawn().await;
    let big = "x".repeat(2 * 1024 * 1024);
    let r = app
        .post(
            "/v1/leases",
            json!({"name": big, "start_date": "now", "end_date": "2030-01-01 10:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.body["error_code"], 413);
}

#[tokio::test]
async fn delete_answers_204_with_an_empty_body() {
    let app = TestApp::spawn().await;
    let id = app.create_host("compute-1", json!({})).await;
    let r = app.delete(&format!("/v1/os-hosts/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(r.body.is_null());
    assert_eq!(r.headers["content-type"], "application/json");
}

/// After a burst of allocations the table is vacuumed and its planner statistics refreshed
/// without waiting for autovacuum (PostgreSQL), and not again until enough changes again;
/// SQLite has none to keep.
#[tokio::test]
async fn planner_statistics_follow_a_burst_of_allocations() {
    let app = TestApp::spawn().await;
    for i in 0..25 {
        app.create_host(&format!("stats-{i:02}"), json!({})).await;
    }
    // 41 leases of every host: 1,025 allocations, more than the refresh threshold.
    let first = chrono::NaiveDate::from_ymd_opt(2031, 1, 1).unwrap();
    for day in 0..41 {
        let date = first + chrono::Days::new(day);
        let r = app
            .host_lease(
                &format!("burst-{day}"),
                &format!("{date} 10:00"),
                &format!("{date} 11:00"),
                25,
                25,
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let store = app.service.store();
    if store.backend() == blazar_db::Backend::Sqlite {
        assert!(store.refresh_statistics().await.unwrap().is_empty());
        return;
    }
    // PostgreSQL publishes table statistics within a second or so of the commits.
    let mut analyzed = Vec::new();
    for _ in 0..100 {
        analyzed = store.refresh_statistics().await.unwrap();
        if analyzed.contains(&"allocations") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        analyzed.contains(&"allocations"),
        "analyzed only {analyzed:?}"
    );
    let again = store.refresh_statistics().await.unwrap();
    assert!(!again.contains(&"allocations"), "analyzed twice: {again:?}");
}
