//! `floatingip-*` commands (`/v1/floatingips`). Floating IPs are named by id only, as in
//! python-blazarclient.

use clap::Args;
use serde_json::{Map, Value};

use super::leases::{Listing, delete_and_say, get_and_show, show_object};
use super::output::ShowOutput;
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

/// What `floatingip-list` lists.
pub const LIST: Listing = Listing {
    path: "/floatingips",
    key: "floatingips",
    columns: &["id", "floating_ip_address", "floating_network_id"],
};

/// Show floating IP details
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID of floatingip to look up
    #[arg(value_name = "FLOATINGIP")]
    id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a floating IP
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// External network ID to which the floating IP belongs
    #[arg(value_name = "NETWORK_ID")]
    network_id: String,
    /// Floating IP address to add to Blazar
    #[arg(value_name = "FLOATING_IP_ADDRESS")]
    floating_ip_address: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Delete a floating IP
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID of floatingip to delete
    #[arg(value_name = "FLOATINGIP")]
    id: String,
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let path = format!("/floatingips/{}", segment(&args.id));
    get_and_show(ctx, &path, "floatingip", &args.out).await
}

pub async fn create(ctx: &Context, args: CreateArgs) -> CliResult {
    let body = blazar_client::api::NewFloatingIp {
        floating_network_id: Some(Value::String(args.network_id.clone())),
        floating_ip_address: Some(Value::String(args.floating_ip_address.clone())),
        ..Default::default()
    };
    let object: Map<String, Value> = ctx.client.post("/floatingips", "floatingip", &body).await?;
    let table = show_object(ctx, object, &args.out)?;
    emit(&format!("Created a new floatingip:\n{table}"));
    Ok(())
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let path = format!("/floatingips/{}", segment(&args.id));
    delete_and_say(ctx, &path, "floatingip", &args.id).await
}
