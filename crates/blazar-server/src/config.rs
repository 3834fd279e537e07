//! Configuration: command-line flags, `BLAZAR_*` environment variables, and a TOML file
//! (`--config`), in that order of precedence, over built-in defaults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
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
    /// X-Auth-Token validated against Keystone v3 (an OpenStack cloud).
    Keystone,
    /// X-Auth-Token checked against tokens made by `blazar-server token create` (no Keystone).
    Tokens,
}

pub use crate::secret::Secret;

const AFTER_HELP: &str = "\
Every option can also be set with its environment variable or in the TOML file given to
--config (keys as the long option names with '_' for '-', e.g. database_url = \"...\").
Precedence: command line, then environment, then file, then default.

Examples:
  blazar-server                                   # API + scheduler on 127.0.0.1:1234, SQLite blazar.db
  blazar-server --database-url postgres://blazar@db/blazar --role api --listen 0.0.0.0:1234
  BLAZAR_ROLE=manager blazar-server --config /etc/blazar/blazar.toml
  BLAZAR_KEYSTONE_PASSWORD=... blazar-server --auth keystone --keystone-url http://keystone:5000/v3 \\
      --keystone-username blazar --listen 0.0.0.0:1234
  blazar-server --auth tokens token create --project demo --role member
  blazar-server --policy-file /etc/blazar/policy.yaml policy show";

// `Default` is the command line without any flag nor environment: what the test kit resolves
// its configuration from.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "blazar-server", version, about = "Blazar-compatible reservation service: v1 API and lease event scheduler", after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML configuration file.
    #[arg(long, env = "BLAZAR_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// What this process does [default: all].
    #[arg(long, env = "BLAZAR_ROLE", value_enum)]
    pub role: Option<Role>,
    /// Address to serve the API on [default: 127.0.0.1:1234].
    #[arg(long, env = "BLAZAR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Database: a SQLite file path or sqlite:// URL, or a postgres:// URL [default: blazar.db].
    #[arg(long, env = "BLAZAR_DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// Database connections per process [default: 16].
    #[arg(long, env = "BLAZAR_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// Authentication mode [default: noauth].
    #[arg(long, env = "BLAZAR_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// Allow noauth on an address other than loopback (anyone who reaches it is admin).
    #[arg(long, env = "BLAZAR_INSECURE_NOAUTH")]
    pub insecure_noauth: bool,
    /// Policy file in oslo.policy's YAML format overriding Blazar's default rules.
    #[arg(long, env = "BLAZAR_POLICY_FILE", global = true)]
    pub policy_file: Option<PathBuf>,
    /// Keystone identity API, e.g. http://keystone:5000/v3 (auth keystone).
    #[arg(long, env = "BLAZAR_KEYSTONE_URL")]
    pub keystone_url: Option<String>,
    /// The service user that validates tokens; needs the service role (auth keystone).
    #[arg(long, env = "BLAZAR_KEYSTONE_USERNAME")]
    pub keystone_username: Option<String>,
    /// Its password; prefer the environment variable or the file to the command line.
    #[arg(long, env = "BLAZAR_KEYSTONE_PASSWORD", hide_env_values = true)]
    pub keystone_password: Option<Secret>,
    /// Domain of the service user [default: Default].
    #[arg(long, env = "BLAZAR_KEYSTONE_USER_DOMAIN")]
    pub keystone_user_domain: Option<String>,
    /// Project the service user logs in to [default: service].
    #[arg(long, env = "BLAZAR_KEYSTONE_PROJECT")]
    pub keystone_project: Option<String>,
    /// Domain of that project [default: Default].
    #[arg(long, env = "BLAZAR_KEYSTONE_PROJECT_DOMAIN")]
    pub keystone_project_domain: Option<String>,
    /// The OpenStack backend authenticates with this application credential instead of the
    /// username and password (its secret in BLAZAR_KEYSTONE_APPLICATION_CREDENTIAL_SECRET).
    #[arg(long, env = "BLAZAR_KEYSTONE_APPLICATION_CREDENTIAL_ID")]
    pub keystone_application_credential_id: Option<String>,
    #[arg(
        long,
        env = "BLAZAR_KEYSTONE_APPLICATION_CREDENTIAL_SECRET",
        hide_env_values = true
    )]
    pub keystone_application_credential_secret: Option<Secret>,
    /// Most validated Keystone tokens kept in memory [default: 10000].
    #[arg(long, env = "BLAZAR_TOKEN_CACHE_SIZE")]
    pub token_cache_size: Option<usize>,
    /// Seconds a Keystone validation is trusted before asking again: the longest a revoked
    /// token keeps working; open event streams check their caller's token this often too
    /// [default: 60].
    #[arg(long, env = "BLAZAR_TOKEN_REVALIDATE_SECONDS")]
    pub token_revalidate_seconds: Option<u64>,
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
    /// Outside-world actions (hand-overs, take-backs) one process carries out at once
    /// [default: 64 with the standalone backend, 16 with the OpenStack one].
    #[arg(long, env = "BLAZAR_ACTION_WORKERS")]
    pub action_workers: Option<usize>,
    /// Minutes an action that keeps failing transiently is retried (from its first
    /// attempt, at most 30 s apart) before it fails for good and its lease goes to ERROR
    /// [default: 30].
    #[arg(long, env = "BLAZAR_ACTION_RETRY_MINUTES")]
    pub action_retry_minutes: Option<u64>,
    /// At most this many attempts of an action, whatever its retry minutes have left
    /// [default: no limit].
    #[arg(long, env = "BLAZAR_ACTION_ATTEMPTS")]
    pub action_attempts: Option<u32>,
    /// Seconds one attempt of an action may take [default: 300].
    #[arg(long, env = "BLAZAR_ACTION_TIMEOUT")]
    pub action_timeout: Option<u64>,
    /// Minutes before the end of a lease its before_end_lease event runs; 0 disables [default: 60].
    #[arg(long, env = "BLAZAR_MINUTES_BEFORE_END_LEASE")]
    pub minutes_before_end_lease: Option<i64>,
    /// SQLite durability: `full` syncs every commit to disk, so an acknowledged change
    /// survives a power loss; `normal` survives a crash of the process only [default: full].
    #[arg(long, env = "BLAZAR_SQLITE_SYNCHRONOUS", value_enum, global = true)]
    pub sqlite_synchronous: Option<SqliteSynchronous>,
    /// Virtual CPUs per physical CPU for instance reservations on hosts that set no
    /// `cpu_allocation_ratio` [default: 1.0, as Blazar's instance plugin].
    #[arg(long, env = "BLAZAR_CPU_ALLOCATION_RATIO")]
    pub cpu_allocation_ratio: Option<f64>,
    /// The same for memory (`ram_allocation_ratio`) [default: 1.0].
    #[arg(long, env = "BLAZAR_RAM_ALLOCATION_RATIO")]
    pub ram_allocation_ratio: Option<f64>,
    /// The same for disk (`disk_allocation_ratio`) [default: 1.0].
    #[arg(long, env = "BLAZAR_DISK_ALLOCATION_RATIO")]
    pub disk_allocation_ratio: Option<f64>,
    /// Most client connections open at once; at the bound, a new connection replaces the one
    /// that has waited longest without a request [default: 4096].
    #[arg(long, env = "BLAZAR_MAX_CLIENT_CONNECTIONS")]
    pub max_client_connections: Option<usize>,
    /// Seconds a new connection has to send its first request's headers [default: 10].
    #[arg(long, env = "BLAZAR_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Option<f64>,
    /// Seconds an idle keep-alive connection stays open [default: 60].
    #[arg(long, env = "BLAZAR_IDLE_TIMEOUT")]
    pub idle_timeout: Option<f64>,
    /// Seconds one request may take once its body has arrived (then 408) [default: 300].
    #[arg(long, env = "BLAZAR_REQUEST_TIMEOUT")]
    pub request_timeout: Option<f64>,
    /// Seconds a request's body has to arrive once its headers have (then 408) [default: 30].
    #[arg(long, env = "BLAZAR_BODY_READ_TIMEOUT")]
    pub body_read_timeout: Option<f64>,
    /// What acts on the outside world: `standalone` records hand-overs; `openstack` acts on
    /// Nova and Placement as Blazar's plugins do, with the --keystone-* service credentials
    /// [default: standalone].
    #[arg(long, env = "BLAZAR_BACKEND", value_enum)]
    pub backend: Option<BackendKind>,
    /// How blazar-rs acts for a lease's user in their project (the server group of an
    /// instance reservation): `trust`, as Blazar, through a Keystone trust each lease create
    /// makes from the caller to the service user (auth keystone only); `project`, with the
    /// service credentials scoped to the user's project (the service user needs a role
    /// there) [default: trust with auth keystone, project otherwise].
    #[arg(long, env = "BLAZAR_ACT_FOR_USER", value_enum)]
    pub act_for_user: Option<ActForUser>,
    /// OpenStack region of the endpoints to use [default: the catalog's first].
    #[arg(long, env = "BLAZAR_OS_REGION")]
    pub os_region: Option<String>,
    /// Catalog interface of the endpoints to use [default: public].
    #[arg(long, env = "BLAZAR_OS_INTERFACE")]
    pub os_interface: Option<String>,
    /// An endpoint to use instead of the catalog's, TYPE=URL (compute, placement, network);
    /// repeatable.
    #[arg(
        long = "os-endpoint",
        env = "BLAZAR_OS_ENDPOINTS",
        value_delimiter = ','
    )]
    pub os_endpoints: Vec<String>,
    /// Seconds one call to an OpenStack service may take [default: 30].
    #[arg(long, env = "BLAZAR_OS_TIMEOUT")]
    pub os_timeout: Option<u64>,
    /// Nova aggregate of the hosts no reservation holds [default: freepool].
    #[arg(long, env = "BLAZAR_NOVA_FREEPOOL")]
    pub nova_freepool: Option<String>,
    /// Aggregate metadata key naming the owning project (blazar-nova's BlazarFilter reads it)
    /// [default: blazar:owner].
    #[arg(long, env = "BLAZAR_NOVA_OWNER_KEY")]
    pub nova_owner_key: Option<String>,
    /// Availability-zone prefix of reservation aggregates [default: blazar_].
    #[arg(long, env = "BLAZAR_NOVA_AZ_PREFIX")]
    pub nova_az_prefix: Option<String>,
    /// Seconds a take-back waits for the servers on a host to be deleted before it is tried
    /// again; at most the action timeout less 30 s [default: 240].
    #[arg(long, env = "BLAZAR_SERVER_DELETE_TIMEOUT")]
    pub server_delete_timeout: Option<u64>,
    /// Seconds between two reconciler passes, which repair drift between Nova and the
    /// database (hosts out of their aggregate, orphaned aggregates); 0 turns it off
    /// [default: 300].
    #[arg(long, env = "BLAZAR_RECONCILE_INTERVAL")]
    pub reconcile_interval: Option<u64>,
    /// Seconds between two passes of the host monitor, which asks the backend (Nova) which
    /// hosts are down or disabled; 0 turns it off [default: 60].
    #[arg(long, env = "BLAZAR_MONITOR_INTERVAL")]
    pub monitor_interval: Option<u64>,
    /// Usage-enforcement filters to enable, as Blazar's `[enforcement] enabled_filters`:
    /// MaxLeaseDurationFilter, ExternalServiceFilter [default: none].
    #[arg(
        long = "enforcement-filter",
        env = "BLAZAR_ENFORCEMENT_ENABLED_FILTERS",
        value_delimiter = ','
    )]
    pub enabled_filters: Vec<String>,
    /// MaxLeaseDurationFilter: longest lease in seconds; -1 for no limit [default: -1].
    #[arg(long, env = "BLAZAR_MAX_LEASE_DURATION", allow_negative_numbers = true)]
    pub max_lease_duration: Option<i64>,
    /// MaxLeaseDurationFilter: projects it leaves alone (ids, comma-separated).
    #[arg(
        long,
        env = "BLAZAR_MAX_LEASE_DURATION_EXEMPT_PROJECT_IDS",
        value_delimiter = ','
    )]
    pub max_lease_duration_exempt_project_ids: Vec<String>,
    /// ExternalServiceFilter: the service's base URL (check-create, check-update and on-end
    /// are resolved against it).
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_BASE_ENDPOINT")]
    pub external_service_base_endpoint: Option<String>,
    /// ExternalServiceFilter: a URL instead of <base>/check-create.
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_CHECK_CREATE_ENDPOINT")]
    pub external_service_check_create_endpoint: Option<String>,
    /// ExternalServiceFilter: a URL instead of <base>/check-update.
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_CHECK_UPDATE_ENDPOINT")]
    pub external_service_check_update_endpoint: Option<String>,
    /// ExternalServiceFilter: a URL instead of <base>/on-end.
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_ON_END_ENDPOINT")]
    pub external_service_on_end_endpoint: Option<String>,
    /// ExternalServiceFilter: sent as X-Auth-Token; prefer the environment or the file.
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_TOKEN", hide_env_values = true)]
    pub external_service_token: Option<Secret>,
    /// ExternalServiceFilter: seconds a call may take; no answer in time refuses the
    /// create or update [default: 10].
    #[arg(long, env = "BLAZAR_EXTERNAL_SERVICE_TIMEOUT")]
    pub external_service_timeout: Option<f64>,
    /// oslo.messaging transport URL notifications are published to, e.g.
    /// rabbit://user:pass@host:5672/ (several hosts separated by commas); without it they
    /// only go to the outbox (`GET /v1/notifications`). File: `[notifications] transport_url`.
    #[arg(
        long,
        env = "BLAZAR_NOTIFICATIONS_TRANSPORT_URL",
        hide_env_values = true
    )]
    pub notifications_transport_url: Option<Secret>,
    /// Notification topics; each notification goes to routing key `<topic>.info` of every
    /// one [default: notifications].
    #[arg(long, env = "BLAZAR_NOTIFICATIONS_TOPICS", value_delimiter = ',')]
    pub notifications_topics: Vec<String>,
    /// Topic exchange notifications are published to (oslo.messaging's control_exchange)
    /// [default: openstack].
    #[arg(long, env = "BLAZAR_NOTIFICATIONS_EXCHANGE")]
    pub notifications_exchange: Option<String>,
    /// `publisher_id` of the notifications [default: blazar.lease].
    #[arg(long, env = "BLAZAR_NOTIFICATIONS_PUBLISHER_ID")]
    pub notifications_publisher_id: Option<String>,
    /// Declare the exchange and the `<topic>.info` queues durable (oslo.messaging's
    /// amqp_durable_queues; must match how the site declared them) [default: false].
    #[arg(long, env = "BLAZAR_NOTIFICATIONS_DURABLE")]
    pub notifications_durable: Option<bool>,
    /// Read Nova's notifications: run a host monitor pass as soon as Nova says a compute
    /// service was disabled, forced down, enabled, created or deleted (Blazar's
    /// `[physical:host] enable_notification_monitor`; Nova sends these when its
    /// `[notifications] notification_format` is versioned or both), and a reconciler pass
    /// when someone else changes an aggregate, a flavor or a server group. Needs `--backend
    /// openstack`, the monitor and a transport URL [default: false]. File: `[monitor]
    /// notifications`.
    #[arg(long, env = "BLAZAR_MONITOR_NOTIFICATIONS")]
    pub monitor_notifications: Option<bool>,
    /// oslo.messaging transport URL of the broker Nova publishes to [default: the
    /// notifications' transport URL]. File: `[monitor] transport_url`.
    #[arg(long, env = "BLAZAR_MONITOR_TRANSPORT_URL", hide_env_values = true)]
    pub monitor_transport_url: Option<Secret>,
    /// Nova's notification topics read, every priority of each (Blazar's `[physical:host]
    /// notification_topics`) [default: notifications,versioned_notifications]. File:
    /// `[monitor] topics`.
    #[arg(
        long,
        env = "BLAZAR_MONITOR_NOTIFICATION_TOPICS",
        value_delimiter = ','
    )]
    pub monitor_notification_topics: Vec<String>,
    /// The topic exchange Nova publishes to (Nova's control_exchange) [default: nova]. File:
    /// `[monitor] exchange`.
    #[arg(long, env = "BLAZAR_MONITOR_NOTIFICATIONS_EXCHANGE")]
    pub monitor_notifications_exchange: Option<String>,
    /// Webhooks: attempts of a delivery before it is dead [default: 8]. File: `[webhooks]
    /// max_attempts`.
    #[arg(long, env = "BLAZAR_WEBHOOK_MAX_ATTEMPTS")]
    pub webhook_max_attempts: Option<u32>,
    /// Webhooks: seconds before the second attempt of a failed delivery; the pause doubles
    /// with each further one [default: 30]. File: `[webhooks] retry_base`.
    #[arg(long, env = "BLAZAR_WEBHOOK_RETRY_BASE")]
    pub webhook_retry_base: Option<f64>,
    /// Webhooks: the longest pause between attempts, in seconds [default: 3600]. File:
    /// `[webhooks] retry_max`.
    #[arg(long, env = "BLAZAR_WEBHOOK_RETRY_MAX")]
    pub webhook_retry_max: Option<f64>,
    /// Webhooks: seconds an endpoint has to answer a delivery [default: 10]. File:
    /// `[webhooks] timeout`.
    #[arg(long, env = "BLAZAR_WEBHOOK_TIMEOUT")]
    pub webhook_timeout: Option<f64>,
    /// Webhooks: whether they may reach internal addresses (loopback, private and
    /// link-local networks, names resolving there) [default: true with `--auth noauth`,
    /// where every caller is trusted; false otherwise]. File: `[webhooks] allow_internal`.
    #[arg(long, env = "BLAZAR_WEBHOOK_ALLOW_INTERNAL")]
    pub webhook_allow_internal: Option<bool>,
    /// Default quota: hosts a project may hold at any one instant; -1 for no limit
    /// [default: -1]. File: `[quotas] hosts`.
    #[arg(long, env = "BLAZAR_QUOTA_HOSTS", allow_negative_numbers = true)]
    pub quota_hosts: Option<i64>,
    /// Default quota: floating IPs a project may hold at any one instant [default: -1].
    #[arg(long, env = "BLAZAR_QUOTA_FLOATINGIPS", allow_negative_numbers = true)]
    pub quota_floatingips: Option<i64>,
    /// Default quota: instance slots a project's instance reservations may hold at any one
    /// instant [default: -1].
    #[arg(long, env = "BLAZAR_QUOTA_INSTANCES", allow_negative_numbers = true)]
    pub quota_instances: Option<i64>,
    /// Default quota: longest lease in seconds [default: -1].
    #[arg(
        long,
        env = "BLAZAR_QUOTA_MAX_LEASE_DURATION",
        allow_negative_numbers = true
    )]
    pub quota_max_lease_duration: Option<i64>,
    /// Default quota: furthest ahead a lease may start, in seconds [default: -1].
    #[arg(
        long,
        env = "BLAZAR_QUOTA_MAX_START_AHEAD",
        allow_negative_numbers = true
    )]
    pub quota_max_start_ahead: Option<i64>,
    /// Default quota: weighted host-hours a project may reserve per calendar month (UTC)
    /// [default: -1].
    #[arg(
        long,
        env = "BLAZAR_QUOTA_HOST_HOURS_PER_MONTH",
        allow_negative_numbers = true
    )]
    pub quota_host_hours_per_month: Option<i64>,
    /// How much an hour of a host counts toward the monthly budget, by host property:
    /// `KEY=VALUE:WEIGHT`, e.g. `node_type=gpu:2` (comma-separated; a host matching none
    /// weighs 1). File: `[quotas.host_weights]`, `"node_type=gpu" = 2.0`.
    #[arg(
        long = "quota-host-weight",
        env = "BLAZAR_QUOTA_HOST_WEIGHTS",
        value_delimiter = ','
    )]
    pub quota_host_weights: Vec<String>,
    /// Log filter, as RUST_LOG [default: info].
    #[arg(long, env = "BLAZAR_LOG", global = true)]
    pub log: Option<String>,
    /// Log lines as `text` for people or `json` (one object per line) for log collectors
    /// [default: text].
    #[arg(long, env = "BLAZAR_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
    /// Who may read `/metrics`: `loopback` clients, anyone (`open`), or `admin` tokens
    /// [default: loopback].
    #[arg(long, env = "BLAZAR_METRICS_ACCESS", value_enum)]
    pub metrics_access: Option<crate::metrics::MetricsAccess>,
    /// Long polls (`?wait_for=`) and event streams open at once, a quarter of them at most
    /// per project; more are answered 503 (0: none) [default: 1024].
    #[arg(long, env = "BLAZAR_MAX_WAITERS")]
    pub max_waiters: Option<usize>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The file's `[quotas]` table: the default limits, and the host weights of the budget.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotasFile {
    pub hosts: Option<i64>,
    pub floatingips: Option<i64>,
    pub instances: Option<i64>,
    pub max_lease_duration: Option<i64>,
    pub max_start_ahead: Option<i64>,
    pub host_hours_per_month: Option<i64>,
    /// `"KEY=VALUE" = weight`.
    pub host_weights: Option<BTreeMap<String, f64>>,
}

