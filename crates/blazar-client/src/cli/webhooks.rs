//! `webhook-*` commands (`/v1/webhooks`): lease events POSTed to an endpoint of yours,
//! signed with a secret shown once at creation.

use clap::Args;
use reqwest::Method;
use serde_json::{Map, Value};

use super::leases::{Listing, delete_and_say, get_and_show, show_object};
use super::output::{ListOutput, ShowOutput, render_list};
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

/// What `webhook-list` lists.
pub const LIST: Listing = Listing {
    path: "/webhooks",
    key: "webhooks",
    columns: &["id", "project_id", "url", "event_types", "created_at"],
};
const DELIVERY_COLUMNS: &[&str] = &[
    "id",
    "event_type",
    "lease_id",
    "status",
    "sending",
    "attempts",
    "last_result",
    "next_attempt_at",
    "created_at",
];

/// Register a webhook: your project's lease events are POSTed to URL, signed
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The http(s) endpoint that receives the events
    #[arg(value_name = "URL")]
    url: String,
    /// An event type to receive (repeatable; default: every type)
    #[arg(long = "event-type", value_name = "EVENT_TYPE")]
    event_types: Vec<String>,
    /// The project whose events it receives (default: yours; another needs admin)
    #[arg(long, value_name = "PROJECT_ID", conflicts_with = "all_projects")]
    project: Option<String>,
    /// Receive every project's events (admin)
    #[arg(long)]
    all_projects: bool,
    /// What the webhook is for
    #[arg(long, default_value = "")]
    description: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Show a webhook
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID of the webhook
    #[arg(value_name = "WEBHOOK_ID")]
    id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Delete a webhook; its pending deliveries are dropped
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID of the webhook
    #[arg(value_name = "WEBHOOK_ID")]
    id: String,
}

/// List a webhook's latest deliveries
#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    /// ID of the webhook
    #[arg(value_name = "WEBHOOK_ID")]
    id: String,
    /// Only deliveries in this status
    #[arg(long, value_parser = ["pending", "delivered", "dead"])]
    status: Option<String>,
    /// At most this many (default and most: 1000), newest first
    #[arg(long)]
    limit: Option<u32>,
    /// Only those older than this delivery (the last of the page before)
    #[arg(long, value_name = "DELIVERY_ID")]
    marker: Option<String>,
    #[command(flatten)]
    out: ListOutput,
}

/// Try a delivery again now (a dead letter, once the endpoint is back)
#[derive(Debug, Args)]
pub struct RedeliverArgs {
    /// ID of the webhook
    #[arg(value_name = "WEBHOOK_ID")]
    id: String,
    /// ID of the delivery (webhook-deliveries lists them)
    #[arg(value_name = "DELIVERY_ID")]
    delivery: String,
}

pub async fn create(ctx: &Context, args: CreateArgs) -> CliResult {
    let mut body = Map::new();
    body.insert("url".into(), Value::String(args.url));
    if !args.event_types.is_empty() {
        body.insert(
            "event_types".into(),
            Value::Array(args.event_types.into_iter().map(Value::String).collect()),
        );
    }
    if let Some(project) = args.project {
        body.insert("project_id".into(), Value::String(project));
    }
    if args.all_projects {
        body.insert("all_projects".into(), Value::Bool(true));
    }
    body.insert("description".into(), Value::String(args.description));
    let hook: Map<String, Value> = ctx
        .client
        .post("/webhooks", "webhook", &Value::Object(body))
        .await?;
    let table = show_object(ctx, hook, &args.out)?;
    emit(&format!("Created a new webhook:\n{table}"));
    Ok(())
}

pub async fn show(ctx: &Context, args: ShowArgs) -> CliResult {
    let path = format!("/webhooks/{}", segment(&args.id));
    get_and_show(ctx, &path, "webhook", &args.out).await
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let path = format!("/webhooks/{}", segment(&args.id));
    delete_and_say(ctx, &path, "webhook", &args.id).await
}

pub async fn deliveries(ctx: &Context, args: DeliveriesArgs) -> CliResult {
    let mut params = Vec::new();
    if let Some(status) = &args.status {
        params.push(format!("status={status}"));
    }
    if let Some(limit) = args.limit {
        params.push(format!("limit={limit}"));
    }
    if let Some(marker) = &args.marker {
        params.push(format!("marker={}", segment(marker)));
    }
    let mut path = format!("/webhooks/{}/deliveries", segment(&args.id));
    if !params.is_empty() {
        path.push_str(&format!("?{}", params.join("&")));
    }
    let items: Vec<Map<String, Value>> = ctx.client.get(&path, "deliveries").await?;
    emit(&render_list(&items, DELIVERY_COLUMNS, &args.out)?);
    Ok(())
}

pub async fn redeliver(ctx: &Context, args: RedeliverArgs) -> CliResult {
    ctx.client
        .send(
            Method::POST,
            &format!(
                "/webhooks/{}/deliveries/{}/redeliver",
                segment(&args.id),
                segment(&args.delivery)
            ),
            Some(&Value::Object(Map::new())),
        )
        .await?;
    emit(&format!(
        "Delivery {} of webhook {} will be tried again now\n",
        args.delivery, args.id
    ));
    Ok(())
}
