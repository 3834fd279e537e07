//! `flavor-*` commands: standalone flavors (`/v1/flavors`) that `flavor:instance`
//! reservations name by `flavor_id` on sites without Nova. The object follows Nova's
//! flavor: `id`, `name`, `vcpus`, `ram` (MB), `disk` (GB), `extra_specs`.

use clap::Args;
use serde_json::{Map, Value};

use super::leases::{Listing, delete_and_say, get_and_show, show_object};
use super::output::ShowOutput;
use super::resolve::{IdShape, Lookup, find_id};
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

/// What `flavor-list` lists.
pub const LIST: Listing = Listing {
    path: "/flavors",
    key: "flavors",
    columns: &["id", "name", "vcpus", "ram", "disk"],
};

const FLAVORS: Lookup<'static> = Lookup {
    resource: "flavor",
    list_path: "/flavors",
    list_key: "flavors",
    name_keys: &["name"],
    shape: IdShape::Uuid,
    list_command: "flavor-list",
};

/// Show flavor details
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID or name of flavor to look up
    #[arg(value_name = "FLAVOR")]
    id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a flavor
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Name of the flavor
    #[arg(value_name = "FLAVOR")]
    name: String,
    /// Virtual CPUs
    #[arg(long)]
    vcpus: u32,
    /// Memory in MB
    #[arg(long)]
    ram: u64,
    /// Disk in GB
    #[arg(long, default_value_t = 0)]
    disk: u64,
    /// Ephemeral disk in GB
    #[arg(long)]
    ephemeral: Option<u64>,
    /// Id to give the flavor (default: chosen by the server)
    #[arg(long)]
    id: Option<String>,
    /// Extra spec key/value pairs (repeatable)
    #[arg(long = "extra-spec", value_name = "KEY=VALUE")]
    extra_specs: Vec<String>,
    #[command(flatten)]
    out: ShowOutput,
}

/// Delete a flavor
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID or name of flavor to delete
    #[arg(value_name = "FLAVOR")]
    id: String,
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let id = find_id(ctx, &FLAVORS, &args.id).await?;
    let path = format!("/flavors/{}", segment(&id));
    get_and_show(ctx, &path, "flavor", &args.out).await
}

pub async fn create(ctx: &Context, args: CreateArgs) -> CliResult {
    let mut specs = Map::new();
    for pair in &args.extra_specs {
        let (key, value) = pair.split_once('=').unwrap_or((pair.as_str(), ""));
        specs.insert(key.to_string(), Value::String(value.to_string()));
    }
    let body = blazar_client::api::NewFlavor {
        id: args.id.clone().map(Value::String),
        name: Some(Value::String(args.name.clone())),
        vcpus: Some(Value::from(args.vcpus)),
        ram: Some(Value::from(args.ram)),
        disk: Some(Value::from(args.disk)),
        // Nova's name for it, which the server accepts as is.
        nova_ephemeral: args.ephemeral.map(Value::from),
        extra_specs: Some(Value::Object(specs)),
        ..Default::default()
    };
    let object: Map<String, Value> = ctx.client.post("/flavors", "flavor", &body).await?;
    let table = show_object(ctx, object, &args.out)?;
    emit(&format!("Created a new flavor:\n{table}"));
    Ok(())
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let id = find_id(ctx, &FLAVORS, &args.id).await?;
    let path = format!("/flavors/{}", segment(&id));
    delete_and_say(ctx, &path, "flavor", &args.id).await
}
