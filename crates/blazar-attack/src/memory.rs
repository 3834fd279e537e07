//! Memory inflation: many distinct, large property queries, every one refused, must not grow
//! the server past its memory budget.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::JoinSet;

pub struct MemConfig {
    pub base: String,
    pub pid: u32,
    pub queries: usize,
    /// Sizes of the queries, bytes: each size gets `queries` requests.
    pub sizes: Vec<usize>,
    pub concurrency: usize,
    pub seed: u64,
}

#[derive(Debug, Default)]
pub struct MemReport {
    pub rss_before: u64,
    pub rss_peak: u64,
    pub rss_after: u64,
    pub statuses: std::collections::BTreeMap<u16, usize>,
    pub failures: Vec<String>,
}

fn query(rng: &mut StdRng, size: usize) -> String {
    // A valid query whose value nobody has: parsed, evaluated and refused with 409 (or, past
    // the size cap, refused with 400 before parsing).
    // Distinct by a random prefix; the rest is padding, cheap to build.
    let prefix: String = (0..16)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect();
    let padding = "x".repeat(size.saturating_sub(56));
    format!("[\"=\", \"$rack\", \"{prefix}{padding}\"]")
}

pub async fn run(config: MemConfig, log: &dyn Fn(&str)) -> anyhow::Result<MemReport> {
    let client = crate::server::http_client(Duration::from_secs(60))?;
    let mut report = MemReport {
        rss_before: crate::server::rss_of(config.pid)?,
        ..MemReport::default()
    };
    report.rss_peak = report.rss_before;
    // One host with the property, so that the key is known and queries are evaluated.
    let _ = client
        .post(format!("{}/v1/os-hosts", config.base))
        .json(&json!({"name": "mem-host", "rack": "r1"}))
        .send()
        .await?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    for &size in &config.sizes {
        let mut tasks = JoinSet::new();
        for i in 0..config.queries {
            let body = json!({
                "name": format!("mem-{size}-{i}"),
                "start_date": "2033-01-01 10:00",
                "end_date": "2033-01-02 10:00",
                "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                    "hypervisor_properties": "", "resource_properties": query(&mut rng, size)}],
                "events": [],
            });
            let client = client.clone();
            let url = format!("{}/v1/leases", config.base);
            tasks.spawn(async move {
                client
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            });
            while tasks.len() >= config.concurrency {
                if let Some(done) = tasks.join_next().await {
                    record(&mut report, done);
                }
                report.rss_peak = report.rss_peak.max(crate::server::rss_of(config.pid)?);
            }
        }
        while let Some(done) = tasks.join_next().await {
            record(&mut report, done);
        }
        report.rss_peak = report.rss_peak.max(crate::server::rss_of(config.pid)?);
        log(&format!(
            "memory: {} queries of {size} bytes sent, RSS now {} MB, peak {} MB",
            config.queries,
            crate::server::rss_of(config.pid)? / 1_000_000,
            report.rss_peak / 1_000_000
        ));
    }
    report.rss_after = crate::server::rss_of(config.pid)?;
    Ok(report)
}

fn record(report: &mut MemReport, done: Result<reqwest::Result<u16>, tokio::task::JoinError>) {
    match done {
        Ok(Ok(status)) => {
            *report.statuses.entry(status).or_default() += 1;
            if !(400..500).contains(&status) {
                report
                    .failures
                    .push(format!("a query nobody matches was answered {status}"));
            }
        }
        Ok(Err(e)) => report.failures.push(format!("request failed: {e}")),
        Err(e) => report.failures.push(format!("task failed: {e}")),
    }
}
