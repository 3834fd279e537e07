//! Outside-world actions: recorded with the change, carried out after commit, retried,
//! ordered per lease and per resource, claimed once among replicas, and the lease statuses
//! they drive (STARTING, ACTIVE, TERMINATING, TERMINATED, ERROR).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use blazar_core::ActionKind;
use blazar_db::{ActionOutcome, Store};
use blazar_server::listener::ConnectionLimits;
use blazar_service::{Action, ActionError, Backend, Settings, StandaloneBackend};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestApp, TestDatabase, t};
use crate::inventory::fip;

/// Records every call, fails the next ones as scripted, and otherwise acts as the
/// standalone backend (so hand-overs stay visible).
#[derive(Default)]
struct Scripted {
    calls: Mutex<Vec<(i64, ActionKind, String)>>,
    failures: Mutex<VecDeque<ActionError>>,
}

impl Scripted {
    fn fail_next(&self, e: ActionError) {
        self.failures.lock().unwrap().push_back(e);
    }

    fn calls(&self) -> Vec<(i64, ActionKind, String)> {
        self.calls.lock().unwrap().clone()
    }

    /// The service is back: no failure scripted any more.
    fn recover(&self) {
        self.failures.lock().unwrap().clear();
    }
}

#[async_trait]
impl Backend for Scripted {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        self.calls
            .lock()
            .unwrap()
            .push((action.seq, action.kind, action.lease_id.clone()));
        if let Some(e) = self.failures.lock().unwrap().pop_front() {
            return Err(e);
        }
        StandaloneBackend.apply(store, action).await
    }
}

fn id(body: &Value) -> String {
    body["lease"]["id"].as_str().unwrap().to_string()
}

async fn lease(app: &TestApp, id: &str) -> Value {
    app.get(&format!("/v1/leases/{id}")).await.body["lease"].clone()
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

/// The ids of the hosts lease `id` holds.
async fn granted(app: &TestApp, id: &str) -> Vec<String> {
    app.get(&format!("/v1/os-hosts/allocations?lease_id={id}"))
        .await
        .body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect()
}

async fn actions(app: &TestApp, id: &str) -> Vec<Value> {
    let r = app.get(&format!("/v1/leases/{id}/actions")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["actions"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_lease_is_starting_until_its_hand_over_is_done() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    app.auto_actions = false;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    assert!(backend.calls().is_empty(), "a create acts on nothing");

    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "STARTING");
    assert_eq!(l["reservations"][0]["status"], "pending");
    assert_eq!(event_status(&l, "start_lease"), "IN_PROGRESS");
    assert_eq!(app.get("/v1/handovers").await.body["handovers"], json!([]));
    // Nothing may change under a start in progress.
    let r = app
        .put(
            &format!("/v1/leases/{lid}"),
            json!({"end_date": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.message().contains("STARTING"), "{}", r.message());
    let listed = actions(&app, &lid).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["kind"], "start");
    assert_eq!(listed[0]["status"], "pending");
    assert_eq!(listed[0]["resources"], json!([1]));

    let report = app.run_actions().await;
    assert_eq!(report.done, 1);
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "ACTIVE");
    assert_eq!(l["reservations"][0]["status"], "active");
    assert_eq!(event_status(&l, "start_lease"), "DONE");
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    assert_eq!(holders.as_array().unwrap().len(), 1);

    // The end goes through TERMINATING the same way.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "TERMINATING");
    assert_eq!(event_status(&l, "end_lease"), "IN_PROGRESS");
    app.run_actions().await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "TERMINATED");
    assert_eq!(l["reservations"][0]["status"], "deleted");
    assert_eq!(app.get("/v1/handovers").await.body["handovers"], json!([]));
    let kinds: Vec<ActionKind> = backend.calls().iter().map(|c| c.1).collect();
    assert_eq!(kinds, vec![ActionKind::Start, ActionKind::Stop]);
}

#[tokio::test]
async fn transient_failures_are_retried_with_backoff() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    backend.fail_next(ActionError::Transient("nova: 503".into()));
    backend.fail_next(ActionError::Transient("nova: connection refused".into()));

    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    assert_eq!(lease(&app, &lid).await["status"], "STARTING");
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "pending");
    assert_eq!(a["attempts"], 1);
    assert_eq!(a["last_error"], "nova: 503");
    // Not again before its backoff (2 s) is over.
    app.clock.set(start + chrono::Duration::seconds(1));
    assert_eq!(app.run_actions().await.done + backend.calls().len(), 1);

    app.clock.set(start + chrono::Duration::seconds(2));
    let report = app.run_actions().await;
    assert_eq!(report.retried, 1);
    assert_eq!(actions(&app, &lid).await[0]["attempts"], 2);
    // The second wait doubles.
    app.clock.set(start + chrono::Duration::seconds(5));
    assert_eq!(app.run_actions().await.done, 0);
    app.clock.set(start + chrono::Duration::seconds(6));
    assert_eq!(app.run_actions().await.done, 1);
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    assert_eq!(backend.calls().len(), 3);
    assert_eq!(actions(&app, &lid).await[0]["status"], "done");
}

#[tokio::test]
async fn a_start_still_retrying_at_the_end_is_reported_as_not_done() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 10:05", 1, 1, "")
        .await;
    let lid = id(&r.body);
    backend.fail_next(ActionError::Transient("nova: 503".into()));
    backend.fail_next(ActionError::Transient("nova: 503".into()));
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.clock
        .set(t(2030, 1, 1, 10, 0) + chrono::Duration::seconds(2));
    assert_eq!(app.run_actions().await.retried, 1);
    assert_eq!(lease(&app, &lid).await["status"], "STARTING");
    // The cloud is still down when the lease ends: the start waits for its third attempt.
    app.tick_at(t(2030, 1, 1, 10, 5)).await;
    let l = lease(&app, &lid).await;
    assert_eq!(event_status(&l, "start_lease"), "ERROR", "{l}");
    assert_eq!(event_status(&l, "end_lease"), "DONE", "{l}");
    assert_eq!(l["status"], "ERROR", "{l}");
    let listed = actions(&app, &lid).await;
    let start = listed.iter().find(|a| a["kind"] == "start").unwrap();
    assert_eq!(start["status"], "failed");
    assert_eq!(
        start["last_error"],
        "not done before the lease ended: nova: 503"
    );
    let stop = listed.iter().find(|a| a["kind"] == "stop").unwrap();
    assert_eq!(stop["status"], "done");
}

