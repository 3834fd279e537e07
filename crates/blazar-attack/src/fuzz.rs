//! A bounded fuzzer of the write endpoints.
//!
//! It seeds a little of every kind of inventory and a few leases, then sends mutations of valid
//! write requests (wrong types, hostile numbers and strings, missing and unknown fields, bad
//! dates, garbage bodies, odd paths) and checks each answer: never a 5xx, never a hang, every
//! 4xx in Blazar's error format, and a refused request leaves the database exactly as it was
//! (a fingerprint of every table before and after). At the end the server must still be up and
//! the database consistent (no orphan rows, allocations inside their leases, no overlaps).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

pub struct FuzzConfig {
    pub base: String,
    pub sqlite_path: std::path::PathBuf,
    pub requests: usize,
    pub seconds: f64,
    pub timeout: Duration,
    pub seed: u64,
}

#[derive(Default, Debug)]
pub struct FuzzReport {
    pub sent: usize,
    pub by_status: BTreeMap<u16, usize>,
    pub failures: Vec<String>,
}

/// Ids of what was seeded, for paths and references in generated requests.
#[derive(Default)]
struct Known {
    hosts: Vec<String>,
    networks: Vec<String>,
    floatingips: Vec<String>,
    devices: Vec<String>,
    flavors: Vec<String>,
    leases: Vec<String>,
}

struct Request {
    method: Method,
    path: String,
    body: Body,
}

