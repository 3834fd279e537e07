//! `quota-*` commands (`/v1/quotas`): per-project limits. Admins set and remove a project's
//! overrides; a project's readers may show its own.

use clap::Args;
use serde_json::{Map, Value};

use super::leases::{delete_and_say, show_object};
use super::output::{ShowOutput, SortedListOutput, check_sort, render_list, sort_objects};
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

/// The project, then its limits in the order the API lists them.
const LIST_COLUMNS: &[&str] = &[
    "project_id",
    "hosts",
    "floatingips",
    "instances",
    "max_lease_duration",
    "max_start_ahead",
    "host_hours_per_month",
];

/// The limits: every list column but the project.
const LIMITS: &[&str] = LIST_COLUMNS.split_at(1).1;

/// Show a project's quotas (-1: no limit) and what it holds now
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID of the project
    #[arg(value_name = "PROJECT_ID")]
    project_id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Set a project's quota overrides (admin); the others keep their values
#[derive(Debug, Args)]
pub struct SetArgs {
    /// ID of the project
    #[arg(value_name = "PROJECT_ID")]
    project_id: String,
    /// Hosts held at any one instant (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    hosts: Option<i64>,
    /// Floating IPs held at any one instant (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    floatingips: Option<i64>,
    /// Instance slots held at any one instant (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    instances: Option<i64>,
    /// Longest lease, in seconds (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    max_lease_duration: Option<i64>,
    /// Furthest ahead a lease may start, in seconds (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    max_start_ahead: Option<i64>,
    /// Weighted host-hours per calendar month, UTC (-1: no limit)
    #[arg(long, allow_negative_numbers = true)]
    host_hours_per_month: Option<i64>,
    /// Give a limit back to the default (can be repeated)
    #[arg(long, value_name = "QUOTA", value_parser = clap::builder::PossibleValuesParser::new(LIMITS))]
    unset: Vec<String>,
    #[command(flatten)]
    out: ShowOutput,
}

/// Remove a project's quota overrides (admin): the defaults apply again
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID of the project
    #[arg(value_name = "PROJECT_ID")]
    project_id: String,
}

/// A quota as one flat object: the limits, the overridden ones by name, and the usage
/// under `usage_` keys.
fn flatten(mut quota: Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for key in LIST_COLUMNS {
        if let Some(v) = quota.remove(*key) {
            out.insert((*key).to_string(), v);
        }
    }
    if let Some(Value::Object(overrides)) = quota.remove("overrides") {
        let named: Vec<&str> = LIMITS
            .iter()
            .copied()
            .filter(|k| overrides.contains_key(*k))
            .collect();
        out.insert("overrides".into(), Value::String(named.join(", ")));
    }
    if let Some(Value::Object(usage)) = quota.remove("usage") {
        for (k, v) in usage {
            out.insert(format!("usage_{k}"), v);
        }
    }
    out.extend(quota);
    out
}

pub async fn list(ctx: &Context, list: SortedListOutput) -> CliResult {
    check_sort(&list.sort_by, LIST_COLUMNS)?;
    let items: Vec<Map<String, Value>> = ctx.client.get("/quotas", "quotas").await?;
    let mut items: Vec<Map<String, Value>> = items.into_iter().map(flatten).collect();
    sort_objects(&mut items, &list.sort_by);
    emit(&render_list(&items, LIST_COLUMNS, &list.out)?);
    Ok(())
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let quota: Map<String, Value> = ctx
        .client
        .get(&format!("/quotas/{}", segment(&args.project_id)), "quota")
        .await?;
    emit(&show_object(ctx, flatten(quota), &args.out)?);
    Ok(())
}

pub async fn set(ctx: &Context, args: SetArgs) -> CliResult {
    let mut body = Map::new();
    for (key, value) in [
        ("hosts", args.hosts),
        ("floatingips", args.floatingips),
        ("instances", args.instances),
        ("max_lease_duration", args.max_lease_duration),
        ("max_start_ahead", args.max_start_ahead),
        ("host_hours_per_month", args.host_hours_per_month),
    ] {
        if let Some(v) = value {
            body.insert(key.into(), Value::from(v));
        }
    }
    for key in &args.unset {
        body.insert(key.clone(), Value::Null);
    }
    if body.is_empty() {
        return Err(super::Failure::plain(
            "Nothing to set: give one or more limits (--hosts, --floatingips, --instances, \
             --max-lease-duration, --max-start-ahead, --host-hours-per-month) or --unset",
        ));
    }
    let quota: Map<String, Value> = ctx
        .client
        .put(
            &format!("/quotas/{}", segment(&args.project_id)),
            "quota",
            &Value::Object(body),
        )
        .await?;
    let table = show_object(ctx, flatten(quota), &args.out)?;
    emit(&format!(
        "Updated quota of project {}:\n{table}",
        args.project_id
    ));
    Ok(())
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let path = format!("/quotas/{}", segment(&args.project_id));
    delete_and_say(ctx, &path, "quota overrides of project", &args.project_id).await
}
