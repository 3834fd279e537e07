//! Engine benchmarks (issue 6): candidate search and allocation on the in-memory structures,
//! at 100, 1,000 and 10,000 hosts with 0, 10,000 and 100,000 existing allocations spread over
//! a year.
//!
//! * `query_parse`: `PropertyQuery::parse` of a one-condition and of a nested query.
//! * `filter/H`: `PropertyQuery::matches` over `HostRecord::property` for every host.
//! * `busy_in/H/A`: `Ledger::busy_in` for a one-hour window.
//! * `pick/H/A`: `engine::pick` of 1..10 hosts among the matching ones, given the busy set.
//! * `allocate/H/A`: the whole in-memory allocation of one request: filter, busy set, pick,
//!   and `Ledger::insert` of the chosen windows (removed again after each iteration, so the
//!   state stays the same).
//!
//! * `instance_capacity/H/A`: instance capacity over every host: `peak_usage` of the host's
//!   reservations inside the window, then `free_slots` for a 4-vCPU/8-GiB/40-GB instance
//!   (each existing allocation here uses one such slot).
//!
//! Run: `cargo bench -p blazar-core --bench engine` (add `-- filter` to pick benchmarks).

// A benchmark is a test harness: a broken fixture should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::hint::black_box;
use std::time::Duration;

use blazar_core::engine::{Ledger, Usage, free_slots, peak_usage, pick};
use blazar_core::{HostFacts, HostRecord, PropertyQuery, TimeWindow};
use chrono::{DateTime, TimeZone, Utc};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const HOST_COUNTS: &[usize] = &[100, 1_000, 10_000];
const ALLOCATION_COUNTS: &[usize] = &[0, 10_000, 100_000];
const RACK_SIZE: usize = 10;
const GPU_QUERY: &str = r#"["==", "$gpu", "true"]"#;
const NESTED_QUERY: &str =
    r#"["and", ["==", "$gpu", "true"], ["or", [">=", "$vcpus", "16"], ["==", "$rack", "r0001"]]]"#;

/// SplitMix64, for a repeatable spread of windows.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn year_start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2031, 1, 1, 0, 0, 0).unwrap()
}

const YEAR_MINUTES: i64 = 365 * 24 * 60;

/// Hosts as blazar-bench registers them: every fourth has `gpu=true`, racks of ten.
fn hosts(n: usize) -> Vec<HostRecord> {
    (0..n)
        .map(|i| {
            let name = format!("bench-h{i:05}");
            let mut capabilities = BTreeMap::new();
            capabilities.insert("gpu".to_string(), (i % 4 == 0).to_string());
            capabilities.insert("rack".to_string(), format!("r{:04}", i / RACK_SIZE));
            HostRecord {
                id: i as i64 + 1,
                facts: HostFacts {
                    hypervisor_hostname: name.clone(),
                    service_name: name,
                    hypervisor_type: "QEMU".into(),
                    hypervisor_version: 0,
                    vcpus: 16,
                    memory_mb: 65536,
                    local_gb: 500,
                    cpu_info: "{}".into(),
                    availability_zone: "nova".into(),
                },
                reservable: true,
                status: None,
                trust_id: String::new(),
                capabilities,
                created_at: year_start(),
                updated_at: None,
            }
        })
        .collect()
}

/// `allocations` windows spread over the year: each host gets the same number, one per slot
/// of the year, each filling half its slot (+-25 %) at a pseudo-random offset.
fn ledger(hosts: usize, allocations: usize) -> Ledger {
    let mut ledger = Ledger::new();
    if allocations == 0 {
        return ledger;
    }
    let slots = allocations.div_ceil(hosts);
    let slot_minutes = YEAR_MINUTES / slots as i64;
    let mut placed = 0;
    'outer: for slot in 0..slots {
        for host in 0..hosts {
            if placed == allocations {
                break 'outer;
            }
            let h = mix64(((host as u64) << 32) ^ slot as u64);
            let fill = 0.5 * (0.75 + (h % 1000) as f64 / 2000.0);
            let duration = ((slot_minutes as f64 * fill) as i64).max(1);
            let offset = (mix64(h) % (slot_minutes - duration + 1) as u64) as i64;
            let start =
                year_start() + chrono::Duration::minutes(slot as i64 * slot_minutes + offset);
            let window =
                TimeWindow::new(start, start + chrono::Duration::minutes(duration)).unwrap();
            ledger.insert(host as i64 + 1, window).unwrap();
            placed += 1;
        }
    }
    ledger
}