#[tokio::test]
async fn a_permanent_failure_puts_the_lease_in_error_and_says_why() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    backend.fail_next(ActionError::Permanent(
        "nova: host compute-1 is in aggregate other-pool".into(),
    ));
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "ERROR");
    assert_eq!(l["reservations"][0]["status"], "error");
    assert_eq!(event_status(&l, "start_lease"), "ERROR");
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "failed");
    assert_eq!(
        a["last_error"],
        "nova: host compute-1 is in aggregate other-pool"
    );
    // Operators see it without knowing the lease (which may be deleted by then).
    let metrics = app.metrics_text().await;
    assert!(
        metrics.lines().any(|l| l == "blazar_actions_failed 1"),
        "{metrics}"
    );
    // Until its end the reconciler leaves whatever was handed over as it is: the host is
    // still granted to the lease.
    let desired = app.service.desired_state().await.unwrap();
    assert!(desired.reservations.is_empty(), "{desired:?}");
    assert_eq!(desired.stranded.len(), 1, "{desired:?}");
    assert_eq!(
        desired.stranded[0].reservation_id,
        l["reservations"][0]["id"]
    );
    assert_eq!(desired.stranded[0].hosts, vec!["compute-1".to_string()]);
    let rid = l["reservations"][0]["id"].as_str().unwrap().to_string();
    assert!(desired.kept.contains(&rid), "{desired:?}");

    // Its end still takes back whatever may have been handed over, and it stays in ERROR.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "ERROR");
    assert_eq!(event_status(&l, "end_lease"), "DONE");
    let desired = app.service.desired_state().await.unwrap();
    assert!(desired.stranded.is_empty(), "{desired:?}");
    // Past its end, whatever a failed take-back might have left is a leftover.
    assert!(!desired.kept.contains(&rid), "{desired:?}");
    let kinds: Vec<ActionKind> = backend.calls().iter().map(|c| c.1).collect();
    assert_eq!(kinds, vec![ActionKind::Start, ActionKind::Stop]);
    // And it can be deleted. Its end took everything back already: the delete takes
    // nothing back again (the host may be another lease's by now).
    assert_eq!(
        app.delete(&format!("/v1/leases/{lid}")).await.status,
        StatusCode::NO_CONTENT
    );
    app.run_actions().await;
    let kinds: Vec<ActionKind> = backend.calls().iter().map(|c| c.1).collect();
    assert_eq!(kinds, vec![ActionKind::Start, ActionKind::Stop]);
}

/// An app on `backend` whose actions get two attempts.
async fn with_two_attempts(backend: Arc<Scripted>) -> TestApp {
    TestApp::spawn_full(
        TestDatabase::new().await,
        Settings {
            action_max_attempts: Some(2),
            ..Settings::default()
        },
        ConnectionLimits::default(),
        backend,
    )
    .await
}

#[tokio::test]
async fn an_action_that_keeps_failing_gives_up_after_its_attempts() {
    let backend = Arc::new(Scripted::default());
    let app = with_two_attempts(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    for _ in 0..2 {
        backend.fail_next(ActionError::Transient("placement: timed out".into()));
    }
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    app.clock.set(start + chrono::Duration::seconds(2));
    app.run_actions().await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "ERROR");
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "failed");
    assert_eq!(
        a["last_error"],
        "gave up after 2 attempts: placement: timed out"
    );
}

/// A time the actions listing shows, in UTC.
fn wire_time(v: &Value) -> DateTime<Utc> {
    chrono::NaiveDateTime::parse_from_str(v.as_str().unwrap(), "%Y-%m-%dT%H:%M:%S%.f")
        .unwrap()
        .and_utc()
}

/// Runs lease `lid`'s first action at each attempt it asks for, while the scripted service
/// fails, until the action is no longer pending or `until` is passed (then the service comes
/// back). Checks that no pause between attempts is longer than 30 s; returns when the
/// action left pending.
async fn retry_through(
    app: &TestApp,
    backend: &Scripted,
    lid: &str,
    until: Option<DateTime<Utc>>,
) -> DateTime<Utc> {
    loop {
        let a = actions(app, lid).await[0].clone();
        if a["status"] != "pending" {
            return wire_time(&a["updated_at"]);
        }
        let next = wire_time(&a["not_before"]);
        let pause = next - wire_time(&a["updated_at"]);
        assert!(pause <= chrono::Duration::seconds(30), "{a}");
        if until.is_some_and(|u| next >= u) {
            backend.recover();
        }
        app.clock.set(next);
        app.run_actions().await;
    }
}

/// A host lease whose start has been tried once, at its start time, while Placement does
/// not answer (every attempt fails until `Scripted::recover`).
async fn start_while_placement_is_away() -> (TestApp, Arc<Scripted>, String, DateTime<Utc>) {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    let lid = id(&app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await
        .body);
    for _ in 0..1_000 {
        backend.fail_next(ActionError::Transient(
            "placement: connection refused".into(),
        ));
    }
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    (app, backend, lid, start)
}

#[tokio::test]
async fn a_start_goes_on_within_30_s_of_the_cloud_coming_back() {
    let (app, backend, lid, start) = start_while_placement_is_away().await;
    // Placement comes back 25 minutes after the start.
    let back = start + chrono::Duration::minutes(25);
    let done_at = retry_through(&app, &backend, &lid, Some(back)).await;
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "done", "{a}");
    assert_eq!(wire_time(&a["first_tried_at"]), start, "{a}");
    assert!(
        done_at >= back && done_at - back <= chrono::Duration::seconds(30),
        "{a}"
    );
    // Far more attempts than a count of doubling pauses would have allowed in that time.
    assert!(a["attempts"].as_i64().unwrap() > 45, "{a}");
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
}

/// Actions that fail together keep failing together until their pauses reach the 30 s cap;
/// from there each pause is 20 to 30 s, so they no longer come back in the same second.
#[tokio::test]
async fn retries_at_the_cap_are_spread_out() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let mut leases = Vec::new();
    for i in 0..8 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
        let r = app
            .host_lease(
                &format!("l{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
                "",
            )
            .await;
        leases.push(id(&r.body));
    }
    for _ in 0..1_000 {
        backend.fail_next(ActionError::Transient("nova: 503".into()));
    }
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    for s in 1..=150 {
        app.clock.set(start + chrono::Duration::seconds(s));
        app.run_actions().await;
    }
    let mut next = std::collections::BTreeSet::new();
    for lid in &leases {
        let a = actions(&app, lid).await[0].clone();
        assert_eq!(a["status"], "pending", "{a}");
        // 2, 4, 8, 16 s, then at the cap.
        assert!(a["attempts"].as_i64().unwrap() >= 6, "{a}");
        let pause = wire_time(&a["not_before"]) - wire_time(&a["updated_at"]);
        assert!(
            pause >= chrono::Duration::seconds(20) && pause <= chrono::Duration::seconds(30),
            "{a}"
        );
        next.insert(wire_time(&a["not_before"]));
    }
    // Eight draws of eleven pauses, each past the first at the cap: all the same by chance
    // about once in 10^14 runs.
    assert!(next.len() > 1, "{next:?}");
}

#[tokio::test]
async fn an_action_that_keeps_failing_gives_up_when_its_retry_span_is_over() {
    let (app, backend, lid, start) = start_while_placement_is_away().await;
    let failed_at = retry_through(&app, &backend, &lid, None).await;
    // The default span is 30 minutes: the first attempt at or past it is the last.
    let span = failed_at - start;
    assert!(
        span >= chrono::Duration::minutes(30) && span <= chrono::Duration::seconds(30 * 60 + 30),
        "{span}"
    );
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "failed", "{a}");
    let error = a["last_error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "gave up after {} attempts in 30 min: ",
            a["attempts"]
        )) && error.ends_with("placement: connection refused"),
        "{a}"
    );
    assert_eq!(lease(&app, &lid).await["status"], "ERROR");
}