/// A host weight's selector and factor: `KEY=VALUE` and a positive, finite number.
fn host_weight(selector: &str, weight: f64) -> anyhow::Result<blazar_service::HostWeight> {
    let Some((key, value)) = selector.split_once('=') else {
        anyhow::bail!("quota host weight {selector:?}: the selector must be KEY=VALUE");
    };
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() {
        anyhow::bail!("quota host weight {selector:?}: the property name is empty");
    }
    if !(weight.is_finite() && (0.0..=1_000_000.0).contains(&weight)) {
        anyhow::bail!("quota host weight {selector:?}: the weight must be 0 or more, got {weight}");
    }
    Ok(blazar_service::HostWeight {
        key: key.to_string(),
        value: value.to_string(),
        weight,
    })
}

/// `[quotas]` from the flags and environment over the file's table.
fn quota_settings(cli: &Cli, file: QuotasFile) -> anyhow::Result<blazar_service::QuotaSettings> {
    use blazar_core::quota::QuotaKind;
    let mut defaults = blazar_core::quota::QuotaValues::default();
    for (kind, flag, from_file) in [
        (QuotaKind::Hosts, cli.quota_hosts, file.hosts),
        (
            QuotaKind::FloatingIps,
            cli.quota_floatingips,
            file.floatingips,
        ),
        (QuotaKind::Instances, cli.quota_instances, file.instances),
        (
            QuotaKind::LeaseDuration,
            cli.quota_max_lease_duration,
            file.max_lease_duration,
        ),
        (
            QuotaKind::StartAhead,
            cli.quota_max_start_ahead,
            file.max_start_ahead,
        ),
        (
            QuotaKind::HostHoursPerMonth,
            cli.quota_host_hours_per_month,
            file.host_hours_per_month,
        ),
    ] {
        let value = flag.or(from_file);
        if let Some(v) = value
            && v < -1
        {
            anyhow::bail!(
                "quota {} must be -1 (no limit) or 0 or more, got {v}",
                kind.as_str()
            );
        }
        defaults.set(kind, value);
    }
    let mut host_weights = Vec::new();
    if cli.quota_host_weights.is_empty() {
        for (selector, weight) in file.host_weights.unwrap_or_default() {
            host_weights.push(host_weight(&selector, weight)?);
        }
    } else {
        for item in cli.quota_host_weights.iter().map(|i| i.trim()) {
            if item.is_empty() {
                continue;
            }
            let Some((selector, weight)) = item.rsplit_once(':') else {
                anyhow::bail!("quota host weight {item:?}: write KEY=VALUE:WEIGHT");
            };
            let weight: f64 = weight.trim().parse().map_err(|_| {
                anyhow::anyhow!("quota host weight {item:?}: {weight:?} is not a number")
            })?;
            host_weights.push(host_weight(selector, weight)?);
        }
    }
    Ok(blazar_service::QuotaSettings {
        defaults,
        host_weights,
    })
}

