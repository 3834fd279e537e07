//! `blazar-attack`: the adversarial checks, each against real `blazar-server` processes it
//! starts itself (the release build in its default configuration, unless told otherwise).
//!
//! * `fuzz`: mutated write requests; no 5xx, no hang, Blazar's error format, no partial write.
//! * `connections`: more idle and slowloris connections than the server may hold, under a
//!   1,024 open-file limit, while another client is served.
//! * `memory`: distinct large property queries, all refused, under the memory budget.
//! * `durability`: kill -9 mid-burst and restart; every acknowledged lease is there, whole.

mod connections;
mod durability;
mod fuzz;
mod memory;
mod server;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};

use crate::server::{Launch, Server, free_port, sqlite_url};

#[derive(Parser)]
#[command(
    name = "blazar-attack",
    about = "Adversarial checks against real blazar-server processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// The server binary to start.
    #[arg(long, default_value = "target/release/blazar-server")]
    server: PathBuf,
    /// Directory for databases and server logs (must exist).
    #[arg(long)]
    workdir: PathBuf,
    /// Seed of the pseudo-random choices (a failure names it, to replay).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Options passed to the server after the listen address and database.
    #[arg(long, allow_hyphen_values = true, num_args = 1..)]
    server_args: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Fuzz the write endpoints; check answers and the database after each request.
    Fuzz {
        #[command(flatten)]
        common: Common,
        /// Requests to send at most.
        #[arg(long, default_value_t = 3000)]
        requests: usize,
        /// Stop sending after this many seconds.
        #[arg(long, default_value_t = 120.0)]
        seconds: f64,
        /// A request not answered within this many seconds is a hang.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
    /// Hold idle and slowloris connections past the server's bound; others must be served.
    Connections {
        #[command(flatten)]
        common: Common,
        /// The server's open-file limit (soft and hard).
        #[arg(long, default_value_t = 1024)]
        nofile: u64,
        #[arg(long, default_value_t = 550)]
        idle: usize,
        #[arg(long, default_value_t = 550)]
        slow: usize,
        /// Seconds to hold them.
        #[arg(long, default_value_t = 45)]
        hold: u64,
        /// A probe not answered within this many seconds fails.
        #[arg(long, default_value_t = 3.0)]
        probe_timeout: f64,
    },
    /// Send distinct large property queries, all refused; resident memory must stay bounded.
    Memory {
        #[command(flatten)]
        common: Common,
        /// Queries of each size.
        #[arg(long, default_value_t = 1024)]
        queries: usize,
        /// Query sizes in bytes.
        #[arg(long, value_delimiter = ',', default_value = "819200,61440")]
        sizes: Vec<usize>,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Resident memory the server must stay under, MB.
        #[arg(long, default_value_t = 200)]
        limit_mb: u64,
    },
    /// Kill -9 the server(s) during bursts of creates, restart, find every acknowledged lease.
    Durability {
        #[command(flatten)]
        common: Common,
        /// Database shared by the replicas (default: a SQLite file in the workdir).
        #[arg(long)]
        database_url: Option<String>,
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Concurrent writers (spread over the replicas).
        #[arg(long, default_value_t = 8)]
        writers: usize,
    },
}

fn log(line: &str) {
    eprintln!("[{}] {line}", chrono::Local::now().format("%H:%M:%S"));
}

fn launch(common: &Common, database_url: String, nofile: Option<u64>, name: &str) -> Launch {
    Launch {
        binary: common.server.clone(),
        database_url,
        args: common.server_args.clone(),
        nofile,
        log: common.workdir.join(format!("{name}-server.log")),
    }
}

