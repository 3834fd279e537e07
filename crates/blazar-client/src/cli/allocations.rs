//! `allocation-list TYPE` and `allocation-show TYPE RESOURCE`: which reservations hold which
//! resources. Filters apply on the client, as python-blazarclient applies them.

use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::human::localize;
use super::inventory::Kind;
use super::leases::show_object;
use super::output::{
    ShowOutput, SortedListOutput, check_sort, render_list, sort_by_default, sort_objects,
};
use super::resolve::{IdShape, Lookup, find_id};
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResourceType {
    Host,
    Network,
    Device,
}

impl ResourceType {
    fn kind(self) -> &'static Kind {
        match self {
            ResourceType::Host => &Kind::HOST,
            ResourceType::Network => &Kind::NETWORK,
            ResourceType::Device => &Kind::DEVICE,
        }
    }
}

const LIST_COLUMNS: &[&str] = &["resource_id", "reservations"];

/// List allocations for all resources of a type
#[derive(Debug, Args)]
#[command(mut_args(sort_by_default("resource_id")))]
pub struct ListArgs {
    /// Show allocations for a resource type
    #[arg(value_enum)]
    resource_type: ResourceType,
    /// Show only allocations with specific reservation_id
    #[arg(long)]
    reservation_id: Option<String>,
    /// Show only allocations with specific lease_id
    #[arg(long)]
    lease_id: Option<String>,
    #[command(flatten)]
    list: SortedListOutput,
}

/// Show allocations for resource identified by type and ID
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Show allocations for a resource type
    #[arg(value_enum)]
    resource_type: ResourceType,
    /// ID or name of resource to look up
    #[arg(value_name = "RESOURCE")]
    id: String,
    /// Show only allocations with specific reservation_id
    #[arg(long)]
    reservation_id: Option<String>,
    /// Show only allocations with specific lease_id
    #[arg(long)]
    lease_id: Option<String>,
    #[command(flatten)]
    out: ShowOutput,
}

/// Keeps the reservations of `allocation` that match the filters.
fn filter(
    allocation: &mut Map<String, Value>,
    lease_id: Option<&str>,
    reservation_id: Option<&str>,
) {
    if let Some(Value::Array(reservations)) = allocation.get_mut("reservations") {
        reservations.retain(|r| {
            lease_id.is_none_or(|l| r.get("lease_id").and_then(Value::as_str) == Some(l))
                && reservation_id.is_none_or(|id| r.get("id").and_then(Value::as_str) == Some(id))
        });
    }
}

pub async fn list(ctx: &Context, args: ListArgs) -> CliResult {
    check_sort(&args.list.sort_by, LIST_COLUMNS)?;
    let kind = args.resource_type.kind();
    let mut items: Vec<Map<String, Value>> = ctx
        .client
        .get(&format!("{}/allocations", kind.path), "allocations")
        .await?;
    for item in &mut items {
        filter(
            item,
            args.lease_id.as_deref(),
            args.reservation_id.as_deref(),
        );
    }
    sort_objects(&mut items, &args.list.sort_by);
    if args.list.out.is_human() {
        items.iter_mut().for_each(|item| localize(item, ctx.utc));
    }
    emit(&render_list(&items, LIST_COLUMNS, &args.list.out)?);
    Ok(())
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let kind = args.resource_type.kind();
    // The Python client resolves names against the resource list, keyed like its own
    // `<type>-show` (hosts by hypervisor_hostname).
    let lookup = Lookup {
        resource: match args.resource_type {
            ResourceType::Host => "host",
            ResourceType::Network => "network",
            ResourceType::Device => "device",
        },
        list_path: kind.path,
        list_key: kind.plural,
        name_keys: kind.name_keys,
        shape: if args.resource_type == ResourceType::Host {
            IdShape::NumericOrUuid
        } else {
            IdShape::Uuid
        },
        list_command: match args.resource_type {
            ResourceType::Host => "host-list",
            ResourceType::Network => "network-list",
            ResourceType::Device => "device-list",
        },
    };
    let id = find_id(ctx, &lookup, &args.id).await?;
    let mut allocation: Map<String, Value> = ctx
        .client
        .get(
            &format!("{}/{}/allocation", kind.path, segment(&id)),
            "allocation",
        )
        .await?;
    filter(
        &mut allocation,
        args.lease_id.as_deref(),
        args.reservation_id.as_deref(),
    );
    emit(&show_object(ctx, allocation, &args.out)?);
    Ok(())
}