/// The file's `[enforcement]` table: Blazar's option names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnforcementFile {
    pub enabled_filters: Option<Vec<String>>,
    pub max_lease_duration: Option<i64>,
    pub max_lease_duration_exempt_project_ids: Option<Vec<String>>,
    pub external_service_base_endpoint: Option<String>,
    pub external_service_check_create_endpoint: Option<String>,
    pub external_service_check_update_endpoint: Option<String>,
    pub external_service_on_end_endpoint: Option<String>,
    pub external_service_token: Option<Secret>,
    pub external_service_timeout: Option<f64>,
}

/// The filters Blazar has, by the names operators enable them with.
pub const FILTERS: [&str; 2] = ["MaxLeaseDurationFilter", "ExternalServiceFilter"];

/// Usage enforcement as configured (checked when the server starts).
#[derive(Debug, Clone)]
pub struct EnforcementConfig {
    /// In the order given, each once.
    pub enabled_filters: Vec<String>,
    pub max_lease_duration: i64,
    pub max_lease_duration_exempt_project_ids: Vec<String>,
    pub external_service_base_endpoint: Option<String>,
    pub external_service_check_create_endpoint: Option<String>,
    pub external_service_check_update_endpoint: Option<String>,
    pub external_service_on_end_endpoint: Option<String>,
    pub external_service_token: Secret,
    pub external_service_timeout: std::time::Duration,
}

/// The file's `[webhooks]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksFile {
    pub max_attempts: Option<u32>,
    pub retry_base: Option<f64>,
    pub retry_max: Option<f64>,
    pub timeout: Option<f64>,
    pub allow_internal: Option<bool>,
}

fn webhook_settings(
    cli: &Cli,
    file: WebhooksFile,
    auth: AuthMode,
) -> anyhow::Result<blazar_service::WebhookSettings> {
    let defaults = blazar_service::WebhookSettings::default();
    let max_attempts = cli
        .webhook_max_attempts
        .or(file.max_attempts)
        .unwrap_or(defaults.max_attempts);
    if !(1..=100).contains(&max_attempts) {
        anyhow::bail!("webhook max_attempts must be between 1 and 100, got {max_attempts}");
    }
    let secs = |name: &str, value: Option<f64>, default: std::time::Duration, max: f64| {
        value.map_or(Ok(default), |v| seconds(name, v, max))
    };
    let retry_base = secs(
        "webhook retry_base",
        cli.webhook_retry_base.or(file.retry_base),
        defaults.retry_base,
        86_400.0,
    )?;
    let retry_max = secs(
        "webhook retry_max",
        cli.webhook_retry_max.or(file.retry_max),
        defaults.retry_max,
        7.0 * 86_400.0,
    )?;
    if retry_max < retry_base {
        anyhow::bail!("webhook retry_max must be at least retry_base");
    }
    Ok(blazar_service::WebhookSettings {
        max_attempts,
        retry_base,
        retry_max,
        timeout: secs(
            "webhook timeout",
            cli.webhook_timeout.or(file.timeout),
            defaults.timeout,
            300.0,
        )?,
        allow_internal: cli
            .webhook_allow_internal
            .or(file.allow_internal)
            .unwrap_or(auth == AuthMode::Noauth),
    })
}

