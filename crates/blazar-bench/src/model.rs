//! What a run measured, as written to JSON and read back by `blazar-bench report`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// Free text naming the server and its backend, e.g. "blazar-rs sqlite".
    pub label: String,
    pub url: String,
    pub started: String,
    pub finished: String,
    pub machine: Machine,
    pub settings: serde_json::Value,
    pub steps: Vec<StepReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_mb: u64,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_mb = kb_field(&meminfo, "MemTotal:").map_or(0, |kb| kb / 1024);
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            mem_total_mb,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} cores ({}), {:.1} GiB RAM",
            self.nproc,
            self.cpu_model,
            self.mem_total_mb as f64 / 1024.0
        )
    }
}

/// A `Name:   123 kB` field of a /proc status-like file, in kB.
pub fn kb_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Resident and peak resident memory of a process, in MB.
pub fn rss_mb(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = kb_field(&status, "VmRSS:")? as f64 / 1024.0;
    let peak = kb_field(&status, "VmHWM:").map_or(rss, |kb| kb as f64 / 1024.0);
    Some((rss, peak))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepReport {
    /// Hosts registered at this step.
    pub hosts: usize,
    /// Allocations the seed phase aimed for (the scale step).
    pub allocations: usize,
    /// Allocations standing when the measurements began: seeded plus the project's leases.
    pub standing_allocations: usize,
    pub seed: SeedReport,
    pub rss_after_seed_mb: Option<f64>,
    pub rss_end_mb: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub ops: Vec<OpStats>,
    pub start_lag: Option<LagStats>,
    #[serde(default)]
    pub burst: Option<BurstStats>,
    pub overlap_check: Option<OverlapCheck>,
    pub seconds: f64,
    /// The machine's 1-minute load average when the measurements began and ended: on a
    /// 2-core machine anything well above 2 means something else competed for the CPU.
    #[serde(default)]
    pub load_avg_start: Option<f64>,
    #[serde(default)]
    pub load_avg_end: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SeedReport {
    pub hosts_created: usize,
    pub hosts_seconds: f64,
    pub leases_created: usize,
    pub allocations_created: usize,
    pub leases_seconds: f64,
    /// Lease creates per second while seeding.
    pub leases_per_s: f64,
    pub failures: usize,
    pub failure_examples: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpStats {
    pub op: String,
    pub concurrency: usize,
    /// Successful requests (2xx).
    pub ok: usize,
    /// Refused or failed requests (non-2xx or transport error); not in the percentiles.
    pub errors: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// Successful requests per second of wall time of the phase.
    pub throughput_per_s: f64,
    pub wall_s: f64,
    /// Items in the response of a list operation (checked once per phase).
    pub items: Option<usize>,
    pub error_examples: Vec<String>,
    /// PostgreSQL only (`--lock-wait-db`): session-milliseconds the server's sessions spent
    /// waiting for locks during the phase, and the most seen waiting at once.
    #[serde(default)]
    pub lock_wait_ms: Option<f64>,
    #[serde(default)]
    pub most_lock_waiters: Option<i64>,
    /// The server's peak resident memory so far (VmHWM) when the phase ended, in MB
    /// (`--server-pid`): the phase that raised it is the one whose value grew.
    #[serde(default)]
    pub server_peak_rss_mb: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LagStats {
    pub samples: usize,
    pub p50_ms: f64,
    pub max_ms: f64,
    /// Leases that did not become ACTIVE within the wait limit.
    pub timeouts: usize,
    pub errors: Vec<String>,
}

/// A burst of leases starting in the same minute: how late after their start time they
/// were seen ACTIVE.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BurstStats {
    /// Leases asked for, and created (a create refused for want of a free host is left out).
    pub leases: usize,
    pub created: usize,
    /// How long the creates took, seconds (they must end before the start time).
    #[serde(default)]
    pub create_s: f64,
    /// When each lease was first seen ACTIVE, after the start time: median and the last.
    pub p50_ms: f64,
    pub last_ms: f64,
    /// Leases not ACTIVE within the wait limit.
    pub timeouts: usize,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OverlapCheck {
    pub hosts: usize,
    pub allocations: usize,
    /// Pairs of allocations of one host whose lease windows overlap. Must be 0.
    pub overlapping_pairs: usize,
    pub examples: Vec<String>,
    /// The race round before the check: this many clients at once asked for the same host
    /// and hour; exactly one may win.
    #[serde(default)]
    pub race_clients: usize,
    #[serde(default)]
    pub race_winners: usize,
}

/// The 1-minute load average (/proc/loadavg).
pub fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_table() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        for (p, expected) in [(50.0, 50.0), (95.0, 95.0), (99.0, 99.0), (100.0, 100.0)] {
            assert_eq!(percentile(&v, p), expected, "p{p}");
        }
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), 2.0);
    }

    #[test]
    fn kb_fields() {
        let status = "Name:\tblazar\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(kb_field(status, "VmRSS:"), Some(10240));
        assert_eq!(kb_field(status, "VmHWM:"), Some(20480));
        assert_eq!(kb_field(status, "VmSwap:"), None);
    }
}
