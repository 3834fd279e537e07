//! The reconciler's repairing passes run in one replica at a time: a pass holds the
//! `reconcile` task claim, others are refused (409) while it runs, and a claim left by a
//! replica that stopped is taken over once it runs out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use blazar_core::ActionKind;
use blazar_db::{RepairItem, Store};
use blazar_service::{
    Action, ActionError, ActionOutput, Backend, Clock, DesiredState, InventoryError, MONITOR_TURN,
    RECONCILE_TURN, ReconcileReport, ServiceError, Settings, StandaloneBackend,
};
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::harness::{TestApp, TestDatabase};

/// A backend whose repairing passes wait at a gate until the test lets them through, so
/// that a pass can be held open while other replicas try to start theirs.
struct Gated {
    /// Repairing passes that reached the cloud.
    entered: AtomicUsize,
    /// Dry runs that reached the cloud.
    dry_runs: AtomicUsize,
    gate: Semaphore,
}

impl Default for Gated {
    fn default() -> Self {
        Gated {
            entered: AtomicUsize::new(0),
            dry_runs: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        }
    }
}

#[async_trait]
impl Backend for Gated {
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        StandaloneBackend.apply(store, action).await
    }

    async fn reconcile(
        &self,
        _store: &Store,
        _desired: &DesiredState,
        apply: bool,
    ) -> Result<ReconcileReport, InventoryError> {
        if apply {
            self.entered.fetch_add(1, Ordering::SeqCst);
            self.gate
                .acquire()
                .await
                .map_err(|e| InventoryError::Unavailable(e.to_string()))?
                .forget();
        } else {
            self.dry_runs.fetch_add(1, Ordering::SeqCst);
        }
        Ok(ReconcileReport {
            applied: apply,
            repairs: vec![format!("pass {}", if apply { "applied" } else { "dry" })],
            ..ReconcileReport::default()
        })
    }
}