#[tokio::test]
async fn deleting_a_starting_lease_cancels_its_hand_over() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    app.auto_actions = false;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert_eq!(lease(&app, &lid).await["status"], "STARTING");
    assert_eq!(
        app.delete(&format!("/v1/leases/{lid}")).await.status,
        StatusCode::NO_CONTENT
    );
    app.run_actions().await;
    // The start never ran, so there is nothing to take back: no action reaches the cloud
    // (what a backend prepared at create is released, as for a lease that never started).
    let kinds: Vec<ActionKind> = backend.calls().iter().map(|c| c.1).collect();
    assert_eq!(kinds, Vec::<ActionKind>::new());
    assert_eq!(app.get("/v1/handovers").await.body["handovers"], json!([]));
    // The host is free for someone else at once.
    let r = app
        .host_lease("m", "2030-01-01 10:30", "2030-01-01 11:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn a_resource_is_taken_back_before_it_is_handed_to_the_next_lease() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    app.auto_actions = false;
    app.create_host("compute-1", json!({})).await;
    let a = id(&app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 11:00", 1, 1, "")
        .await
        .body);
    let b = id(&app
        .host_lease("b", "2030-01-01 11:00", "2030-01-01 12:00", 1, 1, "")
        .await
        .body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.run_actions().await;
    assert_eq!(lease(&app, &a).await["status"], "ACTIVE");

    // At 11:00 a's end and b's start are both recorded; a's take-back fails once.
    let eleven = t(2030, 1, 1, 11, 0);
    app.tick_at(eleven).await;
    backend.fail_next(ActionError::Transient(
        "nova: 409 servers still on host".into(),
    ));
    app.run_actions().await;
    // b's hand-over of the same host waits behind a's open take-back.
    let calls = backend.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        (calls[1].1, calls[1].2.as_str()),
        (ActionKind::Stop, a.as_str())
    );
    assert_eq!(lease(&app, &b).await["status"], "STARTING");
    assert_eq!(lease(&app, &a).await["status"], "TERMINATING");

    app.clock.set(eleven + chrono::Duration::seconds(2));
    app.run_actions().await;
    let order: Vec<(ActionKind, String)> =
        backend.calls().into_iter().map(|c| (c.1, c.2)).collect();
    assert_eq!(
        order,
        vec![
            (ActionKind::Start, a.clone()),
            (ActionKind::Stop, a.clone()),
            (ActionKind::Stop, a.clone()),
            (ActionKind::Start, b.clone()),
        ]
    );
    assert_eq!(lease(&app, &a).await["status"], "TERMINATED");
    assert_eq!(lease(&app, &b).await["status"], "ACTIVE");
}

/// A host lease at its start time, its start recorded but left to the test to carry out
/// (no worker runs it on its own).
async fn start_without_workers(app: &mut TestApp) -> (String, DateTime<Utc>) {
    app.auto_actions = false;
    app.create_host("compute-1", json!({})).await;
    let lid = id(&app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await
        .body);
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    (lid, start)
}

#[tokio::test]
async fn an_expired_claim_is_taken_again_and_the_late_worker_changes_nothing() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    let (lid, start) = start_without_workers(&mut app).await;
    // A worker claims the action and dies.
    let mut tx = app.service.store().write().await.unwrap();
    let claimed = tx
        .claim_actions(start, "dead-worker", chrono::Duration::minutes(6), 10)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(app.run_actions().await.done, 0, "still claimed");

    app.clock.set(start + chrono::Duration::minutes(7));
    assert_eq!(app.run_actions().await.done, 1);
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    // The dead worker's late report is ignored.
    let mut tx = app.service.store().write().await.unwrap();
    let taken = tx
        .finish_action(
            claimed[0].seq,
            "dead-worker",
            &ActionOutcome::Failed {
                error: "late".into(),
            },
            start + chrono::Duration::minutes(8),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!taken);
    assert_eq!(actions(&app, &lid).await[0]["status"], "done");
}

/// Workers that take the lease's one action at `minutes` after `start`, each claiming it
/// for 6 minutes and dying in the attempt: the claims, as each worker got it.
async fn die_in_attempts(
    app: &TestApp,
    start: DateTime<Utc>,
    minutes: &[i64],
) -> Vec<blazar_core::ActionRecord> {
    let mut claims = Vec::new();
    for &m in minutes {
        let at = start + chrono::Duration::minutes(m);
        let mut tx = app.service.store().write().await.unwrap();
        let claimed = tx
            .claim_actions(at, "dying-worker", chrono::Duration::minutes(6), 10)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(claimed.len(), 1, "at {at}");
        claims.extend(claimed);
    }
    claims
}

#[tokio::test]
async fn an_action_whose_workers_keep_dying_fails_after_its_attempts() {
    let backend = Arc::new(Scripted::default());
    let mut app = with_two_attempts(backend.clone()).await;
    let (lid, start) = start_without_workers(&mut app).await;
    // Two workers in turn take the action and die in the attempt (it takes them down).
    die_in_attempts(&app, start, &[0, 7]).await;
    // Taken past its last attempt, it fails without being tried again.
    app.clock.set(start + chrono::Duration::minutes(14));
    let report = app.run_actions().await;
    assert_eq!(report.done, 0);
    assert!(backend.calls().is_empty());
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "failed", "{a}");
    assert!(
        a["last_error"]
            .as_str()
            .unwrap()
            .contains("did not report back"),
        "{a}"
    );
    assert_eq!(lease(&app, &lid).await["status"], "ERROR");
}

/// Without a limit on attempts, an action is still taken from dying workers only five
/// times: each would take another process down for as long as it may be retried.
#[tokio::test]
async fn an_action_fails_after_five_attempts_that_did_not_report_back() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    let (lid, start) = start_without_workers(&mut app).await;
    let lost: Vec<i64> = die_in_attempts(&app, start, &[0, 7, 14, 21, 28])
        .await
        .iter()
        .map(|a| a.lost_attempts)
        .collect();
    assert_eq!(lost, vec![0, 1, 2, 3, 4]);
    app.clock.set(start + chrono::Duration::minutes(35));
    let report = app.run_actions().await;
    assert_eq!(report.done, 0);
    assert!(backend.calls().is_empty());
    let a = &actions(&app, &lid).await[0];
    assert_eq!(a["status"], "failed", "{a}");
    assert_eq!(
        a["last_error"],
        "gave up after 5 attempts: the last did not report back (its worker stopped or hung)"
    );
    assert_eq!(a["attempts"], 5, "{a}");
    assert_eq!(a["lost_attempts"], 5, "{a}");
    assert_eq!(lease(&app, &lid).await["status"], "ERROR");
}

