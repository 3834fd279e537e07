//! `lease-actions` and `action-list` (`/v1/leases/{id}/actions`, `/v1/actions`): what was
//! done, or is being done, in the cloud for leases, and why something failed.

use clap::Args;
use serde_json::{Map, Value};

use super::leases::LEASES;
use super::output::{ListOutput, render_list};
use super::resolve::find_id;
use super::{CliResult, Context, emit};
use blazar_client::client::{query_string, segment};

const LEASE_COLUMNS: &[&str] = &[
    "seq",
    "kind",
    "purpose",
    "resource_type",
    "resources",
    "status",
    "attempts",
    "last_error",
    "updated_at",
];
const LIST_COLUMNS: &[&str] = &[
    "seq",
    "lease_id",
    "project_id",
    "kind",
    "purpose",
    "resource_type",
    "status",
    "attempts",
    "last_error",
    "created_at",
];
const STATUSES: [&str; 5] = ["pending", "running", "done", "failed", "cancelled"];

/// List what was done in the cloud for a lease (also once it is deleted, by id)
#[derive(Debug, Args)]
pub struct LeaseActionsArgs {
    /// ID or name of the lease (a deleted lease by its ID)
    #[arg(value_name = "LEASE")]
    id: String,
    #[command(flatten)]
    out: ListOutput,
}

/// List actions of every lease you may see, deleted leases included, newest first
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only actions in this status (repeatable)
    #[arg(long, value_parser = STATUSES)]
    status: Vec<String>,
    /// Only the actions of this lease (ID)
    #[arg(long, value_name = "LEASE_ID")]
    lease: Option<String>,
    /// Only the actions of this project (admin; yours otherwise)
    #[arg(long, value_name = "PROJECT_ID")]
    project: Option<String>,
    /// At most this many (the server answers at most 1000 at once)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Start after this action (the seq of the last one of the page before)
    #[arg(long, value_name = "SEQ")]
    marker: Option<i64>,
    #[command(flatten)]
    out: ListOutput,
}

pub async fn lease_actions(ctx: &Context, args: LeaseActionsArgs) -> CliResult {
    let id = find_id(ctx, &LEASES, &args.id).await?;
    let path = format!("/leases/{}/actions", segment(&id));
    let items: Vec<Map<String, Value>> = ctx.client.get(&path, "actions").await?;
    emit(&render_list(&items, LEASE_COLUMNS, &args.out)?);
    Ok(())
}

pub async fn list(ctx: &Context, args: ListArgs) -> CliResult {
    let statuses = (!args.status.is_empty()).then(|| args.status.join(","));
    let limit = args.limit.map(|n| n.to_string());
    let marker = args.marker.map(|n| n.to_string());
    let path = format!(
        "/actions{}",
        query_string(&[
            ("status", statuses.as_deref()),
            ("lease_id", args.lease.as_deref()),
            ("project_id", args.project.as_deref()),
            ("limit", limit.as_deref()),
            ("marker", marker.as_deref()),
        ])
    );
    let items: Vec<Map<String, Value>> = ctx.client.get(&path, "actions").await?;
    emit(&render_list(&items, LIST_COLUMNS, &args.out)?);
    Ok(())
}
