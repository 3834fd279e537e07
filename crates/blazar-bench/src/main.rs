//! `blazar-bench`: seeds a Blazar-compatible server through its v1 API and measures it over
//! HTTP (latency percentiles and throughput per operation and concurrency, at each scale
//! step), then prints tables and writes JSON. `blazar-bench report` renders saved runs, side
//! by side and against the issue-6 targets.

mod client;
mod driver;
mod lockwait;
mod model;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::client::Api;
use crate::driver::{Config, Driver, parse_mix, parse_steps};
use crate::model::{Machine, RunReport};

#[derive(Parser)]
#[command(
    name = "blazar-bench",
    about = "HTTP load driver for Blazar-compatible reservation services (blazar-rs, OpenStack Blazar)",
    after_help = "Examples:\n  \
      blazar-bench run --url http://127.0.0.1:1234 --label 'blazar-rs sqlite' --steps 100:0,1000:10000 --out run.json\n  \
      blazar-bench report run.json --targets\n  \
      blazar-bench report --compare peer.json rs.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seed the server to each scale step and measure every operation there.
    // A later option replaces an earlier one, so that `scripts/bench.sh -- --write-ops N`
    // overrides the script's own settings.
    #[command(args_override_self = true)]
    Run(Box<RunArgs>),
    /// Render saved runs as markdown: their tables, targets, or two runs side by side.
    Report(ReportArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Base URL of the server (loopback only); the driver calls URL/v1/... Several, comma
    /// separated, are replicas on one database: requests go to each in turn.
    #[arg(long, default_value = "http://127.0.0.1:1234")]
    url: String,
    /// Names the server and backend in tables and JSON, e.g. "blazar-rs sqlite".
    #[arg(long, default_value = "server")]
    label: String,
    /// Scale steps HOSTS:ALLOCATIONS, seeded in order (neither may shrink).
    #[arg(long, default_value = "100:0")]
    steps: String,
    /// Concurrency levels of each operation.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// Requests per write phase (create, mixed create, update, delete) at each concurrency.
    #[arg(long, default_value_t = 256)]
    write_ops: usize,
    /// Requests per read phase (lease list, host list, allocation list) at each concurrency.
    #[arg(long, default_value_t = 64)]
    read_ops: usize,
    /// Upper bound on a phase's duration: it stops issuing requests after this many seconds.
    #[arg(long, default_value_t = 15.0)]
    phase_seconds: f64,
    /// Concurrent requests while seeding hosts and leases (and cleaning up).
    #[arg(long, default_value_t = 16)]
    seed_concurrency: usize,
    /// Hosts per rack: each seeded lease takes one whole rack (so allocations = leases x this).
    #[arg(long, default_value_t = 10)]
    rack_size: usize,
    /// Share of its time slot a seeded lease fills (0..1, +-25 % per lease).
    #[arg(long, default_value_t = 0.5)]
    seed_fill: f64,
    /// Year the seeded and measured leases fall in (must be in the future).
    #[arg(long, default_value_t = 2031)]
    year: i32,
    /// Reservations of the mixed lease: COUNT[@KEY=VALUE],... (each min = max = COUNT hosts).
    #[arg(long, default_value = "2@gpu=true,2@gpu=false,1")]
    mix: String,
    /// Leases of the project whose lease list is measured.
    #[arg(long, default_value_t = 100)]
    project_leases: usize,
    /// Leases starting `now` whose start lag is measured at each step (0 to skip).
    #[arg(long, default_value_t = 5)]
    lag_samples: usize,
    /// Poll period of the start-lag measurement, ms.
    #[arg(long, default_value_t = 5)]
    lag_poll_ms: u64,
    /// Give up on a lease that is not ACTIVE after this many seconds.
    #[arg(long, default_value_t = 30.0)]
    lag_timeout: f64,
    /// Leases starting in the same minute whose start is measured at each step (the burst
    /// scenario; 0 to skip). Each holds one host, so at most as many as there are hosts.
    #[arg(long, default_value_t = 0)]
    burst_leases: usize,
    /// The burst's leases start at the first minute boundary at least this many seconds
    /// after the burst begins, so that every create is done by then (a slow server needs
    /// more).
    #[arg(long, default_value_t = 45)]
    burst_lead: u64,
    /// Give up on a burst lease that is not ACTIVE this many seconds after its start time.
    #[arg(long, default_value_t = 120.0)]
    burst_timeout: f64,
    /// PID of the server, to report its resident memory (/proc/PID/status VmRSS).
    #[arg(long)]
    server_pid: Option<u32>,
    /// The server's PostgreSQL database: report how long its sessions waited for locks
    /// during each phase (sampled from pg_stat_activity).
    #[arg(long)]
    lock_wait_db: Option<String>,
    /// Only these operations (comma-separated; names as in the tables, plus start_lag and
    /// burst).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Open a new connection per request (as Blazar's clients do) instead of keep-alive.
    #[arg(long)]
    fresh_connections: bool,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Seed of the pseudo-random windows.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The server already holds the state of the (single) step, seeded by an earlier run with
    /// the same settings (a copy of its database): measure without seeding.
    #[arg(long)]
    already_seeded: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the markdown tables here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Args)]