#[tokio::test]
async fn replicas_carry_out_each_action_once() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let replica = app.replica_with(backend.clone()).await;
    let n = 12;
    for i in 0..n {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let mut leases = Vec::new();
    for i in 0..n {
        let r = app
            .host_lease(
                &format!("l{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        leases.push(id(&r.body));
    }
    let start = t(2030, 1, 1, 10, 0);
    replica.clock.set(start);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for service in [app.service.clone(), replica.service.clone()] {
        let mut rx = stop_rx.clone();
        workers.push(tokio::spawn(async move {
            service
                .run_workers(Duration::from_millis(20), async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    // Only one of them runs the events; both run the workers.
    app.clock.set(start);
    app.service.tick(start).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut active = 0;
        for l in &leases {
            if lease(&app, l).await["status"] == "ACTIVE" {
                active += 1;
            }
        }
        if active == n {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{active} of {n} active"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    for w in workers {
        w.await.unwrap();
    }
    let mut per_action: HashMap<i64, usize> = HashMap::new();
    for (seq, _, _) in backend.calls() {
        *per_action.entry(seq).or_default() += 1;
    }
    assert_eq!(per_action.len(), n);
    assert!(
        per_action.values().all(|&c| c == 1),
        "an action ran twice: {per_action:?}"
    );
    drop(replica);
}

#[tokio::test]
async fn an_update_that_adds_a_host_to_an_active_reservation_hands_it_over() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    let rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let r = app
        .put(
            &format!("/v1/leases/{lid}"),
            json!({"reservations": [{"id": rid, "min": 2, "max": 2}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let listed = actions(&app, &lid).await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1]["purpose"], "change");
    assert_eq!(listed[1]["status"], "done");
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    assert_eq!(holders.as_array().unwrap().len(), 2);
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
}

/// A cloud that lists only the hypervisors named in `listed`, all healthy; with facts (of
/// 16 GB, 100 GB, and the vCPUs it names) for those `vcpus` names.
#[derive(Default)]
struct Listing {
    listed: Mutex<Vec<String>>,
    vcpus: Mutex<HashMap<String, i64>>,
}

#[async_trait]
impl Backend for Listing {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        StandaloneBackend.apply(store, action).await
    }

    async fn host_health(
        &self,
    ) -> Result<Option<Vec<blazar_service::HostHealth>>, blazar_service::InventoryError> {
        let listed = self.listed.lock().unwrap().clone();
        let vcpus = self.vcpus.lock().unwrap().clone();
        Ok(Some(
            listed
                .into_iter()
                .map(|name| blazar_service::HostHealth {
                    facts: vcpus.get(&name).map(|&vcpus| blazar_core::HostFacts {
                        hypervisor_hostname: name.clone(),
                        service_name: String::new(),
                        hypervisor_type: "fake".into(),
                        hypervisor_version: 1,
                        vcpus,
                        memory_mb: 16384,
                        local_gb: 100,
                        cpu_info: "{}".into(),
                        availability_zone: String::new(),
                    }),
                    hypervisor_hostname: name,
                    healthy: true,
                    reason: String::new(),
                })
                .collect(),
        ))
    }
}

/// A host whose compute service was deleted from the cloud is failed like a host that is
/// down (its reservation healed onto another), and comes back when the cloud lists it
/// again; a cloud that lists nothing at all fails nobody.
#[tokio::test]
async fn a_host_the_cloud_no_longer_lists_is_failed_and_healed() {
    let backend = Arc::new(Listing {
        listed: Mutex::new(vec!["h1".into(), "h2".into()]),
        ..Listing::default()
    });
    let app = TestApp::spawn_backend(backend.clone()).await;
    let h1 = app.create_host("h1", json!({})).await;
    let h2 = app.create_host("h2", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r.body);
    let before = granted(&app, &lease_id).await;
    assert_eq!(before.len(), 1);
    let (gone, other) = if before[0] == h1 {
        ("h1", &h2)
    } else {
        ("h2", &h1)
    };
    assert_eq!(
        app.service.monitor_hosts().await.unwrap(),
        blazar_service::MonitorReport::default()
    );

    backend.listed.lock().unwrap().clear();
    assert_eq!(
        app.service.monitor_hosts().await.unwrap(),
        blazar_service::MonitorReport::default()
    );

    *backend.listed.lock().unwrap() = vec![if gone == "h1" { "h2" } else { "h1" }.to_string()];
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec![gone.to_string()]);
    assert_eq!(granted(&app, &lease_id).await, vec![other.clone()]);

    *backend.listed.lock().unwrap() = vec!["h1".into(), "h2".into()];
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.recovered, vec![gone.to_string()]);
}

/// A host the monitor took out that an operator then keeps out (`reservable: false`) stays
/// out when the cloud lists it healthy again: the monitor puts back only its own.
#[tokio::test]
async fn a_failed_host_an_operator_keeps_out_is_not_put_back() {
    let backend = Arc::new(Listing {
        listed: Mutex::new(vec!["h1".into()]),
        ..Listing::default()
    });
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("h1", json!({})).await;
    let h2 = app.create_host("h2", json!({})).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec!["h2".to_string()]);
    let r = app
        .put(&format!("/v1/os-hosts/{h2}"), json!({"reservable": false}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    *backend.listed.lock().unwrap() = vec!["h1".into(), "h2".into()];
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.recovered, Vec::<String>::new());
    let shown = app.get(&format!("/v1/os-hosts/{h2}")).await;
    assert_eq!(shown.body["host"]["reservable"], json!(false));
}

/// Facts the cloud reports smaller than before move instance slots that no longer fit onto
/// another host, as an operator's update does.
#[tokio::test]
async fn fewer_vcpus_reported_by_the_cloud_move_instance_slots() {
    let backend = Arc::new(Listing {
        listed: Mutex::new(vec!["h1".into(), "h2".into()]),
        vcpus: Mutex::new(HashMap::from([("h1".into(), 4), ("h2".into(), 4)])),
    });
    let app = TestApp::spawn_backend(backend.clone()).await;
    let facts = json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100});
    let h1 = app.create_host("h1", facts.clone()).await;
    let h2 = app.create_host("h2", facts).await;
    app.service.monitor_hosts().await.unwrap();
    let body = json!({"name": "i", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "virtual:instance", "amount": 2, "vcpus": 2,
            "memory_mb": 1024, "disk_gb": 10, "affinity": true, "resource_properties": ""}]});
    let r = app.post("/v1/leases", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r.body);
    let before = granted(&app, &lease_id).await;
    assert_eq!(before.len(), 1);
    let (shrunk, name, other) = if before[0] == h1 {
        (&h1, "h1", &h2)
    } else {
        (&h2, "h2", &h1)
    };

    backend.vcpus.lock().unwrap().insert(name.into(), 2);
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.refreshed, vec![name.to_string()]);
    let host = app.get(&format!("/v1/os-hosts/{shrunk}")).await.body;
    assert_eq!(host["host"]["vcpus"], 2);
    assert_eq!(granted(&app, &lease_id).await, vec![other.clone()]);
    let l = lease(&app, &lease_id).await;
    assert_eq!(l["reservations"][0]["resources_changed"], true);
    assert_eq!(l["degraded"], false);
}

