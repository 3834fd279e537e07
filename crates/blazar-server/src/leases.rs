//! `/v1/leases`: handlers.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use blazar_api::PoolResource;
use blazar_core::LeaseFilter;
use blazar_core::LeaseStatus;
use blazar_service::{Listed, ServiceError};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, Query, Wire};
use crate::state::AppState;

pub async fn list_leases(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    if let Some(status) = query.get("status")
        && status.parse::<LeaseStatus>().is_err()
    {
        let known: Vec<&str> = LeaseStatus::ALL.iter().map(|s| s.as_str()).collect();
        return Err(ApiError::bad_request(format!(
            "Invalid lease status {status}; use one of {}",
            known.join(", ")
        )));
    }
    let filter = LeaseFilter {
        project_id: query.get("project_id").cloned(),
        user_id: query.get("user_id").cloned(),
        status: query.get("status").cloned(),
        name: query.get("name").cloned(),
        ..LeaseFilter::default()
    };
    // Leases rendered by an earlier list are reused while their revision stands (see
    // `lease_cache`); the answer is the bytes `Json(Envelope("leases", ...))` would write.
    let cache = &state.leases;
    let listed = state
        .service
        .list_leases_reusing(&identity, &filter, |id, revision| cache.get(id, revision))
        .await?;
    let mut parts = Vec::with_capacity(listed.len());
    for entry in listed {
        parts.push(match entry {
            Listed::Kept(json) => json,
            Listed::Fresh(revision, view) => {
                let id = view.lease.id.clone();
                let json = Bytes::from(
                    serde_json::to_vec(&to_wire::lease(*view))
                        .map_err(|e| ServiceError::Internal(format!("rendering a lease: {e}")))?,
                );
                cache.insert(id, revision, json.clone());
                json
            }
        });
    }
    let size = parts.iter().map(|p| p.len() + 1).sum::<usize>() + 16;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(br#"{"leases":["#);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(part);
    }
    body.extend_from_slice(b"]}");
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    ))
}

/// `POST /v1/leases`; with `?dry_run=true` the same answer (the would-be lease, with what
/// each reservation would be granted as `allocations`, or the same refusal) and nothing
/// written. A refusal carries `reasons` beside Blazar's message.
pub async fn create_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    Wire(body): Wire<blazar_api::NewLease>,
) -> ApiResult<impl IntoResponse> {
    async {
        let dry_run = crate::reply::strict_flag(&query, "dry_run")?;
        let request = from_wire::new_lease(body)?;
        let lease = if dry_run {
            let tried = state
                .service
                .dry_run_create_lease(&identity, &request)
                .await?;
            to_wire::lease_with_grants(tried.view, &tried.grants)
        } else {
            to_wire::lease(state.service.create_lease(&identity, &request).await?)
        };
        Ok((StatusCode::CREATED, Json(Envelope("lease", lease))))
    }
    .await
    .map_err(ApiError::explained)
}

/// `POST /v1/leases/offers` (additive): the windows in which a lease request fits.
pub async fn lease_offers(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Wire(body): Wire<blazar_api::OfferRequest>,
) -> ApiResult<impl IntoResponse> {
    let request = from_wire::offer_request(body)?;
    let offers = state.service.lease_offers(&identity, &request).await?;
    Ok(Json(to_wire::offers(offers)))
}

/// `GET /v1/leases/{id}/extension` (additive): whether and how far a lease can be extended.
pub async fn lease_extension(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let ask = from_wire::extension_ask(&query)?;
    let extension = state.service.lease_extension(&identity, &id, ask).await?;
    Ok(Json(Envelope("extension", to_wire::extension(extension))))
}

/// `GET /v1/leases/{id}/actions`: what was done in the cloud for the lease (additive).
pub async fn lease_actions(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let actions = state.service.lease_actions(&identity, &id).await?;
    let actions: Vec<_> = actions.iter().map(to_wire::action).collect();
    Ok(Json(Envelope("actions", actions)))
}

/// `GET /v1/leases/{id}/hosts` (Chameleon): the hosts of the lease's host reservations.
pub async fn lease_hosts(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let hosts: Vec<_> = state
        .service
        .lease_hosts(&identity, &id)
        .await?
        .into_iter()
        .map(to_wire::host)
        .collect();
    Ok(Json(Envelope("hosts", hosts)))
}

async fn lease_pool(
    state: &AppState,
    identity: &blazar_service::Identity,
    id: &str,
    kind: &str,
) -> ApiResult<Vec<PoolResource>> {
    Ok(state
        .service
        .lease_pool_resources(identity, id, kind)
        .await?
        .into_iter()
        .map(|r| to_wire::pool_resource(r, false))
        .collect())
}

/// `GET /v1/leases/{id}/networks` (Chameleon): the segments of its network reservations.
pub async fn lease_networks(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let networks = lease_pool(&state, &identity, &id, "network").await?;
    Ok(Json(Envelope("networks", networks)))
}

/// `GET /v1/leases/{id}/devices` (Chameleon): the devices of its device reservations.
pub async fn lease_devices(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let devices = lease_pool(&state, &identity, &id, "device").await?;
    Ok(Json(Envelope("devices", devices)))
}

/// `GET /v1/leases/{id}`; with `?allocations=true` each reservation also lists what it was
/// granted (`allocations`: resource type and id, dates, units), which Blazar's object lacks.
pub async fn show_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let lease = state.service.get_lease(&identity, &id).await?;
    let body = if crate::reply::flag(&query, "allocations") {
        let grants = state.service.lease_grants(&identity, &id).await?;
        to_wire::lease_with_grants(lease, &grants)
    } else {
        to_wire::lease(lease)
    };
    Ok(Json(Envelope("lease", body)))
}

/// `PUT /v1/leases/{id}`; `?dry_run=true` as for a create.
pub async fn update_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
    Wire(body): Wire<blazar_api::LeaseUpdate>,
) -> ApiResult<impl IntoResponse> {
    async {
        let dry_run = crate::reply::strict_flag(&query, "dry_run")?;
        let update = from_wire::lease_update(body)?;
        let lease = if dry_run {
            let tried = state
                .service
                .dry_run_update_lease(&identity, &id, &update)
                .await?;
            to_wire::lease_with_grants(tried.view, &tried.grants)
        } else {
            to_wire::lease(state.service.update_lease(&identity, &id, &update).await?)
        };
        Ok(Json(Envelope("lease", lease)))
    }
    .await
    .map_err(ApiError::explained)
}

pub async fn delete_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    state.service.delete_lease(&identity, &id).await?;
    Ok(crate::reply::no_content())
}
