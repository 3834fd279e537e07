//! Kill -9 and restart: every lease whose create was acknowledged (201) is there, whole, after
//! the server is killed mid-burst and started again on the same database. With several
//! replicas (PostgreSQL), creates go to all of them and all are killed together.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::server::{Launch, Server, free_port};

pub struct DurConfig {
    pub launch: Launch,
    pub replicas: usize,
    pub rounds: usize,
    pub writers: usize,
    pub seed: u64,
}

#[derive(Debug, Default)]
pub struct DurReport {
    pub acknowledged: usize,
    pub checked: usize,
    pub failures: Vec<String>,
}

async fn start_all(launch: &Launch, ports: &[u16]) -> anyhow::Result<Vec<Server>> {
    let mut servers = Vec::new();
    for (i, &port) in ports.iter().enumerate() {
        let mut l = launch.clone();
        // Only the first replica runs the scheduler; leases are far in the future anyway.
        if i > 0 {
            l.args.extend(["--role".into(), "api".into()]);
        }
        servers.push(Server::start(&l, port).await?);
    }
    Ok(servers)
}

pub async fn run(config: DurConfig, log: &dyn Fn(&str)) -> anyhow::Result<DurReport> {
    let ports: Vec<u16> = (0..config.replicas.max(1))
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let client = crate::server::http_client(Duration::from_secs(30))?;
    let mut report = DurReport::default();
    let mut rng = StdRng::seed_from_u64(config.seed);
    // Hosts to book: one per lease would be wasteful; each lease gets its own window instead.
    let servers = start_all(&config.launch, &ports).await?;
    let hosts = 4;
    for i in 0..hosts {
        let r = client
            .post(format!("{}/v1/os-hosts", servers[0].base))
            .json(&json!({"name": format!("dur-host-{i}")}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "seeding a host: {}", r.status());
    }
    let acknowledged: Arc<Mutex<Vec<String>>> = Arc::default();
    let next_window = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut servers = Some(servers);
    for round in 0..config.rounds {
        let live = match servers.take() {
            Some(s) => s,
            None => start_all(&config.launch, &ports).await?,
        };
        let bases: Vec<String> = live.iter().map(|s| s.base.clone()).collect();
        let mut writers = JoinSet::new();
        for w in 0..config.writers {
            let client = client.clone();
            let base = bases[w % bases.len()].clone();
            let acknowledged = acknowledged.clone();
            let next_window = next_window.clone();
            writers.spawn(async move {
                loop {
                    // Hour-long windows, one after another, on any of the hosts.
                    let slot = next_window.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let start =
                        chrono::DateTime::from_timestamp(2_000_000_000 + slot as i64 * 7200, 0)
                            .unwrap_or_default();
                    let end = start + chrono::Duration::hours(1);
                    let body = json!({
                        "name": format!("dur-{slot}"),
                        "start_date": start.format("%Y-%m-%d %H:%M").to_string(),
                        "end_date": end.format("%Y-%m-%d %H:%M").to_string(),
                        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                            "hypervisor_properties": "", "resource_properties": ""}],
                        "events": [],
                    });
                    let Ok(r) = client
                        .post(format!("{base}/v1/leases"))
                        .json(&body)
                        .send()
                        .await
                    else {
                        // The server died under us: this create was never acknowledged.
                        return;
                    };
                    if r.status().as_u16() == 201
                        && let Ok(v) = r.json::<Value>().await
                        && let Some(id) = v["lease"]["id"].as_str()
                        && let Ok(mut ack) = acknowledged.lock()
                    {
                        ack.push(id.to_string());
                    }
                }
            });
        }
        let wait = Duration::from_millis(rng.random_range(500..2500));
        tokio::time::sleep(wait).await;
        for server in live {
            server.kill9().await?;
        }
        while writers.join_next().await.is_some() {}
        let count = acknowledged.lock().map(|a| a.len()).unwrap_or(0);
        log(&format!(
            "durability: round {}: killed after {wait:?}, {count} creates acknowledged so far",
            round + 1
        ));
    }
    // Start again and look for every acknowledged lease, whole.
    let live = start_all(&config.launch, &ports).await?;
    let ids = acknowledged.lock().map(|a| a.clone()).unwrap_or_default();
    report.acknowledged = ids.len();
    for (i, id) in ids.iter().enumerate() {
        let base = &live[i % live.len()].base;
        let r = client
            .get(format!("{base}/v1/leases/{id}"))
            .send()
            .await
            .context("reading a lease back")?;
        report.checked += 1;
        if r.status().as_u16() != 200 {
            report
                .failures
                .push(format!("acknowledged lease {id} is gone ({})", r.status()));
            continue;
        }
        let v: Value = r.json().await?;
        let reservations = v["lease"]["reservations"].as_array().map(Vec::len);
        let status = v["lease"]["status"].as_str().unwrap_or("");
        if reservations != Some(1) || status != "PENDING" {
            report.failures.push(format!(
                "acknowledged lease {id} came back partial: {reservations:?} reservations, status {status:?}"
            ));
        }
    }
    // And each holds its host: the allocation survived with the lease.
    let v: Value = client
        .get(format!("{}/v1/os-hosts/allocations", live[0].base))
        .send()
        .await?
        .json()
        .await?;
    let allocated: std::collections::HashSet<&str> = v["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["reservations"].as_array().into_iter().flatten())
        .filter_map(|r| r["lease_id"].as_str())
        .collect();
    for id in &ids {
        if !allocated.contains(id.as_str()) {
            report
                .failures
                .push(format!("acknowledged lease {id} holds no host"));
        }
    }
    for server in live {
        server.kill9().await?;
    }
    Ok(report)
}
