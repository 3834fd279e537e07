//! Real `blazar-server` processes: several on one database, crashes, restarts, SIGTERM.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::harness::TestDatabase;

struct Server {
    child: Child,
    base: String,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn start(db: &TestDatabase, role: &str) -> Server {
    start_polling(db, role, "0.2").await
}

/// A server whose loops look at the database every `poll` seconds when nothing wakes them.
async fn start_polling(db: &TestDatabase, role: &str, poll: &str) -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_blazar-server"))
        .arg("--role")
        .arg(role)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--database-url")
        .arg(&db.url)
        .arg("--poll-interval")
        .arg(poll)
        .env("BLAZAR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn blazar-server");
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    if role != "manager" {
        wait_until(Duration::from_secs(30), || async {
            reqwest::get(format!("{}/healthz", server.base))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }
    server
}

/// Polls `check` until it holds; the processes under test run on real time.
async fn wait_until<F, Fut>(limit: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends SIGTERM to `server` and waits for it to exit successfully.
async fn terminate(server: &mut Server) {
    let pid = server.child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn lease_body(name: &str, start: &str, end: &str) -> Value {
    json!({
        "name": name, "start_date": start, "end_date": end, "events": [],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "hypervisor_properties": "", "resource_properties": ""}],
    })
}

/// Two server processes on one database take 50 concurrent creates for the only host between
/// them: exactly one lease is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_database_grant_a_host_once() {
    let db = TestDatabase::new().await;
    let a = start(&db, "api").await;
    let b = start(&db, "api").await;
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{}/v1/os-hosts", a.base),
        Some(json!({"name": "only"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let requests = (0..50).map(|i| {
        let server = if i % 2 == 0 { &a } else { &b };
        call(
            reqwest::Method::POST,
            format!("{}/v1/leases", server.base),
            Some(lease_body(
                &format!("race-{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
            )),
        )
    });
    let responses = join_all(requests).await;
    let created = responses
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    let conflicts = responses
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .count();
    assert_eq!(
        created,
        1,
        "{:?}",
        responses
            .iter()
            .map(|(s, b)| (s, b["error_message"].clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(conflicts, 49);
    let (_, leases) = call(reqwest::Method::GET, format!("{}/v1/leases", b.base), None).await;
    assert_eq!(leases["leases"].as_array().unwrap().len(), 1);
}

async fn lease_status(base: &str, id: &str) -> String {
    let (_, body) = call(reqwest::Method::GET, format!("{base}/v1/leases/{id}"), None).await;
    body["lease"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Every hand-over on record, ended ones included.
async fn handover_count(base: &str) -> usize {
    handovers_listed(base, "?all=true").await
}

/// Hand-overs in force now.
async fn open_handover_count(base: &str) -> usize {
    handovers_listed(base, "").await
}

async fn handovers_listed(base: &str, query: &str) -> usize {
    let (_, body) = call(
        reqwest::Method::GET,
        format!("{base}/v1/handovers{query}"),
        None,
    )
    .await;
    body["handovers"].as_array().map_or(0, Vec::len)
}

/// Waits until the lease shows `status`; fails after `limit`.
async fn wait_for_status(base: &str, id: &str, status: &str, limit: Duration) {
    wait_until(
        limit,
        || async move { lease_status(base, id).await == status },
    )
    .await;
}

/// A lease falls due while no scheduler runs and the server is killed; the restarted server
/// runs the start event exactly once, and another restart does not run it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_event_missed_while_down_runs_once_after_restart() {
    let db = TestDatabase::new().await;
    let mut api = start(&db, "api").await;
    call(
        reqwest::Method::POST,
        format!("{}/v1/os-hosts", api.base),
        Some(json!({"name": "only"})),
    )
    .await;
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}/v1/leases", api.base),
        Some(lease_body("due", "now", "2099-01-01 00:00")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["lease"]["id"].as_str().unwrap().to_string();
    api.child.start_kill().unwrap();
    api.child.wait().await.unwrap();

    let mut server = start(&db, "all").await;
    wait_for_status(&server.base, &id, "ACTIVE", Duration::from_secs(30)).await;
    assert_eq!(handover_count(&server.base).await, 1);
    server.child.start_kill().unwrap();
    server.child.wait().await.unwrap();

    let again = start(&db, "all").await;
    // Give the restarted scheduler several polls to (wrongly) run the event again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(lease_status(&again.base, &id).await, "ACTIVE");
    assert_eq!(handover_count(&again.base).await, 1);
}

/// Two scheduler processes on one database start each of twenty leases exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_managers_run_each_event_once() {
    let db = TestDatabase::new().await;
    let api = start(&db, "api").await;
    for i in 0..20 {
        call(
            reqwest::Method::POST,
            format!("{}/v1/os-hosts", api.base),
            Some(json!({"name": format!("c{i}")})),
        )
        .await;
    }
    let _m1 = start(&db, "manager").await;
    let _m2 = start(&db, "manager").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let (status, body) = call(
            reqwest::Method::POST,
            format!("{}/v1/leases", api.base),
            Some(lease_body(&format!("l{i}"), "now", "2099-01-01 00:00")),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["lease"]["id"].as_str().unwrap().to_string());
    }
    let base = api.base.clone();
    wait_until(Duration::from_secs(30), || {
        let base = base.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                if lease_status(&base, id).await != "ACTIVE" {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert_eq!(handover_count(&api.base).await, 20);
}

/// On PostgreSQL, a lease created through a `--role api` replica to start now is started
/// by a manager that polls only every 10 s well before its next poll, and its take-back
/// after a delete through the replica as soon: processes on one database wake each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_wakes_the_manager_instead_of_waiting_for_its_poll() {
    let db = TestDatabase::new().await;
    if !db.is_postgres() {
        // Processes sharing a SQLite file have no channel between them; they poll.
        return;
    }
    let api = start(&db, "api").await;
    call(
        reqwest::Method::POST,
        format!("{}/v1/os-hosts", api.base),
        Some(json!({"name": "only"})),
    )
    .await;
    let _manager = start_polling(&db, "manager", "10").await;
    // The manager's first look at the events is at its start; give it that.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}/v1/leases", api.base),
        Some(lease_body("woken", "now", "2099-01-01 00:00")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["lease"]["id"].as_str().unwrap().to_string();
    wait_for_status(&api.base, &id, "ACTIVE", Duration::from_secs(5)).await;
    assert_eq!(handover_count(&api.base).await, 1);

    // Deleting the running lease records its take-back: the manager's workers carry it out
    // at once too (an ended hand-over leaves the list of open ones).
    let (status, _) = call(
        reqwest::Method::DELETE,
        format!("{}/v1/leases/{id}", api.base),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    wait_until(Duration::from_secs(5), || async {
        open_handover_count(&api.base).await == 0
    })
    .await;
}

/// SIGTERM stops the server cleanly, and it leaves nothing of its own beside a SQLite file.
#[tokio::test]
async fn sigterm_shuts_down_gracefully() {
    let db = TestDatabase::new().await;
    let mut server = start(&db, "all").await;
    terminate(&mut server).await;
    if let Some(file) = db.url.strip_prefix("sqlite://") {
        let workers = std::path::PathBuf::from(format!("{file}-workers"));
        assert!(!workers.exists(), "{} left behind", workers.display());
    }
}

/// A process keeps the host inventory in memory; a change made through another process is
/// seen by its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_changes_reach_every_process() {
    let db = TestDatabase::new().await;
    let a = start(&db, "api").await;
    let b = start(&db, "api").await;
    let (_, host) = call(
        reqwest::Method::POST,
        format!("{}/v1/os-hosts", a.base),
        Some(json!({"name": "h", "gpu": "false"})),
    )
    .await;
    let gpu_lease = json!({
        "name": "g", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "resource_properties": "[\"==\", \"$gpu\", \"true\"]"}],
    });
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{}/v1/leases", b.base),
        Some(gpu_lease.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "no GPU host yet");
    let id = host["host"]["id"].as_str().unwrap();
    let (status, _) = call(
        reqwest::Method::PUT,
        format!("{}/v1/os-hosts/{id}", a.base),
        Some(json!({"gpu": "true"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}/v1/leases", b.base),
        Some(gpu_lease),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the other process sees the new capability: {body}"
    );
}

/// A server killed while it delivers a webhook leaves its claim of the delivery behind; the
/// server started after it finds it gone and delivers again at once (the same delivery),
/// not when the claim runs out (the webhook timeout and half a minute more: 41 s here).
/// The attempt that never reported back counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_takes_over_at_once_what_a_killed_one_had_claimed() {
    take_over_a_delivery(false).await;
}

/// A server stopped by SIGTERM while it delivers a webhook gives the delivery back: the next
/// server sends it at once, and the attempt cut short is not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_stopped_while_it_delivers_gives_the_delivery_back_uncounted() {
    take_over_a_delivery(true).await;
}

async fn take_over_a_delivery(graceful: bool) {
    use std::sync::{Arc, Mutex};
    let db = TestDatabase::new().await;
    // An endpoint that never answers its first request, and answers the others.
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let endpoint = {
        let got = got.clone();
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let got = got.clone();
                async move {
                    let delivery = headers
                        .get("x-blazar-delivery")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let first = {
                        let mut got = got.lock().unwrap();
                        got.push(delivery);
                        got.len() == 1
                    };
                    if first {
                        std::future::pending::<()>().await;
                    }
                    StatusCode::NO_CONTENT
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, endpoint).await;
    });
    let delivered = || got.lock().unwrap().clone();

    let mut first = start(&db, "all").await;
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}/v1/webhooks", first.base),
        Some(json!({"url": hook, "event_types": ["lease.create"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let webhook = body["webhook"]["id"].as_str().unwrap().to_string();
    call(
        reqwest::Method::POST,
        format!("{}/v1/os-hosts", first.base),
        Some(json!({"name": "only"})),
    )
    .await;
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}/v1/leases", first.base),
        Some(lease_body("hooked", "2099-01-01 00:00", "2099-01-02 00:00")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    wait_until(Duration::from_secs(10), || async { delivered().len() == 1 }).await;
    if graceful {
        terminate(&mut first).await;
    } else {
        first.child.start_kill().unwrap();
        first.child.wait().await.unwrap();
    }

    let second = start(&db, "all").await;
    wait_until(Duration::from_secs(10), || async { delivered().len() >= 2 }).await;
    let sent = delivered();
    assert_eq!(sent[1], sent[0], "the same delivery, again");
    let deliveries = format!("{}/v1/webhooks/{webhook}/deliveries", second.base);
    wait_until(Duration::from_secs(10), || async {
        let (_, body) = call(reqwest::Method::GET, deliveries.clone(), None).await;
        body["deliveries"][0]["status"] == "delivered"
    })
    .await;
    let (_, body) = call(reqwest::Method::GET, deliveries, None).await;
    let attempts = if graceful { 1 } else { 2 };
    assert_eq!(body["deliveries"][0]["attempts"], attempts, "{body}");
}

/// On PostgreSQL a worker's presence is a lock held on a connection of its own. When that
/// connection is cut (a database restart, a proxy's timeout), the worker takes its lock
/// again on a new one, so that the others do not go on finding it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_presence_connection_is_cut_holds_its_lock_again() {
    let db = TestDatabase::new().await;
    if !db.is_postgres() {
        return;
    }
    let server = start(&db, "all").await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    // This test's connections share its application name. The presence lock is held, on
    // two keys, by a connection that is idle; the others' advisory locks last for their
    // transactions, so one seen twice in a row, on the same connection, is the presence.
    let holders = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
             AND a.state = 'idle' \
             AND a.application_name = current_setting('application_name') \
             AND l.pid <> pg_backend_pid()",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let started = Instant::now();
    let mut seen = None;
    let first = loop {
        let pids = holders().await;
        match pids[..] {
            [pid] if seen == Some(pid) => break pid,
            [pid] => seen = Some(pid),
            _ => seen = None,
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{pids:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(cut);
    // Taken again, on another connection.
    wait_until(Duration::from_secs(15), || async {
        matches!(holders().await[..], [pid] if pid != first)
    })
    .await;
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .unwrap();
    assert!(health.status().is_success());
}

/// A server that cannot take its port exits before doing any work: it never starts its
/// scheduler, so it never registers as a worker nor claims an event, action or
/// notification another process would then have to take over.
#[tokio::test]
async fn a_server_whose_port_is_taken_exits_before_it_claims_anything() {
    let db = TestDatabase::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_blazar-server"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--database-url")
        .arg(&db.url)
        .env("BLAZAR_LOG", "info")
        .output()
        .await
        .expect("run blazar-server");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("cannot listen"), "{log}");
    assert!(!log.contains("event scheduler started"), "{log}");
    drop(taken);
}