/// The file's `[notifications]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationsFile {
    pub transport_url: Option<Secret>,
    pub topics: Option<Vec<String>>,
    pub exchange: Option<String>,
    pub publisher_id: Option<String>,
    pub durable: Option<bool>,
}

/// A list of oslo.messaging topics: the options' if given, else the file's, else `default`;
/// each trimmed, empty ones dropped. `None` when none is left.
fn topic_list(cli: &[String], file: Option<&[String]>, default: &[&str]) -> Option<Vec<String>> {
    let topics: Vec<String> = if cli.is_empty() {
        file.map(<[String]>::to_vec)
            .unwrap_or_else(|| default.iter().map(|t| t.to_string()).collect())
    } else {
        cli.to_vec()
    };
    let topics: Vec<String> = topics
        .into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    (!topics.is_empty()).then_some(topics)
}

/// Where notifications are published; `None` in [`Config::notifications`] when no transport
/// URL is configured.
#[derive(Debug, Clone, PartialEq)]
pub struct NotificationsConfig {
    pub transport_url: Secret,
    pub topics: Vec<String>,
    pub exchange: String,
    pub publisher_id: String,
    pub durable: bool,
}

impl NotificationsConfig {
    fn resolve(cli: &Cli, file: &NotificationsFile) -> anyhow::Result<Option<Self>> {
        let Some(transport_url) = cli
            .notifications_transport_url
            .clone()
            .or(file.transport_url.clone())
            .filter(|url| !url.expose().is_empty())
        else {
            return Ok(None);
        };
        let topics = topic_list(
            &cli.notifications_topics,
            file.topics.as_deref(),
            &["notifications"],
        )
        .ok_or_else(|| anyhow::anyhow!("notifications topics must name at least one topic"))?;
        let config = NotificationsConfig {
            transport_url,
            topics,
            exchange: cli
                .notifications_exchange
                .clone()
                .or(file.exchange.clone())
                .unwrap_or_else(|| "openstack".into()),
            publisher_id: cli
                .notifications_publisher_id
                .clone()
                .or(file.publisher_id.clone())
                .unwrap_or_else(|| "blazar.lease".into()),
            durable: cli.notifications_durable.or(file.durable).unwrap_or(false),
        };
        // A bad URL is a configuration error at start, not a publisher failing forever.
        blazar_openstack::notifier::amqp_uris(config.transport_url.expose())
            .map_err(|e| anyhow::anyhow!("notifications {e}"))?;
        Ok(Some(config))
    }

    /// The publisher's settings.
    pub fn notifier_settings(&self) -> blazar_openstack::NotifierSettings {
        blazar_openstack::NotifierSettings {
            transport_url: self.transport_url.expose().to_string(),
            exchange: self.exchange.clone(),
            topics: self.topics.clone(),
            publisher_id: self.publisher_id.clone(),
            durable: self.durable,
            ..blazar_openstack::NotifierSettings::default()
        }
    }
}

/// The file's `[monitor]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorFile {
    pub notifications: Option<bool>,
    pub transport_url: Option<Secret>,
    pub topics: Option<Vec<String>>,
    pub exchange: Option<String>,
}

/// Where Nova's notifications are read from; `None` in [`Config::nova_notifications`]
/// unless `--monitor-notifications` is on.
#[derive(Debug, Clone, PartialEq)]
pub struct NovaNotificationsConfig {
    pub transport_url: Secret,
    pub topics: Vec<String>,
    pub exchange: String,
}

impl NovaNotificationsConfig {
    fn resolve(
        cli: &Cli,
        file: &MonitorFile,
        notifications: Option<&NotificationsConfig>,
        backend: BackendKind,
    ) -> anyhow::Result<Option<Self>> {
        if !cli
            .monitor_notifications
            .or(file.notifications)
            .unwrap_or(false)
        {
            return Ok(None);
        }
        if backend != BackendKind::Openstack {
            anyhow::bail!("--monitor-notifications needs --backend openstack");
        }
        let Some(transport_url) = cli
            .monitor_transport_url
            .clone()
            .or(file.transport_url.clone())
            .or(notifications.map(|n| n.transport_url.clone()))
            .filter(|url| !url.expose().is_empty())
        else {
            anyhow::bail!(
                "--monitor-notifications needs a transport URL: --monitor-transport-url \
                 (BLAZAR_MONITOR_TRANSPORT_URL, file [monitor] transport_url) or \
                 --notifications-transport-url (BLAZAR_NOTIFICATIONS_TRANSPORT_URL, file \
                 [notifications] transport_url)"
            );
        };
        let topics = topic_list(
            &cli.monitor_notification_topics,
            file.topics.as_deref(),
            &["notifications", "versioned_notifications"],
        )
        .ok_or_else(|| {
            anyhow::anyhow!("monitor notification topics must name at least one topic")
        })?;
        blazar_openstack::notifier::amqp_uris(transport_url.expose())
            .map_err(|e| anyhow::anyhow!("monitor {e}"))?;
        Ok(Some(NovaNotificationsConfig {
            transport_url,
            topics,
            exchange: cli
                .monitor_notifications_exchange
                .clone()
                .or(file.exchange.clone())
                .unwrap_or_else(|| "nova".into()),
        }))
    }

    /// The listener's settings.
    pub fn listener_settings(&self) -> blazar_openstack::NovaEventSettings {
        blazar_openstack::NovaEventSettings {
            transport_url: self.transport_url.expose().to_string(),
            exchange: self.exchange.clone(),
            topics: self.topics.clone(),
            ..blazar_openstack::NovaEventSettings::default()
        }
    }
}

/// How the service acts for a lease's user in their project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActForUser {
    /// Through a Keystone trust made at lease create (trustor the caller, trustee the
    /// service user, the caller's roles, impersonation); deleted with the lease.
    Trust,
    /// With the service credentials scoped to the user's project.
    Project,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Hand-overs are records (`GET /v1/handovers`); nothing outside is touched.
    Standalone,
    /// Nova aggregates and Placement providers, as Blazar's plugins use them.
    Openstack,
}

/// Actions carried out at once unless configured. With the OpenStack backend each one is
/// a series of calls to Nova and Placement, and 16 at a time keeps a burst from flooding
/// their APIs. The standalone backend's actions are records written with their outcome:
/// more at once only means bigger batches, and 64 start a burst of 1,000 leases within a
/// second or two (docs/performance.md).
pub fn default_action_workers(backend: BackendKind) -> usize {
    match backend {
        BackendKind::Standalone => 64,
        BackendKind::Openstack => 16,
    }
}

