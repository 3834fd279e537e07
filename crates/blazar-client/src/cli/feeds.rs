//! `ical-feed-*` commands (`/v1/ical-feeds`): a project's leases as a calendar feed that
//! calendar applications subscribe to by URL.

use clap::Args;
use serde_json::{Map, Value};

use super::leases::{Listing, delete_and_say, show_object};
use super::output::ShowOutput;
use super::{CliResult, Context, emit};
use blazar_client::client::segment;

/// What `ical-feed-list` lists.
pub const LIST: Listing = Listing {
    path: "/ical-feeds",
    key: "ical_feeds",
    columns: &[
        "id",
        "project_id",
        "description",
        "created_by",
        "created_at",
    ],
};

/// Create a calendar feed of your project's leases; its URL is shown this once
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The project whose leases the feed shows (default: yours; another needs admin)
    #[arg(long, value_name = "PROJECT_ID")]
    project: Option<String>,
    /// What the feed is for
    #[arg(long, default_value = "")]
    description: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Delete a calendar feed: its URL stops working at once
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID of the feed
    #[arg(value_name = "FEED_ID")]
    id: String,
}

pub async fn create(ctx: &Context, args: CreateArgs) -> CliResult {
    let mut body = Map::new();
    if let Some(project) = args.project {
        body.insert("project_id".into(), Value::String(project));
    }
    body.insert("description".into(), Value::String(args.description));
    let mut feed: Map<String, Value> = ctx
        .client
        .post("/ical-feeds", "ical_feed", &Value::Object(body))
        .await?;
    // The document is served from the server's root, beside the /v1 endpoint.
    if let Some(Value::String(path)) = feed.remove("path") {
        let endpoint = ctx.client.endpoint().trim_end_matches('/');
        let root = endpoint.strip_suffix("/v1").unwrap_or(endpoint);
        feed.insert("url".into(), Value::String(format!("{root}{path}")));
    }
    let table = show_object(ctx, feed, &args.out)?;
    emit(&format!("Created a new calendar feed:\n{table}"));
    Ok(())
}

pub async fn delete(ctx: &Context, args: DeleteArgs) -> CliResult {
    let path = format!("/ical-feeds/{}", segment(&args.id));
    delete_and_say(ctx, &path, "calendar feed", &args.id).await
}