async fn until_entered(backend: &Gated, n: usize) {
    for _ in 0..500 {
        if backend.entered.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no pass reached the cloud");
}

#[tokio::test]
async fn one_repairing_pass_at_a_time_among_replicas() {
    let backend = Arc::new(Gated::default());
    let app = TestApp::builder()
        .database(Arc::new(TestDatabase::new().await))
        .backend(backend.clone())
        .spawn()
        .await;
    let replicas = [
        app.replica_with(backend.clone()).await,
        app.replica_with(backend.clone()).await,
        app.replica_with(backend.clone()).await,
    ];

    // Four replicas ask at once: one pass reaches the cloud, the others are refused.
    let mut passes = Vec::new();
    for service in std::iter::once(&app)
        .chain(replicas.iter())
        .map(|a| a.service.clone())
    {
        passes.push(tokio::spawn(async move { service.reconcile(true).await }));
    }
    until_entered(&backend, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(backend.entered.load(Ordering::SeqCst), 1);

    // While it runs, every replica (the one running it too) refuses another repairing pass
    // and still answers a dry run.
    for replica in std::iter::once(&app).chain(replicas.iter()) {
        let r = replica
            .post("/v1/reconcile", json!({"dry_run": false}))
            .await;
        r.assert_status(StatusCode::CONFLICT);
        assert!(
            r.message().contains("reconciliation pass is running"),
            "{r:?}"
        );
    }
    assert_eq!(backend.entered.load(Ordering::SeqCst), 1);
    let r = replicas[1]
        .post("/v1/reconcile", json!({"dry_run": true}))
        .await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["reconcile"]["repairs"], json!(["pass dry"]));
    assert_eq!(backend.dry_runs.load(Ordering::SeqCst), 1);

    backend.gate.add_permits(1);
    let mut applied = 0;
    let mut refused = 0;
    for pass in passes {
        match pass.await.unwrap() {
            Ok(report) => {
                assert!(report.applied);
                applied += 1;
            }
            Err(ServiceError::Conflict(_)) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!((applied, refused), (1, 3));
    assert_eq!(backend.entered.load(Ordering::SeqCst), 1);

    // Once it ended, the claim is free for whichever replica comes next.
    backend.gate.add_permits(1);
    let r = replicas[2]
        .post("/v1/reconcile", json!({"dry_run": false}))
        .await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["reconcile"]["repairs"], json!(["pass applied"]));
    assert_eq!(backend.entered.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_pass_whose_caller_goes_away_still_releases_its_claim() {
    let backend = Arc::new(Gated::default());
    let app = TestApp::builder()
        .database(Arc::new(TestDatabase::new().await))
        .backend(backend.clone())
        .spawn()
        .await;
    let replica = app.replica_with(backend.clone()).await;

    let service = app.service.clone();
    let caller = tokio::spawn(async move { service.reconcile(true).await });
    until_entered(&backend, 1).await;
    // The caller is dropped mid-pass (as an HTTP client that timed out); the pass runs on
    // and gives the claim back when it ends.
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    backend.gate.add_permits(100);
    let mut free = false;
    for _ in 0..200 {
        match replica.service.reconcile(true).await {
            Ok(_) => {
                free = true;
                break;
            }
            Err(ServiceError::Conflict(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(free, "the claim was never released");
}

#[tokio::test]
async fn a_claim_left_by_a_stopped_replica_is_taken_over_when_it_runs_out() {
    let backend = Arc::new(Gated::default());
    backend.gate.add_permits(10);
    let db = Arc::new(TestDatabase::new().await);
    let app = TestApp::builder()
        .database(db.clone())
        .backend(backend.clone())
        .spawn()
        .await;
    let now = app.clock.now().timestamp();

    // A replica that stopped mid-pass a moment ago: its claim still holds.
    db.execute(&format!(
        "INSERT INTO task_claims (name, holder, held_until) VALUES ('reconcile', 'gone', {})",
        now + 60
    ))
    .await;
    let r = app.post("/v1/reconcile", json!({"dry_run": false})).await;
    r.assert_status(StatusCode::CONFLICT);
    assert_eq!(backend.entered.load(Ordering::SeqCst), 0);

    // Once its time has passed, the claim is free.
    db.execute(&format!(
        "UPDATE task_claims SET held_until = {} WHERE name = 'reconcile'",
        now - 1
    ))
    .await;
    let r = app.post("/v1/reconcile", json!({"dry_run": false})).await;
    r.assert_status(StatusCode::OK);
    assert_eq!(backend.entered.load(Ordering::SeqCst), 1);
    let left = db
        .execute("DELETE FROM task_claims WHERE name = 'reconcile'")
        .await;
    assert_eq!(left, 0, "the pass gave its claim back");
}

#[tokio::test]
async fn periodic_passes_take_one_turn_an_interval_among_replicas() {
    let app = TestApp::builder()
        .database(Arc::new(TestDatabase::new().await))
        .spawn()
        .await;
    let replica = app.replica().await;
    let every = Duration::from_secs(300);
    let start = app.clock.now();
    let at = |seconds: i64| {
        let t = start + chrono::Duration::seconds(seconds);
        app.set_time(t);
        replica.set_time(t);
    };

    // The first timer to fire takes the turn; the other replica's, and its own again, wait.
    assert!(app.service.take_turn(RECONCILE_TURN, every).await.unwrap());
    assert!(
        !replica
            .service
            .take_turn(RECONCILE_TURN, every)
            .await
            .unwrap()
    );
    at(299);
    assert!(!app.service.take_turn(RECONCILE_TURN, every).await.unwrap());
    assert!(
        !replica
            .service
            .take_turn(RECONCILE_TURN, every)
            .await
            .unwrap()
    );
    // The monitor's turns are its own.
    assert!(
        replica
            .service
            .take_turn(MONITOR_TURN, every)
            .await
            .unwrap()
    );

    // An interval on, the turn goes to whichever fires first; a replica that stopped
    // taking turns is followed by the others.
    at(300);
    assert!(
        replica
            .service
            .take_turn(RECONCILE_TURN, every)
            .await
            .unwrap()
    );
    assert!(!app.service.take_turn(RECONCILE_TURN, every).await.unwrap());
    at(598);
    assert!(!app.service.take_turn(MONITOR_TURN, every).await.unwrap());
    at(599);
    assert!(app.service.take_turn(MONITOR_TURN, every).await.unwrap());
    at(600);
    assert!(
        replica
            .service
            .take_turn(RECONCILE_TURN, every)
            .await
            .unwrap()
    );
    assert!(!app.service.take_turn(RECONCILE_TURN, every).await.unwrap());

    // A turn is not a running pass: an operator's pass runs meanwhile.
    let r = app.post("/v1/reconcile", json!({"dry_run": false})).await;
    r.assert_status(StatusCode::OK);
}

/// A backend whose first `failing` repairing passes find the cloud away; records when
/// each repairing pass came.
struct Flaky {
    failing: usize,
    passes: std::sync::Mutex<Vec<std::time::Instant>>,
}

#[async_trait]
impl Backend for Flaky {
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        StandaloneBackend.apply(store, action).await
    }

    async fn reconcile(
        &self,
        _store: &Store,
        _desired: &DesiredState,
        apply: bool,
    ) -> Result<ReconcileReport, InventoryError> {
        let mut passes = self.passes.lock().unwrap();
        if apply {
            passes.push(std::time::Instant::now());
        }
        let failed = if apply && passes.len() <= self.failing {
            vec!["aggregates could not be listed: nova: 503".to_string()]
        } else {
            Vec::new()
        };
        Ok(ReconcileReport {
            applied: apply,
            failed,
            ..ReconcileReport::default()
        })
    }
}

/// The timer's first pass comes soon after start, not an interval later; a pass that
/// failed is tried again after the retry pause, doubling, until one succeeds; then the
/// interval.
#[tokio::test]
async fn the_first_pass_comes_soon_and_a_failed_one_is_tried_again_before_the_interval() {
    let backend = Arc::new(Flaky {
        failing: 2,
        passes: Default::default(),
    });
    let app = TestApp::builder()
        .settings(Settings {
            reconcile_retry: Duration::from_millis(600),
            ..Settings::default()
        })
        .backend(backend.clone())
        .spawn()
        .await;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let service = app.service.clone();
    let began = std::time::Instant::now();
    let timer = tokio::spawn(async move {
        service
            .run_reconciler(Duration::from_secs(3600), None, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await
    });
    // 300 ms, then 600 ms and 1.2 s later; then an hour (nothing more while the test waits).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while backend.passes.lock().unwrap().len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "three passes not within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stop_tx.send(true).unwrap();
    timer.await.unwrap();
    let passes = backend.passes.lock().unwrap().clone();
    assert_eq!(passes.len(), 3, "{passes:?}");
    let first = passes[0] - began;
    let (second, third) = (passes[1] - passes[0], passes[2] - passes[1]);
    assert!(first >= Duration::from_millis(250), "{first:?}");
    assert!(second >= Duration::from_millis(550), "{second:?}");
    assert!(third >= Duration::from_millis(1_150), "{third:?}");
}

/// A backend whose repairing pass holds a write transaction for a while, as a pass that
/// records what it made does, or waits at the gate.
struct Slow {
    hold: Duration,
    gated: Gated,
}

#[async_trait]
impl Backend for Slow {
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        StandaloneBackend.apply(store, action).await
    }

    async fn reconcile(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
    ) -> Result<ReconcileReport, InventoryError> {
        let unavailable = |e: blazar_db::DbError| InventoryError::Unavailable(e.to_string());
        let tx = store.write().await.map_err(unavailable)?;
        tokio::time::sleep(self.hold).await;
        tx.commit().await.map_err(unavailable)?;
        self.gated.reconcile(store, desired, apply).await
    }
}

fn renewing_every(ms: u64) -> Settings {
    Settings {
        claim_renewal: Duration::from_millis(ms),
        ..Settings::default()
    }
}

#[tokio::test]
async fn a_renewal_waits_beside_a_pass_that_holds_the_write_lock() {
    // Renewals every 300 ms while the pass holds a write transaction for 400 ms: on SQLite
    // the renewal waits for the pass's lock, and the pass must go on meanwhile. (Claims
    // are kept to the second: one renewed every 300 ms is held 1.2 s, more than none.)
    let backend = Arc::new(Slow {
        hold: Duration::from_millis(400),
        gated: Gated::default(),
    });
    backend.gated.gate.add_permits(1);
    let app = TestApp::builder()
        .database(Arc::new(TestDatabase::new().await))
        .settings(renewing_every(300))
        .backend(backend.clone())
        .spawn()
        .await;
    let report = tokio::time::timeout(Duration::from_secs(20), app.service.reconcile(true))
        .await
        .expect("the pass and its renewals wait for each other")
        .unwrap();
    assert_eq!(report.repairs, ["pass applied"]);
}

#[tokio::test]
async fn a_pass_that_lost_its_claim_stops_and_leaves_the_new_holder_alone() {
    let backend = Arc::new(Gated::default());
    let db = Arc::new(TestDatabase::new().await);
    let app = TestApp::builder()
        .database(db.clone())
        .settings(renewing_every(300))
        .backend(backend.clone())
        .spawn()
        .await;
    let service = app.service.clone();
    let pass = tokio::spawn(async move { service.reconcile(true).await });
    until_entered(&backend, 1).await;
    // Another replica took the claim over (this one's ran out while it was cut off).
    let far = app.clock.now().timestamp() + 3_600;
    db.execute(&format!(
        "UPDATE task_claims SET holder = 'other', held_until = {far} WHERE name = 'reconcile'"
    ))
    .await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), pass)
        .await
        .expect("the pass stops")
        .unwrap();
    match stopped {
        Err(ServiceError::Unavailable(m)) => {
            assert!(m.contains("another replica took it over"), "{m}");
        }
        other => panic!("expected the pass to stop, got {other:?}"),
    }
    let r = app.post("/v1/reconcile", json!({"dry_run": false})).await;
    r.assert_status(StatusCode::CONFLICT);
    assert_eq!(
        db.execute("UPDATE task_claims SET held_until = 0 WHERE holder = 'other'")
            .await,
        1,
        "the new holder's claim stays"
    );
}

/// A backend whose repairing pass holds one lease, as a repair of it does, and waits at a
/// gate; it records the actions it carries out meanwhile.
#[derive(Default)]
struct Holding {
    lease_id: std::sync::Mutex<String>,
    /// Whether the pass got its hold.
    held: std::sync::Mutex<Option<bool>>,
    applied: std::sync::Mutex<Vec<(ActionKind, String)>>,
    gated: Gated,
}

#[async_trait]
impl Backend for Holding {
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        self.applied
            .lock()
            .unwrap()
            .push((action.kind, action.lease_id.clone()));
        StandaloneBackend.apply(store, action).await
    }

    async fn reconcile(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
    ) -> Result<ReconcileReport, InventoryError> {
        let item = RepairItem {
            lease_id: Some(self.lease_id.lock().unwrap().clone()),
            resources: Vec::new(),
        };
        let held = desired.hold(store, &item).await;
        *self.held.lock().unwrap() = Some(held);
        self.gated.reconcile(store, desired, apply).await
    }
}

/// A repair and the lease's own actions never run at once: the end of a lease whose
/// repair is under way waits for it (refusing a hold on news is checked in the store's
/// conformance suite).
#[tokio::test]
async fn a_lease_being_repaired_ends_after_the_repair() {
    let backend = Arc::new(Holding::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    app.create_host("h1", json!({})).await;
    let r = app
        .host_lease("repaired", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    r.assert_status(StatusCode::CREATED);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    *backend.lease_id.lock().unwrap() = lease_id.clone();
    app.tick_at(crate::harness::t(2030, 1, 1, 10, 0)).await;
    let status = async || {
        app.get(&format!("/v1/leases/{lease_id}")).await.body["lease"]["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(status().await, "ACTIVE");
    let stops = || {
        backend
            .applied
            .lock()
            .unwrap()
            .iter()
            .filter(|(kind, lease)| *kind == ActionKind::Stop && *lease == lease_id)
            .count()
    };

    // The pass's claim (and so its hold) lasts two minutes of the test's clock.
    app.set_time(crate::harness::t(2030, 1, 1, 11, 59));
    let service = app.service.clone();
    let pass = tokio::spawn(async move { service.reconcile(true).await });
    until_entered(&backend.gated, 1).await;
    assert_eq!(*backend.held.lock().unwrap(), Some(true));
    app.tick_at(crate::harness::t(2030, 1, 1, 12, 0)).await;
    app.run_actions().await;
    assert_eq!(stops(), 0, "the take-back ran beside the repair");
    assert_ne!(status().await, "TERMINATED");
    backend.gated.gate.add_permits(1);
    pass.await.unwrap().unwrap();
    app.run_actions().await;
    assert_eq!(stops(), 1);
    assert_eq!(status().await, "TERMINATED");
}

/// A dry run asked in the query, as lease creates take it, only lists; a parameter the
/// reconciliation does not know (a misspelt dry run) is refused rather than repairing.
#[tokio::test]
async fn a_dry_run_in_the_query_only_lists_and_a_misspelt_one_repairs_nothing() {
    let backend = Arc::new(Gated::default());
    let app = TestApp::spawn_backend(backend.clone()).await;
    let r = app.post("/v1/reconcile?dry_run=true", json!({})).await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["reconcile"]["applied"], false, "{r:?}");
    let r = app.post("/v1/reconcile?dry-run=true", json!({})).await;
    r.assert_status(StatusCode::BAD_REQUEST);
    assert!(r.message().contains("Unknown parameter dry-run"), "{r:?}");
    assert_eq!(backend.dry_runs.load(Ordering::SeqCst), 1);
    assert_eq!(backend.entered.load(Ordering::SeqCst), 0);
}