/// A host whose capacity falls under what a running lease's instances hold gives up only
/// the slots over it: the others stay handed over there (its servers may run on them), the
/// one that no longer fits is handed over on another host, and nothing is taken back.
#[tokio::test]
async fn a_running_reservation_gives_up_only_the_instance_slots_over_a_fallen_capacity() {
    let backend = Arc::new(Scripted::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let facts = json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100});
    let h1 = app.create_host("h1", facts.clone()).await;
    let h2 = app.create_host("h2", facts).await;
    let body = json!({"name": "i", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "virtual:instance", "amount": 4, "vcpus": 1,
            "memory_mb": 1024, "disk_gb": 10, "affinity": null, "resource_properties": ""}]});
    let r = app.post("/v1/leases", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = id(&r.body);
    assert_eq!(granted(&app, &lid).await, vec![h1.clone()]);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.run_actions().await;
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    let before = backend.calls().len();

    let r = app
        .put(&format!("/v1/os-hosts/{h1}"), json!({"vcpus": 3}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let mut held = granted(&app, &lid).await;
    held.sort();
    assert_eq!(held, vec![h1.clone(), h2.clone()]);
    assert_eq!(crate::instances::units_on(&app, &h1).await, 3);
    assert_eq!(crate::instances::units_on(&app, &h2).await, 1);
    let l = lease(&app, &lid).await;
    assert_eq!(l["degraded"], false);
    assert_eq!(l["reservations"][0]["resources_changed"], true);
    assert_eq!(l["reservations"][0]["missing_resources"], false);

    app.run_actions().await;
    let kinds: Vec<ActionKind> = backend.calls()[before..].iter().map(|c| c.1).collect();
    assert!(!kinds.is_empty());
    assert!(
        kinds.iter().all(|k| *k == ActionKind::Start),
        "nothing is taken back: {kinds:?}"
    );
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    let mut handed: Vec<String> = holders
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["resource_id"].to_string().trim_matches('"').to_string())
        .collect();
    handed.sort();
    assert_eq!(handed, vec![h1, h2], "{holders}");
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
}

/// A cloud that prepares reservations (an aggregate per host reservation, as the OpenStack
/// backend does), acting otherwise as the standalone backend, and records each action it
/// carried out: kind, purpose and resources.
#[derive(Default)]
struct Preparing {
    done: Mutex<Vec<(ActionKind, String, Vec<i64>)>>,
}

#[async_trait]
impl Backend for Preparing {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        self.done.lock().unwrap().push((
            action.kind,
            action.purpose.as_str().to_string(),
            action.resources.clone(),
        ));
        StandaloneBackend.apply(store, action).await
    }

    fn prepares_reservations(&self) -> bool {
        true
    }
}

/// A running host reservation that healing left with nothing (its host failed, none to
/// replace it) still has its aggregate in the cloud, and maybe servers there: its end takes
/// the reservation back as a whole, and the lease ends once that is done.
#[tokio::test]
async fn the_end_of_a_reservation_healing_left_empty_takes_it_back_whole() {
    let backend = Arc::new(Preparing::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let host = app.create_host("only", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.run_actions().await;
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    app.set_time(t(2030, 1, 1, 11, 0));
    let r = app
        .put(
            &format!("/v1/os-hosts/{host}"),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.run_actions().await;
    let l = lease(&app, &lid).await;
    assert_eq!(l["degraded"], true);
    assert!(granted(&app, &lid).await.is_empty());

    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    app.run_actions().await;
    let done = backend.done.lock().unwrap().clone();
    let last = done.last().cloned().unwrap();
    assert_eq!(
        (last.0, last.1.as_str(), last.2),
        (ActionKind::Stop, "lease_end", vec![])
    );
    let l = lease(&app, &lid).await;
    assert_eq!(l["status"], "TERMINATED");
    assert_eq!(l["reservations"][0]["status"], "deleted");
}

/// A cloud that lists the hypervisors of `listed`, all healthy, fails the next attempts as
/// scripted, and records what each action it carried out handed over or took back.
#[derive(Default)]
struct ListingScripted {
    listed: Mutex<Vec<String>>,
    failures: Mutex<VecDeque<ActionError>>,
    done: Mutex<Vec<(ActionKind, String, Vec<i64>)>>,
}

#[async_trait]
impl Backend for ListingScripted {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        if let Some(e) = self.failures.lock().unwrap().pop_front() {
            return Err(e);
        }
        self.done.lock().unwrap().push((
            action.kind,
            action.purpose.as_str().to_string(),
            action.resources.clone(),
        ));
        StandaloneBackend.apply(store, action).await
    }

    async fn host_health(
        &self,
    ) -> Result<Option<Vec<blazar_service::HostHealth>>, blazar_service::InventoryError> {
        let listing = Listing {
            listed: Mutex::new(self.listed.lock().unwrap().clone()),
            ..Listing::default()
        };
        listing.host_health().await
    }
}

/// A host that fails while its lease is starting (the start's action recorded with it and
/// not yet carried out) is replaced in the cloud too: the start hands it over as recorded,
/// then the replacement is handed over and the failed host taken back, as when a running
/// lease is healed.
#[tokio::test]
async fn a_host_failed_while_its_lease_starts_is_replaced_after_the_start() {
    let backend = Arc::new(ListingScripted {
        listed: Mutex::new(vec!["h1".into(), "h2".into()]),
        ..ListingScripted::default()
    });
    let app = TestApp::spawn_backend(backend.clone()).await;
    let h1 = app.create_host("h1", json!({})).await;
    let h2 = app.create_host("h2", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r.body);
    backend
        .failures
        .lock()
        .unwrap()
        .push_back(ActionError::Transient("cloud busy".into()));
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert_eq!(lease(&app, &lease_id).await["status"], "STARTING");
    let granted = granted(&app, &lease_id).await;
    assert_eq!(granted.len(), 1);
    let (failed, spare, failed_name) = if granted[0] == h1 {
        (&h1, &h2, "h1")
    } else {
        (&h2, &h1, "h2")
    };
    *backend.listed.lock().unwrap() = vec![if failed_name == "h1" { "h2" } else { "h1" }.into()];
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec![failed_name.to_string()]);

    app.set_time(t(2030, 1, 1, 10, 1));
    app.run_actions().await;
    assert_eq!(lease(&app, &lease_id).await["status"], "ACTIVE");
    let failed: i64 = failed.parse().unwrap();
    let spare: i64 = spare.parse().unwrap();
    assert_eq!(
        *backend.done.lock().unwrap(),
        vec![
            (ActionKind::Start, "lease_start".to_string(), vec![failed]),
            (ActionKind::Start, "change".to_string(), vec![spare]),
            (ActionKind::Stop, "change".to_string(), vec![failed]),
        ]
    );
    let holders = app.get("/v1/handovers").await.body["handovers"].clone();
    let held: Vec<&Value> = holders
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["until"].is_null())
        .collect();
    assert_eq!(held.len(), 1, "{holders}");
    assert_eq!(held[0]["resource_id"], spare.to_string());
}

