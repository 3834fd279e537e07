//! Store-level benchmark (issue 6): `Service::create_lease` against a SQLite temp database,
//! at 100, 1,000 and 10,000 hosts with 0, 10,000 and 100,000 existing allocations spread over
//! a year (`BLAZAR_BENCH_ALLOCATIONS=0,10000` and `BLAZAR_BENCH_HOSTS=100,1000` choose
//! others; seeding 100,000 allocations takes about a minute per host count).
//!
//! The database is seeded through the Service API (`create_host`, `create_lease`), not HTTP:
//! hosts carry `gpu` (every fourth) and `rack` capabilities and 32 vCPUs, and the existing
//! allocations are whole-rack leases, one per rack and slot of the year. Each measured
//! iteration creates, for one hour somewhere in that year, either a `physical:host` lease of
//! 1..10 `gpu` hosts (`sqlite-host`) or a `virtual:instance` lease of 1..4 instances of 4
//! vCPUs (`sqlite-instance`: capacity counted over the window on every candidate host); it is
//! deleted again outside the timed part, so every iteration sees the same state.
//!
//! `BLAZAR_BENCH_PAST=0.9` measures with history: the seeded leases are written with the clock
//! before the year, then the clock moves to 90 % through it and the scheduler runs every
//! event due by then (the leases of the first 90 % end: TERMINATED, their allocations over),
//! and the measured creates fall in the year's last 10 %. With `BLAZAR_BENCH_ALLOCATIONS=
//! 100000,1000000` that is the "flat over history" comparison of issue 15.
//!
//! `BLAZAR_BENCH_HISTORY=900000` adds history without changing the present: that many more
//! allocations, as dense as the year's, over the years before it (9 years for 900,000 on top
//! of 100,000), all over (TERMINATED) when creates are measured. The year measured is then the
//! same as without it, so `BLAZAR_BENCH_ALLOCATIONS=100000` with and without
//! `BLAZAR_BENCH_HISTORY=900000` is item 3 of issue 15 exactly: a million allocations of which
//! 900,000 are over, against the figures at 100,000. (`BLAZAR_BENCH_PAST` with 100,000 and
//! 1,000,000 compares a year ten times as dense too.)
//!
//! `BLAZAR_BENCH_KEEP_DB=DIR` keeps each seeded database in DIR (`create_lease-<hosts>-<
//! allocations>.db`), to measure a server's start-up and memory on it.
//!
//! `BLAZAR_BENCH_SAMPLES=N` and `BLAZAR_BENCH_SECONDS=S` take N samples over S seconds per
//! benchmark (10 over 5 by default).
//!
//! Run: `cargo bench -p blazar-service --bench create_lease`.

// A benchmark is a test harness: a broken fixture should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use blazar_core::When;
use blazar_db::{Store, StoreOptions};
use blazar_service::{Identity, ManualClock, NewLease, Service, Settings, StandaloneBackend};
use chrono::{DateTime, TimeZone, Utc};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};

const YEAR_MINUTES: i64 = 365 * 24 * 60;

fn counts(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn year_start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2031, 1, 1, 0, 0, 0).unwrap()
}

fn year_end() -> DateTime<Utc> {
    year_start() + chrono::Duration::minutes(YEAR_MINUTES)
}

fn admin() -> Identity {
    Identity {
        user_id: "admin".into(),
        project_id: "admin".into(),
        roles: vec!["admin".into(), "member".into(), "reader".into()],
    }
}

fn reservation(count: usize, key: &str, value: &str) -> Map<String, Value> {
    let Value::Object(map) = json!({
        "resource_type": "physical:host",
        "min": count,
        "max": count,
        "hypervisor_properties": "",
        "resource_properties": json!(["==", format!("${key}"), value]).to_string(),
    }) else {
        unreachable!()
    };
    map
}

fn instances(count: usize) -> Map<String, Value> {
    let Value::Object(map) = json!({
        "resource_type": "virtual:instance",
        "amount": count,
        "vcpus": 4,
        "memory_mb": 8_192,
        "disk_gb": 40,
        "affinity": null,
        "resource_properties": "",
    }) else {
        unreachable!()
    };
    map
}

