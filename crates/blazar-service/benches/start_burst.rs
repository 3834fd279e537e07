//! Start burst (issue 13, item 7): N leases starting at the same instant, each on its own
//! host, with a backend whose every action takes a fixed time (the latency of a cloud's API:
//! a host hand-over is several Nova calls of tens of milliseconds each). Measures, per
//! latency and worker count, how long after the instant the last lease is ACTIVE, with the
//! real scheduler and workers over SQLite.
//!
//! Run: `cargo bench -p blazar-service --bench start_burst` (BLAZAR_BENCH_LEASES=200,
//! BLAZAR_BENCH_LATENCY_MS=0,50,200, BLAZAR_BENCH_WORKERS=1,16,64 choose others;
//! BLAZAR_BENCH_DATABASE_URL=postgres://... runs each burst in a fresh schema of that
//! PostgreSQL database instead of a SQLite file).
//! Prints a markdown table.

// A benchmark is a test harness: a broken fixture should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use blazar_core::When;
use blazar_db::{Store, StoreOptions};
use blazar_service::{
    Action, ActionError, Backend, Identity, ManualClock, NewLease, Service, Settings,
    StandaloneBackend,
};
use blazar_testkit::TestDatabase;
use chrono::{TimeZone, Utc};
use serde_json::{Value, json};

/// The standalone backend, slowed to a cloud's pace.
struct Paced(Duration);

#[async_trait]
impl Backend for Paced {
    async fn apply(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<blazar_service::ActionOutput, ActionError> {
        tokio::time::sleep(self.0).await;
        StandaloneBackend.apply(store, action).await
    }
}

fn counts(var: &str, default: &[u64]) -> Vec<u64> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn admin() -> Identity {
    Identity {
        user_id: "admin".into(),
        project_id: "admin".into(),
        roles: vec!["admin".into(), "member".into(), "reader".into()],
    }
}

/// Seconds from the start instant until every lease is ACTIVE.
async fn burst(leases: usize, latency: Duration, workers: usize) -> f64 {
    let database = database_for_burst().await;
    let store = Store::connect(&StoreOptions {
        url: database.url.clone(),
        max_connections: 8,
        ..Default::default()
    })
    .await
    .unwrap();
    let start = Utc.with_ymd_and_hms(2031, 1, 1, 10, 0, 0).unwrap();
    let clock = Arc::new(ManualClock::new(start - chrono::Duration::hours(1)));
    let service = Service::new(
        store,
        clock.clone(),
        Settings {
            action_workers: workers,
            ..Settings::default()
        },
        Arc::new(Paced(latency)),
    );
    let who = admin();
    for i in 0..leases {
        let Value::Object(body) = json!({ "name": format!("burst-h{i:04}") }) else {
            unreachable!()
        };
        service.create_host(&who, &body).await.unwrap();
    }
    for i in 0..leases {
        let Value::Object(r) = json!({"resource_type": "physical:host", "min": 1, "max": 1,
            "hypervisor_properties": "", "resource_properties": ""})
        else {
            unreachable!()
        };
        service
            .create_lease(
                &who,
                &NewLease {
                    name: format!("burst-{i}"),
                    start: When::At(start),
                    end: When::At(start + chrono::Duration::hours(2)),
                    before_end: None,
                    reservations: blazar_core::ReservationRequest::read_all(vec![r]),
                    earliest: None,
                    user_token: None,
                },
            )
            .await
            .unwrap();
    }
    clock.set(start);
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker_service = service.clone();
    let workers_task = tokio::spawn(async move {
        worker_service
            .run_workers(Duration::from_millis(200), async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await
    });
    let t0 = Instant::now();
    service.tick(start).await.unwrap();
    eprintln!("  tick: {:.2} s", t0.elapsed().as_secs_f64());
    loop {
        // A count, not the leases: the watcher must not be what slows the burst down.
        let mut tx = service.store().read().await.unwrap();
        let active = tx
            .lease_status_counts()
            .await
            .unwrap()
            .into_iter()
            .find(|(status, _)| status == "ACTIVE")
            .map_or(0, |(_, n)| usize::try_from(n).unwrap());
        drop(tx);
        if active == leases {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "{active} of {leases} active"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t0.elapsed().as_secs_f64();
    stop_tx.send(true).unwrap();
    workers_task.await.unwrap();
    service.store().close().await;
    drop(database);
    took
}

/// A fresh database for one burst: a temporary SQLite file, or, when
/// `BLAZAR_BENCH_DATABASE_URL` names a PostgreSQL database, a schema of its own in it.
async fn database_for_burst() -> TestDatabase {
    match std::env::var("BLAZAR_BENCH_DATABASE_URL") {
        Ok(base) if !base.is_empty() => TestDatabase::postgres(base).await,
        _ => TestDatabase::sqlite(),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let leases = counts("BLAZAR_BENCH_LEASES", &[200])[0] as usize;
    let latencies = counts("BLAZAR_BENCH_LATENCY_MS", &[0, 50, 200]);
    let workers = counts("BLAZAR_BENCH_WORKERS", &[1, 16, 64]);
    println!(
        "\n{leases} leases starting at one instant, one host each: seconds until the last is ACTIVE\n"
    );
    print!("| latency per action |");
    for w in &workers {
        print!(" {w} worker(s) |");
    }
    println!();
    print!("| --- |");
    for _ in &workers {
        print!(" --- |");
    }
    println!();
    for &ms in &latencies {
        print!("| {ms} ms |");
        for &w in &workers {
            let s = runtime.block_on(burst(leases, Duration::from_millis(ms), w as usize));
            print!(" {s:.2} |");
        }
        println!();
    }
}
