//! `GET /v1/<resources>/allocations`, streamed: the JSON is written a batch of resources at a
//! time as the client reads it, so the answer's size never sits in the server's memory.

use axum::response::Response;
use std::collections::HashMap;

use foldhash::fast::RandomState;

use blazar_service::{
    AllocationBatch, AllocationEntry, AllocationKind, AllocationList, Identity, ServiceResult,
};

use crate::convert::{from_wire, to_wire};
use crate::error::ApiResult;
use crate::state::AppState;
use crate::stream::{Batches, Pieces, json_value, stream_json};

impl Batches for AllocationList {
    type Batch = AllocationBatch;

    async fn next_batch(&mut self) -> ServiceResult<Option<AllocationBatch>> {
        AllocationList::next_batch(self).await
    }

    fn write_batch(&self, batch: AllocationBatch, out: &mut Pieces, written: bool) -> bool {
        write_entries(&batch.entries, out.bytes(), written)
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
    state
        .service
        .authorize_allocation_read(identity, kind, false)?;
    let request = from_wire::allocation_list_request(query)?;
    let list = state
        .service
        .allocation_list(identity, kind, &request)
        .await?;
    stream_json(b"{\"allocations\": [".to_vec(), list).await
}

/// Appends `entries` as array items, each after `, ` when an item precedes it (`written`);
/// says whether an item has been written by now. The bytes are serde's for
/// `to_wire::allocation`, but each reservation is rendered once per batch: a lease of a
/// rack holds a hundred resources, and rendering its ids and dates for each of them was
/// most of a list's time.
fn write_entries(entries: &[AllocationEntry], out: &mut Vec<u8>, mut written: bool) -> bool {
    let held: usize = entries.iter().map(|e| e.reservations.len()).sum();
    // About what the batch takes (a host's entry and a reservation's rendering are a few
    // dozen and under two hundred bytes): a batch's half megabyte is not grown by doubling.
    out.reserve(entries.len() * 48 + held * 192);
    let mut rendered: HashMap<&str, Vec<u8>, RandomState> = HashMap::default();
    for entry in entries {
        if written {
            out.extend_from_slice(b", ");
        }
        written = true;
        out.extend_from_slice(b"{\"resource_id\":");
        out.extend_from_slice(&json_value(&entry.resource_id));
        out.extend_from_slice(b",\"reservations\":[");
        for (at, view) in entry.reservations.iter().enumerate() {
            if at > 0 {
                out.push(b',');
            }
            let item = rendered
                .entry(&*view.reservation_id)
                .or_insert_with(|| json_value(&to_wire::allocation_reservation(view)));
            out.extend_from_slice(item);
        }
        out.extend_from_slice(b"]}");
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use blazar_service::AllocationView;
    use chrono::{TimeZone, Utc};

    fn view(resource_id: i64, reservation: &str, lease: &str, day: u32) -> AllocationView {
        AllocationView {
            resource_id,
            reservation_id: reservation.into(),
            lease_id: lease.into(),
            lease_start: Utc.with_ymd_and_hms(2031, 1, day, 10, 0, 0).unwrap(),
            lease_end: Utc.with_ymd_and_hms(2031, 1, day + 1, 10, 0, 0).unwrap(),
        }
    }

    #[test]
    fn entries_are_written_as_serde_writes_them() {
        let entries = vec![
            AllocationEntry {
                resource_id: "1".into(),
                reservations: vec![view(1, "r-a", "l-a", 2), view(1, "r-b", "l-b", 5)],
            },
            AllocationEntry {
                resource_id: "a \"quoted\" \\ id".into(),
                reservations: vec![],
            },
            AllocationEntry {
                resource_id: "3".into(),
                reservations: vec![view(3, "r-b", "l-b", 5)],
            },
        ];
        let mut expected = Vec::new();
        for (at, entry) in entries.iter().enumerate() {
            if at > 0 {
                expected.extend_from_slice(b", ");
            }
            expected.extend(serde_json::to_vec(&to_wire::allocation(entry.clone())).unwrap());
        }
        let mut out = Vec::new();
        assert!(write_entries(&entries, &mut out, false));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(expected).unwrap()
        );
        // After items already written, the first one is separated too; none written stays so.
        let mut out = Vec::new();
        assert!(write_entries(&entries[..1], &mut out, true));
        assert!(out.starts_with(b", {"));
        let mut out = Vec::new();
        assert!(!write_entries(&[], &mut out, false));
        assert!(out.is_empty());
    }
}