fn lease(
    name: String,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    r: Map<String, Value>,
) -> NewLease {
    NewLease {
        name,
        start: When::At(start),
        end: When::At(end),
        before_end: None,
        reservations: blazar_core::ReservationRequest::read_all(vec![r]),
        earliest: None,
        user_token: None,
    }
}

struct Fixture {
    service: Service,
    /// Where measured creates may start: from here to the end of the year.
    from: DateTime<Utc>,
    /// The temporary directory of the database, unless it is kept (`BLAZAR_BENCH_KEEP_DB`).
    _dir: Option<tempfile::TempDir>,
}

/// The share of the seeded year already over when creates are measured.
fn past() -> f64 {
    std::env::var("BLAZAR_BENCH_PAST")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|p| (0.0..0.99).contains(p))
        .unwrap_or(0.0)
}

/// Finished allocations seeded before the measured year (`BLAZAR_BENCH_HISTORY`).
fn history() -> usize {
    std::env::var("BLAZAR_BENCH_HISTORY")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Whole-rack leases making `allocations` allocations over `minutes` from `from`, one per rack
/// and slot, each lasting about half its slot.
async fn seed(
    service: &Service,
    hosts: usize,
    rack_size: usize,
    from: DateTime<Utc>,
    minutes: i64,
    allocations: usize,
    prefix: &str,
) {
    let who = admin();
    let racks = hosts / rack_size;
    let leases = allocations.div_ceil(rack_size);
    let slots = leases.div_ceil(racks).max(1);
    let slot_minutes = minutes / slots as i64;
    for n in 0..leases {
        let (rack, round) = (n % racks, n / racks);
        let slot = (rack * 7919 + round) % slots;
        let h = mix64(((rack as u64) << 32) ^ slot as u64);
        let duration =
            ((slot_minutes as f64 * 0.5 * (0.75 + (h % 1000) as f64 / 2000.0)) as i64).max(1);
        let offset = (mix64(h) % (slot_minutes - duration + 1) as u64) as i64;
        let start = from + chrono::Duration::minutes(slot as i64 * slot_minutes + offset);
        let request = lease(
            format!("{prefix}-{n}"),
            start,
            start + chrono::Duration::minutes(duration),
            reservation(rack_size, "rack", &format!("r{rack:04}")),
        );
        service.create_lease(&who, &request).await.unwrap();
    }
}

/// A service over a fresh SQLite file with `hosts` hosts and `allocations` allocations.
async fn fixture(hosts: usize, allocations: usize) -> Fixture {
    // `BLAZAR_BENCH_KEEP_DB=DIR` keeps each seeded database there (measured creates are
    // deleted again, so it is the seeded state), for measuring a server started on it.
    let (dir, path) = match std::env::var("BLAZAR_BENCH_KEEP_DB") {
        Ok(keep) if !keep.is_empty() => {
            let path =
                std::path::Path::new(&keep).join(format!("create_lease-{hosts}-{allocations}.db"));
            let _ = std::fs::remove_file(&path);
            (None, path)
        }
        _ => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("bench.db");
            (Some(dir), path)
        }
    };
    let store = Store::connect(&StoreOptions {
        url: path.display().to_string(),
        max_connections: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    let clock = Arc::new(ManualClock::new(year_start() - chrono::Duration::days(1)));
    let service = Service::new(
        store,
        clock.clone(),
        Settings::default(),
        Arc::new(StandaloneBackend),
    );
    // Racks of 10 hosts, or of 1 % of the hosts: fewer, larger seed leases at scale.
    let rack_size = (hosts / 100).max(10);
    let who = admin();
    for i in 0..hosts {
        let Value::Object(body) = json!({
            "name": format!("bench-h{i:05}"),
            "gpu": if i % 4 == 0 { "true" } else { "false" },
            "vcpus": 32,
            "memory_mb": 131_072,
            "local_gb": 2_000,
            "rack": format!("r{:04}", i / rack_size),
        }) else {
            unreachable!()
        };
        service.create_host(&who, &body).await.unwrap();
    }
    let history = history();
    // As dense as the measured year: as many years as it takes at the year's rate.
    let history_years = if history == 0 {
        0
    } else {
        history.div_ceil(allocations.max(1)).max(1) as i64
    };
    let history_start = year_start() - chrono::Duration::minutes(history_years * YEAR_MINUTES);
    clock.set(history_start - chrono::Duration::days(1));
    seed(
        &service,
        hosts,
        rack_size,
        history_start,
        history_years * YEAR_MINUTES,
        history,
        "old",
    )
    .await;
    seed(
        &service,
        hosts,
        rack_size,
        year_start(),
        YEAR_MINUTES,
        allocations,
        "seed",
    )
    .await;
    let from = year_start() + chrono::Duration::minutes((YEAR_MINUTES as f64 * past()) as i64);
    clock.set(from);
    if past() > 0.0 || history > 0 {
        // Every start and end due by now, as a scheduler running all along would have.
        let t = Instant::now();
        let mut events = 0;
        loop {
            let report = service.tick(from).await.unwrap();
            events += report.executed + report.failed;
            if report.executed + report.failed == 0 {
                break;
            }
        }
        eprintln!(
            "ran {events} events up to {from} in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Fixture {
        service,
        from,
        _dir: dir,
    }
}

fn bench_create_lease(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let who = admin();
    let mut group = c.benchmark_group("create_lease");
    // `BLAZAR_BENCH_SAMPLES` and `BLAZAR_BENCH_SECONDS` measure longer, to compare two runs
    // whose difference is within the default run's noise.
    let knob = |var: &str, default: u64| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    group.sample_size(knob("BLAZAR_BENCH_SAMPLES", 10).max(10) as usize);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(knob("BLAZAR_BENCH_SECONDS", 5)));
    for hosts in counts("BLAZAR_BENCH_HOSTS", &[100, 1_000, 10_000]) {
        for allocations in counts("BLAZAR_BENCH_ALLOCATIONS", &[0, 10_000, 100_000]) {
            let t = Instant::now();
            let fx = runtime.block_on(fixture(hosts, allocations));
            eprintln!(
                "seeded {hosts} hosts / {allocations} allocations in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            // Both requests must be grantable, or the benchmark would time refusals.
            runtime.block_on(async {
                for (n, wanted) in [reservation(1, "gpu", "true"), instances(1)]
                    .into_iter()
                    .enumerate()
                {
                    let start = fx.from + (year_end() - fx.from) / 2;
                    let request = lease(
                        format!("check-{n}"),
                        start,
                        start + chrono::Duration::hours(1),
                        wanted,
                    );
                    let view = fx.service.create_lease(&who, &request).await.unwrap();
                    fx.service.delete_lease(&who, &view.lease.id).await.unwrap();
                }
            });
            let mut i = 0u64;
            for kind in ["host", "instance"] {
                group.bench_function(
                    BenchmarkId::new(
                        format!("sqlite-{kind}"),
                        match history() {
                            0 => format!("{hosts}/{allocations}/past{:.0}", past() * 100.0),
                            h => format!(
                                "{hosts}/{allocations}/past{:.0}/history{h}",
                                past() * 100.0
                            ),
                        },
                    ),
                    |b| {
                        b.iter_custom(|iters| {
                            runtime.block_on(async {
                                let mut timed = Duration::ZERO;
                                for _ in 0..iters {
                                    i += 1;
                                    let open = (year_end() - fx.from).num_minutes() - 60;
                                    let start = fx.from
                                        + chrono::Duration::minutes(
                                            (mix64(i) % open.max(1) as u64) as i64,
                                        );
                                    let wanted = match kind {
                                        "host" => reservation((i % 10 + 1) as usize, "gpu", "true"),
                                        _ => instances((i % 4 + 1) as usize),
                                    };
                                    let request = lease(
                                        format!("bench-{i}"),
                                        start,
                                        start + chrono::Duration::hours(1),
                                        wanted,
                                    );
                                    let t = Instant::now();
                                    let created = fx.service.create_lease(&who, &request).await;
                                    timed += t.elapsed();
                                    if let Ok(view) = created {
                                        fx.service
                                            .delete_lease(&who, &view.lease.id)
                                            .await
                                            .unwrap();
                                    }
                                }
                                timed
                            })
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_create_lease);
criterion_main!(benches);
