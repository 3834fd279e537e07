//! `lease-create --wait`, `lease-wait` and relative dates, with the server's clock set to
//! the real time so that `now+2m` means the same to both sides.

use std::time::Duration;

use chrono::{TimeDelta, Utc};

use crate::harness::{ONE_HOST, Server};

/// The real current minute, on the server's clock too. A command run after it may already
/// be in the next minute, so its `now+Nm` can be a minute later than `returned + N`: the
/// tests run the scheduler a minute past the dates they gave (`past`).
fn sync_clock(s: &Server) -> chrono::DateTime<Utc> {
    let now = blazar_client::time::floor_minute(Utc::now());
    s.clock.set(now);
    now
}

/// `now + minutes`, and the minute after: past the date a command gave as `now+{minutes}m`
/// whichever minute it ran in.
fn past(now: chrono::DateTime<Utc>, minutes: i64) -> chrono::DateTime<Utc> {
    now + TimeDelta::minutes(minutes + 1)
}

/// Host compute-1, and lease `later` of it from 5 to 65 minutes after the real current
/// minute (the server's too), which is returned.
async fn later_lease(s: &Server) -> chrono::DateTime<Utc> {
    s.blazar(&["host-create", "compute-1"]).await.ok();
    let now = sync_clock(s);
    s.blazar(&[
        "lease-create",
        "--physical-reservation",
        ONE_HOST,
        "--start-date",
        "now+5m",
        "--end-date",
        "now+65m",
        "later",
    ])
    .await
    .ok();
    now
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_with_wait_returns_once_the_lease_is_active() {
    let s = Server::start().await;
    s.blazar(&["host-create", "compute-1"]).await.ok();
    let now = sync_clock(&s);
    let base = s.base.clone();
    let home = s.home.path().to_path_buf();
    let create = tokio::spawn(async move {
        crate::harness::run_blazar(
            &[
                "lease-create",
                "--physical-reservation",
                ONE_HOST,
                "--start-date",
                "now+2m",
                "--duration",
                "1h",
                "--wait",
                "--poll-interval",
                "100ms",
                "-f",
                "value",
                "-c",
                "name",
                "-c",
                "start_date",
                "-c",
                "end_date",
                "-c",
                "status",
                "soon",
            ],
            &[("BLAZAR_URL", &base)],
            &home,
        )
        .await
    });
    // Wait until the lease exists, then let its start come.
    let mut listed = String::new();
    for _ in 0..100 {
        listed = s
            .blazar(&["lease-list", "-f", "value", "-c", "name"])
            .await
            .stdout;
        if listed.contains("soon") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed.contains("soon"), "the lease was not created");
    s.tick_at(past(now, 2)).await;
    let run = tokio::time::timeout(Duration::from_secs(20), create)
        .await
        .expect("--wait returned")
        .unwrap();
    // `now+2m` is two minutes after the minute the command ran in: this one or the next.
    let printed = run.ok();
    let format = |t: chrono::DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S.000000").to_string();
    let start = [2, 3]
        .into_iter()
        .map(|m| now + TimeDelta::minutes(m))
        .find(|start| printed.contains(&format!("\n{}\n", format(*start))))
        .unwrap_or_else(|| panic!("no start two minutes after {now}: {printed}"));
    let (end, start) = (format(start + TimeDelta::hours(1)), format(start));
    // Printed as it is once the wait is over, not as it was created (PENDING).
    assert_eq!(
        printed,
        format!("Created a new lease:\n{end}\nsoon\n{start}\nACTIVE\n")
    );
    assert_eq!(
        run.stderr, "",
        "no progress output when stderr is not a terminal"
    );
    let status = s
        .blazar(&["lease-show", "-f", "value", "-c", "status", "soon"])
        .await;
    assert_eq!(status.ok(), "ACTIVE\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_uses_the_servers_long_poll() {
    let s = Server::start().await;
    let now = later_lease(&s).await;
    let base = s.base.clone();
    let home = s.home.path().to_path_buf();
    // An hour between polls: only the server's answer to the long poll can end this wait.
    let wait = tokio::spawn(async move {
        crate::harness::run_blazar(
            &["lease-wait", "later", "--poll-interval", "1h"],
            &[("BLAZAR_URL", &base)],
            &home,
        )
        .await
    });
    // Let the client reach the server first (the wait ends at once either way).
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.tick_at(past(now, 5)).await;
    let run = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("lease-wait returned")
        .unwrap();
    assert_eq!(run.code, 0, "{}", run.transcript());
}

/// A server without long polls (as Blazar): it answers `?wait_for=` at once and without
/// `Blazar-Wait-For`; the lease is ACTIVE from its third read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_falls_back_to_polling_a_server_without_long_polls() {
    use std::sync::{Arc, Mutex};
    let reads: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = reads.clone();
    let app = axum::Router::new().route(
        "/v1/leases/{id}",
        axum::routing::get(move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                let mut reads = seen.lock().unwrap();
                reads.push(uri.to_string());
                let status = if reads.len() >= 3 {
                    "ACTIVE"
                } else {
                    "PENDING"
                };
                axum::Json(serde_json::json!({"lease": {"id": "x", "status": status}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let home = tempfile::tempdir().unwrap();
    let id = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
    let run = crate::harness::run_blazar(
        &[
            "lease-wait",
            id,
            "--poll-interval",
            "50ms",
            "--timeout",
            "20s",
        ],
        &[("BLAZAR_URL", &base)],
        home.path(),
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.transcript());
    let reads = reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert!(reads[0].contains("wait_for=ACTIVE"), "{reads:?}");
    assert!(
        reads[1..].iter().all(|r| r == &format!("/v1/leases/{id}")),
        "{reads:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_wait_exit_codes() {
    let s = Server::start().await;
    let now = later_lease(&s).await;

    // Not started yet: a short timeout ends with 3 and says where the lease is.
    let timed_out = s
        .blazar(&[
            "lease-wait",
            "later",
            "--timeout",
            "300ms",
            "--poll-interval",
            "100ms",
        ])
        .await;
    assert_eq!(timed_out.code, 3, "{}", timed_out.transcript());
    // Five minutes after the server's minute, less the seconds the real clock has moved on
    // since (a minute boundary may pass while the test runs).
    let prefix = "ERROR: lease later is still PENDING after 300ms (it starts in ";
    assert!(
        timed_out.stderr.starts_with(prefix)
            && ["3m", "4m", "5m"]
                .iter()
                .any(|m| timed_out.stderr[prefix.len()..].starts_with(m)),
        "{}",
        timed_out.stderr
    );
    assert!(
        timed_out.stderr.contains("blazar lease-wait"),
        "{}",
        timed_out.stderr
    );

    // Once it starts, waiting for ACTIVE succeeds at once, and waiting for PENDING can
    // never succeed.
    s.tick_at(past(now, 5)).await;
    let active = s
        .blazar(&["lease-wait", "later", "--status", "active"])
        .await;
    assert_eq!(active.code, 0, "{}", active.transcript());
    let pending = s
        .blazar(&["lease-wait", "later", "--status", "PENDING"])
        .await;
    assert_eq!(pending.code, 4, "{}", pending.transcript());
    assert_eq!(
        pending.stderr,
        "ERROR: lease later is ACTIVE and cannot become PENDING any more\n"
    );

    s.tick_at(past(now, 65)).await;
    let ended = s
        .blazar(&["lease-wait", "later", "--status", "TERMINATED"])
        .await;
    assert_eq!(ended.code, 0, "{}", ended.transcript());

    let usage = s.blazar(&["lease-wait", "later", "--status", "SOON"]).await;
    assert_eq!(usage.code, 2, "{}", usage.transcript());
    let missing = s.blazar(&["lease-wait", "nope"]).await;
    assert_eq!(missing.code, 1, "{}", missing.transcript());
}