/// A one-hour request window somewhere in the year.
fn window(i: u64) -> TimeWindow {
    let start =
        year_start() + chrono::Duration::minutes((mix64(i) % (YEAR_MINUTES as u64 - 60)) as i64);
    TimeWindow::new(start, start + chrono::Duration::hours(1)).unwrap()
}

fn matching(hosts: &[HostRecord], query: &PropertyQuery) -> Vec<i64> {
    hosts
        .iter()
        .filter(|h| h.reservable)
        .filter(|h| {
            let lookup = |k: &str| h.property(k);
            query.matches(&lookup)
        })
        .map(|h| h.id)
        .collect()
}

fn bench_query(c: &mut Criterion) {
    let mut group = c.benchmark_group("query_parse");
    group.bench_function("one_condition", |b| {
        b.iter(|| PropertyQuery::parse(black_box(GPU_QUERY)).unwrap())
    });
    group.bench_function("nested", |b| {
        b.iter(|| PropertyQuery::parse(black_box(NESTED_QUERY)).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("filter");
    let gpu = PropertyQuery::parse(GPU_QUERY).unwrap().unwrap();
    let nested = PropertyQuery::parse(NESTED_QUERY).unwrap().unwrap();
    for &n in HOST_COUNTS {
        let hosts = hosts(n);
        group.bench_with_input(BenchmarkId::new("gpu", n), &hosts, |b, hosts| {
            b.iter(|| matching(black_box(hosts), &gpu))
        });
        group.bench_with_input(BenchmarkId::new("nested", n), &hosts, |b, hosts| {
            b.iter(|| matching(black_box(hosts), &nested))
        });
    }
    group.finish();
}

fn bench_allocation(c: &mut Criterion) {
    let gpu = PropertyQuery::parse(GPU_QUERY).unwrap().unwrap();
    for &n in HOST_COUNTS {
        let hosts = hosts(n);
        let candidates = matching(&hosts, &gpu);
        for &a in ALLOCATION_COUNTS {
            let mut ledger = ledger(n, a);
            let id = format!("{n}/{a}");

            c.benchmark_group("busy_in").bench_function(&id, |b| {
                let mut i = 0u64;
                b.iter(|| {
                    i += 1;
                    ledger.busy_in(&window(i))
                })
            });

            let busy_sets: Vec<HashSet<i64>> =
                (0..64).map(|i| ledger.busy_in(&window(i))).collect();
            c.benchmark_group("pick").bench_function(&id, |b| {
                let mut i = 0usize;
                b.iter(|| {
                    i += 1;
                    let k = i % 10 + 1;
                    pick(
                        black_box(&candidates),
                        &busy_sets[i % busy_sets.len()],
                        &[],
                        k,
                        k,
                    )
                })
            });

            c.benchmark_group("allocate").bench_function(&id, |b| {
                let mut i = 0u64;
                b.iter(|| {
                    i += 1;
                    let w = window(i);
                    let matching = matching(&hosts, &gpu);
                    let busy = ledger.busy_in(&w);
                    let k = (i % 10 + 1) as usize;
                    if let Ok(chosen) = pick(&matching, &busy, &[], k, k) {
                        for id in &chosen {
                            ledger.insert(*id, w).unwrap();
                        }
                        for id in &chosen {
                            ledger.remove(*id, &w);
                        }
                    }
                })
            });
        }
    }
}

fn bench_instance_capacity(c: &mut Criterion) {
    let slot = Usage {
        vcpus: 4,
        memory_mb: 8192,
        disk_gb: 40,
    };
    let capacity = Usage {
        vcpus: 16,
        memory_mb: 65536,
        disk_gb: 500,
    };
    for &n in HOST_COUNTS {
        for &a in ALLOCATION_COUNTS {
            let ledger = ledger(n, a);
            let mut per_host: Vec<Vec<(TimeWindow, Usage)>> = vec![Vec::new(); n];
            for (id, w) in ledger.windows() {
                per_host[id as usize - 1].push((*w, slot));
            }
            c.benchmark_group("instance_capacity")
                .bench_function(format!("{n}/{a}"), |b| {
                    let mut i = 0u64;
                    b.iter(|| {
                        i += 1;
                        let w = window(i);
                        per_host
                            .iter()
                            .filter(|intervals| {
                                free_slots(capacity, peak_usage(intervals, &w), slot) >= 1
                            })
                            .count()
                    })
                });
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = engine;
    config = config();
    targets = bench_query, bench_allocation, bench_instance_capacity
}
criterion_main!(engine);
