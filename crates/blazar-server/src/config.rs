//! Configuration: command-line flags, `BLAZAR_*` environment variables, and a TOML file
//! (`--config`), in that order of precedence, over built-in defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serve the API and run the event scheduler.
    All,
    /// Serve the API only.
    Api,
    /// Run the event scheduler only.
    Manager,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: every request acts as an admin of the default project unless the
    /// X-Project-Id, X-User-Id and X-Roles headers say otherwise. For development only.
    Noauth,
}

const AFTER_HELP: &str = "\
Every option can also be set with its environment variable or in the TOML file given to
--config (keys as the long option names with '_' for '-', e.g. database_url = \"...\").
Precedence: command line, then environment, then file, then default.

Examples:
  blazar-server                                   # API + scheduler on 127.0.0.1:1234, SQLite blazar.db
  blazar-server --database-url postgres://blazar@db/blazar --role api --listen 0.0.0.0:1234
  BLAZAR_ROLE=manager blazar-server --config /etc/blazar/blazar.toml";

#[derive(Debug, Clone, Parser)]
#[command(name = "blazar-server", version, about = "Blazar-compatible reservation service: v1 API and lease event scheduler", after_help = AFTER_HELP)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, env = "BLAZAR_CONFIG")]
    pub config: Option<PathBuf>,
    /// What this process does [default: all].
    #[arg(long, env = "BLAZAR_ROLE", value_enum)]
    pub role: Option<Role>,
    /// Address to serve the API on [default: 127.0.0.1:1234].
    #[arg(long, env = "BLAZAR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Database: a SQLite file path or sqlite:// URL, or a postgres:// URL [default: blazar.db].
    #[arg(long, env = "BLAZAR_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Database connections per process [default: 16].
    #[arg(long, env = "BLAZAR_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// Authentication mode [default: noauth].
    #[arg(long, env = "BLAZAR_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// Project id of noauth requests without X-Project-Id [default: the id derived from "admin"].
    #[arg(long, env = "BLAZAR_NOAUTH_PROJECT_ID")]
    pub noauth_project_id: Option<String>,
    /// User id of noauth requests without X-User-Id [default: the id derived from "admin"].
    #[arg(long, env = "BLAZAR_NOAUTH_USER_ID")]
    pub noauth_user_id: Option<String>,
    /// Seconds between scheduler polls for events written by other processes [default: 1].
    #[arg(long, env = "BLAZAR_POLL_INTERVAL")]
    pub poll_interval: Option<f64>,
    /// Minutes a resource stays unavailable after a lease ends [default: 0].
    #[arg(long, env = "BLAZAR_CLEANING_MINUTES")]
    pub cleaning_minutes: Option<i64>,
    /// Minutes before the end of a lease its before_end_lease event runs; 0 disables [default: 60].
    #[arg(long, env = "BLAZAR_MINUTES_BEFORE_END_LEASE")]
    pub minutes_before_end_lease: Option<i64>,
    /// Log filter, as RUST_LOG [default: info].
    #[arg(long, env = "BLAZAR_LOG")]
    pub log: Option<String>,
}

/// The file's keys: the same names as the long options.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub role: Option<Role>,
    pub listen: Option<SocketAddr>,
    pub database_url: Option<String>,
    pub max_connections: Option<u32>,
    pub auth: Option<AuthMode>,
    pub noauth_project_id: Option<String>,
    pub noauth_user_id: Option<String>,
    pub poll_interval: Option<f64>,
    pub cleaning_minutes: Option<i64>,
    pub minutes_before_end_lease: Option<i64>,
    pub log: Option<String>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    pub listen: SocketAddr,
    pub database_url: String,
    pub max_connections: u32,
    pub auth: AuthMode,
    pub noauth_project_id: String,
    pub noauth_user_id: String,
    pub poll_interval: std::time::Duration,
    pub cleaning_minutes: i64,
    pub minutes_before_end_lease: i64,
    pub log: String,
}

impl Config {
    pub fn resolve(cli: Cli) -> anyhow::Result<Config> {
        let file = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!("cannot read configuration file {}: {e}", path.display())
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| {
                    anyhow::anyhow!("invalid configuration file {}: {e}", path.display())
                })?
            }
            None => FileConfig::default(),
        };
        let poll = cli.poll_interval.or(file.poll_interval).unwrap_or(1.0);
        if !(poll.is_finite() && poll > 0.0 && poll <= 10.0) {
            anyhow::bail!("poll_interval must be between 0 and 10 seconds, got {poll}");
        }
        let minutes_before_end_lease = cli
            .minutes_before_end_lease
            .or(file.minutes_before_end_lease)
            .unwrap_or(60);
        if minutes_before_end_lease < 0 {
            anyhow::bail!(
                "minutes_before_end_lease must be 0 or more, got {minutes_before_end_lease}"
            );
        }
        let cleaning_minutes = cli.cleaning_minutes.or(file.cleaning_minutes).unwrap_or(0);
        if cleaning_minutes < 0 {
            anyhow::bail!("cleaning_minutes must be 0 or more, got {cleaning_minutes}");
        }
        Ok(Config {
            role: cli.role.or(file.role).unwrap_or(Role::All),
            listen: cli
                .listen
                .or(file.listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 1234))),
            database_url: cli
                .database_url
                .or(file.database_url)
                .unwrap_or_else(|| "blazar.db".into()),
            max_connections: cli.max_connections.or(file.max_connections).unwrap_or(16),
            auth: cli.auth.or(file.auth).unwrap_or(AuthMode::Noauth),
            noauth_project_id: cli
                .noauth_project_id
                .or(file.noauth_project_id)
                .unwrap_or_else(|| "admin".into()),
            noauth_user_id: cli
                .noauth_user_id
                .or(file.noauth_user_id)
                .unwrap_or_else(|| "admin".into()),
            poll_interval: std::time::Duration::from_secs_f64(poll),
            cleaning_minutes,
            minutes_before_end_lease,
            log: cli.log.or(file.log).unwrap_or_else(|| "info".into()),
        })
    }
}