enum Body {
    None,
    Json(Value),
    Raw(Vec<u8>, &'static str),
}

const YEAR: i32 = 2032;

fn date(rng: &mut StdRng, day_from: u32) -> String {
    let day = day_from + rng.random_range(0..20);
    let month = 1 + day / 28 % 12;
    format!(
        "{YEAR}-{month:02}-{:02} {:02}:{:02}",
        1 + day % 28,
        rng.random_range(0..24),
        rng.random_range(0..60)
    )
}

fn pick<'a>(rng: &mut StdRng, items: &'a [String], fallback: &'a str) -> &'a str {
    if items.is_empty() {
        fallback
    } else {
        &items[rng.random_range(0..items.len())]
    }
}

/// A valid reservation of one of the six kinds.
fn reservation(rng: &mut StdRng, known: &Known) -> Value {
    match rng.random_range(0..6) {
        0 => json!({"resource_type": "physical:host", "min": 1, "max": rng.random_range(1..3),
            "hypervisor_properties": "", "resource_properties": if rng.random_bool(0.5) { json!("[\"=\", \"$gpu\", \"true\"]") } else { json!("") }}),
        1 => {
            let affinity = ["None", "true", "false"][rng.random_range(0..3)];
            json!({"resource_type": "virtual:instance", "amount": rng.random_range(1..4), "vcpus": rng.random_range(1..4),
            "memory_mb": 1024, "disk_gb": 10, "affinity": affinity,
            "resource_properties": ""})
        }
        2 => {
            json!({"resource_type": "virtual:floatingip", "network_id": "public-net", "amount": 1})
        }
        3 => {
            json!({"resource_type": "network", "network_name": format!("net-{}", rng.random_range(0..1000)),
            "resource_properties": "", "network_properties": ""})
        }
        4 => json!({"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""}),
        _ => {
            json!({"resource_type": "flavor:instance", "flavor_id": pick(rng, &known.flavors, "none"), "amount": 1, "affinity": "None"})
        }
    }
}

fn lease_body(rng: &mut StdRng, known: &Known) -> Value {
    let start = rng.random_range(0..300);
    let reservations: Vec<Value> = (0..rng.random_range(1..3))
        .map(|_| reservation(rng, known))
        .collect();
    json!({
        "name": format!("fuzz-{}", rng.random::<u32>()),
        "start_date": date(rng, start),
        "end_date": date(rng, start + 25),
        "reservations": reservations,
        "events": [],
    })
}

/// A valid (or nearly valid) write request, before mutation.
fn template(rng: &mut StdRng, known: &Known) -> Request {
    let n = rng.random::<u32>();
    let (method, path, body) = match rng.random_range(0..16) {
        0..=4 => (
            Method::POST,
            "/v1/leases".to_string(),
            lease_body(rng, known),
        ),
        5 | 6 => {
            let id = pick(rng, &known.leases, "no-such-lease").to_string();
            let start = rng.random_range(0..300);
            let body = match rng.random_range(0..4) {
                0 => json!({"name": format!("renamed-{n}")}),
                1 => json!({"end_date": date(rng, start + 30)}),
                2 => json!({"start_date": date(rng, start), "end_date": date(rng, start + 30)}),
                _ => json!({"prolong_for": "1d", "reservations": [{"id": "x", "max": 2}]}),
            };
            (Method::PUT, format!("/v1/leases/{id}"), body)
        }
        7 => (
            Method::POST,
            "/v1/os-hosts".into(),
            json!({"name": format!("fz-host-{n}"), "gpu": "false", "vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
        ),
        8 => (
            Method::PUT,
            format!("/v1/os-hosts/{}", pick(rng, &known.hosts, "999")),
            json!({"values": {"gpu": "true", "rack": format!("r{}", n % 4)}}),
        ),
        9 => (
            Method::PATCH,
            "/v1/os-hosts/properties/gpu".into(),
            json!({"private": rng.random_bool(0.5)}),
        ),
        10 => (
            Method::POST,
            "/v1/networks".into(),
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100 + n % 4000}),
        ),
        11 => (
            Method::POST,
            "/v1/floatingips".into(),
            json!({"floating_network_id": "public-net", "floating_ip_address": format!("172.24.{}.{}", n % 250, n / 250 % 250)}),
        ),
        12 => (
            Method::POST,
            "/v1/devices".into(),
            json!({"name": format!("fz-dev-{n}"), "device_type": "gpu", "device_driver": "k8s"}),
        ),
        13 => (
            Method::POST,
            "/v1/flavors".into(),
            json!({"name": format!("fz.flavor.{n}"), "vcpus": 1 + n % 8, "ram": 512, "disk": 5}),
        ),
        14 => (
            Method::PUT,
            format!("/v1/os-hosts/{}/allocation", pick(rng, &known.hosts, "1")),
            json!({"lease_id": pick(rng, &known.leases, "x"), "reservation_id": "x"}),
        ),
        _ => {
            let (kind, items) = match rng.random_range(0..6) {
                0 => ("leases", &known.leases),
                1 => ("os-hosts", &known.hosts),
                2 => ("networks", &known.networks),
                3 => ("floatingips", &known.floatingips),
                4 => ("devices", &known.devices),
                _ => ("flavors", &known.flavors),
            };
            (
                Method::DELETE,
                format!("/v1/{kind}/{}", pick(rng, items, "nothing")),
                Value::Null,
            )
        }
    };
    Request {
        method,
        path,
        body: if body.is_null() {
            Body::None
        } else {
            Body::Json(body)
        },
    }
}

/// A value chosen to break parsers, arithmetic, storage or clients.
fn hostile(rng: &mut StdRng) -> Value {
    match rng.random_range(0..26) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(i64::MAX),
        5 => json!(i64::MIN),
        6 => json!(u64::MAX),
        7 => json!(1e308),
        8 => json!(-0.5),
        9 => json!(""),
        10 => json!("1"),
        11 => json!("-7"),
        12 => json!("x".repeat(70_000)),
        13 => json!("\u{0}\u{202e}\u{feff}é😀"),
        14 => json!("+262142-12-31 23:59"),
        15 => json!("2032-02-30 10:00"),
        16 => json!("now"),
        17 => json!("0000-01-01 00:00"),
        18 => json!("9999-12-31 23:59"),
        19 => json!([]),
        20 => json!({}),
        21 => json!([["=", "$gpu"], {"a": [1, 2]}]),
        22 => json!("[\"=\", \"$secret\", \"x\"]"),
        23 => json!("[\"or\", [\">\", \"$vcpus\", \"1e400\"], [\"=\", \"$a\"]]"),
        24 => {
            // Deep nesting, but under serde_json's recursion limit as a value.
            let mut v = json!(1);
            for _ in 0..100 {
                v = json!([v]);
            }
            v
        }
        _ => json!(rng.random::<i32>()),
    }
}

/// Paths of every object and array inside `v`, so a random leaf can be reached.
fn mutate_value(rng: &mut StdRng, v: &mut Value, depth: usize) {
    match v {
        Value::Object(map) if !map.is_empty() && depth < 6 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = keys[rng.random_range(0..keys.len())].clone();
            match rng.random_range(0..10) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(format!("unknown_{}", rng.random::<u16>()), hostile(rng));
                }
                2 | 3 => {
                    map.insert(key, hostile(rng));
                }
                _ => {
                    if let Some(inner) = map.get_mut(&key) {
                        mutate_value(rng, inner, depth + 1);
                    }
                }
            }
        }
        Value::Array(items) if !items.is_empty() && depth < 6 => {
            let i = rng.random_range(0..items.len());
            match rng.random_range(0..6) {
                0 => {
                    items.remove(i);
                }
                1 => {
                    let copy = items[i].clone();
                    items.push(copy);
                }
                2 => items[i] = hostile(rng),
                _ => mutate_value(rng, &mut items[i], depth + 1),
            }
        }
        _ => *v = hostile(rng),
    }
}