/// Snapshots always fail (the image service is down); every other action is the standalone
/// backend's.
struct NoImages;

#[async_trait]
impl Backend for NoImages {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        if action.kind == ActionKind::Snapshot {
            return Err(ActionError::Transient("image service unreachable".into()));
        }
        StandaloneBackend.apply(store, action).await
    }
}

/// Creates a one-host lease on day `day` of 2030-01, 10:00 to 12:00, whose reservation
/// asks for a snapshot at 11:00; answers its id.
async fn snapshot_lease(app: &TestApp, name: &str, day: u32) -> String {
    let date = |hour: u32| format!("2030-01-{day:02} {hour}:00");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": name, "start_date": date(10), "end_date": date(12),
                "before_end_date": date(11),
                "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                    "hypervisor_properties": "", "resource_properties": "",
                    "before_end": "snapshot"}], "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    id(&r.body)
}

/// A `before_end` snapshot that keeps failing is given up at the lease's end instead of
/// holding the take-back (and the next lease of the hosts) back for its retries.
#[tokio::test]
async fn a_snapshot_that_keeps_failing_does_not_hold_the_end_back() {
    let app = TestApp::spawn_backend(Arc::new(NoImages)).await;
    app.create_host("h1", json!({})).await;
    let lid = snapshot_lease(&app, "l", 1).await;
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 11, 0)).await;
    // Still retried past the retry span (30 minutes): a snapshot is tried until its lease
    // ends.
    app.set_time(t(2030, 1, 1, 11, 45));
    app.run_actions().await;
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let listed = actions(&app, &lid).await;
    assert_eq!(
        lease(&app, &lid).await["status"],
        "TERMINATED",
        "{listed:?}"
    );
    let snapshot = listed.iter().find(|a| a["kind"] == "snapshot").unwrap();
    assert_eq!(snapshot["status"], "failed");
    assert!(
        snapshot["last_error"]
            .as_str()
            .unwrap()
            .starts_with("not done before the lease ended: "),
        "{snapshot}"
    );

    // Both events due in one tick (the scheduler catching up): the snapshot is tried once,
    // before the take-back, and not again.
    let lid = snapshot_lease(&app, "m", 2).await;
    app.tick_at(t(2030, 1, 2, 10, 0)).await;
    app.tick_at(t(2030, 1, 2, 12, 0)).await;
    let listed = actions(&app, &lid).await;
    assert_eq!(
        lease(&app, &lid).await["status"],
        "TERMINATED",
        "{listed:?}"
    );
    let snapshot = listed.iter().find(|a| a["kind"] == "snapshot").unwrap();
    assert_eq!(snapshot["status"], "failed", "{snapshot}");
    assert_eq!(snapshot["attempts"], 1, "{snapshot}");
}

/// Start actions wait at a gate; every action is the standalone backend's.
struct GatedStarts {
    entered: std::sync::atomic::AtomicUsize,
    gate: tokio::sync::Semaphore,
}

impl Default for GatedStarts {
    fn default() -> Self {
        GatedStarts {
            entered: std::sync::atomic::AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(0),
        }
    }
}

#[async_trait]
impl Backend for GatedStarts {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        if action.kind == ActionKind::Start {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.gate
                .acquire()
                .await
                .map_err(|e| ActionError::Transient(e.to_string()))?
                .forget();
        }
        StandaloneBackend.apply(store, action).await
    }
}