struct ReportArgs {
    /// JSON files written by `blazar-bench run --out`.
    files: Vec<PathBuf>,
    /// Also evaluate the issue-6 targets (PostgreSQL limits when the label mentions postgres).
    #[arg(long)]
    targets: bool,
    /// Two runs side by side, with ratios: BASE OTHER.
    #[arg(long, num_args = 2, value_names = ["BASE", "OTHER"])]
    compare: Option<Vec<PathBuf>>,
}

fn log(line: &str) {
    eprintln!("[{}] {line}", chrono::Local::now().format("%H:%M:%S"));
}

fn read_run(path: &PathBuf) -> anyhow::Result<RunReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = Config {
        steps: parse_steps(&args.steps)?,
        concurrency: args.concurrency.clone(),
        write_ops: args.write_ops,
        read_ops: args.read_ops,
        phase_seconds: args.phase_seconds,
        seed_concurrency: args.seed_concurrency.max(1),
        rack_size: args.rack_size,
        seed_fill: args.seed_fill.clamp(0.01, 1.0),
        year: args.year,
        mix: parse_mix(&args.mix)?,
        project_leases: args.project_leases,
        lag_samples: args.lag_samples,
        lag_poll_ms: args.lag_poll_ms.max(1),
        lag_timeout_s: args.lag_timeout,
        burst_leases: args.burst_leases,
        burst_lead_s: args.burst_lead,
        burst_timeout_s: args.burst_timeout,
        lock_wait_db: args.lock_wait_db,
        server_pid: args.server_pid,
        only: args.only.clone(),
        seed: args.seed,
        already_seeded: args.already_seeded,
    };
    let settings = serde_json::json!({
        "steps": args.steps,
        "concurrency": args.concurrency,
        "write_ops": args.write_ops,
        "read_ops": args.read_ops,
        "phase_seconds": args.phase_seconds,
        "seed_concurrency": args.seed_concurrency,
        "rack_size": args.rack_size,
        "seed_fill": args.seed_fill,
        "year": args.year,
        "mix": args.mix,
        "project_leases": args.project_leases,
        "lag_samples": args.lag_samples,
        "fresh_connections": args.fresh_connections,
        "seed": args.seed,
    });
    let api = Api::new(
        &args.url,
        args.fresh_connections,
        Duration::from_secs_f64(args.timeout),
    )?;
    let steps = config.steps.clone();
    let mut driver = Driver::new(api, config)?;
    let mut report = RunReport {
        label: args.label.clone(),
        url: args.url.clone(),
        started: chrono::Local::now()
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        finished: String::new(),
        machine: Machine::detect(),
        settings,
        steps: Vec::new(),
    };
    log(&format!(
        "{} at {}: steps {}",
        args.label, args.url, args.steps
    ));
    for step in steps {
        let result = driver.run_step(step, &log).await?;
        report.steps.push(result);
        report.finished = chrono::Local::now()
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string();
        // Written after every step, so a long run that fails later keeps what it measured.
        if let Some(path) = &args.out {
            let json = serde_json::to_string_pretty(&report)?;
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let markdown = report::render_run(&report);
    println!("{markdown}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn report_cmd(args: ReportArgs) -> anyhow::Result<()> {
    let mut out = String::new();
    for path in &args.files {
        let run = read_run(path)?;
        out.push_str(&report::render_run(&run));
        if args.targets {
            let postgres = run.label.to_ascii_lowercase().contains("postgres");
            out.push_str(&report::render_targets(&run, postgres));
        }
    }
    if let Some(pair) = &args.compare
        && let [base, other] = pair.as_slice()
    {
        out.push_str(&report::render_compare(&read_run(base)?, &read_run(other)?));
    }
    print!("{out}");
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Report(args) => report_cmd(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blazar-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
