//! `GET /v1/<resources>/allocations`, streamed: the JSON is written a batch of resources at a
//! time as the client reads it, so the answer's size never sits in the server's memory.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use blazar_service::{AllocationBatch, AllocationEntry, AllocationKind, Identity};

use crate::convert::{from_wire, to_wire};
use crate::error::ApiResult;
use crate::state::AppState;

/// Where the writer is in `{"allocations": [...], "next_marker": ...}`.
enum Part {
    /// The opening and the first batch, read before the answer began.
    Head(Option<AllocationBatch>),
    /// Batches read as the client takes them; whether an entry was written yet.
    Batches {
        written: bool,
    },
    Done,
}

/// The allocation list of `kind`, as the query string asks. Errors found before the first
/// byte (policy, bad parameters, the first batch's read) are ordinary error answers; a read
/// that fails later can only cut the answer short, which a client sees as a broken body.
pub async fn stream_allocations(
    state: &AppState,
    identity: &Identity,
    kind: AllocationKind,
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<Response> {
    let request = from_wire::allocation_list_request(query)?;
    let mut list = state
        .service
        .allocation_list(identity, kind, &request)
        .await?;
    let first = list.next_batch().await?;
    let stream =
        futures::stream::unfold((list, Part::Head(first)), |(mut list, part)| async move {
            match part {
                Part::Head(first) => {
                    let mut out = b"{\"allocations\": [".to_vec();
                    let written = match first {
                        Some(batch) => write_entries(&mut out, batch.entries, false),
                        None => false,
                    };
                    Some((Ok(Bytes::from(out)), (list, Part::Batches { written })))
                }
                Part::Batches { written } => match list.next_batch().await {
                    Ok(Some(batch)) => {
                        // The batch (and its permit) goes once its entries are written.
                        let mut out = Vec::new();
                        let written = write_entries(&mut out, batch.entries, written);
                        Some((Ok(Bytes::from(out)), (list, Part::Batches { written })))
                    }
                    Ok(None) => {
                        let mut out = b"]".to_vec();
                        if let Some(marker) = &list.next_marker {
                            out.extend_from_slice(b", \"next_marker\": ");
                            out.extend_from_slice(&json_string(marker));
                        }
                        out.push(b'}');
                        Some((Ok(Bytes::from(out)), (list, Part::Done)))
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "allocation list cut short");
                        Some((
                            Err(std::io::Error::other(e.to_string())),
                            (list, Part::Done),
                        ))
                    }
                },
                Part::Done => None,
            }
        });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Appends `entries` as JSON array items; `written` says whether an item precedes them.
fn write_entries(out: &mut Vec<u8>, entries: Vec<AllocationEntry>, mut written: bool) -> bool {
    for entry in entries {
        match serde_json::to_vec(&to_wire::allocation(entry)) {
            Ok(item) => {
                if written {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(&item);
                written = true;
            }
            // Strings and numbers always serialise; should one not, the list stays valid.
            Err(e) => tracing::error!(error = %e, "allocation left out of the list"),
        }
    }
    written
}

fn json_string(text: &str) -> Vec<u8> {
    serde_json::to_vec(text).unwrap_or_else(|_| b"null".to_vec())
}