/// The OpenStack backend's settings, as configured.
#[derive(Debug, Clone)]
pub struct OpenStackConfig {
    pub region: Option<String>,
    pub interface: String,
    pub endpoints: Vec<(String, String)>,
    pub timeout: std::time::Duration,
    pub freepool: String,
    pub owner_key: String,
    pub az_prefix: String,
    pub server_delete_timeout: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// Every commit is on disk before it is acknowledged (survives a power loss).
    Full,
    /// Commits survive a crash of the process, not of the machine (faster).
    Normal,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve the API and/or run the scheduler, as --role says (what runs without a command).
    Serve,
    /// Manage the API tokens of auth mode "tokens" (in the database).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Inspect the authorization policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Compare the cloud (Nova aggregates, the freepool) with the database, once, and print
    /// every difference; with --apply, repair them.
    Reconcile {
        /// Only report (the default).
        #[arg(long, conflicts_with = "apply")]
        dry_run: bool,
        /// Repair what differs.
        #[arg(long)]
        apply: bool,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum TokenCommand {
    /// Create a token; it is printed once, on standard output.
    Create {
        /// Project the token acts in.
        #[arg(long)]
        project: String,
        /// Role(s) the token holds (repeat, or separate with commas): reader, member, admin.
        #[arg(long = "role", required = true, value_delimiter = ',')]
        roles: Vec<String>,
        /// User id the token acts as [default: token-<id>].
        #[arg(long)]
        user: Option<String>,
        /// Lifetime such as 90d, 12h or 30m [default: never expires].
        #[arg(long)]
        expires_in: Option<String>,
        /// Free text shown by `token list`.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id: requests with it are refused from then on, and event streams it
    /// opened end within --token-revalidate-seconds.
    Revoke {
        /// The token's id (as `token list` shows it), or the token itself.
        id: String,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum PolicyCommand {
    /// Print the effective rules (the defaults with the policy file's overrides), as a
    /// policy file.
    Show,
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
    pub insecure_noauth: Option<bool>,
    pub policy_file: Option<PathBuf>,
    pub keystone_url: Option<String>,
    pub keystone_username: Option<String>,
    pub keystone_password: Option<Secret>,
    pub keystone_user_domain: Option<String>,
    pub keystone_project: Option<String>,
    pub keystone_project_domain: Option<String>,
    pub keystone_application_credential_id: Option<String>,
    pub keystone_application_credential_secret: Option<Secret>,
    pub token_cache_size: Option<usize>,
    pub token_revalidate_seconds: Option<u64>,
    pub noauth_project_id: Option<String>,
    pub noauth_user_id: Option<String>,
    pub poll_interval: Option<f64>,
    pub cleaning_minutes: Option<i64>,
    pub action_workers: Option<usize>,
    pub action_retry_minutes: Option<u64>,
    pub action_attempts: Option<u32>,
    pub action_timeout: Option<u64>,
    pub minutes_before_end_lease: Option<i64>,
    pub sqlite_synchronous: Option<SqliteSynchronous>,
    pub cpu_allocation_ratio: Option<f64>,
    pub ram_allocation_ratio: Option<f64>,
    pub disk_allocation_ratio: Option<f64>,
    pub max_client_connections: Option<usize>,
    pub header_read_timeout: Option<f64>,
    pub idle_timeout: Option<f64>,
    pub request_timeout: Option<f64>,
    pub body_read_timeout: Option<f64>,
    pub backend: Option<BackendKind>,
    pub act_for_user: Option<ActForUser>,
    pub os_region: Option<String>,
    pub os_interface: Option<String>,
    pub os_endpoints: Option<Vec<String>>,
    pub os_timeout: Option<u64>,
    pub nova_freepool: Option<String>,
    pub nova_owner_key: Option<String>,
    pub nova_az_prefix: Option<String>,
    pub server_delete_timeout: Option<u64>,
    pub monitor_interval: Option<u64>,
    pub reconcile_interval: Option<u64>,
    pub log: Option<String>,
    pub log_format: Option<LogFormat>,
    pub metrics_access: Option<crate::metrics::MetricsAccess>,
    pub max_waiters: Option<usize>,
    pub enforcement: Option<EnforcementFile>,
    pub notifications: Option<NotificationsFile>,
    pub monitor: Option<MonitorFile>,
    pub quotas: Option<QuotasFile>,
    pub webhooks: Option<WebhooksFile>,
}

/// Keystone settings as configured (checked when the server starts in keystone mode).
#[derive(Debug, Clone)]
pub struct KeystoneConfig {
    pub url: Option<String>,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub user_domain: String,
    pub project: String,
    pub project_domain: String,
    pub application_credential: Option<(String, Secret)>,
    pub token_cache_size: usize,
    pub token_revalidate_seconds: u64,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    pub listen: SocketAddr,
    pub database_url: String,
    pub max_connections: u32,
    pub auth: AuthMode,
    pub insecure_noauth: bool,
    pub policy_file: Option<PathBuf>,
    pub keystone: KeystoneConfig,
    pub noauth_project_id: String,
    pub noauth_user_id: String,
    pub poll_interval: std::time::Duration,
    pub cleaning_minutes: i64,
    pub action_workers: usize,
    pub action_retry_for: std::time::Duration,
    pub action_attempts: Option<u32>,
    pub action_timeout: std::time::Duration,
    pub backend: BackendKind,
    pub act_for_user: ActForUser,
    pub openstack: OpenStackConfig,
    /// `None`: the monitor is off.
    pub monitor_interval: Option<std::time::Duration>,
    /// `None`: no periodic reconciler.
    pub reconcile_interval: Option<std::time::Duration>,
    pub minutes_before_end_lease: i64,
    pub sqlite_synchronous: SqliteSynchronous,
    pub ratios: blazar_service::Ratios,
    pub connections: crate::listener::ConnectionLimits,
    pub enforcement: EnforcementConfig,
    /// `None`: notifications stay in the outbox.
    pub notifications: Option<NotificationsConfig>,
    /// `None`: the monitor runs on its interval only.
    pub nova_notifications: Option<NovaNotificationsConfig>,
    pub quotas: blazar_service::QuotaSettings,
    pub webhooks: blazar_service::WebhookSettings,
    pub log: String,
    pub log_format: LogFormat,
    pub metrics_access: crate::metrics::MetricsAccess,
    pub max_waiters: usize,
}

/// A number of seconds from the configuration, checked to lie in `(0, max]`.
fn seconds(name: &str, value: f64, max: f64) -> anyhow::Result<std::time::Duration> {
    if !(value.is_finite() && value > 0.0 && value <= max) {
        anyhow::bail!("{name} must be more than 0 and at most {max} seconds, got {value}");
    }
    Ok(std::time::Duration::from_secs_f64(value))
}

/// An allocation ratio: positive and finite (Nova's go up to a few dozen).
fn ratio(name: &str, value: f64) -> anyhow::Result<f64> {
    if !(value.is_finite() && value > 0.0 && value <= 1000.0) {
        anyhow::bail!("{name} must be more than 0 and at most 1000, got {value}");
    }
    Ok(value)
}

/// `[enforcement]` from the flags and environment over the file's table.
fn enforcement_config(cli: &Cli, file: EnforcementFile) -> anyhow::Result<EnforcementConfig> {
    let listed = if cli.enabled_filters.is_empty() {
        file.enabled_filters.unwrap_or_default()
    } else {
        cli.enabled_filters.clone()
    };
    let mut enabled_filters: Vec<String> = Vec::new();
    for name in listed.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if !FILTERS.contains(&name) {
            anyhow::bail!(
                "enabled_filters: {name} is not a usage-enforcement filter (known: {})",
                FILTERS.join(", ")
            );
        }
        if !enabled_filters.iter().any(|n| n == name) {
            enabled_filters.push(name.to_string());
        }
    }
    let max_lease_duration = cli
        .max_lease_duration
        .or(file.max_lease_duration)
        .unwrap_or(-1);
    if max_lease_duration < -1 {
        anyhow::bail!("max_lease_duration must be -1 (no limit) or more, got {max_lease_duration}");
    }
    let timeout = seconds(
        "external_service_timeout",
        cli.external_service_timeout
            .or(file.external_service_timeout)
            .unwrap_or(10.0),
        600.0,
    )?;
    Ok(EnforcementConfig {
        enabled_filters,
        max_lease_duration,
        max_lease_duration_exempt_project_ids: if cli
            .max_lease_duration_exempt_project_ids
            .is_empty()
        {
            file.max_lease_duration_exempt_project_ids
                .unwrap_or_default()
        } else {
            cli.max_lease_duration_exempt_project_ids.clone()
        },
        external_service_base_endpoint: cli
            .external_service_base_endpoint
            .clone()
            .or(file.external_service_base_endpoint),
        external_service_check_create_endpoint: cli
            .external_service_check_create_endpoint
            .clone()
            .or(file.external_service_check_create_endpoint),
        external_service_check_update_endpoint: cli
            .external_service_check_update_endpoint
            .clone()
            .or(file.external_service_check_update_endpoint),
        external_service_on_end_endpoint: cli
            .external_service_on_end_endpoint
            .clone()
            .or(file.external_service_on_end_endpoint),
        external_service_token: cli
            .external_service_token
            .clone()
            .or(file.external_service_token)
            .unwrap_or_default(),
        external_service_timeout: timeout,
    })
}

impl Config {
    /// The usage-enforcement filters as configured, in order; a bad external service URL
    /// stops the start, as in Blazar.
    pub fn usage_enforcement(&self) -> anyhow::Result<blazar_service::Enforcement> {
        let e = &self.enforcement;
        let mut filters: Vec<std::sync::Arc<dyn blazar_service::UsageFilter>> = Vec::new();
        for name in &e.enabled_filters {
            match name.as_str() {
                "MaxLeaseDurationFilter" => filters.push(std::sync::Arc::new(
                    blazar_service::MaxLeaseDurationFilter {
                        max_seconds: e.max_lease_duration,
                        exempt_project_ids: e.max_lease_duration_exempt_project_ids.clone(),
                    },
                )),
                "ExternalServiceFilter" => {
                    let filter = blazar_openstack::ExternalServiceFilter::new(
                        &blazar_openstack::ExternalServiceConfig {
                            base_endpoint: e.external_service_base_endpoint.clone(),
                            check_create_endpoint: e.external_service_check_create_endpoint.clone(),
                            check_update_endpoint: e.external_service_check_update_endpoint.clone(),
                            on_end_endpoint: e.external_service_on_end_endpoint.clone(),
                            token: e.external_service_token.expose().to_string(),
                            timeout: e.external_service_timeout,
                        },
                    )
                    .map_err(|m| anyhow::anyhow!("ExternalServiceFilter: {m}"))?;
                    filters.push(std::sync::Arc::new(filter));
                }
                other => anyhow::bail!("unknown usage-enforcement filter {other}"),
            }
        }
        Ok(blazar_service::Enforcement::new(
            filters,
            self.keystone.url.clone(),
            self.openstack.region.clone(),
        ))
    }
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
        let defaults = crate::listener::ConnectionLimits::default();
        let connections = crate::listener::ConnectionLimits {
            max_connections: cli
                .max_client_connections
                .or(file.max_client_connections)
                .unwrap_or(defaults.max_connections),
            header_read_timeout: seconds(
                "header_read_timeout",
                cli.header_read_timeout
                    .or(file.header_read_timeout)
                    .unwrap_or(defaults.header_read_timeout.as_secs_f64()),
                3600.0,
            )?,
            idle_timeout: seconds(
                "idle_timeout",
                cli.idle_timeout
                    .or(file.idle_timeout)
                    .unwrap_or(defaults.idle_timeout.as_secs_f64()),
                86_400.0,
            )?,
            request_timeout: seconds(
                "request_timeout",
                cli.request_timeout
                    .or(file.request_timeout)
                    .unwrap_or(defaults.request_timeout.as_secs_f64()),
                86_400.0,
            )?,
            body_read_timeout: seconds(
                "body_read_timeout",
                cli.body_read_timeout
                    .or(file.body_read_timeout)
                    .unwrap_or(defaults.body_read_timeout.as_secs_f64()),
                3600.0,
            )?,
            body_bytes_in_flight: defaults.body_bytes_in_flight,
            body_bytes_per_peer: defaults.body_bytes_per_peer,
            response_bytes_in_flight: defaults.response_bytes_in_flight,
            response_bytes_per_peer: defaults.response_bytes_per_peer,
        };
        if connections.max_connections == 0 {
            anyhow::bail!("max_client_connections must be at least 1");
        }
        let ratios = blazar_service::Ratios {
            cpu: ratio(
                "cpu_allocation_ratio",
                cli.cpu_allocation_ratio
                    .or(file.cpu_allocation_ratio)
                    .unwrap_or(1.0),
            )?,
            ram: ratio(
                "ram_allocation_ratio",
                cli.ram_allocation_ratio
                    .or(file.ram_allocation_ratio)
                    .unwrap_or(1.0),
            )?,
            disk: ratio(
                "disk_allocation_ratio",
                cli.disk_allocation_ratio
                    .or(file.disk_allocation_ratio)
                    .unwrap_or(1.0),
            )?,
        };
        let mut endpoints = Vec::new();
        let listed = if cli.os_endpoints.is_empty() {
            file.os_endpoints.clone().unwrap_or_default()
        } else {
            cli.os_endpoints.clone()
        };
        for item in listed {
            match item.split_once('=') {
                Some((kind, url)) if !kind.is_empty() && url.starts_with("http") => {
                    endpoints.push((kind.trim().to_string(), url.trim().to_string()));
                }
                _ => anyhow::bail!("os_endpoint must be TYPE=URL, got {item:?}"),
            }
        }
        let openstack = OpenStackConfig {
            region: cli.os_region.clone().or(file.os_region.clone()),
            interface: cli
                .os_interface
                .clone()
                .or(file.os_interface.clone())
                .unwrap_or_else(|| "public".into()),
            endpoints,
            timeout: std::time::Duration::from_secs(
                cli.os_timeout
                    .or(file.os_timeout)
                    .unwrap_or(30)
                    .clamp(1, 600),
            ),
            freepool: cli
                .nova_freepool
                .clone()
                .or(file.nova_freepool.clone())
                .unwrap_or_else(|| "freepool".into()),
            owner_key: cli
                .nova_owner_key
                .clone()
                .or(file.nova_owner_key.clone())
                .unwrap_or_else(|| "blazar:owner".into()),
            az_prefix: cli
                .nova_az_prefix
                .clone()
                .or(file.nova_az_prefix.clone())
                .unwrap_or_else(|| "blazar_".into()),
            server_delete_timeout: std::time::Duration::from_secs(
                cli.server_delete_timeout
                    .or(file.server_delete_timeout)
                    .unwrap_or(240)
                    .clamp(1, 86_400),
            ),
        };
        let enforcement = enforcement_config(&cli, file.enforcement.clone().unwrap_or_default())?;
        let quotas = quota_settings(&cli, file.quotas.clone().unwrap_or_default())?;
        let webhooks = webhook_settings(
            &cli,
            file.webhooks.clone().unwrap_or_default(),
            cli.auth.or(file.auth).unwrap_or(AuthMode::Noauth),
        )?;
        let monitor_seconds = cli.monitor_interval.or(file.monitor_interval).unwrap_or(60);
        let reconcile_seconds = cli
            .reconcile_interval
            .or(file.reconcile_interval)
            .unwrap_or(300);
        let notifications =
            NotificationsConfig::resolve(&cli, &file.notifications.clone().unwrap_or_default())?;
        let auth = cli.auth.or(file.auth).unwrap_or(AuthMode::Noauth);
        let act_for_user = act_for_user(cli.act_for_user.or(file.act_for_user), auth)?;
        let backend = cli
            .backend
            .or(file.backend)
            .unwrap_or(BackendKind::Standalone);
        let nova_notifications = NovaNotificationsConfig::resolve(
            &cli,
            &file.monitor.clone().unwrap_or_default(),
            notifications.as_ref(),
            backend,
        )?;
        if nova_notifications.is_some() && monitor_seconds == 0 {
            anyhow::bail!("--monitor-notifications needs the monitor (--monitor-interval above 0)");
        }
        Ok(Config {
            notifications,
            nova_notifications,
            act_for_user,
            reconcile_interval: (reconcile_seconds > 0)
                .then(|| std::time::Duration::from_secs(reconcile_seconds.min(86_400))),
            monitor_interval: (monitor_seconds > 0)
                .then(|| std::time::Duration::from_secs(monitor_seconds.min(86_400))),
            backend,
            openstack,
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
            auth,
            insecure_noauth: cli.insecure_noauth || file.insecure_noauth.unwrap_or(false),
            policy_file: cli.policy_file.or(file.policy_file),
            keystone: KeystoneConfig {
                url: cli.keystone_url.or(file.keystone_url),
                username: cli.keystone_username.or(file.keystone_username),
                password: cli.keystone_password.or(file.keystone_password),
                user_domain: cli
                    .keystone_user_domain
                    .or(file.keystone_user_domain)
                    .unwrap_or_else(|| "Default".into()),
                project: cli
                    .keystone_project
                    .or(file.keystone_project)
                    .unwrap_or_else(|| "service".into()),
                project_domain: cli
                    .keystone_project_domain
                    .or(file.keystone_project_domain)
                    .unwrap_or_else(|| "Default".into()),
                application_credential: match (
                    cli.keystone_application_credential_id
                        .or(file.keystone_application_credential_id),
                    cli.keystone_application_credential_secret
                        .or(file.keystone_application_credential_secret),
                ) {
                    (Some(id), Some(secret)) => Some((id, secret)),
                    (None, None) => None,
                    _ => {
                        anyhow::bail!("keystone_application_credential_id and _secret go together")
                    }
                },
                token_cache_size: cli
                    .token_cache_size
                    .or(file.token_cache_size)
                    .unwrap_or(10_000),
                token_revalidate_seconds: cli
                    .token_revalidate_seconds
                    .or(file.token_revalidate_seconds)
                    .unwrap_or(60),
            },
            noauth_project_id: cli
                .noauth_project_id
                .or(file.noauth_project_id)
                .unwrap_or_else(|| crate::ids::keystone_like_id("project", "admin")),
            noauth_user_id: cli
                .noauth_user_id
                .or(file.noauth_user_id)
                .unwrap_or_else(|| crate::ids::keystone_like_id("user", "admin")),
            poll_interval: std::time::Duration::from_secs_f64(poll),
            cleaning_minutes,
            action_workers: cli
                .action_workers
                .or(file.action_workers)
                .unwrap_or(default_action_workers(backend))
                .clamp(1, 1024),
            // A week at most: a lease waiting longer on a cloud that does not answer is
            // better in ERROR, where its owner sees it.
            action_retry_for: cli
                .action_retry_minutes
                .or(file.action_retry_minutes)
                .map_or(blazar_service::Settings::default().action_retry_for, |m| {
                    std::time::Duration::from_secs(m.min(7 * 24 * 60) * 60)
                }),
            action_attempts: cli
                .action_attempts
                .or(file.action_attempts)
                .map(|n| n.clamp(1, 100_000)),
            action_timeout: std::time::Duration::from_secs(
                cli.action_timeout
                    .or(file.action_timeout)
                    .unwrap_or(300)
                    .clamp(1, 3600),
            ),
            minutes_before_end_lease,
            sqlite_synchronous: cli
                .sqlite_synchronous
                .or(file.sqlite_synchronous)
                .unwrap_or(SqliteSynchronous::Full),
            ratios,
            connections,
            enforcement,
            quotas,
            webhooks,
            log: cli.log.or(file.log).unwrap_or_else(|| "info".into()),
            log_format: cli.log_format.or(file.log_format).unwrap_or_default(),
            metrics_access: cli
                .metrics_access
                .or(file.metrics_access)
                .unwrap_or_default(),
            max_waiters: cli
                .max_waiters
                .or(file.max_waiters)
                .unwrap_or(1024)
                // 0: none at all (every stream, and every poll that would wait, is a 503).
                .min(1_000_000),
        })
    }
}

impl Config {
    /// Settings of `/metrics`, long polls and event streams. A long poll must answer within
    /// the request timeout, so the longest wait stays a second short of it (5 min at most).
    pub fn observe_settings(&self) -> crate::state::ObserveSettings {
        let max_wait = self
            .connections
            .request_timeout
            .saturating_sub(std::time::Duration::from_secs(1))
            .clamp(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(300),
            );
        crate::state::ObserveSettings {
            metrics_access: self.metrics_access,
            max_waiters: self.max_waiters,
            max_wait,
            // An open stream is held to what a request is: a revoked or expired token stops
            // it within the revalidation interval (Keystone's cache is asked each time).
            recheck: std::time::Duration::from_secs(self.keystone.token_revalidate_seconds.max(1)),
        }
    }

    /// How long one take-back waits for servers to be deleted: as configured, but ending
    /// 30 s before the attempt's own limit (`action_timeout`), so that an attempt that runs
    /// out of patience says so and is retried rather than cut off without a reason.
    pub fn server_delete_wait(&self) -> std::time::Duration {
        let limit = self
            .action_timeout
            .saturating_sub(std::time::Duration::from_secs(30))
            .max(std::time::Duration::from_secs(1));
        if self.openstack.server_delete_timeout > limit {
            tracing::warn!(
                server_delete_timeout = self.openstack.server_delete_timeout.as_secs(),
                action_timeout = self.action_timeout.as_secs(),
                "server_delete_timeout shortened to {} s to end within one action attempt",
                limit.as_secs()
            );
        }
        self.openstack.server_delete_timeout.min(limit)
    }

    /// The store's SQLite durability setting.
    pub fn sqlite_sync(&self) -> blazar_service::SqliteSync {
        match self.sqlite_synchronous {
            SqliteSynchronous::Full => blazar_service::SqliteSync::Full,
            SqliteSynchronous::Normal => blazar_service::SqliteSync::Normal,
        }
    }

    /// Whether this process serves the API.
    pub fn serves_api(&self) -> bool {
        self.role != Role::Manager
    }

    /// Refuses to serve without authentication on an address other machines can reach,
    /// unless the operator said so explicitly.
    pub fn check_noauth_exposure(&self) -> anyhow::Result<()> {
        if self.auth == AuthMode::Noauth
            && self.serves_api()
            && !self.listen.ip().is_loopback()
            && !self.insecure_noauth
        {
            anyhow::bail!(
                "refusing to serve without authentication (auth = noauth) on {}, which is not a \
                 loopback address: anyone who can reach it could act as any project, admin \
                 included. Use --auth keystone or --auth tokens, listen on 127.0.0.1, or pass \
                 --insecure-noauth to accept the risk",
                self.listen
            );
        }
        Ok(())
    }

    /// The Keystone client settings; fails if a required one is missing.
    /// The OpenStack backend's session: the --keystone-* service credentials, the catalog
    /// interface and region, endpoint overrides, timeouts.
    pub fn openstack_session(&self) -> anyhow::Result<blazar_openstack::SessionConfig> {
        let k = &self.keystone;
        let (Some(url), Some(username), Some(password)) = (&k.url, &k.username, &k.password) else {
            anyhow::bail!(
                "backend = openstack needs the service credentials: --keystone-url, \
                 --keystone-username and BLAZAR_KEYSTONE_PASSWORD (or the same keys in the file)"
            );
        };
        Ok(blazar_openstack::SessionConfig {
            auth_url: url.clone(),
            credentials: blazar_openstack::Credentials::Password {
                username: username.clone(),
                password: password.expose().to_string(),
                user_domain: k.user_domain.clone(),
                project: k.project.clone(),
                project_domain: k.project_domain.clone(),
            },
            region: self.openstack.region.clone(),
            interface: self.openstack.interface.clone(),
            endpoint_overrides: self.openstack.endpoints.iter().cloned().collect(),
            timeout: self.openstack.timeout,
        })
    }

    pub fn keystone_settings(&self) -> anyhow::Result<crate::keystone::KeystoneSettings> {
        let k = &self.keystone;
        let missing: Vec<&str> = [
            ("keystone_url", k.url.is_none()),
            ("keystone_username", k.username.is_none()),
            ("keystone_password", k.password.is_none()),
        ]
        .into_iter()
        .filter(|(_, absent)| *absent)
        .map(|(name, _)| name)
        .collect();
        if !missing.is_empty() {
            anyhow::bail!(
                "auth = keystone needs {} (options --keystone-url, --keystone-username and the \
                 BLAZAR_KEYSTONE_PASSWORD environment variable, or the same keys in the file)",
                missing.join(", ")
            );
        }
        Ok(crate::keystone::KeystoneSettings {
            auth_url: k.url.clone().unwrap_or_default(),
            username: k.username.clone().unwrap_or_default(),
            password: k.password.clone().unwrap_or_default(),
            user_domain_name: k.user_domain.clone(),
            project_name: k.project.clone(),
            project_domain_name: k.project_domain.clone(),
            cache_size: k.token_cache_size,
            revalidate_after: chrono::Duration::seconds(
                i64::try_from(k.token_revalidate_seconds).unwrap_or(i64::MAX / 1000),
            ),
            timeout: std::time::Duration::from_secs(10),
        })
    }
}

/// How the service acts for users: as configured, else as Blazar does (trusts) whenever
/// there is a user's Keystone token to make one with.
fn act_for_user(configured: Option<ActForUser>, auth: AuthMode) -> anyhow::Result<ActForUser> {
    match (configured, auth) {
        (Some(ActForUser::Trust), AuthMode::Noauth | AuthMode::Tokens) => anyhow::bail!(
            "act_for_user = trust needs auth = keystone: a trust is made with the caller's \
             Keystone token. Use --auth keystone, or --act-for-user project to act with the \
             service credentials scoped to the user's project"
        ),
        (Some(mode), _) => Ok(mode),
        (None, AuthMode::Keystone) => Ok(ActForUser::Trust),
        (None, AuthMode::Noauth | AuthMode::Tokens) => Ok(ActForUser::Project),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        let mut argv = vec!["blazar-server"];
        argv.extend_from_slice(args);
        Config::resolve(Cli::parse_from(argv)).unwrap()
    }

    #[test]
    fn a_take_back_waits_for_servers_within_one_action_attempt() {
        let secs = |args: &[&str]| config(args).server_delete_wait().as_secs();
        assert_eq!(secs(&[]), 240);
        assert_eq!(secs(&["--server-delete-timeout", "100"]), 100);
        assert_eq!(
            secs(&["--action-timeout", "60", "--server-delete-timeout", "600"]),
            30
        );
        assert_eq!(secs(&["--action-timeout", "10"]), 1);
    }

    #[test]
    fn noauth_is_refused_beyond_loopback_unless_insecure() {
        let rows: &[(&[&str], bool)] = &[
            (&["--listen", "127.0.0.1:1234"], true),
            (&["--listen", "[::1]:1234"], true),
            (&["--listen", "0.0.0.0:1234"], false),
            (&["--listen", "192.0.2.10:1234"], false),
            (&["--listen", "0.0.0.0:1234", "--insecure-noauth"], true),
            (&["--listen", "0.0.0.0:1234", "--auth", "tokens"], true),
            (&["--listen", "0.0.0.0:1234", "--role", "manager"], true),
        ];
        for (args, ok) in rows {
            let result = config(args).check_noauth_exposure();
            assert_eq!(result.is_ok(), *ok, "{args:?}: {result:?}");
        }
        let err = config(&["--listen", "0.0.0.0:1234"])
            .check_noauth_exposure()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--insecure-noauth"), "{err}");
    }

    #[test]
    fn acting_for_users_is_through_trusts_wherever_keystone_tokens_are() {
        let rows: &[(&[&str], Option<ActForUser>)] = &[
            (&["--auth", "keystone"], Some(ActForUser::Trust)),
            (
                &["--auth", "keystone", "--act-for-user", "project"],
                Some(ActForUser::Project),
            ),
            (
                &["--auth", "keystone", "--act-for-user", "trust"],
                Some(ActForUser::Trust),
            ),
            (&[], Some(ActForUser::Project)),
            (&["--auth", "tokens"], Some(ActForUser::Project)),
            (
                &["--auth", "tokens", "--act-for-user", "project"],
                Some(ActForUser::Project),
            ),
            // No user's Keystone token to make a trust with: refused at start.
            (&["--act-for-user", "trust"], None),
            (&["--auth", "tokens", "--act-for-user", "trust"], None),
        ];
        for (args, expected) in rows {
            let mut argv = vec!["blazar-server"];
            argv.extend_from_slice(args);
            let resolved = Config::resolve(Cli::parse_from(argv));
            match (resolved, expected) {
                (Ok(c), Some(mode)) => assert_eq!(c.act_for_user, *mode, "{args:?}"),
                (Err(e), None) => assert!(
                    e.to_string()
                        .contains("act_for_user = trust needs auth = keystone"),
                    "{e}"
                ),
                (other, _) => panic!("{args:?}: {:?}", other.map(|c| c.act_for_user)),
            }
        }
        let file: FileConfig = toml::from_str("act_for_user = \"project\"").unwrap();
        assert_eq!(file.act_for_user, Some(ActForUser::Project));
    }

    #[test]
    fn keystone_settings_need_url_user_and_password() {
        let err = config(&["--auth", "keystone", "--keystone-url", "http://k:5000"])
            .keystone_settings()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("keystone_username, keystone_password"),
            "{err}"
        );
        let settings = config(&[
            "--auth",
            "keystone",
            "--keystone-url",
            "http://k:5000",
            "--keystone-username",
            "blazar",
            "--keystone-password",
            "s3cret",
        ])
        .keystone_settings()
        .unwrap();
        assert_eq!(settings.project_name, "service");
        assert_eq!(settings.user_domain_name, "Default");
        assert_eq!(settings.revalidate_after, chrono::Duration::seconds(60));
        // The password never shows in debug output, hence in no log line.
        assert!(!format!("{settings:?}").contains("s3cret"));
    }

    #[test]
    fn durability_ratios_and_connection_limits_have_safe_defaults() {
        let c = config(&[]);
        assert_eq!(c.sqlite_synchronous, SqliteSynchronous::Full);
        assert_eq!(c.sqlite_sync(), blazar_service::SqliteSync::Full);
        assert_eq!(c.ratios, blazar_service::Ratios::default());
        assert_eq!(c.connections, crate::listener::ConnectionLimits::default());
        let c = config(&[
            "--sqlite-synchronous",
            "normal",
            "--cpu-allocation-ratio",
            "16",
            "--ram-allocation-ratio",
            "1.5",
            "--max-client-connections",
            "100",
            "--header-read-timeout",
            "2.5",
            "--idle-timeout",
            "30",
        ]);
        assert_eq!(c.sqlite_sync(), blazar_service::SqliteSync::Normal);
        assert_eq!(
            (c.ratios.cpu, c.ratios.ram, c.ratios.disk),
            (16.0, 1.5, 1.0)
        );
        assert_eq!(c.connections.max_connections, 100);
        assert_eq!(
            c.connections.header_read_timeout,
            std::time::Duration::from_millis(2_500)
        );
        assert_eq!(
            c.connections.idle_timeout,
            std::time::Duration::from_secs(30)
        );
        for bad in [
            &["--cpu-allocation-ratio", "0"][..],
            &["--ram-allocation-ratio=-1"],
            &["--disk-allocation-ratio", "NaN"],
            &["--max-client-connections", "0"],
            &["--header-read-timeout", "0"],
            &["--idle-timeout=-5"],
        ] {
            let mut argv = vec!["blazar-server"];
            argv.extend_from_slice(bad);
            assert!(Config::resolve(Cli::parse_from(argv)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn action_workers_default_to_what_the_backend_bears() {
        assert_eq!(config(&[]).action_workers, 64);
        assert_eq!(config(&["--action-workers", "8"]).action_workers, 8);
        assert_eq!(config(&["--action-workers", "0"]).action_workers, 1);
        assert_eq!(default_action_workers(BackendKind::Openstack), 16);
    }

    #[test]
    fn token_subcommands_parse_with_global_options_anywhere() {
        let cli = Cli::parse_from([
            "blazar-server",
            "token",
            "create",
            "--project",
            "p",
            "--role",
            "member,reader",
            "--role",
            "admin",
            "--database-url",
            "x.db",
        ]);
        assert_eq!(cli.database_url.as_deref(), Some("x.db"));
        match cli.command {
            Some(Command::Token(TokenCommand::Create { project, roles, .. })) => {
                assert_eq!(project, "p");
                assert_eq!(roles, vec!["member", "reader", "admin"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn novas_notifications_are_read_only_when_asked_for() {
        assert_eq!(config(&["--backend", "openstack"]).nova_notifications, None);
        // Blazar reads them through its one notification transport: so does blazar-rs,
        // unless told another.
        let n = config(&[
            "--backend",
            "openstack",
            "--notifications-transport-url",
            "rabbit://u:secret@mq:5672/blazar",
            "--monitor-notifications",
            "true",
        ])
        .nova_notifications
        .unwrap();
        assert_eq!(n.transport_url.expose(), "rabbit://u:secret@mq:5672/blazar");
        assert_eq!(n.topics, ["notifications", "versioned_notifications"]);
        assert_eq!(n.exchange, "nova");
        assert!(!format!("{n:?}").contains("secret"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blazar.toml");
        std::fs::write(
            &path,
            "backend = \"openstack\"\n[monitor]\nnotifications = true\n\
             transport_url = \"rabbit://nova:pw@mq2/nova\"\ntopics = [\"versioned_notifications\"]\n\
             exchange = \"compute\"\n",
        )
        .unwrap();
        let n = config(&["--config", path.to_str().unwrap()])
            .nova_notifications
            .unwrap();
        assert_eq!(n.transport_url.expose(), "rabbit://nova:pw@mq2/nova");
        assert_eq!(n.topics, ["versioned_notifications"]);
        assert_eq!(n.exchange, "compute");

        let refused = |args: &[&str]| {
            let mut all = vec!["blazar-server"];
            all.extend_from_slice(args);
            Config::resolve(Cli::parse_from(all))
                .unwrap_err()
                .to_string()
        };
        let err = refused(&["--backend", "openstack", "--monitor-notifications", "true"]);
        assert!(err.contains("transport URL"), "{err}");
        let err = refused(&["--monitor-notifications", "true"]);
        assert!(err.contains("--backend openstack"), "{err}");
        let err = refused(&[
            "--backend",
            "openstack",
            "--monitor-interval",
            "0",
            "--monitor-notifications",
            "true",
            "--monitor-transport-url",
            "rabbit://mq/",
        ]);
        assert!(err.contains("--monitor-interval"), "{err}");
        let err = refused(&[
            "--backend",
            "openstack",
            "--monitor-notifications",
            "true",
            "--monitor-transport-url",
            "kafka://mq/",
        ]);
        assert!(err.contains("rabbit://"), "{err}");
    }

    #[test]
    fn notifications_come_from_the_file_table_or_the_options() {
        assert_eq!(config(&[]).notifications, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blazar.toml");
        std::fs::write(
            &path,
            "[notifications]\ntransport_url = \"rabbit://u:secret@mq:5672/blazar\"\n\
             topics = [\"notifications\", \"billing\"]\ndurable = true\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let n = config(&["--config", file]).notifications.unwrap();
        assert_eq!(n.transport_url.expose(), "rabbit://u:secret@mq:5672/blazar");
        assert_eq!(n.topics, ["notifications", "billing"]);
        assert_eq!(
            (n.exchange.as_str(), n.publisher_id.as_str(), n.durable),
            ("openstack", "blazar.lease", true)
        );
        assert!(!format!("{n:?}").contains("secret"));
        let n = config(&[
            "--config",
            file,
            "--notifications-exchange",
            "blazar",
            "--notifications-topics",
            "other",
        ])
        .notifications
        .unwrap();
        assert_eq!(
            (n.exchange.as_str(), n.topics.as_slice()),
            ("blazar", &["other".to_string()][..])
        );
        let bad = Cli::parse_from([
            "blazar-server",
            "--notifications-transport-url",
            "kafka://broker:9092",
        ]);
        let err = Config::resolve(bad).unwrap_err().to_string();
        assert!(err.contains("rabbit://"), "{err}");
    }

    #[test]
    fn webhooks_reach_internal_addresses_only_where_callers_are_trusted() {
        assert!(
            config(&[]).webhooks.allow_internal,
            "noauth trusts every caller"
        );
        assert!(!config(&["--auth", "tokens"]).webhooks.allow_internal);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blazar.toml");
        std::fs::write(&path, "[webhooks]\nallow_internal = true\n").unwrap();
        let file = path.to_str().unwrap();
        assert!(
            config(&["--auth", "tokens", "--config", file])
                .webhooks
                .allow_internal
        );
        let off = config(&["--config", file, "--webhook-allow-internal", "false"]);
        assert!(!off.webhooks.allow_internal);
    }

    #[test]
    fn quotas_come_from_the_file_table_or_the_options() {
        use blazar_core::quota::QuotaKind;
        assert_eq!(config(&[]).quotas, blazar_service::QuotaSettings::default());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blazar.toml");
        std::fs::write(
            &path,
            "[quotas]\nhosts = 10\nhost_hours_per_month = 5000\n\
             [quotas.host_weights]\n\"node_type=gpu\" = 2.0\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let q = config(&["--config", file]).quotas;
        assert_eq!(q.defaults.limit(QuotaKind::Hosts), Some(10));
        assert_eq!(q.defaults.limit(QuotaKind::HostHoursPerMonth), Some(5000));
        assert_eq!(q.defaults.limit(QuotaKind::Instances), None);
        assert_eq!(
            q.host_weights,
            [blazar_service::HostWeight {
                key: "node_type".into(),
                value: "gpu".into(),
                weight: 2.0
            }]
        );
        let q = config(&[
            "--config",
            file,
            "--quota-hosts",
            "-1",
            "--quota-host-weight",
            "node_type=fpga:1.5,gpu=a=b:3",
        ])
        .quotas;
        assert_eq!(q.defaults.limit(QuotaKind::Hosts), None);
        assert_eq!(
            q.host_weights
                .iter()
                .map(|w| (w.key.as_str(), w.value.as_str(), w.weight))
                .collect::<Vec<_>>(),
            [("node_type", "fpga", 1.5), ("gpu", "a=b", 3.0)]
        );
        for bad in [
            &["--quota-hosts", "-2"][..],
            &["--quota-host-weight", "node_type:2"],
            &["--quota-host-weight", "node_type=gpu:x"],
            &["--quota-host-weight", "node_type=gpu:-1"],
        ] {
            let mut argv = vec!["blazar-server"];
            argv.extend_from_slice(bad);
            assert!(Config::resolve(Cli::parse_from(argv)).is_err(), "{bad:?}");
        }
    }
}