fn mutate(rng: &mut StdRng, mut req: Request) -> Request {
    match rng.random_range(0..20) {
        // Garbage bodies.
        0 => req.body = Body::Raw(b"{\"name\": \"unterminated".to_vec(), "application/json"),
        1 => req.body = Body::Raw("[".repeat(20_000).into_bytes(), "application/json"),
        2 => req.body = Body::Raw(vec![0xff, 0xfe, 0x00, 0x41], "application/json"),
        3 => {
            if let Body::Json(v) = &req.body {
                req.body = Body::Raw(v.to_string().into_bytes(), "text/plain");
            }
        }
        4 => req.body = Body::Json(json!([1, 2, 3])),
        // Odd paths.
        5 => {
            let odd = [
                "%00",
                "..%2F..%2Fetc",
                &"9".repeat(400),
                "-1",
                "1e9",
                "%E2%80%AE",
            ];
            let base = req.path.rsplit_once('/').map(|(b, _)| b).unwrap_or("/v1");
            req.path = format!("{base}/{}", odd[rng.random_range(0..odd.len())]);
        }
        // Usually: one to three mutations of the JSON.
        _ => {
            if let Body::Json(v) = &mut req.body {
                for _ in 0..rng.random_range(1..4) {
                    mutate_value(rng, v, 0);
                }
            }
        }
    }
    req
}

async fn open_db(path: &Path) -> anyhow::Result<SqlitePool> {
    let options = SqliteConnectOptions::new().filename(path).read_only(true);
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .with_context(|| format!("opening {}", path.display()))
}

/// A hash of every row of every table (SQLite's own tables and the migration log aside).
async fn fingerprint(db: &SqlitePool) -> anyhow::Result<String> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         AND name <> '_sqlx_migrations' ORDER BY name",
    )
    .fetch_all(db)
    .await?;
    let mut hash = Sha256::new();
    for table in tables {
        let columns: Vec<String> =
            sqlx::query_scalar(&format!("SELECT name FROM pragma_table_info('{table}')"))
                .fetch_all(db)
                .await?;
        let row_text = columns
            .iter()
            .map(|c| format!("quote(\"{c}\")"))
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT {row_text} FROM \"{table}\" ORDER BY 1"))
                .fetch_all(db)
                .await?;
        hash.update(table.as_bytes());
        for row in rows {
            hash.update(row.as_bytes());
            hash.update(b"\n");
        }
    }
    Ok(format!("{:x}", hash.finalize()))
}