/// Prints the failures, or nothing, and turns them into the exit status.
fn verdict(what: &str, failures: &[String]) -> anyhow::Result<()> {
    if failures.is_empty() {
        println!("{what}: passed");
        return Ok(());
    }
    for f in failures {
        println!("FAIL {what}: {f}");
    }
    bail!("{what}: {} failure(s)", failures.len())
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Fuzz {
            common,
            requests,
            seconds,
            timeout,
        } => {
            let path = common.workdir.join("fuzz.db");
            let mut l = launch(
                &common,
                sqlite_url(&common.workdir, "fuzz.db"),
                None,
                "fuzz",
            );
            // Only requests change the database: no events run behind the fingerprint.
            l.args.extend(["--role".into(), "api".into()]);
            let mut server = Server::start(&l, free_port()?).await?;
            let report = fuzz::run(
                fuzz::FuzzConfig {
                    base: server.base.clone(),
                    sqlite_path: path,
                    requests,
                    seconds,
                    timeout: Duration::from_secs_f64(timeout),
                    seed: common.seed,
                },
                &log,
            )
            .await?;
            let mut failures = report.failures;
            if !server.alive() {
                failures.push("the server exited".into());
            }
            println!(
                "fuzz: {} requests (seed {}), statuses {:?}",
                report.sent, common.seed, report.by_status
            );
            server.kill9().await?;
            verdict("fuzz", &failures)
        }
        Command::Connections {
            common,
            nofile,
            idle,
            slow,
            hold,
            probe_timeout,
        } => {
            let l = launch(
                &common,
                sqlite_url(&common.workdir, "connections.db"),
                Some(nofile),
                "connections",
            );
            let mut server = Server::start(&l, free_port()?).await?;
            let addr = server.base.trim_start_matches("http://").to_string();
            let report = connections::run(
                connections::ConnConfig {
                    addr,
                    idle,
                    slow,
                    hold: Duration::from_secs(hold),
                    probe_timeout: Duration::from_secs_f64(probe_timeout),
                },
                &log,
            )
            .await?;
            println!(
                "connections: {} probes, slowest {:?}, {} held connections closed by the server, {} refused",
                report.probes, report.slowest_probe, report.closed_by_server, report.refused
            );
            let mut failures = report.probe_failures;
            if report.closed_by_server == 0 {
                failures.push("the server never closed an idle or slow connection".into());
            }
            if !server.alive() {
                failures.push("the server exited".into());
            }
            server.kill9().await?;
            verdict("connections", &failures)
        }
        Command::Memory {
            common,
            queries,
            sizes,
            concurrency,
            limit_mb,
        } => {
            let l = launch(
                &common,
                sqlite_url(&common.workdir, "memory.db"),
                None,
                "memory",
            );
            let mut server = Server::start(&l, free_port()?).await?;
            let pid = server
                .pid()
                .ok_or_else(|| anyhow::anyhow!("no server pid"))?;
            let report = memory::run(
                memory::MemConfig {
                    base: server.base.clone(),
                    pid,
                    queries,
                    sizes,
                    concurrency: concurrency.max(1),
                    seed: common.seed,
                },
                &log,
            )
            .await?;
            println!(
                "memory: RSS {} MB before, {} MB at peak, {} MB after; statuses {:?}",
                report.rss_before / 1_000_000,
                report.rss_peak / 1_000_000,
                report.rss_after / 1_000_000,
                report.statuses
            );
            let mut failures = report.failures;
            failures.truncate(10);
            if report.rss_peak > limit_mb * 1_000_000 {
                failures.push(format!(
                    "resident memory reached {} MB (limit {limit_mb} MB)",
                    report.rss_peak / 1_000_000
                ));
            }
            if !server.alive() {
                failures.push("the server exited".into());
            }
            server.kill9().await?;
            verdict("memory", &failures)
        }
        Command::Durability {
            common,
            database_url,
            replicas,
            rounds,
            writers,
        } => {
            let url = database_url.unwrap_or_else(|| sqlite_url(&common.workdir, "durability.db"));
            let report = durability::run(
                durability::DurConfig {
                    launch: launch(&common, url, None, "durability"),
                    replicas,
                    rounds,
                    writers,
                    seed: common.seed,
                },
                &log,
            )
            .await?;
            println!(
                "durability: {} creates acknowledged over {rounds} kills, {} read back",
                report.acknowledged, report.checked
            );
            let mut failures = report.failures;
            failures.truncate(20);
            if report.acknowledged == 0 {
                failures.push("no create was acknowledged: nothing was tested".into());
            }
            verdict("durability", &failures)
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blazar-attack: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
