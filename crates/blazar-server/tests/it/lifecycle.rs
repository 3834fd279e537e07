//! The event scheduler, driven with a fixed clock: start, before-end, end, hand-overs, and
//! deletes in every status.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestApp, t};

fn lease_id(body: &Value) -> String {
    body["lease"]["id"].as_str().unwrap().to_string()
}

fn event_status(lease: &Value, kind: &str) -> String {
    lease["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == kind)
        .map(|e| e["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

async fn lease(app: &TestApp, id: &str) -> Value {
    app.get(&format!("/v1/leases/{id}")).await.body["lease"].clone()
}

#[tokio::test]
async fn a_lease_starts_and_ends_on_time() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);

    assert_eq!(app.tick_at(t(2030, 1, 1, 9, 59)).await.executed, 0);
    assert_eq!(lease(&app, &id).await["status"], "PENDING");

    assert_eq!(app.tick_at(t(2030, 1, 1, 10, 0)).await.executed, 1);
    let l = lease(&app, &id).await;
    assert_eq!(l["status"], "ACTIVE");
    assert_eq!(l["reservations"][0]["status"], "active");
    assert_eq!(event_status(&l, "start_lease"), "DONE");
    assert_eq!(event_status(&l, "before_end_lease"), "UNDONE");
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    assert_eq!(holders.as_array().unwrap().len(), 1);
    assert_eq!(holders[0]["resource_id"], "1");
    assert_eq!(holders[0]["project_id"], "admin-project");
    assert_eq!(holders[0]["lease_id"], id.as_str());

    // Running the same instant again does nothing: every event runs once.
    assert_eq!(app.tick_at(t(2030, 1, 1, 10, 0)).await.executed, 0);

    assert_eq!(app.tick_at(t(2030, 1, 1, 11, 0)).await.executed, 1);
    assert_eq!(
        event_status(&lease(&app, &id).await, "before_end_lease"),
        "DONE"
    );
    assert_eq!(lease(&app, &id).await["status"], "ACTIVE");

    assert_eq!(app.tick_at(t(2030, 1, 1, 12, 0)).await.executed, 1);
    let l = lease(&app, &id).await;
    assert_eq!(l["status"], "TERMINATED");
    assert_eq!(l["reservations"][0]["status"], "deleted");
    assert_eq!(event_status(&l, "end_lease"), "DONE");
    assert_eq!(app.get("/v1/handovers").await.body["handovers"], json!([]));
    let history = app.get("/v1/handovers?all=true").await.body["handovers"].clone();
    assert_eq!(history[0]["until"], "2030-01-01T12:00:00.000000");
}

#[tokio::test]
async fn a_late_scheduler_runs_everything_due_in_order() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);
    // The server was down for the whole lease: start, before-end and end all run, in order.
    let report = app.tick_at(t(2030, 1, 2, 0, 0)).await;
    assert_eq!(report.executed, 3);
    assert_eq!(lease(&app, &id).await["status"], "TERMINATED");
}

