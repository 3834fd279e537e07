//! `GET /v1/<resources>/allocations`, streamed: the JSON is written a batch of resources at a
//! time as the client reads it, so the answer's size never sits in the server's memory.

use axum::response::Response;
use blazar_service::{AllocationBatch, AllocationKind, AllocationList, Identity, ServiceResult};

use crate::convert::{from_wire, to_wire};
use crate::error::ApiResult;
use crate::state::AppState;
use crate::stream::{Batches, json_value, push_item, stream_json};

impl Batches for AllocationList {
    type Batch = AllocationBatch;

    async fn next_batch(&mut self) -> ServiceResult<Option<AllocationBatch>> {
        AllocationList::next_batch(self).await
    }

    fn write_batch(&self, batch: AllocationBatch, out: &mut Vec<u8>, mut written: bool) -> bool {
        for entry in batch.entries {
            written = push_item(out, &to_wire::allocation(entry), b", ", written);
        }
        written
    }

    fn suffix(&self) -> Vec<u8> {
        let mut out = b"]".to_vec();
        if let Some(marker) = &self.next_marker {
            out.extend_from_slice(b", \"next_marker\": ");
            out.extend_from_slice(&json_value(marker));
        }
        out.push(b'}');
        out
    }
}

/// The allocation list of `kind`, as the query string asks, as `{"allocations": [...]}`
/// with a `next_marker` when the limit cut it.
pub async fn stream_allocations(
    state: &AppState,
    identity: &Identity,
    kind: AllocationKind,
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<Response> {
    let request = from_wire::allocation_list_request(query)?;
    let list = state
        .service
        .allocation_list(identity, kind, &request)
        .await?;
    stream_json(b"{\"allocations\": [".to_vec(), list).await
}
