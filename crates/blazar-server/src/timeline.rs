//! `GET /v1/<resources>/timeline` (additive): occupancy calendars of hosts, floating IPs,
//! network segments and devices.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use blazar_service::{ServiceResult, TimelineBatch, TimelineReader};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::ApiResult;
use crate::extract::{Caller, Query};
use crate::state::AppState;
use crate::stream::{Batches, Pieces, json_value, push_item, stream_json};

/// A timeline being written: the reader and the window's bounds as the wire writes them.
struct TimelineStream {
    reader: TimelineReader,
    start_date: String,
    end_date: String,
}

impl Batches for TimelineStream {
    type Batch = TimelineBatch;

    async fn next_batch(&mut self) -> ServiceResult<Option<TimelineBatch>> {
        self.reader.next_batch().await
    }

    fn write_batch(&self, batch: TimelineBatch, out: &mut Pieces, mut written: bool) -> bool {
        let out = out.bytes();
        for resource in batch.resources {
            let item = to_wire::timeline_resource(resource, &self.start_date, &self.end_date);
            written = push_item(out, &item, b",", written);
        }
        written
    }

    fn suffix(&self) -> Vec<u8> {
        let mut out = b"],\"next_marker\":".to_vec();
        out.extend_from_slice(&json_value(&self.reader.next_marker));
        out.extend_from_slice(b"}}");
        out
    }
}

/// The timeline of `resource_type`, as the query string asks, streamed a batch of
/// resources at a time: `{"timeline": {"resource_type", "start_date", "end_date",
/// "resources": [...], "next_marker"}}`, as `blazar_api::Timeline` reads it.
pub async fn show_timeline(
    state: &AppState,
    identity: &blazar_service::Identity,
    query: &std::collections::HashMap<String, String>,
    resource_type: &'static str,
) -> ApiResult<Response> {
    let request = from_wire::timeline_request(query)?;
    let reader = state
        .service
        .timeline(identity, resource_type, &request)
        .await?;
    let (start_date, end_date) = to_wire::timeline_window(&reader.window);
    let mut prefix = b"{\"timeline\":{\"resource_type\":".to_vec();
    prefix.extend_from_slice(&json_value(&resource_type));
    prefix.extend_from_slice(b",\"start_date\":");
    prefix.extend_from_slice(&json_value(&start_date));
    prefix.extend_from_slice(b",\"end_date\":");
    prefix.extend_from_slice(&json_value(&end_date));
    prefix.extend_from_slice(b",\"resources\":[");
    let source = TimelineStream {
        reader,
        start_date,
        end_date,
    };
    stream_json(prefix, source).await
}

/// `GET /v1/os-hosts/timeline`.
pub async fn host_timeline(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    show_timeline(&state, &identity, &query, blazar_core::PHYSICAL_HOST).await
}

/// The properties the timeline of `resource_type` may be grouped by, with their values.
pub async fn show_timeline_properties(
    state: &AppState,
    identity: &blazar_service::Identity,
    resource_type: &'static str,
) -> ApiResult<impl IntoResponse + use<>> {
    let listing = state
        .service
        .timeline_properties(identity, resource_type)
        .await?;
    Ok(Envelope(
        "resource_properties",
        to_wire::property_listing(listing),
    ))
}

/// `GET /v1/os-hosts/timeline/properties`.
pub async fn host_timeline_properties(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    show_timeline_properties(&state, &identity, blazar_core::PHYSICAL_HOST).await
}