#[tokio::test]
async fn back_to_back_leases_hand_over_end_before_start() {
    let mut app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let a = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    app.act_as("demo", "alice", "member");
    let b = app
        .host_lease("b", "2030-01-01 12:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(b.status, StatusCode::CREATED);
    app.act_as_admin();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    assert_eq!(
        lease(&app, &lease_id(&a.body)).await["status"],
        "TERMINATED"
    );
    assert_eq!(lease(&app, &lease_id(&b.body)).await["status"], "ACTIVE");
    let open = app.get("/v1/handovers").await.body["handovers"].clone();
    assert_eq!(
        open.as_array().unwrap().len(),
        1,
        "one holder at a time: {open}"
    );
    assert_eq!(open[0]["project_id"], "demo");
    let history = app.get("/v1/handovers?all=true").await.body["handovers"].clone();
    assert_eq!(history.as_array().unwrap().len(), 2);
}

/// A host taken back from a running reservation and handed to it again later has two
/// periods in the hand-over history, not one that forgets the first.
#[tokio::test]
async fn a_host_handed_to_a_reservation_twice_has_two_periods_on_record() {
    let app = TestApp::spawn().await;
    let h1 = app.create_host("compute-1", json!({})).await;
    let h2 = app.create_host("compute-2", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert_eq!(lease(&app, &id).await["status"], "ACTIVE");
    let reservable = |host: String, on: bool, at: chrono::DateTime<chrono::Utc>| {
        let app = &app;
        async move {
            app.set_time(at);
            let r = app
                .put(&format!("/v1/os-hosts/{host}"), json!({"reservable": on}))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            app.run_actions().await;
        }
    };
    // compute-1 out of service at 10:30: the lease moves to compute-2; compute-2 out at
    // 11:00 with compute-1 back: it moves back to compute-1.
    reservable(h1.clone(), false, t(2030, 1, 1, 10, 30)).await;
    reservable(h1.clone(), true, t(2030, 1, 1, 10, 45)).await;
    reservable(h2.clone(), false, t(2030, 1, 1, 11, 0)).await;
    let history = app.get("/v1/handovers?all=true").await.body["handovers"].clone();
    let periods: Vec<(String, String, Value)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["resource_id"].as_str().unwrap().to_string(),
                h["since"].as_str().unwrap().to_string(),
                h["until"].clone(),
            )
        })
        .collect();
    assert_eq!(
        periods,
        vec![
            (
                h1.clone(),
                "2030-01-01T10:00:00.000000".into(),
                json!("2030-01-01T10:30:00.000000")
            ),
            (h1, "2030-01-01T11:00:00.000000".into(), Value::Null),
            (
                h2,
                "2030-01-01T10:30:00.000000".into(),
                json!("2030-01-01T11:00:00.000000")
            ),
        ],
        "{history}"
    );
}

