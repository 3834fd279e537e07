//! The load driver: seeds a server to each scale step through the v1 API, then measures each
//! operation at each concurrency.
//!
//! Seeded state, at a step of H hosts and A allocations:
//! * hosts `bench-hNNNNN`, extra capabilities `gpu` ("true" for every fourth host) and `rack`
//!   (`rNNNN`, `--rack-size` consecutive hosts per rack);
//! * A allocations as leases of one whole rack each (`min = max = rack size`, filter
//!   `$rack == rNNNN`), one per (rack, slot), where the benchmark year is cut into slots so
//!   that every rack gets the same number of leases; a lease fills `--seed-fill` of its slot at
//!   a pseudo-random offset. Racks take slots in a scattered order, so any prefix of the
//!   seeding is spread over the whole year, and scale steps can seed incrementally;
//! * `--project-leases` one-host leases of the project `bench-project` (in the year after, out
//!   of the seeded leases' way), for the project's lease list.
//!
//! Measured leases take random one-hour windows in the same year, so they compete with the
//! seeded allocations; every lease a step creates is deleted before the next step.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{NaiveDate, NaiveDateTime, TimeDelta, Timelike, Utc};
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::{Api, Who};
use crate::lockwait;
use crate::model::{
    BurstStats, LagStats, OpStats, OverlapCheck, SeedReport, StepReport, load_avg, percentile,
    rss_mb,
};

/// The operations the driver measures, in the order it runs them at each step. Reads come
/// first so that they see the seeded state, not the measured leases.
pub const OPERATIONS: &[&str] = &[
    "lease_list_project",
    "lease_list_all",
    "host_list",
    "allocation_list",
    "host_timeline_month",
    "host_timeline_week_query",
    "lease_create",
    "lease_create_mixed",
    "lease_create_instance",
    "lease_update",
    "lease_delete",
    "lease_offers",
    "lease_create_earliest",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub hosts: usize,
    pub allocations: usize,
}

/// One reservation of the mixed lease: `count` hosts (min = max), optionally filtered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixPart {
    pub count: u32,
    pub filter: Option<(String, String)>,
}

/// Parses `2@gpu=true,2@gpu=false,1`.
pub fn parse_mix(text: &str) -> anyhow::Result<Vec<MixPart>> {
    let mut parts = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (count, filter) = match item.split_once('@') {
            Some((count, filter)) => {
                let (key, value) = filter
                    .split_once('=')
                    .with_context(|| format!("mix item {item:?}: expected COUNT@KEY=VALUE"))?;
                (count, Some((key.to_string(), value.to_string())))
            }
            None => (item, None),
        };
        let count: u32 = count
            .parse()
            .with_context(|| format!("mix item {item:?}: bad host count"))?;
        if count == 0 {
            bail!("mix item {item:?}: host count must be at least 1");
        }
        parts.push(MixPart { count, filter });
    }
    if parts.is_empty() {
        bail!("--mix needs at least one reservation");
    }
    Ok(parts)
}

/// Parses `100:0,1000:10000` into steps; both numbers must not decrease (seeding only adds).
pub fn parse_steps(text: &str) -> anyhow::Result<Vec<Step>> {
    let mut steps: Vec<Step> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (h, a) = item
            .split_once(':')
            .with_context(|| format!("step {item:?}: expected HOSTS:ALLOCATIONS"))?;
        let step = Step {
            hosts: h.trim().parse().with_context(|| format!("step {item:?}"))?,
            allocations: a
                .trim()
                .replace('_', "")
                .parse()
                .with_context(|| format!("step {item:?}"))?,
        };
        if let Some(prev) = steps.last()
            && (step.hosts < prev.hosts || step.allocations < prev.allocations)
        {
            bail!(
                "steps must not shrink: {item} follows {}:{}",
                prev.hosts,
                prev.allocations
            );
        }
        steps.push(step);
    }
    if steps.is_empty() {
        bail!("--steps needs at least one HOSTS:ALLOCATIONS pair");
    }
    Ok(steps)
}

#[derive(Debug, Clone)]
pub struct Config {
    pub steps: Vec<Step>,
    pub concurrency: Vec<usize>,
    pub write_ops: usize,
    pub read_ops: usize,
    pub phase_seconds: f64,
    pub seed_concurrency: usize,
    pub rack_size: usize,
    pub seed_fill: f64,
    pub year: i32,
    pub mix: Vec<MixPart>,
    pub project_leases: usize,
    pub lag_samples: usize,
    pub lag_poll_ms: u64,
    pub lag_timeout_s: f64,
    pub burst_leases: usize,
    pub burst_lead_s: u64,
    pub burst_timeout_s: f64,
    pub lock_wait_db: Option<String>,
    pub server_pid: Option<u32>,
    pub only: Option<Vec<String>>,
    pub seed: u64,
    pub already_seeded: bool,
}

/// SplitMix64: a small deterministic generator, so that a run can be repeated exactly.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fmt_minute(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// A lease the driver created and still owns.
#[derive(Debug, Clone)]
struct Created {
    id: String,
    end: NaiveDateTime,
}

/// The outcome of one measured request.
enum Outcome {
    Ok,
    Created(Created),
}

/// What a measured write does to each lease of its batch.
#[derive(Clone, Copy)]
enum Change {
    /// Moves its end an hour later.
    Extend,
    Delete,
}

pub struct Driver {
    api: Api,
    cfg: Config,
    year_start: NaiveDateTime,
    year_minutes: i64,
    /// Host index -> host id, for hosts named `bench-hNNNNN`.
    hosts: BTreeMap<usize, String>,
    /// Seeded leases per rack so far.
    rack_rounds: Vec<usize>,
    /// Slots per rack-year: fixed for the run by its largest step.
    slots: usize,
    seeded_allocations: usize,
    project_allocations: usize,
    project_ready: bool,
}

/// A lease of `amount` instances of 2 vCPU, 2 GB of RAM and 20 GB of disk on any hosts.
fn instance_body(name: &str, start: &str, end: &str, amount: usize) -> Value {
    json!({
        "name": name,
        "start_date": start,
        "end_date": end,
        "events": [],
        "reservations": [{
            "resource_type": "virtual:instance",
            "amount": amount,
            "vcpus": 2,
            "memory_mb": 2048,
            "disk_gb": 20,
            "affinity": null,
            "resource_properties": "",
        }],
    })
}

