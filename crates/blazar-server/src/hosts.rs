//! `/v1/os-hosts`: the hosts themselves and their re-allocation (their properties and
//! allocations are served by the handlers of `inventory`); `/v1/handovers` and `/v1/reconcile`.

use axum::extract::State;

use crate::extract::Path;
use axum::response::IntoResponse;
use blazar_core::{HandoverFilter, HandoverPlace};
use blazar_service::{HostList, Reallocated, ServiceResult};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, Query, Wire};
use crate::state::AppState;
use crate::stream::{Batches, Pages, Pieces, push_item, stream_json, stream_pages};

pub async fn list_hosts(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let name = query
        .get("hypervisor_hostname")
        .or_else(|| query.get("name"))
        .cloned();
    // Read as `dry_run` is: a value that is neither yes nor no is a 400, not "no".
    let reservable = match query.contains_key("reservable") {
        true => Some(crate::reply::strict_flag(&query, "reservable")?),
        false => None,
    };
    let source = HostStream {
        list: state.service.list_hosts(&identity).await?,
        done: 0,
        name,
        reservable,
    };
    stream_json(br#"{"hosts":["#.to_vec(), source).await
}

/// Hosts per batch of the host list (about 40 kB of JSON).
const HOST_BATCH: usize = 100;

/// A host list written as the client reads it, from the shared inventory: the bytes
/// `Envelope("hosts", ...)` would write, without the whole list in memory for each
/// reader.
struct HostStream {
    list: HostList,
    done: usize,
    name: Option<String>,
    reservable: Option<bool>,
}

impl Batches for HostStream {
    type Batch = std::ops::Range<usize>;

    async fn next_batch(&mut self) -> ServiceResult<Option<std::ops::Range<usize>>> {
        let total = self.list.hosts().len();
        if self.done >= total {
            return Ok(None);
        }
        let batch = self.done..total.min(self.done + HOST_BATCH);
        self.done = batch.end;
        Ok(Some(batch))
    }

    fn write_batch(
        &self,
        batch: std::ops::Range<usize>,
        out: &mut Pieces,
        mut written: bool,
    ) -> bool {
        let hosts = self.list.hosts().get(batch).unwrap_or_default();
        for host in hosts {
            if self
                .name
                .as_ref()
                .is_some_and(|n| &host.facts.hypervisor_hostname != n)
                || self.reservable.is_some_and(|r| host.reservable != r)
            {
                continue;
            }
            written = push_item(out.bytes(), &to_wire::host(host.clone()), b",", written);
        }
        written
    }

    fn suffix(&self) -> Vec<u8> {
        b"]}".to_vec()
    }
}

pub async fn create_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Wire(body): Wire<blazar_api::NewHost>,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::new_host(&body)?;
    let host = state.service.create_host(&identity, &body).await?;
    Ok(crate::reply::created("host", to_wire::host(host)))
}

pub async fn show_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let host = state.service.get_host(&identity, &id).await?;
    Ok(Envelope("host", to_wire::host(host)))
}

pub async fn update_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Wire(body): Wire<blazar_api::HostUpdate>,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::host_update(body);
    let host = state
        .service
        .update_host(&identity, &id, &body)
        .await
        .map_err(|e| {
            let mut e = ApiError::from(e);
            // Blazar names this one 400 as a server error (an empty update of a host).
            if body.is_empty() && e.message == blazar_service::NO_DATA_TO_UPDATE {
                e.name = Some("INTERNAL_SERVER_ERROR");
            }
            e
        })?;
    Ok(Envelope("host", to_wire::host(host)))
}

pub async fn delete_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    state.service.delete_host(&identity, &id).await?;
    Ok(crate::reply::no_content())
}

/// `PUT /v1/os-hosts/{id}/allocation` and `PUT /v1/devices/{id}/allocation` (Chameleon):
/// moves reservations off the host or device.
pub async fn reallocate(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Wire(body): Wire<blazar_api::Reallocation>,
    what: Reallocated,
) -> ApiResult<impl IntoResponse> {
    let filter = from_wire::reallocation(body)?;
    let entry = state
        .service
        .reallocate(&identity, what, &id, &filter)
        .await?;
    Ok(Envelope("allocation", to_wire::allocation(entry)))
}

/// `POST /v1/reconcile` (admin, additive): compares the cloud with the database once and
/// repairs what differs; `{"dry_run": true}` (or `?dry_run=true`) only reports. A query
/// parameter it does not know is refused: a misspelt dry run must not repair.
pub async fn reconcile(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    Wire(body): Wire<blazar_api::ReconcileRequest>,
) -> ApiResult<impl IntoResponse> {
    let apply = from_wire::reconcile(body, &query)?;
    let report = state.service.reconcile_for(&identity, apply).await?;
    Ok(Envelope("reconcile", to_wire::reconcile_report(report)))
}

/// The kinds of resource that are handed over whole (instance slots are not).
const HANDED_OVER: [&str; 4] = [
    blazar_core::PHYSICAL_HOST,
    blazar_core::reservation::FLOATINGIP,
    blazar_core::reservation::NETWORK,
    blazar_core::reservation::DEVICE,
];

/// `GET /v1/handovers[?resource_type=..][&lease_id=..][&project_id=..][&all=true]`: who
/// holds which resource now (or ever), written a page at a time: with `all`, the history of
/// a site that ran for years is never read at once.
pub async fn list_handovers(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    from_wire::only_known(
        &query,
        &["all", "lease_id", "project_id", "resource_type"],
        "the hand-over list",
    )?;
    let text = |key: &str| query.get(key).filter(|v| !v.is_empty()).cloned();
    let resource_type = text("resource_type");
    if let Some(kind) = &resource_type
        && !HANDED_OVER.contains(&kind.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "Invalid resource_type {kind}; hand-overs are of {}",
            HANDED_OVER.join(", ")
        )));
    }
    let include_ended = match query.get("all").map(|v| v.to_ascii_lowercase()) {
        None => false,
        Some(v) if matches!(v.as_str(), "true" | "1" | "yes") => true,
        Some(v) if matches!(v.as_str(), "false" | "0" | "no" | "") => false,
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "Invalid all {v}; give true or false"
            )));
        }
    };
    let pages = HandoverPages {
        service: state.service.clone(),
        identity,
        filter: HandoverFilter {
            resource_type,
            lease_id: text("lease_id"),
            project_id: text("project_id"),
            include_ended,
        },
    };
    stream_pages("handovers", pages).await
}

struct HandoverPages {
    service: blazar_service::Service,
    identity: blazar_service::Identity,
    filter: HandoverFilter,
}

impl Pages for HandoverPages {
    type Place = HandoverPlace;
    type Item = blazar_core::ListedHandover;
    type Wire = blazar_api::Handover;
    const PAGE: usize = 1000;

    async fn page(
        &self,
        after: Option<&Self::Place>,
        limit: usize,
    ) -> ServiceResult<Vec<(Self::Place, Self::Item)>> {
        self.service
            .handovers_page(&self.identity, &self.filter, after, limit)
            .await
    }

    fn wire(item: Self::Item) -> Self::Wire {
        to_wire::handover(item)
    }
}
