//! Calendar feeds: a project's leases as an iCalendar document at a secret URL that a
//! calendar application can fetch without a token; created, listed and deleted through
//! the API, only ever showing the feed's own project.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::TestApp;

fn lease(name: &str, start: &str, end: &str) -> serde_json::Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [],
           "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                             "hypervisor_properties": "", "resource_properties": ""}]})
}

/// Fetches a document with no identity at all, as a calendar application does.
async fn fetch(app: &TestApp, path: &str) -> (StatusCode, String, String) {
    let r = reqwest::get(format!("{}{path}", app.base)).await.unwrap();
    let status = r.status();
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, kind, r.text().await.unwrap())
}

/// A feed's document with its folded lines joined again.
async fn fetch_unfolded(app: &TestApp, path: &str) -> String {
    let (_, _, text) = fetch(app, path).await;
    text.replace("\r\n ", "")
}

#[tokio::test]
async fn a_project_feed_shows_its_own_leases_to_a_calendar_application_until_deleted() {
    let mut app = TestApp::spawn().await;
    for i in 0..3 {
        app.create_host(&format!("h{i}"), json!({})).await;
    }
    app.act_as("alpha", "ada", "member");
    for (name, start, end) in [
        ("alpha, first; run", "2030-01-01 10:00", "2030-01-01 12:00"),
        ("alpha-second", "2030-02-01 08:30", "2030-02-03 08:30"),
    ] {
        let r = app.post("/v1/leases", lease(name, start, end)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    app.act_as("beta", "bob", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("beta-secret", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // A member makes a feed of its own project; the path is shown this once.
    app.act_as("alpha", "ada", "member");
    let r = app
        .post("/v1/ical-feeds", json!({"description": "lab calendar"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let feed = r.body["ical_feed"].clone();
    assert_eq!(feed["project_id"], "alpha");
    assert_eq!(feed["created_by"], "ada");
    let path = feed["path"].as_str().unwrap().to_string();
    let id = feed["id"].as_str().unwrap().to_string();
    assert!(
        path.starts_with(&format!("/ical/{id}_")) && path.ends_with(".ics"),
        "{path}"
    );

    let (status, kind, text) = fetch(&app, &path).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(kind, "text/calendar; charset=utf-8");
    assert!(
        text.starts_with("BEGIN:VCALENDAR\r\nVERSION:2.0\r\n"),
        "{text}"
    );
    assert!(text.ends_with("END:VCALENDAR\r\n"));
    for line in text.split("\r\n") {
        assert!(line.len() <= 75, "an unfolded line: {line}");
        assert!(!line.contains('\n'), "a bare line feed: {line:?}");
    }
    let unfolded = text.replace("\r\n ", "");
    assert_eq!(unfolded.matches("BEGIN:VEVENT").count(), 2, "{unfolded}");
    assert!(
        unfolded.contains("SUMMARY:alpha\\, first\\; run\r\n"),
        "{unfolded}"
    );
    assert!(unfolded.contains("DTSTART:20300201T083000Z\r\nDTEND:20300203T083000Z\r\n"));
    assert!(unfolded.contains("X-WR-CALDESC:lab calendar\r\n"));
    assert!(unfolded.contains("physical:host: 1 granted"));
    assert!(
        !unfolded.contains("beta"),
        "another project's lease in the feed"
    );

    // Listed without its path; another project sees none of it.
    let r = app.get("/v1/ical-feeds").await;
    assert_eq!(r.status, StatusCode::OK);
    let listed = r.body["ical_feeds"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    assert!(listed[0].get("path").is_none(), "{}", r.body);
    app.act_as("beta", "bob", "member");
    assert_eq!(
        app.get("/v1/ical-feeds").await.body,
        json!({"ical_feeds": []})
    );
    let r = app.delete(&format!("/v1/ical-feeds/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = app
        .post("/v1/ical-feeds", json!({"project_id": "alpha"}))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);

    // An admin sees every feed and may make one for any project.
    app.act_as_admin();
    let r = app
        .post("/v1/ical-feeds", json!({"project_id": "beta"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let beta_path = r.body["ical_feed"]["path"].as_str().unwrap().to_string();
    let (_, _, beta_text) = fetch(&app, &beta_path).await;
    assert!(beta_text.contains("SUMMARY:beta-secret"), "{beta_text}");
    assert!(!beta_text.contains("alpha"));
    assert_eq!(
        app.get("/v1/ical-feeds").await.body["ical_feeds"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A wrong secret, a malformed path and an unknown id are all just not found.
    let secret_start = path.find('_').unwrap() + 1;
    let mut wrong = path.clone();
    let flipped = if &path[secret_start..=secret_start] == "0" {
        "1"
    } else {
        "0"
    };
    wrong.replace_range(secret_start..=secret_start, flipped);
    for bad in [
        wrong.as_str(),
        "/ical/nothing.ics",
        "/ical/0123456789abcdef_00.ics",
    ] {
        let (status, _, _) = fetch(&app, bad).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{bad}");
    }
    for bad in [json!({"project_id": 3}), json!({"colour": "red"})] {
        let r = app.post("/v1/ical-feeds", bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    }

    // Deleting the feed revokes its URL at once.
    app.act_as("alpha", "ada", "member");
    let r = app.delete(&format!("/v1/ical-feeds/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let (status, _, _) = fetch(&app, &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_project_has_at_most_25_feeds() {
    let mut app = TestApp::spawn().await;
    app.act_as("alpha", "alpha-user", "member");
    for _ in 0..25 {
        app.post("/v1/ical-feeds", json!({}))
            .await
            .assert_status(StatusCode::CREATED);
    }
    let r = app.post("/v1/ical-feeds", json!({})).await;
    r.assert_status(StatusCode::BAD_REQUEST);
    assert!(r.message().contains("at most 25"), "{}", r.message());
    // Another project's count is its own.
    app.act_as("beta", "beta-user", "member");
    app.post("/v1/ical-feeds", json!({}))
        .await
        .assert_status(StatusCode::CREATED);
}

/// A calendar application that polls gets 304 while nothing changed (the feed has an entity
/// tag and the same leases give the same bytes, whenever read), and the new document once
/// a lease changes.
#[tokio::test]
async fn a_feed_polled_again_is_not_sent_again_until_a_lease_changes() {
    let mut app = TestApp::spawn().await;
    app.create_host("h0", json!({})).await;
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("run", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app.post("/v1/ical-feeds", json!({})).await;
    let url = format!(
        "{}{}",
        app.base,
        r.body["ical_feed"]["path"].as_str().unwrap()
    );
    let client = reqwest::Client::new();
    let get = |etag: Option<&str>| {
        let mut request = client.get(&url);
        if let Some(etag) = etag {
            request = request.header("If-None-Match", etag);
        }
        async move {
            let r = request.send().await.unwrap();
            let etag = r.headers()["etag"].to_str().unwrap().to_string();
            let cache = r.headers()["cache-control"].to_str().unwrap().to_string();
            (r.status(), etag, cache, r.text().await.unwrap())
        }
    };
    let (status, etag, _, first) = get(None).await;
    assert_eq!(status, StatusCode::OK);
    // Later, the same bytes and the same tag.
    app.set_time(blazar_testkit::epoch() + chrono::Duration::hours(3));
    let (status, again, _, second) = get(None).await;
    assert_eq!((status, &again), (StatusCode::OK, &etag));
    assert_eq!(first, second);
    let (status, tag, cache, body) = get(Some(&etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(tag, etag);
    assert_eq!(cache, "private, no-cache");
    assert!(body.is_empty());
    // A renamed lease is a new document.
    let r = app
        .put(
            &format!("/v1/leases/{lease_id}"),
            json!({"name": "renamed"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let (status, changed, _, text) = get(Some(&etag)).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(changed, etag);
    assert!(text.contains("SUMMARY:renamed"), "{text}");
}

/// A lease that lost what it was granted says so in its event, beside the figure granted.
#[tokio::test]
async fn a_feed_says_when_a_lease_lost_what_it_was_granted() {
    let mut app = TestApp::spawn().await;
    let host = app.create_host("only", json!({})).await;
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("kept", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app.post("/v1/ical-feeds", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let path = r.body["ical_feed"]["path"].as_str().unwrap().to_string();
    let unfolded = fetch_unfolded(&app, &path).await;
    assert!(
        unfolded.contains("physical:host: 1 granted\r\n"),
        "{unfolded}"
    );

    // The only host leaves the pool: nothing can replace it.
    app.act_as_admin();
    let r = app
        .put(
            &format!("/v1/os-hosts/{host}"),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let unfolded = fetch_unfolded(&app, &path).await;
    assert!(
        unfolded.contains("Status: PENDING\\, degraded"),
        "{unfolded}"
    );
    assert!(
        unfolded.contains("physical:host: 1 granted\\, some of it lost\r\n"),
        "{unfolded}"
    );
}