/// Consistency of what the accepted requests left behind.
async fn invariants(db: &SqlitePool) -> anyhow::Result<Vec<String>> {
    let checks = [
        (
            "reservations without their lease",
            "SELECT count(*) FROM reservations r WHERE NOT EXISTS (SELECT 1 FROM leases l WHERE l.id = r.lease_id)",
        ),
        (
            "allocations without their reservation",
            "SELECT count(*) FROM allocations a WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = a.reservation_id)",
        ),
        (
            "allocations outside their lease",
            "SELECT count(*) FROM allocations a JOIN leases l ON l.id = a.lease_id \
             WHERE a.start_at <> l.start_at OR a.end_at <> l.end_at",
        ),
        (
            "overlapping allocations of one exclusive resource",
            "SELECT count(*) FROM allocations a JOIN allocations b ON a.resource_type = b.resource_type \
             AND a.resource_id = b.resource_id AND a.id < b.id \
             WHERE (a.exclusive = 1 OR b.exclusive = 1) \
             AND a.start_at < b.blocked_until AND b.start_at < a.blocked_until",
        ),
        (
            // Shared (instance) allocations: at each one's start, the vCPUs of all those
            // running then fit the host (hosts with their own allocation ratio aside).
            "moments where instance slots exceed a host's vCPUs",
            "SELECT count(*) FROM allocations a JOIN hosts h ON h.id = a.resource_id \
             WHERE a.exclusive = 0 AND NOT EXISTS (SELECT 1 FROM host_capabilities c \
               JOIN resource_properties p ON p.id = c.property_id \
               WHERE c.host_id = h.id AND p.property_name LIKE '%ratio%') \
             AND h.vcpus < (SELECT sum(b.vcpus * b.units) FROM allocations b \
               WHERE b.exclusive = 0 AND b.resource_type = a.resource_type \
               AND b.resource_id = a.resource_id \
               AND b.start_at <= a.start_at AND a.start_at < b.blocked_until)",
        ),
        (
            "leases with dates outside 0001-9999",
            "SELECT count(*) FROM leases WHERE start_at < -62135596800 OR end_at > 253402300799",
        ),
    ];
    let mut broken = Vec::new();
    for (what, sql) in checks {
        let n: i64 = sqlx::query(sql).fetch_one(db).await?.try_get(0)?;
        if n != 0 {
            broken.push(format!("{n} {what}"));
        }
    }
    Ok(broken)
}

async fn send(
    client: &reqwest::Client,
    base: &str,
    req: &Request,
) -> reqwest::Result<(u16, Vec<u8>)> {
    let mut builder = client.request(req.method.clone(), format!("{base}{}", req.path));
    builder = match &req.body {
        Body::None => builder,
        Body::Json(v) => builder
            .header("content-type", "application/json")
            .body(v.to_string()),
        Body::Raw(bytes, content_type) => builder
            .header("content-type", *content_type)
            .body(bytes.clone()),
    };
    let response = builder.send().await?;
    let status = response.status().as_u16();
    let body = response.bytes().await?.to_vec();
    Ok((status, body))
}

/// Blazar's error bodies: `{"error_code": N, "error_message": "...", "error_name": N}` from
/// its API, `{"error": N, "error_message": "..."}` from Flask (unrouted paths, bad bodies).
fn blazar_error_shape(status: u16, body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "not JSON".to_string())?;
    let code = v
        .get("error_code")
        .or_else(|| v.get("error"))
        .and_then(Value::as_u64);
    let message = v.get("error_message").and_then(Value::as_str);
    match (code, message) {
        (Some(c), Some(_)) if c == u64::from(status) => Ok(()),
        _ => Err(format!("not Blazar's error format: {v}")),
    }
}

fn describe(req: &Request) -> String {
    let body = match &req.body {
        Body::None => String::new(),
        Body::Json(v) => {
            let s = v.to_string();
            s.chars().take(300).collect()
        }
        Body::Raw(bytes, ct) => format!("<{} raw bytes, {ct}>", bytes.len()),
    };
    format!(
        "{} {} {body}",
        req.method,
        req.path.chars().take(120).collect::<String>()
    )
}