/// An action's claim is short and renewed while its worker carries it out: another worker
/// does not take an action in progress, and takes over within a claim's length (four
/// renewals) one whose worker stopped (killed mid-attempt), not an action timeout later.
#[tokio::test]
async fn a_stopped_workers_action_is_taken_over_within_a_claim() {
    let backend = Arc::new(GatedStarts::default());
    let settings = Settings {
        action_claim_renewal: Duration::from_millis(300),
        ..Settings::default()
    };
    let db = Arc::new(TestDatabase::new().await);
    let app = TestApp::builder()
        .database(db.clone())
        .settings(settings.clone())
        .backend(backend.clone())
        .auto_actions(false)
        .spawn()
        .await;
    let other = TestApp::builder()
        .database(db)
        .settings(settings)
        .backend(backend.clone())
        .auto_actions(false)
        .spawn()
        .await;
    app.create_host("h1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = id(&r.body);
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    let service = app.service.clone();
    let first = tokio::spawn(async move { service.run_actions(start).await });
    while backend.entered.load(std::sync::atomic::Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Well past the first claim (1.2 s, kept to the second): once the worker has renewed
    // it, the other worker leaves the action alone.
    let later = start + chrono::Duration::seconds(30);
    app.set_time(later);
    other.set_time(later);
    let renewed = format!(
        "UPDATE actions SET attempts = attempts WHERE claimed_until > {}",
        later.timestamp()
    );
    for _ in 0..600 {
        if app.database().execute(&renewed).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = other.service.run_actions(later).await.unwrap();
    assert_eq!(report, blazar_service::ActionReport::default());

    // The first worker stops mid-attempt: its claim runs out and the other takes over.
    first.abort();
    let _ = first.await;
    let after = later + chrono::Duration::seconds(3);
    other.set_time(after);
    backend.gate.add_permits(1);
    let report = other.service.run_actions(after).await.unwrap();
    assert_eq!(report.done, 1, "{report:?}");
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    let listed = actions(&app, &lid).await;
    assert_eq!(listed[0]["attempts"], 2, "{listed:?}");
}

/// The lease notifications of `lease_id`, oldest first.
/// A lease's notifications, oldest first.
async fn notifications_of(app: &TestApp, lease_id: &str) -> Vec<Value> {
    let notes = app
        .get(&format!("/v1/notifications?lease_id={lease_id}"))
        .await;
    notes.body["notifications"].as_array().unwrap().clone()
}

async fn notified(app: &TestApp, lease_id: &str) -> Vec<String> {
    notifications_of(app, lease_id)
        .await
        .iter()
        .map(|n| n["event_type"].as_str().unwrap().to_string())
        .collect()
}

/// The lease's and its first reservation's status in each of a lease's notifications.
async fn payload_statuses(app: &TestApp, lease_id: &str) -> Vec<(String, String)> {
    notifications_of(app, lease_id)
        .await
        .iter()
        .map(|n| {
            let payload = &n["payload"];
            (
                payload["status"].as_str().unwrap().to_string(),
                payload["reservations"][0]["status"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_before_end_due_at_the_start_waits_for_the_start_and_comes_before_the_end() {
    let app = TestApp::builder().auto_actions(false).spawn().await;
    app.create_host("h1", json!({})).await;
    // Shorter than the notice (60 minutes by default): the before-end falls at the start.
    let r = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 10:30", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let a = id(&r.body);
    let start = t(2030, 1, 1, 10, 0);
    app.tick_at(start).await;
    // The start's hand-over has not run: the lease is starting, and the notice waits.
    assert_eq!(lease(&app, &a).await["status"], "STARTING");
    assert_eq!(notified(&app, &a).await, ["lease.create"]);
    app.tick_at(start).await;
    assert_eq!(notified(&app, &a).await, ["lease.create"]);
    app.set_time(start);
    app.run_actions().await;
    app.tick_at(start).await;
    assert_eq!(
        notified(&app, &a).await,
        [
            "lease.create",
            "lease.event.start_lease",
            "lease.event.before_end_lease"
        ]
    );

    // A start whose hand-over never ran before the lease's end: the end settles the start,
    // and the notice comes between the two.
    let r = app
        .host_lease("b", "2030-01-01 11:00", "2030-01-01 11:30", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let b = id(&r.body);
    app.tick_at(t(2030, 1, 1, 11, 0)).await;
    assert_eq!(lease(&app, &b).await["status"], "STARTING");
    let end = t(2030, 1, 1, 11, 30);
    app.tick_at(end).await;
    app.set_time(end);
    app.run_actions().await;
    assert_eq!(lease(&app, &b).await["status"], "TERMINATED");
    assert_eq!(
        notified(&app, &b).await,
        [
            "lease.create",
            "lease.event.start_lease",
            "lease.event.before_end_lease",
            "lease.event.end_lease"
        ]
    );
    // Each announced with the lease as Blazar shows it: started (ACTIVE, its reservation
    // active) for the start and the notice, over for the end.
    let seen = payload_statuses(&app, &b).await;
    assert_eq!(
        seen[1..],
        [
            ("ACTIVE".to_string(), "active".to_string()),
            ("ACTIVE".to_string(), "active".to_string()),
            ("TERMINATED".to_string(), "deleted".to_string())
        ],
        "{seen:?}"
    );
}

/// A cloud in which the floating IPs and segments named in `taken` (by address, or VLAN id)
/// are held by another project's floating IP or network; otherwise the standalone backend.
#[derive(Default)]
struct Holding {
    taken: Mutex<Vec<String>>,
}

#[async_trait]
impl Backend for Holding {
    /// A start hands over what is not held, and says what is.
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        let mut output = StandaloneBackend.apply(store, action).await?;
        if action.kind == ActionKind::Start {
            let taken = self.taken.lock().unwrap().clone();
            let mut tx = store.read().await.unwrap();
            for r in tx
                .resources_named(&action.resource_type, &action.resources)
                .await
                .unwrap()
            {
                if taken.contains(&r.resource.display_name()) {
                    output.held_outside.push(r.id);
                    output.handovers.retain(|h| {
                        !matches!(h, blazar_service::HandoverChange::Start(h) if h.resource_id == r.id)
                    });
                }
            }
        }
        Ok(output)
    }

    async fn pools_taken(
        &self,
        checks: &[blazar_service::PoolCheck],
    ) -> Result<Option<std::collections::BTreeMap<i64, String>>, blazar_service::InventoryError>
    {
        let taken = self.taken.lock().unwrap().clone();
        Ok(Some(
            checks
                .iter()
                .filter(|c| taken.contains(&c.record.resource.display_name()))
                .map(|c| (c.record.id, "floating IP f-1 of project other".to_string()))
                .collect(),
        ))
    }
}

/// The addresses the floating-IP reservations of lease `id` are handed now.
async fn addresses_held(app: &TestApp, id: &str) -> Vec<String> {
    let mut held = Vec::new();
    for h in app.get("/v1/handovers").await.body["handovers"]
        .as_array()
        .unwrap()
    {
        if h["lease_id"] == id && h["until"].is_null() {
            let shown = app
                .get(&format!(
                    "/v1/floatingips/{}",
                    h["resource_id"].as_str().unwrap()
                ))
                .await;
            held.push(
                shown.body["floatingip"]["floating_ip_address"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    held.sort();
    held
}

/// A reserved floating IP that another project holds in the cloud cannot be handed over:
/// the monitor takes it out of service and the reservations holding it get another address
/// (the running one at once), the lease degraded when none is free; when the cloud lets go
/// of it, it is reservable again and the lease is made whole. One an operator took out
/// stays out.
#[tokio::test]
async fn a_floating_ip_held_by_another_project_is_healed_around_and_comes_back() {
    let backend = Arc::new(Holding::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let mut ids = HashMap::new();
    for address in ["172.24.4.101", "172.24.4.102"] {
        ids.insert(address, fip(&app, "net-1", address).await);
    }
    let body = json!({"name": "f", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 1}]});
    let r = app.post("/v1/leases", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let first = addresses_held(&app, &lease_id).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let (lost, other) = if first[0] == "172.24.4.101" {
        ("172.24.4.101", "172.24.4.102")
    } else {
        ("172.24.4.102", "172.24.4.101")
    };
    // Nothing held outside: nothing changes.
    assert_eq!(
        app.service.monitor_pools().await.unwrap(),
        blazar_service::MonitorReport::default()
    );

    // Another project made a floating IP with the lease's address.
    *backend.taken.lock().unwrap() = vec![lost.to_string()];
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.taken, vec![lost.to_string()]);
    app.run_actions().await;
    assert_eq!(
        addresses_held(&app, &lease_id).await,
        vec![other.to_string()]
    );
    let shown = app.get(&format!("/v1/floatingips/{}", ids[lost])).await;
    assert_eq!(shown.body["floatingip"]["reservable"], json!(false));
    let l = lease(&app, &lease_id).await;
    assert_eq!(l["degraded"], json!(false), "{l}");
    assert_eq!(
        l["reservations"][0]["resources_changed"],
        json!(true),
        "{l}"
    );
    assert!(
        notified(&app, &lease_id)
            .await
            .contains(&"reservation.resources_changed".to_string())
    );
    // Asked again: already out, nothing more to do.
    assert_eq!(
        app.service.monitor_pools().await.unwrap(),
        blazar_service::MonitorReport::default()
    );

    // The other address goes the same way: nothing is left to replace it.
    *backend.taken.lock().unwrap() = vec![lost.to_string(), other.to_string()];
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.taken, vec![other.to_string()]);
    app.run_actions().await;
    assert_eq!(addresses_held(&app, &lease_id).await, Vec::<String>::new());
    let l = lease(&app, &lease_id).await;
    assert_eq!(l["degraded"], json!(true), "{l}");
    assert_eq!(
        l["reservations"][0]["missing_resources"],
        json!(true),
        "{l}"
    );
    assert!(
        notified(&app, &lease_id)
            .await
            .contains(&"lease.degraded".to_string())
    );

    // An operator takes the first out by hand while the cloud still holds it; then the
    // cloud lets go of both: only the one the monitor took out comes back.
    let r = app
        .put(
            &format!("/v1/floatingips/{}", ids[lost]),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    backend.taken.lock().unwrap().clear();
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.freed, vec![other.to_string()]);
    app.run_actions().await;
    assert_eq!(
        addresses_held(&app, &lease_id).await,
        vec![other.to_string()]
    );
    let l = lease(&app, &lease_id).await;
    assert_eq!(l["degraded"], json!(false), "{l}");
    assert_eq!(
        l["reservations"][0]["missing_resources"],
        json!(false),
        "{l}"
    );
    let shown = app.get(&format!("/v1/floatingips/{}", ids[lost])).await;
    assert_eq!(shown.body["floatingip"]["reservable"], json!(false));
}

/// A reserved address another project took before the monitor noticed is found by the
/// lease's start: the start hands over what it can, and the address is taken out and
/// replaced at once, the lease ACTIVE and whole.
#[tokio::test]
async fn a_start_that_finds_its_address_held_outside_gets_another() {
    let backend = Arc::new(Holding::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    fip(&app, "net-1", "172.24.4.101").await;
    let body = json!({"name": "f", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 1}]});
    let r = app.post("/v1/leases", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r.body);
    fip(&app, "net-1", "172.24.4.102").await;
    *backend.taken.lock().unwrap() = vec!["172.24.4.101".to_string()];

    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.run_actions().await;
    let l = lease(&app, &lease_id).await;
    assert_eq!(l["status"], "ACTIVE", "{l}");
    assert_eq!(l["degraded"], json!(false), "{l}");
    assert_eq!(
        addresses_held(&app, &lease_id).await,
        vec!["172.24.4.102".to_string()]
    );
    // Out of service until the cloud lets go of it.
    let listed = app.get("/v1/floatingips").await.body["floatingips"].clone();
    let first = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["floating_ip_address"] == "172.24.4.101")
        .unwrap()
        .clone();
    assert_eq!(first["reservable"], json!(false));
    backend.taken.lock().unwrap().clear();
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.freed, vec!["172.24.4.101".to_string()]);
}

#[tokio::test]
async fn a_deleted_leases_failed_clean_up_stays_listed_for_its_project_and_admins() {
    let backend = Arc::new(Scripted::default());
    let mut app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "ada", "member");
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lid = id(&r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert_eq!(lease(&app, &lid).await["status"], "ACTIVE");
    backend.fail_next(ActionError::Permanent("nova: aggregate is gone".into()));
    assert_eq!(
        app.delete(&format!("/v1/leases/{lid}")).await.status,
        StatusCode::NO_CONTENT
    );
    app.run_actions().await;
    assert_eq!(
        app.get(&format!("/v1/leases/{lid}")).await.status,
        StatusCode::NOT_FOUND
    );

    // The lease is gone; what its clean-up did, and why it failed, is not.
    let listed = actions(&app, &lid).await;
    let summary: Vec<(&str, &str)> = listed
        .iter()
        .map(|a| (a["kind"].as_str().unwrap(), a["status"].as_str().unwrap()))
        .collect();
    assert_eq!(summary, vec![("start", "done"), ("stop", "failed")]);
    assert_eq!(listed[1]["last_error"], "nova: aggregate is gone");
    assert_eq!(listed[1]["purpose"], "delete");

    // The same, among every action the project may see, newest first.
    let r = app.get("/v1/actions?status=failed").await;
    r.assert_status(StatusCode::OK);
    let failed = r.body["actions"].as_array().unwrap().clone();
    assert_eq!(failed.len(), 1, "{}", r.body);
    assert_eq!(failed[0]["lease_id"], lid.as_str());
    assert_eq!(failed[0]["project_id"], "alpha");

    // Another project sees neither.
    app.act_as("beta", "bob", "member");
    app.get(&format!("/v1/leases/{lid}/actions"))
        .await
        .assert_denied("blazar:leases:get");
    assert_eq!(app.get("/v1/actions").await.body["actions"], json!([]));
    assert_eq!(
        app.get("/v1/actions?project_id=alpha").await.body["actions"],
        json!([])
    );

    // An admin sees every project's, filtered and paged.
    app.act_as_admin();
    assert_eq!(actions(&app, &lid).await, listed);
    let all = app.get("/v1/actions").await.body["actions"].clone();
    let seqs: Vec<i64> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 2, "{all}");
    assert!(seqs[0] > seqs[1], "newest first: {seqs:?}");
    let first = app.get("/v1/actions?limit=1").await.body["actions"].clone();
    assert_eq!(first, json!([all[0]]));
    let next = app
        .get(&format!("/v1/actions?limit=1&marker={}", seqs[0]))
        .await
        .body["actions"]
        .clone();
    assert_eq!(next, json!([all[1]]));
    let of_lease = app
        .get(&format!("/v1/actions?lease_id={lid}&status=done,failed"))
        .await;
    assert_eq!(of_lease.body["actions"], all);
    assert_eq!(
        app.get("/v1/actions?project_id=beta").await.body["actions"],
        json!([])
    );

    // Bad queries are 400s that say what is wrong; a lease that never was is 404.
    for (query, words) in [
        ("status=broken", "Invalid action status broken"),
        ("limit=0", "Malformed parameter limit"),
        ("marker=abc", "Malformed parameter marker"),
        ("lease=x", "Unknown parameter lease"),
    ] {
        let r = app.get(&format!("/v1/actions?{query}")).await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert!(r.message().contains(words), "{query}: {}", r.body);
    }
    app.get("/v1/leases/4f1d2c3b-0000-4000-8000-000000000000/actions")
        .await
        .assert_status(StatusCode::NOT_FOUND);
}

/// What the cloud answers a host's withdrawal with; otherwise the standalone backend.
#[derive(Default)]
struct Withdrawals {
    answer: Mutex<Option<blazar_service::InventoryError>>,
}

#[async_trait]
impl Backend for Withdrawals {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        StandaloneBackend.apply(store, action).await
    }

    async fn check_withdrawal(
        &self,
        _facts: &blazar_core::HostFacts,
    ) -> Result<(), blazar_service::InventoryError> {
        match self.answer.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A host is withdrawn only when the cloud lets it go (no servers on it), and is asked only
/// for a host that is not reserved, as Blazar refuses a reserved host first; nothing is
/// written when it refuses or cannot be asked.
#[tokio::test]
async fn a_host_the_cloud_will_not_let_go_stays_enrolled() {
    use blazar_service::InventoryError;
    let backend = Arc::new(Withdrawals::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let reserved = app.create_host("h1", json!({})).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let free = app.create_host("h2", json!({})).await;
    *backend.answer.lock().unwrap() = Some(InventoryError::Conflict(
        "Servers [s1] found for host h2".into(),
    ));
    let r = app.delete(&format!("/v1/os-hosts/{reserved}")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.message(),
        format!("Can't delete host {reserved}. The host is reserved.")
    );
    let r = app.delete(&format!("/v1/os-hosts/{free}")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(r.message(), "Servers [s1] found for host h2");
    *backend.answer.lock().unwrap() = Some(InventoryError::Unavailable("nova: down".into()));
    let r = app.delete(&format!("/v1/os-hosts/{free}")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(
        app.get(&format!("/v1/os-hosts/{free}")).await.status,
        StatusCode::OK
    );
    *backend.answer.lock().unwrap() = None;
    let r = app.delete(&format!("/v1/os-hosts/{free}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        app.get(&format!("/v1/os-hosts/{free}")).await.status,
        StatusCode::NOT_FOUND
    );
}