/// A refused lease starting `now` at a second of its minute (after an early end) is advised
/// a window at least as long as it asked for: its part-minute counts as a minute.
#[tokio::test]
async fn advice_for_a_lease_from_a_second_of_the_minute_is_as_long_as_asked() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.set_time(t(2030, 1, 1, 10, 0));
    let r = app
        .host_lease("early", "now", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = lease_id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(1))
        .await;
    app.set_time(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(20));
    let r = app
        .put(&format!("/v1/leases/{id}"), json!({"end_date": "now"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(21))
        .await;
    let r = app
        .host_lease("later", "2030-01-01 10:01", "2030-01-01 10:10", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.set_time(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(30));
    let r = app
        .host_lease("refused", "now", "2030-01-01 10:03", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.body["reasons"][0]["next_offer"],
        json!({"start_date": "2030-01-01T10:10:00.000000",
               "end_date": "2030-01-01T10:13:00.000000"}),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn a_lease_starting_now_is_active_after_one_tick() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.set_time(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(25));
    let r = app
        .host_lease("now", "now", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["status"], "PENDING");
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:00.000000");
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(26))
        .await;
    let id = lease_id(&r.body);
    assert_eq!(lease(&app, &id).await["status"], "ACTIVE");
    // Ended in the minute it started: the end equals the start, which Blazar accepts.
    app.set_time(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(40));
    let path = format!("/v1/leases/{id}");
    let r = app.put(&path, json!({"end_date": "now"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(41))
        .await;
    let ended = lease(&app, &id).await;
    assert_eq!(ended["status"], "TERMINATED", "{ended}");
    assert!(
        ended["end_date"]
            .as_str()
            .unwrap()
            .starts_with("2030-01-01T10:00:0"),
        "{ended}"
    );
    // The host is free now, in the minute the ended lease started: a lease starting `now`
    // starts at the release rather than at the minute's start, which the ended lease held.
    app.set_time(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(50));
    let r = app
        .host_lease("now-again", "now", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:01.000000");
    let again = lease_id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(51))
        .await;
    assert_eq!(lease(&app, &again).await["status"], "ACTIVE");
    // It too ends in that minute; a pending lease moved to start `now` follows it.
    let r = app
        .put(&format!("/v1/leases/{again}"), json!({"end_date": "now"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.tick_at(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(52))
        .await;
    assert_eq!(lease(&app, &again).await["status"], "TERMINATED");
    let r = app
        .host_lease("later", "2030-01-01 13:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let later = lease_id(&r.body);
    let r = app
        .put(&format!("/v1/leases/{later}"), json!({"start_date": "now"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:02.000000");
    // From the next minute on, `now` is that minute again.
    app.set_time(t(2030, 1, 1, 10, 1) + chrono::Duration::seconds(5));
    app.create_host("compute-2", json!({})).await;
    let r = app
        .host_lease("next", "now", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:01:00.000000");
}

/// An early end in the minute moves a `now` lease past it only when the lease gets what
/// ended: a lease on another host starts at the minute, and the minute sent back with a
/// new end names the start of one that could not.
#[tokio::test]
async fn a_lease_starting_now_waits_only_for_an_early_end_of_what_it_gets() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({"rack": "a"})).await;
    app.create_host("compute-2", json!({"rack": "b"})).await;
    let rack = |r: &str| format!(r#"["==", "$rack", "{r}"]"#);
    let minute = t(2030, 1, 1, 10, 0);
    let seconds = |s: i64| minute + chrono::Duration::seconds(s);
    app.set_time(seconds(10));
    let r = app
        .host_lease("early", "now", "2030-01-01 12:00", 1, 1, &rack("a"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let early = lease_id(&r.body);
    app.tick_at(seconds(11)).await;
    app.set_time(seconds(20));
    let r = app
        .put(&format!("/v1/leases/{early}"), json!({"end_date": "now"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.tick_at(seconds(21)).await;
    assert_eq!(lease(&app, &early).await["status"], "TERMINATED");
    // Another host: nothing it gets was released in the minute.
    app.set_time(seconds(30));
    let r = app
        .host_lease("other", "now", "2030-01-01 12:00", 1, 1, &rack("b"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:00.000000");
    let other = lease_id(&r.body);
    // The host that was: the lease starts when it was released.
    let r = app
        .host_lease("same", "now", "2030-01-01 12:00", 1, 1, &rack("a"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:01.000000");
    let same = lease_id(&r.body);
    app.tick_at(seconds(31)).await;
    for id in [&other, &same] {
        assert_eq!(lease(&app, id).await["status"], "ACTIVE");
    }
    // Its start sent back as the input format writes it, with a new end: the same start.
    let r = app
        .put(
            &format!("/v1/leases/{same}"),
            json!({"start_date": "2030-01-01 10:00", "end_date": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:01.000000");
    assert_eq!(r.body["lease"]["end_date"], "2030-01-01T13:00:00.000000");
    // A pending lease moved to `now` follows the same rule. Both hosts are taken until
    // 12:00 and 13:00; a third one, never held, is what it gets.
    app.create_host("compute-3", json!({"rack": "c"})).await;
    let r = app
        .host_lease(
            "later",
            "2030-01-01 14:00",
            "2030-01-01 15:00",
            1,
            1,
            &rack("c"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let later = lease_id(&r.body);
    let r = app
        .put(&format!("/v1/leases/{later}"), json!({"start_date": "now"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T10:00:00.000000");
    let events = &r.body["lease"]["events"];
    let start_event = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == "start_lease")
        .unwrap();
    assert_eq!(
        start_event["time"], "2030-01-01T10:00:00.000000",
        "{events}"
    );
    // What each holds, by the allocation list: no two overlap on one host.
    crate::concurrency::assert_no_overlaps(&app).await;
}

#[tokio::test]
async fn delete_works_in_every_status() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    let pending = app
        .host_lease("p", "2030-01-02 10:00", "2030-01-02 12:00", 1, 1, "")
        .await;
    let active = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let ended = app
        .host_lease("e", "2030-01-01 08:00", "2030-01-01 09:00", 1, 1, "")
        .await;
    app.tick_at(t(2030, 1, 1, 10, 30)).await;
    assert_eq!(
        lease(&app, &lease_id(&active.body)).await["status"],
        "ACTIVE"
    );
    assert_eq!(
        lease(&app, &lease_id(&ended.body)).await["status"],
        "TERMINATED"
    );
    assert_eq!(
        app.get("/v1/handovers").await.body["handovers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    for r in [&pending, &active, &ended] {
        let id = lease_id(&r.body);
        assert_eq!(
            app.delete(&format!("/v1/leases/{id}")).await.status,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            app.get(&format!("/v1/leases/{id}")).await.status,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        app.get("/v1/handovers").await.body["handovers"],
        json!([]),
        "the active lease gave its host back"
    );
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
    // The freed host is reservable again right away.
    let again = app
        .host_lease("again", "2030-01-01 11:00", "2030-01-01 12:00", 2, 2, "")
        .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
}

#[tokio::test]
async fn active_leases_can_extend_and_rename_but_not_move_their_start() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);
    let path = format!("/v1/leases/{id}");
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let moved = app
        .put(&path, json!({"start_date": "2030-01-01 10:30"}))
        .await;
    assert_eq!(moved.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        moved.message(),
        "Cannot modify the start date of already started leases"
    );
    let extended = app
        .put(&path, json!({"end_date": "2030-01-01 14:00"}))
        .await;
    assert_eq!(extended.status, StatusCode::OK, "{}", extended.body);
    // Blazar answers from within the update (UPDATING); the lease is ACTIVE again after.
    assert_eq!(extended.body["lease"]["status"], "UPDATING");
    assert_eq!(lease(&app, &id).await["status"], "ACTIVE");
    // The end moved with it: nothing happens at 12:00 any more.
    assert_eq!(app.tick_at(t(2030, 1, 1, 12, 0)).await.executed, 0);
    app.tick_at(t(2030, 1, 1, 14, 0)).await;
    assert_eq!(lease(&app, &id).await["status"], "TERMINATED");
    let r = app
        .put(&path, json!({"end_date": "2030-01-01 16:00"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.message(), "Terminated leases can only be renamed");
    let r = app.put(&path, json!({"name": "history"})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["lease"]["name"], "history");
    assert_eq!(lease(&app, &id).await["status"], "TERMINATED");
}

#[tokio::test]
async fn extending_an_active_lease_into_another_one_fails_cleanly() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let a = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let b = app
        .host_lease("b", "2030-01-01 12:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(b.status, StatusCode::CREATED);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let path = format!("/v1/leases/{}", lease_id(&a.body));
    let r = app
        .put(&path, json!({"end_date": "2030-01-01 13:00"}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let l = lease(&app, &lease_id(&a.body)).await;
    assert_eq!(l["status"], "ACTIVE");
    assert_eq!(l["end_date"], "2030-01-01T12:00:00.000000");
}

#[tokio::test]
async fn a_burst_of_events_runs_in_time_order_across_transactions() {
    let app = TestApp::spawn().await;
    // 70 hosts, each handed from a lease ending at 12:00 to one starting at 12:00: 140 events
    // due at once, more than one scheduler transaction runs.
    let mut first = Vec::new();
    let mut second = Vec::new();
    for i in 0..70 {
        app.create_host(&format!("compute-{i:02}"), json!({"n": i.to_string()}))
            .await;
        let only = format!(r#"["==", "$n", "{i}"]"#);
        let r = app
            .host_lease(
                &format!("a{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
                &only,
            )
            .await;
        first.push(lease_id(&r.body));
        let r = app
            .host_lease(
                &format!("b{i}"),
                "2030-01-01 12:00",
                "2030-01-01 14:00",
                1,
                1,
                &only,
            )
            .await;
        second.push(lease_id(&r.body));
    }
    assert_eq!(app.tick_at(t(2030, 1, 1, 10, 0)).await.executed, 70);
    // The notices before the first leases end.
    assert_eq!(app.tick_at(t(2030, 1, 1, 11, 0)).await.executed, 70);
    // Every end before every start of the same instant, each event once.
    assert_eq!(app.tick_at(t(2030, 1, 1, 12, 0)).await.executed, 140);
    assert_eq!(app.tick_at(t(2030, 1, 1, 12, 0)).await.executed, 0);
    for id in &first {
        assert_eq!(lease(&app, id).await["status"], "TERMINATED");
    }
    for id in &second {
        assert_eq!(lease(&app, id).await["status"], "ACTIVE");
    }
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    let holders = holders.as_array().unwrap();
    assert_eq!(holders.len(), 70, "one holder per host");
    assert!(
        holders
            .iter()
            .all(|h| second.contains(&h["lease_id"].as_str().unwrap().to_string()))
    );
}

#[tokio::test]
async fn an_event_that_cannot_run_is_set_aside_and_the_others_run() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..4 {
        app.create_host(&format!("compute-{i}"), json!({"n": i.to_string()}))
            .await;
        let r = app
            .host_lease(
                &format!("l{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
                &format!(r#"["==", "$n", "{i}"]"#),
            )
            .await;
        ids.push(lease_id(&r.body));
    }
    // Rows no request can write: an event of an unknown type, a reservation whose status
    // does not read back. Each fails its event whatever the scheduler tries.
    let db = app.database();
    let broken_event = format!(
        "UPDATE events SET event_type = 'bogus' \
         WHERE lease_id = '{}' AND event_type = 'start_lease'",
        ids[1]
    );
    assert_eq!(db.execute(&broken_event).await, 1);
    let broken_reservation = format!(
        "UPDATE reservations SET status = 'bogus' WHERE lease_id = '{}'",
        ids[2]
    );
    assert_eq!(db.execute(&broken_reservation).await, 1);

    // Each fails a few ticks in a row before it is set aside (a failure that passes sets
    // nothing aside); the events behind it wait for those ticks, then run.
    let at = t(2030, 1, 1, 10, 0);
    app.clock.set(at);
    let first = app.service.tick(at).await.unwrap();
    assert_eq!(first.failed, 0, "nothing set aside at the first failure");
    let (mut executed, mut failed) = (first.executed, 0);
    for _ in 0..10 {
        let report = app.service.tick(at).await.unwrap();
        executed += report.executed;
        failed += report.failed;
    }
    assert_eq!((executed, failed), (2, 2));
    // Set aside: the next tick finds nothing due.
    let report = app.tick_at(t(2030, 1, 1, 10, 1)).await;
    assert_eq!((report.executed, report.failed), (0, 0), "{report:?}");

    // Mended by hand, the two leases read back as Blazar leaves a lease whose event
    // raised: the event and the lease in ERROR.
    db.execute("UPDATE events SET event_type = 'start_lease' WHERE event_type = 'bogus'")
        .await;
    db.execute("UPDATE reservations SET status = 'pending' WHERE status = 'bogus'")
        .await;
    for (i, id) in ids.iter().enumerate() {
        let l = lease(&app, id).await;
        let (status, start) = if i == 1 || i == 2 {
            ("ERROR", "ERROR")
        } else {
            ("ACTIVE", "DONE")
        };
        assert_eq!(l["status"], status, "l{i}: {l}");
        assert_eq!(event_status(&l, "start_lease"), start, "l{i}: {l}");
    }

    // Their later events run as any other's.
    let report = app.tick_at(t(2030, 1, 1, 12, 0)).await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(lease(&app, &ids[0]).await["status"], "TERMINATED");
    assert_eq!(lease(&app, &ids[1]).await["status"], "ERROR");
    assert_eq!(
        event_status(&lease(&app, &ids[1]).await, "end_lease"),
        "DONE"
    );
}

/// The leases holding `host` at some time in a window of 2030-01-01 (`HH:MM` to `HH:MM`), by
/// its allocation's window filter.
async fn leases_holding(app: &TestApp, host: &str, start: &str, end: &str) -> Vec<String> {
    let r = app
        .get(&format!(
            "/v1/os-hosts/{host}/allocation?start=2030-01-01%20{start}&end=2030-01-01%20{end}"
        ))
        .await;
    r.assert_status(StatusCode::OK);
    r.body["allocation"]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["lease_id"].as_str().unwrap().to_string())
        .collect()
}

/// A running lease whose host was replaced by healing holds the replacement from the
/// swap on: it can be extended though another lease had that host before the swap.
#[tokio::test]
async fn a_lease_healed_onto_another_host_can_still_be_extended() {
    let app = TestApp::spawn().await;
    let c1 = app.create_host("c1", json!({"n": "1"})).await;
    let c2 = app.create_host("c2", json!({"n": "2"})).await;
    // c2 is someone else's until 10:30, so the lease gets c1.
    let earlier = app
        .host_lease(
            "earlier",
            "2030-01-01 09:00",
            "2030-01-01 10:30",
            1,
            1,
            r#"["==", "$n", "2"]"#,
        )
        .await;
    assert_eq!(earlier.status, StatusCode::CREATED);
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);
    assert_eq!(app.hosts_of(&id).await, std::slice::from_ref(&c1));
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 10, 30)).await;
    assert_eq!(lease(&app, &id).await["status"], "ACTIVE");

    // c1 fails at 10:40: the lease moves to c2.
    app.set_time(t(2030, 1, 1, 10, 40));
    app.put(&format!("/v1/os-hosts/{c1}"), json!({"reservable": false}))
        .await
        .assert_status(StatusCode::OK);
    let hosts = app.hosts_of(&id).await;
    assert_eq!(hosts, std::slice::from_ref(&c2));
    // A window of c2's allocation shows who held it then: `earlier` until 10:30, this lease
    // from the swap on, never the two at once.
    assert_eq!(
        leases_holding(&app, &c2, "10:00", "10:30").await,
        [lease_id(&earlier.body)]
    );
    assert_eq!(
        leases_holding(&app, &c2, "10:40", "11:00").await,
        std::slice::from_ref(&id)
    );

    let check = app
        .get(&format!("/v1/leases/{id}/extension?prolong_for=1h"))
        .await;
    check.assert_status(StatusCode::OK);
    assert_eq!(check.body["extension"]["possible"], true, "{}", check.body);
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 13:00"}),
        )
        .await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["lease"]["end_date"], "2030-01-01T13:00:00.000000");
    assert_eq!(app.hosts_of(&id).await, hosts);
}

#[tokio::test]
async fn an_event_that_fails_once_is_not_set_aside() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let id = lease_id(&r.body);
    let db = app.database();
    db.execute("UPDATE events SET event_type = 'bogus' WHERE event_type = 'start_lease'")
        .await;
    let at = t(2030, 1, 1, 10, 0);
    app.clock.set(at);
    let report = app.service.tick(at).await.unwrap();
    assert_eq!((report.executed, report.failed), (0, 0), "{report:?}");
    db.execute("UPDATE events SET event_type = 'start_lease' WHERE event_type = 'bogus'")
        .await;
    let report = app.tick_at(at).await;
    assert_eq!((report.executed, report.failed), (1, 0), "{report:?}");
    let l = lease(&app, &id).await;
    assert_eq!(l["status"], "ACTIVE");
    assert_eq!(event_status(&l, "start_lease"), "DONE");
}

/// A running lease grows onto a host another lease held earlier in its life and gave back:
/// the past is over, so only the time from now on must be free; the host it kept shows as
/// held from its start, as before the update.
#[tokio::test]
async fn an_active_lease_grows_onto_a_host_an_ended_lease_held() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    let short = app
        .host_lease("short", "2030-01-01 10:00", "2030-01-01 10:30", 1, 1, "")
        .await;
    assert_eq!(short.status, StatusCode::CREATED, "{}", short.body);
    let long = app
        .host_lease("long", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(long.status, StatusCode::CREATED, "{}", long.body);
    let id = lease_id(&long.body);
    let rid = long.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 10, 30)).await;
    assert_eq!(
        lease(&app, &lease_id(&short.body)).await["status"],
        "TERMINATED"
    );
    app.set_time(t(2030, 1, 1, 10, 45));
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"reservations": [{"id": rid, "min": 2, "max": 2}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let held = app
        .get(&format!("/v1/os-hosts/allocations?lease_id={id}"))
        .await
        .body;
    let holding = held["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .count();
    assert_eq!(holding, 2, "{held}");
    // The calendar: the kept host busy for "long" from 10:00, the new one from 10:45, and
    // "short" still on record before it.
    let timeline = app
        .get("/v1/os-hosts/timeline?start=2030-01-01%2009:00&end=2030-01-01%2013:00")
        .await
        .body;
    let mut busy: Vec<(String, String)> = timeline["timeline"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["busy"].as_array().unwrap().clone())
        .map(|b| {
            (
                b["lease_name"].as_str().unwrap_or_default().to_string(),
                b["start_date"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    busy.sort();
    assert_eq!(
        busy,
        vec![
            ("long".to_string(), "2030-01-01T10:00:00.000000".to_string()),
            ("long".to_string(), "2030-01-01T10:45:00.000000".to_string()),
            (
                "short".to_string(),
                "2030-01-01T10:00:00.000000".to_string()
            ),
        ],
        "{timeline}"
    );
    // It runs to its end and ends whole.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    assert_eq!(lease(&app, &id).await["status"], "TERMINATED");
}

/// Years of hand-overs are written a page at a time, in order, each once; a member's list
/// is their project's, decided before paging (so it is whole too).
#[tokio::test]
async fn a_long_history_of_hand_overs_is_listed_whole_in_order_by_pages() {
    let mut app = TestApp::spawn().await;
    let base = t(2030, 1, 1, 0, 0);
    let mut tx = app.service.store().write().await.unwrap();
    let total = 2_345;
    for i in 0..total {
        let handover = blazar_core::Handover {
            resource_type: "physical:host".into(),
            resource_id: i % 40 + 1,
            project_id: if i % 3 == 0 { "alpha" } else { "beta" }.into(),
            lease_id: format!("lease-{}", i % 7),
            reservation_id: format!("reservation-{i}"),
            // Pairs of hand-overs of one host that start together: the id orders them.
            started_at: base + chrono::Duration::hours(i / 80),
            ended_at: None,
        };
        tx.start_handover(&handover).await.unwrap();
        if i % 2 == 0 {
            tx.end_handovers(
                &handover.reservation_id,
                None,
                base + chrono::Duration::days(400),
            )
            .await
            .unwrap();
        }
    }
    tx.commit().await.unwrap();

    let listed = |body: &Value| -> Vec<(i64, String, String)> {
        body["handovers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["resource_id"].as_str().unwrap().parse().unwrap(),
                    h["since"].as_str().unwrap().to_string(),
                    h["reservation_id"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let all = listed(&app.get("/v1/handovers?all=true").await.body);
    assert_eq!(all.len(), total as usize);
    let unique: std::collections::HashSet<&String> = all.iter().map(|h| &h.2).collect();
    assert_eq!(unique.len(), all.len(), "each once");
    assert!(
        all.windows(2)
            .all(|w| (w[0].0, &w[0].1) <= (w[1].0, &w[1].1)),
        "by host, then start"
    );
    let open = listed(&app.get("/v1/handovers").await.body);
    assert_eq!(open.len(), (total / 2) as usize);
    let beta = listed(&app.get("/v1/handovers?all=true&project_id=beta").await.body);
    assert_eq!(beta.len(), 1_563);
    let of_lease = listed(
        &app.get("/v1/handovers?all=true&lease_id=lease-3")
            .await
            .body,
    );
    assert_eq!(of_lease.len(), 335);

    app.act_as("alpha", "ada", "reader");
    let mine = app.get("/v1/handovers?all=true").await.body;
    assert_eq!(listed(&mine).len(), 782);
    assert!(
        mine["handovers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["project_id"] == "alpha")
    );
    // Another project's, asked by name, is still only theirs.
    let asked = app.get("/v1/handovers?all=true&project_id=beta").await.body;
    assert_eq!(asked["handovers"], json!([]));
}

/// The hand-over list takes only its own parameters, with values it understands: a typo or
/// a bad value is a 400 that says so, not a list of something else.
#[tokio::test]
async fn the_hand_over_list_refuses_what_it_does_not_take() {
    let app = TestApp::spawn().await;
    for (query, says) in [
        ("all=maybe", "Invalid all maybe"),
        ("resource_type=bogus", "Invalid resource_type bogus"),
        ("limit=1", "Unknown parameter limit"),
        ("marker=x&foo=bar", "Unknown parameter foo, marker"),
    ] {
        let r = app.get(&format!("/v1/handovers?{query}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.body);
        assert!(r.message().contains(says), "{query}: {}", r.message());
    }
    for query in [
        "all=TRUE",
        "all=false",
        "all=0",
        "resource_type=virtual:floatingip",
        "resource_type=physical:host&project_id=p&lease_id=l",
    ] {
        let r = app.get(&format!("/v1/handovers?{query}")).await;
        assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.body);
        assert_eq!(r.body["handovers"], json!([]), "{query}");
    }
}