async fn seed(client: &reqwest::Client, base: &str, known: &mut Known) -> anyhow::Result<()> {
    let post = async |path: &str, body: Value, key: &str| -> anyhow::Result<String> {
        let r = client
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        if !status.is_success() {
            bail!("seeding {path}: {status} {v}");
        }
        let id = &v[key]["id"];
        Ok(id
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| id.to_string()))
    };
    for i in 0..6 {
        let gpu = if i % 2 == 0 { "true" } else { "false" };
        known.hosts.push(
            post(
                "/v1/os-hosts",
                json!({"name": format!("seed-host-{i}"), "gpu": gpu, "vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
                "host",
            )
            .await?,
        );
    }
    for i in 0..3 {
        known.networks.push(
            post(
                "/v1/networks",
                json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 10 + i}),
                "network",
            )
            .await?,
        );
        known.floatingips.push(
            post(
                "/v1/floatingips",
                json!({"floating_network_id": "public-net", "floating_ip_address": format!("172.25.0.{}", 10 + i)}),
                "floatingip",
            )
            .await?,
        );
        known.devices.push(
            post(
                "/v1/devices",
                json!({"name": format!("seed-dev-{i}"), "device_type": "gpu", "device_driver": "k8s"}),
                "device",
            )
            .await?,
        );
    }
    known.flavors.push(
        post(
            "/v1/flavors",
            json!({"name": "seed.small", "vcpus": 1, "ram": 1024, "disk": 10}),
            "flavor",
        )
        .await?,
    );
    Ok(())
}

pub async fn run(config: FuzzConfig, log: &dyn Fn(&str)) -> anyhow::Result<FuzzReport> {
    let client = crate::server::http_client(config.timeout)?;
    let db = open_db(&config.sqlite_path).await?;
    let mut known = Known::default();
    seed(&client, &config.base, &mut known).await?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut report = FuzzReport::default();
    let started = Instant::now();
    let mut before = fingerprint(&db).await?;
    while report.sent < config.requests && started.elapsed().as_secs_f64() < config.seconds {
        let base = template(&mut rng, &known);
        // One request in ten goes unmutated, so that valid writes keep changing the state.
        let req = if rng.random_bool(0.1) {
            base
        } else {
            mutate(&mut rng, base)
        };
        report.sent += 1;
        let (status, body) = match send(&client, &config.base, &req).await {
            Ok(answer) => answer,
            Err(e) if e.is_timeout() => {
                report.failures.push(format!(
                    "no answer within {:?}: {}",
                    config.timeout,
                    describe(&req)
                ));
                break;
            }
            Err(e) => {
                report
                    .failures
                    .push(format!("transport error {e}: {}", describe(&req)));
                break;
            }
        };
        *report.by_status.entry(status).or_default() += 1;
        let after = fingerprint(&db).await?;
        if status >= 500 {
            report.failures.push(format!(
                "{status} {}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(300)
                    .collect::<String>(),
                describe(&req)
            ));
        } else if status >= 400 {
            if let Err(e) = blazar_error_shape(status, &body) {
                report
                    .failures
                    .push(format!("{status} {e}: {}", describe(&req)));
            }
            if after != before {
                report.failures.push(format!(
                    "a refused request ({status}) changed the database: {}",
                    describe(&req)
                ));
            }
        } else if req.method == Method::POST
            && req.path == "/v1/leases"
            && let Ok(v) = serde_json::from_slice::<Value>(&body)
            && let Some(id) = v["lease"]["id"].as_str()
        {
            known.leases.push(id.to_string());
        }
        before = after;
        if report.failures.len() >= 20 {
            break;
        }
        if report.sent % 500 == 0 {
            log(&format!(
                "fuzz: {} requests, {:?}",
                report.sent, report.by_status
            ));
        }
    }
    for broken in invariants(&db).await? {
        report
            .failures
            .push(format!("database inconsistent: {broken}"));
    }
    // The API and the database agree on what exists.
    let listed: Value = client
        .get(format!("{}/v1/leases", config.base))
        .send()
        .await?
        .json()
        .await?;
    let listed = listed["leases"].as_array().map(Vec::len).unwrap_or(0) as i64;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM leases")
        .fetch_one(&db)
        .await?;
    if listed != stored {
        report.failures.push(format!(
            "the API lists {listed} leases, the database holds {stored}"
        ));
    }
    Ok(report)
}