fn lease_body(
    name: &str,
    start: &str,
    end: &str,
    reservations: Vec<(u32, Option<(&str, &str)>)>,
) -> Value {
    let reservations: Vec<Value> = reservations
        .into_iter()
        .map(|(count, filter)| {
            let properties = match filter {
                Some((key, value)) => json!(["==", format!("${key}"), value]).to_string(),
                None => String::new(),
            };
            json!({
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "hypervisor_properties": "",
                "resource_properties": properties,
            })
        })
        .collect();
    json!({
        "name": name,
        "start_date": start,
        "end_date": end,
        "reservations": reservations,
        "events": [],
        "before_end_date": null,
    })
}

fn lease_id_of(reply: &crate::client::Reply) -> Result<String, String> {
    let body = reply.json().map_err(|e| e.to_string())?;
    body.pointer("/lease/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("no lease id in {}", reply.text()))
}

impl Driver {
    pub fn new(api: Api, cfg: Config) -> anyhow::Result<Driver> {
        let year_start = NaiveDate::from_ymd_opt(cfg.year, 1, 1)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .with_context(|| format!("bad --year {}", cfg.year))?;
        let year_end = NaiveDate::from_ymd_opt(cfg.year + 1, 1, 1)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .with_context(|| format!("bad --year {}", cfg.year))?;
        let year_minutes = (year_end - year_start).num_minutes();
        if cfg.rack_size == 0 {
            bail!("--rack-size must be at least 1");
        }
        let mut slots = 1;
        for step in &cfg.steps {
            let racks = step.hosts / cfg.rack_size;
            if step.allocations > 0 && racks == 0 {
                bail!(
                    "step {}:{} has fewer hosts than one rack ({})",
                    step.hosts,
                    step.allocations,
                    cfg.rack_size
                );
            }
            if racks > 0 {
                slots = slots.max(step.allocations.div_ceil(racks * cfg.rack_size));
            }
        }
        if (slots as i64) * 4 > year_minutes {
            bail!("too many allocations per host ({slots}) to fit a year");
        }
        Ok(Driver {
            api,
            cfg,
            year_start,
            year_minutes,
            hosts: BTreeMap::new(),
            rack_rounds: Vec::new(),
            slots,
            seeded_allocations: 0,
            project_allocations: 0,
            project_ready: false,
        })
    }

    fn wanted(&self, op: &str) -> bool {
        self.cfg
            .only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == op))
    }

    /// A random one-hour window in the benchmark year, minute-aligned.
    fn random_window(&self, salt: u64) -> (NaiveDateTime, NaiveDateTime) {
        let r = mix64(self.cfg.seed ^ salt);
        let start =
            self.year_start + TimeDelta::minutes((r % (self.year_minutes - 60) as u64) as i64);
        (start, start + TimeDelta::hours(1))
    }

    fn host_body(&self, i: usize) -> Value {
        json!({
            "name": format!("bench-h{i:05}"),
            "gpu": if i.is_multiple_of(4) { "true" } else { "false" },
            "rack": format!("r{:04}", i / self.cfg.rack_size),
        })
    }

    pub async fn run_step(&mut self, step: Step, log: &dyn Fn(&str)) -> anyhow::Result<StepReport> {
        let t0 = Instant::now();
        let mut report = StepReport {
            hosts: step.hosts,
            allocations: step.allocations,
            ..StepReport::default()
        };
        self.ensure_hosts(step.hosts, &mut report.seed, log).await?;
        if self.cfg.already_seeded {
            self.seeded_allocations = step.allocations;
            self.project_allocations = self.cfg.project_leases;
            self.project_ready = true;
        }
        self.seed_allocations(step, &mut report.seed, log).await?;
        if !self.project_ready {
            self.create_project_leases(log).await?;
        }
        report.standing_allocations = self.seeded_allocations + self.project_allocations;
        if let Some(pid) = self.cfg.server_pid {
            report.rss_after_seed_mb = rss_mb(pid).map(|(rss, _)| rss);
        }
        report.load_avg_start = load_avg();
        log(&format!(
            "step {}:{}: {} hosts, {} standing allocations, RSS {}",
            step.hosts,
            step.allocations,
            self.hosts.len(),
            report.standing_allocations,
            report
                .rss_after_seed_mb
                .map_or("n/a".into(), |m| format!("{m:.0} MB"))
        ));

        let mut pool: Vec<Created> = Vec::new();
        let mut leftovers: Vec<Created> = Vec::new();
        let concurrency = self.cfg.concurrency.clone();
        let max_c = concurrency.iter().copied().max().unwrap_or(1);
        for op in OPERATIONS {
            if !self.wanted(op) {
                continue;
            }
            for &c in &concurrency {
                let sampler = match &self.cfg.lock_wait_db {
                    Some(url) => match lockwait::Sampler::start(url).await {
                        Ok(sampler) => Some(sampler),
                        Err(e) => {
                            log(&format!("  {e}"));
                            None
                        }
                    },
                    None => None,
                };
                let mut stats = match *op {
                    "lease_list_project" => self.measure_read(op, "/leases", Who::Member, c).await,
                    "lease_list_all" => self.measure_read(op, "/leases", Who::Admin, c).await,
                    "host_list" => self.measure_read(op, "/os-hosts", Who::Admin, c).await,
                    "allocation_list" => {
                        self.measure_read(op, "/os-hosts/allocations", Who::Admin, c)
                            .await
                    }
                    "host_timeline_month" => {
                        let path = self.timeline_path(31, None);
                        self.measure_read(op, &path, Who::Member, c).await
                    }
                    "host_timeline_week_query" => {
                        let path = self.timeline_path(7, Some(self.hundred_hosts_query()));
                        self.measure_read(op, &path, Who::Member, c).await
                    }
                    "lease_create" | "lease_create_mixed" | "lease_create_instance" => {
                        let (stats, created) = self.measure_create(op, c).await;
                        if *op == "lease_create" {
                            pool.extend(created);
                        } else {
                            leftovers.extend(created);
                        }
                        stats
                    }
                    "lease_update" => {
                        let n = self.cfg.write_ops.min(pool.len() / 2);
                        let batch: Vec<Created> = pool.drain(..n).collect();
                        let (stats, updated) =
                            self.measure_change(op, c, batch, Change::Extend).await;
                        pool.extend(updated);
                        stats
                    }
                    "lease_offers" => self.measure_offers(op, c).await,
                    "lease_create_earliest" => {
                        let (stats, created) = self.measure_earliest(op, c).await;
                        leftovers.extend(created);
                        stats
                    }
                    "lease_delete" => {
                        let n = self.cfg.write_ops.min(pool.len());
                        let batch: Vec<Created> = pool.drain(..n).collect();
                        let (stats, kept) = self.measure_change(op, c, batch, Change::Delete).await;
                        leftovers.extend(kept);
                        stats
                    }
                    _ => continue,
                };
                if let Some(sampler) = sampler {
                    match sampler.stop().await {
                        Ok(wait) => {
                            stats.lock_wait_ms = Some(wait.total_ms);
                            stats.most_lock_waiters = Some(wait.most_waiting);
                        }
                        Err(e) => log(&format!("  {e}")),
                    }
                }
                stats.server_peak_rss_mb =
                    self.cfg.server_pid.and_then(rss_mb).map(|(_, peak)| peak);
                log(&format!(
                    "  {op:<20} c={c:<3} ok {:>5} err {:>4}  p50 {:>8.2} ms  p95 {:>8.2} ms  p99 {:>8.2} ms  {:>8.1}/s{}{}",
                    stats.ok,
                    stats.errors,
                    stats.p50_ms,
                    stats.p95_ms,
                    stats.p99_ms,
                    stats.throughput_per_s,
                    stats
                        .lock_wait_ms
                        .map_or(String::new(), |ms| format!("  lock wait {ms:.0} ms")),
                    stats
                        .server_peak_rss_mb
                        .map_or(String::new(), |mb| format!("  peak RSS {mb:.0} MB"))
                ));
                if let Some(e) = stats.error_examples.first() {
                    log(&format!("    first error: {e}"));
                }
                report.ops.push(stats);
                if *op == "lease_create" && c == max_c {
                    let winners = self.race_round(c).await;
                    let mut check = self.overlap_check().await?;
                    check.race_clients = c;
                    check.race_winners = winners.len();
                    leftovers.extend(winners);
                    log(&format!(
                        "  race: {} of {c} clients got the one contested host; overlap check after c={c} creates: {} allocations on {} hosts, {} overlapping pairs",
                        check.race_winners, check.allocations, check.hosts, check.overlapping_pairs
                    ));
                    report.overlap_check = Some(check);
                }
            }
        }
        if self.cfg.lag_samples > 0 && self.wanted("start_lag") {
            let lag = self.measure_start_lag().await;
            log(&format!(
                "  start lag: {} samples, p50 {:.1} ms, max {:.1} ms, {} timeouts",
                lag.samples, lag.p50_ms, lag.max_ms, lag.timeouts
            ));
            report.start_lag = Some(lag);
        }
        if self.cfg.burst_leases > 0 && self.wanted("burst") {
            let (burst, created) = self.measure_burst(self.cfg.burst_leases, log).await;
            log(&format!(
                "  burst: {} of {} leases created; ACTIVE p50 {:.0} ms, last {:.0} ms after their start time, {} timeouts",
                burst.created, burst.leases, burst.p50_ms, burst.last_ms, burst.timeouts
            ));
            leftovers.extend(created);
            report.burst = Some(burst);
        }
        leftovers.append(&mut pool);
        self.cleanup(leftovers, log).await;
        if let Some(pid) = self.cfg.server_pid
            && let Some((rss, peak)) = rss_mb(pid)
        {
            report.rss_end_mb = Some(rss);
            report.peak_rss_mb = Some(peak);
        }
        report.load_avg_end = load_avg();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    async fn ensure_hosts(
        &mut self,
        target: usize,
        seed: &mut SeedReport,
        log: &dyn Fn(&str),
    ) -> anyhow::Result<()> {
        if self.hosts.is_empty() {
            let reply = self.api.get("/os-hosts", Who::Admin).await?;
            if !reply.is_success() {
                bail!("GET /v1/os-hosts: {} {}", reply.status, reply.text());
            }
            let body = reply.json()?;
            for host in body["hosts"].as_array().into_iter().flatten() {
                let name = host["hypervisor_hostname"].as_str().unwrap_or_default();
                if let Some(index) = name.strip_prefix("bench-h").and_then(|n| n.parse().ok()) {
                    let id = match &host["id"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    self.hosts.insert(index, id);
                }
            }
        }
        let missing: Vec<usize> = (0..target)
            .filter(|i| !self.hosts.contains_key(i))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        // The first host alone: it creates the capability properties, which Blazar does not
        // do safely under concurrency (409 "Can't add extracapabilities").
        let split = usize::from(self.hosts.is_empty()).min(missing.len());
        let batches = [
            (&missing[..split], 1),
            (&missing[split..], self.cfg.seed_concurrency),
        ];
        let created: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
        for (batch, concurrency) in batches {
            let bodies: Arc<Vec<(usize, Value)>> =
                Arc::new(batch.iter().map(|&i| (i, self.host_body(i))).collect());
            let api = self.api.clone();
            let sink = created.clone();
            let results = run_concurrently(concurrency, bodies.len(), f64::INFINITY, move |k| {
                let api = api.clone();
                let bodies = bodies.clone();
                let sink = sink.clone();
                async move {
                    let (index, body) = &bodies[k];
                    let reply = api
                        .call_ok(
                            Method::POST,
                            "/os-hosts",
                            Who::Admin,
                            Some(body),
                            "host create: ",
                        )
                        .await?;
                    let body = reply.json().map_err(|e| e.to_string())?;
                    let id = match &body["host"]["id"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    if let Ok(mut v) = sink.lock() {
                        v.push((*index, id));
                    }
                    Ok(Outcome::Ok)
                }
            })
            .await;
            let failures: Vec<String> = results.samples.into_iter().filter_map(|s| s.1).collect();
            if let Some(first) = failures.first() {
                bail!("{} host creates failed, first: {first}", failures.len());
            }
        }
        if let Ok(v) = created.lock() {
            self.hosts.extend(v.iter().cloned());
        }
        seed.hosts_created = missing.len();
        seed.hosts_seconds = t0.elapsed().as_secs_f64();
        log(&format!(
            "seeded {} hosts in {:.1} s ({:.0}/s)",
            missing.len(),
            seed.hosts_seconds,
            missing.len() as f64 / seed.hosts_seconds.max(1e-9)
        ));
        Ok(())
    }

    /// The window of the seeded lease of `rack` in `slot`.
    fn seed_window(&self, rack: usize, slot: usize) -> (NaiveDateTime, NaiveDateTime) {
        let slot_minutes = self.year_minutes / self.slots as i64;
        let h = mix64(self.cfg.seed ^ ((rack as u64) << 32) ^ slot as u64);
        // fill +-25 %, at least one minute, at most the slot
        let jitter = (h % 1000) as f64 / 1000.0 * 0.5 + 0.75;
        let duration =
            ((slot_minutes as f64 * self.cfg.seed_fill * jitter) as i64).clamp(1, slot_minutes);
        let offset = (mix64(h) % (slot_minutes - duration + 1) as u64) as i64;
        let start = self.year_start + TimeDelta::minutes(slot as i64 * slot_minutes + offset);
        (start, start + TimeDelta::minutes(duration))
    }

    async fn seed_allocations(
        &mut self,
        step: Step,
        seed: &mut SeedReport,
        log: &dyn Fn(&str),
    ) -> anyhow::Result<()> {
        if step.allocations <= self.seeded_allocations {
            return Ok(());
        }
        let racks = step.hosts / self.cfg.rack_size;
        self.rack_rounds
            .resize(racks.max(self.rack_rounds.len()), 0);
        let leases_needed =
            (step.allocations - self.seeded_allocations).div_ceil(self.cfg.rack_size);
        // Balanced over racks: always the rack with the fewest seeded leases.
        let mut plan: Vec<(usize, usize)> = Vec::with_capacity(leases_needed);
        while plan.len() < leases_needed {
            let Some(round) = self.rack_rounds[..racks].iter().copied().min() else {
                bail!("no rack to seed");
            };
            if round >= self.slots {
                bail!("every rack's slots are full; raise the slot count");
            }
            for rack in 0..racks {
                if plan.len() == leases_needed {
                    break;
                }
                if self.rack_rounds[rack] == round {
                    let slot = (rack * 7919 + round) % self.slots;
                    plan.push((rack, slot));
                    self.rack_rounds[rack] += 1;
                }
            }
        }
        let bodies: Vec<Value> = plan
            .iter()
            .map(|&(rack, slot)| {
                let (start, end) = self.seed_window(rack, slot);
                let rack_name = format!("r{rack:04}");
                lease_body(
                    &format!("bench-seed-{rack_name}-s{slot}"),
                    &fmt_minute(start),
                    &fmt_minute(end),
                    vec![(
                        self.cfg.rack_size as u32,
                        Some(("rack", rack_name.as_str())),
                    )],
                )
            })
            .collect();
        let t0 = Instant::now();
        let total = bodies.len();
        let failures = self.create_leases(bodies, Who::Admin, "seed lease: ").await;
        let ok = total - failures.len();
        self.seeded_allocations += ok * self.cfg.rack_size;
        seed.leases_created = ok;
        seed.allocations_created = ok * self.cfg.rack_size;
        seed.leases_seconds = t0.elapsed().as_secs_f64();
        seed.leases_per_s = ok as f64 / seed.leases_seconds.max(1e-9);
        seed.failures = failures.len();
        seed.failure_examples = failures.iter().take(3).cloned().collect();
        log(&format!(
            "seeded {ok} leases ({} allocations) in {:.1} s ({:.0} leases/s), {} failures{}",
            seed.allocations_created,
            seed.leases_seconds,
            seed.leases_per_s,
            failures.len(),
            failures
                .first()
                .map_or(String::new(), |f| format!(", first: {f}"))
        ));
        Ok(())
    }

    async fn create_project_leases(&mut self, log: &dyn Fn(&str)) -> anyhow::Result<()> {
        let bodies: Vec<Value> = (0..self.cfg.project_leases)
            .map(|i| {
                // The year after the benchmark year: never in the way of seeded leases.
                let (start, end) = self.random_window(0x5052_4f4a_0000_0000 | i as u64);
                let (start, end) = (start + TimeDelta::days(366), end + TimeDelta::days(366));
                lease_body(
                    &format!("bench-project-{i:04}"),
                    &fmt_minute(start),
                    &fmt_minute(end),
                    vec![(1, Some(("gpu", "true")))],
                )
            })
            .collect();
        let failures = self
            .create_leases(bodies, Who::Member, "project lease: ")
            .await;
        if let Some(first) = failures.first() {
            log(&format!(
                "{} project lease creates failed, first: {first}",
                failures.len()
            ));
        }
        self.project_allocations = self.cfg.project_leases - failures.len();
        self.project_ready = true;
        log(&format!(
            "created {} leases in project {}",
            self.project_allocations,
            crate::client::BENCH_PROJECT
        ));
        Ok(())
    }

    /// Creates the leases `bodies` as `who`, `seed_concurrency` at a time and untimed.
    /// Returns the failures, each after `what`.
    async fn create_leases(&self, bodies: Vec<Value>, who: Who, what: &'static str) -> Vec<String> {
        let bodies = Arc::new(bodies);
        let api = self.api.clone();
        let results = run_concurrently(
            self.cfg.seed_concurrency,
            bodies.len(),
            f64::INFINITY,
            move |k| {
                let api = api.clone();
                let bodies = bodies.clone();
                async move {
                    api.call_ok(Method::POST, "/leases", who, Some(&bodies[k]), what)
                        .await?;
                    Ok(Outcome::Ok)
                }
            },
        )
        .await;
        results.samples.into_iter().filter_map(|s| s.1).collect()
    }

    /// `GET /v1/os-hosts/timeline` over `days` from February 1st of the benchmark year (the
    /// seeded leases cover the whole year), optionally with a property query.
    fn timeline_path(&self, days: i64, query: Option<String>) -> String {
        let start = self.year_start + TimeDelta::days(31);
        let end = start + TimeDelta::days(days);
        let mut pairs = url::form_urlencoded::Serializer::new(String::new());
        pairs
            .append_pair("start", &fmt_minute(start))
            .append_pair("end", &fmt_minute(end));
        if let Some(query) = query {
            pairs.append_pair("query", &query);
        }
        format!("/os-hosts/timeline?{}", pairs.finish())
    }

    /// A property query matching about 100 hosts: the first racks (racks sort by name).
    fn hundred_hosts_query(&self) -> String {
        let racks = (100 / self.cfg.rack_size).max(1);
        json!(["<", "$rack", format!("r{racks:04}")]).to_string()
    }

    async fn measure_read(&self, op: &str, path: &str, who: Who, c: usize) -> OpStats {
        let items = match self.api.get(path, who).await {
            Ok(reply) if reply.is_success() => reply.json().ok().and_then(|v| {
                // A list under its envelope key, or a timeline's resources.
                let inner = v.as_object().and_then(|o| o.values().next())?;
                inner
                    .as_array()
                    .or_else(|| inner.get("resources").and_then(Value::as_array))
                    .map(Vec::len)
            }),
            _ => None,
        };
        let api = self.api.clone();
        let path: Arc<str> = Arc::from(path);
        let results = run_concurrently(c, self.cfg.read_ops, self.cfg.phase_seconds, move |_| {
            let api = api.clone();
            let path = path.clone();
            async move {
                api.read_through(&path, who, "").await?;
                Ok(Outcome::Ok)
            }
        })
        .await;
        let mut stats = results.stats(op, c);
        stats.items = items;
        stats
    }

    async fn measure_create(&self, op: &str, c: usize) -> (OpStats, Vec<Created>) {
        let mixed = op == "lease_create_mixed";
        let salt_base = mix64(c as u64 ^ if mixed { 0xA5A5 } else { 0x5A5A });
        let bodies: Vec<(Value, NaiveDateTime)> = (0..self.cfg.write_ops)
            .map(|i| {
                let (start, end) = self.random_window(salt_base ^ (i as u64) << 20);
                let reservations: Vec<(u32, Option<(&str, &str)>)> = if mixed {
                    self.cfg
                        .mix
                        .iter()
                        .map(|p| {
                            (
                                p.count,
                                p.filter.as_ref().map(|(k, v)| (k.as_str(), v.as_str())),
                            )
                        })
                        .collect()
                } else {
                    vec![((i % 10 + 1) as u32, Some(("gpu", "true")))]
                };
                let name = format!("bench-{op}-c{c}-{i:05}");
                let body = if op == "lease_create_instance" {
                    instance_body(&name, &fmt_minute(start), &fmt_minute(end), i % 4 + 1)
                } else {
                    lease_body(&name, &fmt_minute(start), &fmt_minute(end), reservations)
                };
                (body, end)
            })
            .collect();
        let results = self
            .on_each_body(c, bodies, |api, bodies, i| async move {
                let (body, end) = &bodies[i];
                let reply = api
                    .call_ok(Method::POST, "/leases", Who::Admin, Some(body), "")
                    .await?;
                let id = lease_id_of(&reply)?;
                Ok(Outcome::Created(Created { id, end: *end }))
            })
            .await;
        let created = results.created.clone();
        (results.stats(op, c), created)
    }

    /// The body of an offer search (and, with a name, of an `earliest` create): ten GPU
    /// hosts for four hours within 30 days of a random minute of the benchmark year.
    fn search_body(&self, salt: u64, name: Option<&str>) -> Value {
        let (from, _) = self.random_window(salt);
        let mut body = json!({
            "reservations": [{
                "resource_type": "physical:host", "min": 10, "max": 10,
                "hypervisor_properties": "",
                "resource_properties": json!(["==", "$gpu", "true"]).to_string(),
            }],
            "duration": 240,
            "not_before": fmt_minute(from),
            "not_after": fmt_minute(from + TimeDelta::days(30)),
        });
        if let (Some(name), Some(map)) = (name, body.as_object_mut()) {
            map.insert("name".into(), json!(name));
            map.insert("start_date".into(), json!("earliest"));
            map.insert("events".into(), json!([]));
        }
        body
    }

    /// `POST /v1/leases/offers`: five offers for ten matching hosts.
    async fn measure_offers(&self, op: &str, c: usize) -> OpStats {
        let salt = mix64(c as u64 ^ 0x0FFE);
        let bodies: Vec<Value> = (0..self.cfg.read_ops)
            .map(|i| self.search_body(salt ^ (i as u64) << 20, None))
            .collect();
        let results = self
            .on_each_body(c, bodies, |api, bodies, i| async move {
                let reply = api
                    .call_ok(
                        Method::POST,
                        "/leases/offers",
                        Who::Admin,
                        Some(&bodies[i]),
                        "",
                    )
                    .await?;
                let found = reply
                    .json()
                    .ok()
                    .and_then(|v| v.get("offers").and_then(Value::as_array).map(Vec::len));
                match found {
                    Some(n) if n > 0 => Ok(Outcome::Ok),
                    _ => Err(format!("no offers in {}", reply.text())),
                }
            })
            .await;
        results.stats(op, c)
    }

    /// `POST /v1/leases` with `start_date: "earliest"`: search and book in one request.
    async fn measure_earliest(&self, op: &str, c: usize) -> (OpStats, Vec<Created>) {
        let salt = mix64(c as u64 ^ 0xEA51);
        let bodies: Vec<Value> = (0..self.cfg.write_ops)
            .map(|i| {
                let name = format!("bench-{op}-c{c}-{i:05}");
                self.search_body(salt ^ (i as u64) << 20, Some(&name))
            })
            .collect();
        let results = self
            .on_each_body(c, bodies, |api, bodies, i| async move {
                let reply = api
                    .call_ok(Method::POST, "/leases", Who::Admin, Some(&bodies[i]), "")
                    .await?;
                let id = lease_id_of(&reply)?;
                let end = reply
                    .json()
                    .ok()
                    .and_then(|v| {
                        v.pointer("/lease/end_date")
                            .and_then(Value::as_str)
                            .and_then(parse_wire)
                    })
                    .ok_or_else(|| format!("no end date in {}", reply.text()))?;
                Ok(Outcome::Created(Created { id, end }))
            })
            .await;
        let created = results.created.clone();
        (results.stats(op, c), created)
    }

    /// Changes every lease of `batch` (`c` clients at once, for at most a phase) and answers
    /// the leases still ours afterwards: all of them after extensions (a refused one keeps
    /// its end), those not deleted after deletes.
    async fn measure_change(
        &self,
        op: &str,
        c: usize,
        batch: Vec<Created>,
        change: Change,
    ) -> (OpStats, Vec<Created>) {
        let batch = Arc::new(batch);
        let phase = self.cfg.phase_seconds;
        let results = self
            .on_each_lease(c, phase, &batch, move |api, lease| async move {
                let path = format!("/leases/{}", lease.id);
                match change {
                    Change::Extend => {
                        let end = lease.end + TimeDelta::hours(1);
                        let body = json!({ "end_date": fmt_minute(end) });
                        api.call_ok(Method::PUT, &path, Who::Admin, Some(&body), "")
                            .await?;
                        Ok(Outcome::Created(Created { id: lease.id, end }))
                    }
                    Change::Delete => {
                        api.call_ok(Method::DELETE, &path, Who::Admin, None, "")
                            .await?;
                        Ok(Outcome::Created(lease))
                    }
                }
            })
            .await;
        let changed: HashMap<&str, NaiveDateTime> = results
            .created
            .iter()
            .map(|c| (c.id.as_str(), c.end))
            .collect();
        let ours = batch
            .iter()
            .filter_map(|l| match change {
                Change::Extend => Some(Created {
                    id: l.id.clone(),
                    end: changed.get(l.id.as_str()).copied().unwrap_or(l.end),
                }),
                Change::Delete => (!changed.contains_key(l.id.as_str())).then(|| l.clone()),
            })
            .collect();
        (results.stats(op, c), ours)
    }

    /// `c` clients at once ask for the same host (`bench-h00000`, by hypervisor properties)
    /// for the same hour, in a year no other lease uses; a correct server lets exactly one
    /// win. Returns the winners.
    async fn race_round(&self, c: usize) -> Vec<Created> {
        let start = self.year_start + TimeDelta::days(2 * 366) + TimeDelta::hours(self.race_hour());
        let end = start + TimeDelta::hours(1);
        let mut body = lease_body(
            "bench-race",
            &fmt_minute(start),
            &fmt_minute(end),
            vec![(1, None)],
        );
        body["reservations"][0]["hypervisor_properties"] =
            json!(json!(["==", "$hypervisor_hostname", "bench-h00000"]).to_string());
        let body = Arc::new(body);
        let api = self.api.clone();
        let barrier = Arc::new(tokio::sync::Barrier::new(c.max(1)));
        let results = run_concurrently(c, c, f64::INFINITY, move |_| {
            let api = api.clone();
            let body = body.clone();
            let barrier = barrier.clone();
            async move {
                barrier.wait().await;
                let reply = api
                    .call_ok(Method::POST, "/leases", Who::Admin, Some(&body), "")
                    .await?;
                Ok(Outcome::Created(Created {
                    id: lease_id_of(&reply)?,
                    end,
                }))
            }
        })
        .await;
        results.created
    }

    /// A different hour for each step's race round, so rounds never meet.
    fn race_hour(&self) -> i64 {
        (self.hosts.len() as i64 + self.seeded_allocations as i64 / 10) % (24 * 300)
    }

    /// Reads every allocation and counts pairs of one host whose lease windows overlap.
    async fn overlap_check(&self) -> anyhow::Result<OverlapCheck> {
        let reply = self.api.get("/os-hosts/allocations", Who::Admin).await?;
        if !reply.is_success() {
            bail!(
                "GET /v1/os-hosts/allocations: {} {}",
                reply.status,
                reply.text()
            );
        }
        count_overlaps(&reply.json()?)
    }

    async fn measure_start_lag(&self) -> LagStats {
        let mut lags = Vec::new();
        let mut stats = LagStats::default();
        for i in 0..self.cfg.lag_samples {
            match self.one_start_lag(i).await {
                Ok(Some(ms)) => lags.push(ms),
                Ok(None) => stats.timeouts += 1,
                Err(e) => stats.errors.push(e),
            }
        }
        lags.sort_by(f64::total_cmp);
        stats.samples = lags.len();
        stats.p50_ms = percentile(&lags, 50.0);
        stats.max_ms = lags.last().copied().unwrap_or(0.0);
        stats
    }

    /// Creates a lease starting now; returns the time from the create response until a GET
    /// shows it ACTIVE (`None` on timeout). The lease is deleted afterwards.
    async fn one_start_lag(&self, i: usize) -> Result<Option<f64>, String> {
        let end = Utc::now().naive_utc() + TimeDelta::minutes(62);
        let body = lease_body(
            &format!("bench-start-now-{i}"),
            "now",
            &fmt_minute(end),
            vec![(1, Some(("gpu", "true")))],
        );
        let reply = self
            .api
            .call_ok(Method::POST, "/leases", Who::Admin, Some(&body), "create: ")
            .await?;
        let id = lease_id_of(&reply)?;
        let created = Instant::now();
        let deadline = created + Duration::from_secs_f64(self.cfg.lag_timeout_s);
        let mut lag = None;
        while Instant::now() < deadline {
            if let Ok(reply) = self.api.get(&format!("/leases/{id}"), Who::Admin).await
                && let Ok(v) = reply.json()
                && v.pointer("/lease/status").and_then(Value::as_str) == Some("ACTIVE")
            {
                lag = Some(created.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            tokio::time::sleep(Duration::from_millis(self.cfg.lag_poll_ms)).await;
        }
        let _ = self
            .api
            .call(Method::DELETE, &format!("/leases/{id}"), Who::Admin, None)
            .await;
        Ok(lag)
    }

    /// `n` one-host leases that all start at the same minute boundary (at least the burst
    /// lead ahead, so the creates are done by then), then the lease list read every 100 ms until each
    /// is ACTIVE: how long after the start time the scheduler and the workers get there.
    async fn measure_burst(&self, n: usize, log: &dyn Fn(&str)) -> (BurstStats, Vec<Created>) {
        let mut stats = BurstStats {
            leases: n,
            ..BurstStats::default()
        };
        let now = Utc::now().naive_utc();
        let lead = i64::try_from(self.cfg.burst_lead_s).unwrap_or(i64::MAX / 2);
        let Some(start) = (now + TimeDelta::seconds(lead.saturating_add(59)))
            .with_second(0)
            .and_then(|t| t.with_nanosecond(0))
        else {
            stats.errors.push("no start minute".into());
            return (stats, Vec::new());
        };
        let end = start + TimeDelta::minutes(30);
        log(&format!("  burst: {n} leases starting at {start} UTC"));
        let bodies: Arc<Vec<Value>> = Arc::new(
            (0..n)
                .map(|i| {
                    lease_body(
                        &format!("bench-burst-{i:05}"),
                        &fmt_minute(start),
                        &fmt_minute(end),
                        vec![(1, None)],
                    )
                })
                .collect(),
        );
        let api = self.api.clone();
        let results = run_concurrently(16, n, 120.0, move |i| {
            let api = api.clone();
            let bodies = bodies.clone();
            async move {
                let reply = api
                    .call_ok(Method::POST, "/leases", Who::Admin, Some(&bodies[i]), "")
                    .await?;
                let id = lease_id_of(&reply)?;
                Ok(Outcome::Created(Created { id, end }))
            }
        })
        .await;
        let created = results.created.clone();
        stats.created = created.len();
        stats.create_s = (Utc::now().naive_utc() - now).num_milliseconds() as f64 / 1000.0;
        if Utc::now().naive_utc() > start {
            stats.errors.push(format!(
                "the creates took {:.1} s and ended after the start time: raise --burst-lead",
                stats.create_s
            ));
        }
        let mut waiting: std::collections::HashSet<String> =
            created.iter().map(|c| c.id.clone()).collect();
        let start_at = start.and_utc();
        let mut lags = Vec::new();
        let deadline =
            start_at + TimeDelta::milliseconds((self.cfg.burst_timeout_s * 1000.0) as i64);
        while !waiting.is_empty() && Utc::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if Utc::now() < start_at {
                continue;
            }
            let Ok(reply) = self.api.get("/leases", Who::Admin).await else {
                continue;
            };
            let Ok(body) = reply.json() else {
                continue;
            };
            let seen = (Utc::now() - start_at).num_milliseconds() as f64;
            for lease in body["leases"].as_array().into_iter().flatten() {
                if lease["status"] == "ACTIVE"
                    && let Some(id) = lease["id"].as_str()
                    && waiting.remove(id)
                {
                    lags.push(seen);
                }
            }
        }
        lags.sort_by(f64::total_cmp);
        stats.timeouts = waiting.len();
        stats.p50_ms = percentile(&lags, 50.0);
        stats.last_ms = lags.last().copied().unwrap_or(0.0);
        (stats, created)
    }

    /// Runs `request` on each of `leases`, `c` at a time, for at most `max_seconds`.
    /// Runs `request(api, bodies, i)` for each index of `bodies`, `c` at a time, for at most
    /// a phase.
    async fn on_each_body<T, F, Fut>(&self, c: usize, bodies: Vec<T>, request: F) -> PhaseResults
    where
        T: Send + Sync + 'static,
        F: Fn(Api, Arc<Vec<T>>, usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, String>> + Send + 'static,
    {
        let api = self.api.clone();
        let n = bodies.len();
        let bodies = Arc::new(bodies);
        run_concurrently(c, n, self.cfg.phase_seconds, move |i| {
            request(api.clone(), bodies.clone(), i)
        })
        .await
    }

    async fn on_each_lease<F, Fut>(
        &self,
        c: usize,
        max_seconds: f64,
        leases: &Arc<Vec<Created>>,
        request: F,
    ) -> PhaseResults
    where
        F: Fn(Api, Created) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, String>> + Send + 'static,
    {
        let api = self.api.clone();
        let list = leases.clone();
        run_concurrently(c, leases.len(), max_seconds, move |i| {
            request(api.clone(), list[i].clone())
        })
        .await
    }

    /// Deletes what the step created, untimed, so the next step starts from seeded state.
    async fn cleanup(&self, leases: Vec<Created>, log: &dyn Fn(&str)) {
        let leases = Arc::new(leases);
        let c = self.cfg.seed_concurrency;
        let results = self
            .on_each_lease(c, f64::INFINITY, &leases, |api, lease| async move {
                let path = format!("/leases/{}", lease.id);
                api.call_ok(Method::DELETE, &path, Who::Admin, None, "")
                    .await?;
                Ok(Outcome::Ok)
            })
            .await;
        let failed = results.samples.iter().filter(|s| s.1.is_some()).count();
        log(&format!(
            "  cleanup: deleted {} measured leases in {:.1} s{}",
            leases.len() - failed,
            results.wall_s,
            if failed > 0 {
                format!(", {failed} deletes failed")
            } else {
                String::new()
            }
        ));
    }
}

/// A date as Blazar's API writes it (`2031-01-01T10:00:00.000000`, or with a space).
pub fn parse_wire(text: &str) -> Option<NaiveDateTime> {
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
}

/// Counts overlapping allocation pairs in a `GET /v1/os-hosts/allocations` body.
pub fn count_overlaps(body: &Value) -> anyhow::Result<OverlapCheck> {
    let mut check = OverlapCheck::default();
    let hosts = body["allocations"]
        .as_array()
        .context("no \"allocations\" list in the allocations response")?;
    for host in hosts {
        check.hosts += 1;
        let mut windows: Vec<(NaiveDateTime, NaiveDateTime, &str)> = Vec::new();
        for r in host["reservations"].as_array().into_iter().flatten() {
            let parse = |key: &str| -> anyhow::Result<NaiveDateTime> {
                let text = r[key].as_str().unwrap_or_default();
                parse_wire(text)
                    .with_context(|| format!("bad {key} {text:?} in the allocations response"))
            };
            windows.push((
                parse("start_date")?,
                parse("end_date")?,
                r["id"].as_str().unwrap_or(""),
            ));
        }
        check.allocations += windows.len();
        windows.sort();
        // Each window against every later one that starts before it ends.
        for (i, a) in windows.iter().enumerate() {
            for b in &windows[i + 1..] {
                if b.0 >= a.1 {
                    break;
                }
                check.overlapping_pairs += 1;
                if check.examples.len() < 5 {
                    check.examples.push(format!(
                        "host {}: reservations {} and {} overlap",
                        host["resource_id"], a.2, b.2
                    ));
                }
            }
        }
    }
    Ok(check)
}

/// Results of one concurrent phase.
struct PhaseResults {
    /// Latency and, for a failure, its message.
    samples: Vec<(Duration, Option<String>)>,
    created: Vec<Created>,
    wall_s: f64,
}

impl PhaseResults {
    fn stats(&self, op: &str, c: usize) -> OpStats {
        let mut ok: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.1.is_none())
            .map(|s| s.0.as_secs_f64() * 1000.0)
            .collect();
        ok.sort_by(f64::total_cmp);
        let mut examples: Vec<String> = Vec::new();
        for e in self.samples.iter().filter_map(|s| s.1.as_ref()) {
            if examples.len() < 3 && !examples.contains(e) {
                examples.push(e.clone());
            }
        }
        OpStats {
            op: op.to_string(),
            concurrency: c,
            ok: ok.len(),
            errors: self.samples.len() - ok.len(),
            p50_ms: percentile(&ok, 50.0),
            p95_ms: percentile(&ok, 95.0),
            p99_ms: percentile(&ok, 99.0),
            mean_ms: if ok.is_empty() {
                0.0
            } else {
                ok.iter().sum::<f64>() / ok.len() as f64
            },
            max_ms: ok.last().copied().unwrap_or(0.0),
            throughput_per_s: ok.len() as f64 / self.wall_s.max(1e-9),
            wall_s: self.wall_s,
            items: None,
            error_examples: examples,
            lock_wait_ms: None,
            most_lock_waiters: None,
            server_peak_rss_mb: None,
        }
    }
}

/// Runs `op(0..n)` on `c` workers until all are done or `max_seconds` passed (requests in
/// flight then finish), timing each call.
async fn run_concurrently<F, Fut>(c: usize, n: usize, max_seconds: f64, op: F) -> PhaseResults
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome, String>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = if max_seconds.is_finite() {
        Some(start + Duration::from_secs_f64(max_seconds))
    } else {
        None
    };
    let mut workers = Vec::new();
    for _ in 0..c.max(1) {
        let op = op.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut created = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let t = Instant::now();
                let outcome = op(i).await;
                let elapsed = t.elapsed();
                match outcome {
                    Ok(Outcome::Ok) => samples.push((elapsed, None)),
                    Ok(Outcome::Created(c)) => {
                        samples.push((elapsed, None));
                        created.push(c);
                    }
                    Err(e) => samples.push((elapsed, Some(e))),
                }
            }
            (samples, created)
        }));
    }
    let mut results = PhaseResults {
        samples: Vec::new(),
        created: Vec::new(),
        wall_s: 0.0,
    };
    for worker in workers {
        match worker.await {
            Ok((samples, created)) => {
                results.samples.extend(samples);
                results.created.extend(created);
            }
            Err(e) => results
                .samples
                .push((Duration::ZERO, Some(format!("worker task failed: {e}")))),
        }
    }
    results.wall_s = start.elapsed().as_secs_f64();
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_and_must_grow() {
        assert_eq!(
            parse_steps("100:0, 1000:10_000").unwrap(),
            vec![
                Step {
                    hosts: 100,
                    allocations: 0
                },
                Step {
                    hosts: 1000,
                    allocations: 10_000
                }
            ]
        );
        assert!(parse_steps("1000:0,100:0").is_err());
        assert!(parse_steps("100:10,100:0").is_err());
        assert!(parse_steps("100").is_err());
        assert!(parse_steps("").is_err());
    }

    #[test]
    fn mix_parses() {
        assert_eq!(
            parse_mix("2@gpu=true,1").unwrap(),
            vec![
                MixPart {
                    count: 2,
                    filter: Some(("gpu".into(), "true".into()))
                },
                MixPart {
                    count: 1,
                    filter: None
                }
            ]
        );
        assert!(parse_mix("0").is_err());
        assert!(parse_mix("2@gpu").is_err());
        assert!(parse_mix("").is_err());
    }

    #[test]
    fn overlaps_are_counted_per_host() {
        let body = json!({"allocations": [
            {"resource_id": "1", "reservations": [
                {"id": "a", "lease_id": "l1", "start_date": "2031-01-01T10:00:00.000000", "end_date": "2031-01-01T12:00:00.000000"},
                {"id": "b", "lease_id": "l2", "start_date": "2031-01-01T12:00:00.000000", "end_date": "2031-01-01T13:00:00.000000"},
                {"id": "c", "lease_id": "l3", "start_date": "2031-01-01T11:00:00.000000", "end_date": "2031-01-01T12:30:00.000000"}
            ]},
            {"resource_id": "2", "reservations": [
                {"id": "d", "lease_id": "l1", "start_date": "2031-01-01T10:00:00.000000", "end_date": "2031-01-01T12:00:00.000000"}
            ]},
            {"resource_id": "3", "reservations": []}
        ]});
        let check = count_overlaps(&body).unwrap();
        assert_eq!(
            (check.hosts, check.allocations, check.overlapping_pairs),
            (3, 4, 2)
        );
    }

    fn config(steps: &str) -> Config {
        Config {
            steps: parse_steps(steps).unwrap(),
            concurrency: vec![1],
            write_ops: 1,
            read_ops: 1,
            phase_seconds: 1.0,
            seed_concurrency: 1,
            rack_size: 10,
            seed_fill: 0.5,
            year: 2031,
            mix: parse_mix("1").unwrap(),
            project_leases: 0,
            lag_samples: 0,
            lag_poll_ms: 5,
            lag_timeout_s: 1.0,
            burst_leases: 0,
            burst_lead_s: 45,
            burst_timeout_s: 120.0,
            lock_wait_db: None,
            server_pid: None,
            only: None,
            seed: 7,
            already_seeded: false,
        }
    }

    #[test]
    fn seed_windows_stay_inside_their_slot_and_never_collide() {
        let api = Api::new("http://127.0.0.1:9", false, Duration::from_secs(1)).unwrap();
        let driver = Driver::new(api, config("100:0,100:100000")).unwrap();
        assert_eq!(driver.slots, 1000);
        let slot_minutes = driver.year_minutes / driver.slots as i64;
        for rack in 0..10 {
            let mut windows: Vec<_> = (0..driver.slots)
                .map(|round| {
                    let slot = (rack * 7919 + round) % driver.slots;
                    let (s, e) = driver.seed_window(rack, slot);
                    let lo = driver.year_start + TimeDelta::minutes(slot as i64 * slot_minutes);
                    assert!(s >= lo && e <= lo + TimeDelta::minutes(slot_minutes) && s < e);
                    (s, e)
                })
                .collect();
            windows.sort();
            for pair in windows.windows(2) {
                assert!(pair[0].1 <= pair[1].0, "rack {rack}: {pair:?}");
            }
        }
    }
}
