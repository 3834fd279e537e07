//! `/v1/floatingips`, `/v1/networks`, `/v1/devices` (one set of handlers over a kind
//! description, whose allocation and property handlers serve `/v1/os-hosts` too),
//! `/v1/flavors` and `/v1/notifications`.

use axum::Router;
use axum::extract::State;

use crate::extract::Path;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{get, patch};
use blazar_core::ResourceRecord;
use blazar_service::{
    AllocationKind, DEVICES, FLOATINGIPS, KindSpec, NETWORKS, Reallocated, ServiceResult,
};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::ApiResult;
use crate::extract::{Caller, JsonObject, Query, Wire};
use crate::reply::flag;
use crate::state::AppState;
use crate::stream::{Pages, stream_pages};

/// Envelope keys of a kind.
struct Names {
    one: &'static str,
    many: &'static str,
}

fn names(spec: &KindSpec) -> Names {
    match spec.id_param {
        "floatingip_id" => Names {
            one: "floatingip",
            many: "floatingips",
        },
        "network_id" => Names {
            one: "network",
            many: "networks",
        },
        _ => Names {
            one: "device",
            many: "devices",
        },
    }
}

/// The routes of one kind, to nest under its prefix.
pub fn routes(spec: &'static KindSpec) -> Router<AppState> {
    let kind = AllocationKind::Pool(spec);
    Router::new()
        .route(
            "/",
            get(move |s, c| list(s, c, spec)).post(move |s, c, b| create(s, c, b, spec)),
        )
        .route(
            "/allocations",
            get(move |s, c, q| allocations(s, c, q, kind)),
        )
        .route("/properties", get(move |s, c, q| properties(s, c, q, kind)))
        .route(
            "/timeline",
            get(
                move |State(state): State<AppState>,
                      Caller(identity): Caller,
                      Query(query): Query| async move {
                    crate::timeline::show_timeline(&state, &identity, &query, spec.kind).await
                },
            ),
        )
        .route(
            "/timeline/properties",
            get(
                move |State(state): State<AppState>, Caller(identity): Caller| async move {
                    crate::timeline::show_timeline_properties(&state, &identity, spec.kind).await
                },
            ),
        )
        .route(
            "/properties/{name}",
            patch(move |s, c, p, b| update_property(s, c, p, b, kind)),
        )
        .route(
            "/{id}",
            get(move |s, c, p| show(s, c, p, spec))
                .put(move |s, c, p, b| update(s, c, p, b, spec))
                .delete(move |s, c, p| delete(s, c, p, spec)),
        )
        .route("/{id}/allocation", {
            let route = get(move |s, c, p, q| allocation(s, c, p, q, kind));
            // Chameleon re-allocates devices (and hosts, in hosts.rs) only.
            if spec.kind == DEVICES.kind {
                route.put(|s, c, p, b| crate::hosts::reallocate(s, c, p, b, Reallocated::Device))
            } else {
                route
            }
        })
}

pub fn floatingip_routes() -> Router<AppState> {
    routes(&FLOATINGIPS)
}

pub fn network_routes() -> Router<AppState> {
    routes(&NETWORKS)
}

pub fn device_routes() -> Router<AppState> {
    routes(&DEVICES)
}

async fn list(
    State(state): State<AppState>,
    Caller(identity): Caller,
    spec: &'static KindSpec,
) -> ApiResult<impl IntoResponse> {
    let items: Vec<_> = state
        .service
        .list_resources(&identity, spec)
        .await?
        .into_iter()
        .map(|r| to_wire::pool_resource(r, false))
        .collect();
    Ok(Envelope(names(spec).many, items))
}

async fn create(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
    spec: &'static KindSpec,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::new_resource(spec, body)?;
    let record = state
        .service
        .create_resource(&identity, spec, &body)
        .await?;
    let raw = spec.id_param == "floatingip_id";
    Ok(crate::reply::created(
        names(spec).one,
        to_wire::pool_resource(record, raw),
    ))
}

/// One resource as a show or an update answers it.
fn one(spec: &KindSpec, record: ResourceRecord) -> Envelope<blazar_api::PoolResource> {
    Envelope(names(spec).one, to_wire::pool_resource(record, false))
}

async fn show(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    spec: &'static KindSpec,
) -> ApiResult<impl IntoResponse> {
    let record = state.service.get_resource(&identity, spec, &id).await?;
    Ok(one(spec, record))
}

async fn update(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Wire(body): Wire<blazar_api::ResourceUpdate>,
    spec: &'static KindSpec,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::resource_update(body);
    let record = state
        .service
        .update_resource(&identity, spec, &id, &body)
        .await?;
    Ok(one(spec, record))
}

async fn delete(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    spec: &'static KindSpec,
) -> ApiResult<Response> {
    state.service.delete_resource(&identity, spec, &id).await?;
    Ok(crate::reply::no_content())
}

/// `GET .../allocations` of hosts or of one kind of pool resource.
pub async fn allocations(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    kind: AllocationKind,
) -> ApiResult<Response> {
    crate::allocations::stream_allocations(&state, &identity, kind, &query).await
}

/// `GET .../{id}/allocation` of a host or a pool resource.
pub async fn allocation(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
    kind: AllocationKind,
) -> ApiResult<impl IntoResponse> {
    let service = &state.service;
    service.authorize_allocation_read(&identity, kind, true)?;
    // The list's filters, its window included (paging has nothing to page here).
    let request = from_wire::allocation_list_request(&query)?;
    let entry = match kind {
        AllocationKind::Hosts => service.host_allocation(&identity, &id, &request).await?,
        AllocationKind::Pool(spec) => {
            service
                .resource_allocation(&identity, spec, &id, &request)
                .await?
        }
    };
    Ok(Envelope("allocation", to_wire::allocation(entry)))
}

/// `GET .../properties` of hosts or of one kind of pool resource.
pub async fn properties(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    kind: AllocationKind,
) -> ApiResult<impl IntoResponse> {
    let (detail, all) = (flag(&query, "detail"), flag(&query, "all"));
    let service = &state.service;
    let listing = match kind {
        AllocationKind::Hosts => service.list_host_properties(&identity, detail, all).await?,
        AllocationKind::Pool(spec) => {
            service
                .list_resource_properties(&identity, spec, detail, all)
                .await?
        }
    };
    Ok(Envelope(
        "resource_properties",
        to_wire::property_listing(listing),
    ))
}

/// `PATCH .../properties/{name}` of hosts or of one kind of pool resource.
pub async fn update_property(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(name): Path<String>,
    Wire(body): Wire<blazar_api::PropertyUpdate>,
    kind: AllocationKind,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::property_update(&body)?;
    let service = &state.service;
    let property = match kind {
        AllocationKind::Hosts => {
            service
                .update_host_property(&identity, &name, &body)
                .await?
        }
        AllocationKind::Pool(spec) => {
            service
                .update_resource_property(&identity, spec, &name, &body)
                .await?
        }
    };
    Ok(Envelope(
        "resource_property",
        to_wire::resource_property(property),
    ))
}

pub fn flavor_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(list_flavors).post(create_flavor))
        .route("/{id}", get(show_flavor).delete(delete_flavor))
}

async fn list_flavors(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    let flavors: Vec<_> = state
        .service
        .list_flavors(&identity)
        .await?
        .into_iter()
        .map(to_wire::flavor)
        .collect();
    Ok(Envelope("flavors", flavors))
}

async fn create_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Wire(body): Wire<blazar_api::NewFlavor>,
) -> ApiResult<impl IntoResponse> {
    let body = from_wire::new_flavor(&body)?;
    let created = state.service.create_flavor(&identity, &body).await?;
    Ok(crate::reply::created("flavor", to_wire::flavor(created)))
}

async fn show_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let flavor = state.service.get_flavor(&identity, &id).await?;
    Ok(Envelope("flavor", to_wire::flavor(flavor)))
}

async fn delete_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    state.service.delete_flavor(&identity, &id).await?;
    Ok(crate::reply::no_content())
}

/// `GET /v1/notifications[?lease_id=..]`: the outbox of lease notifications (admin),
/// streamed a page at a time: the outbox keeps every notification, so its size is the
/// service's whole history.
pub async fn list_notifications(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<Response> {
    let pages = NotificationPages {
        service: state.service.clone(),
        identity,
        lease_id: query.get("lease_id").cloned(),
    };
    stream_pages("notifications", pages).await
}

struct NotificationPages {
    service: blazar_service::Service,
    identity: blazar_service::Identity,
    lease_id: Option<String>,
}

impl Pages for NotificationPages {
    type Place = (i64, String);
    type Item = blazar_core::Notification;
    type Wire = blazar_api::Notification;
    const PAGE: usize = 200;

    async fn page(
        &self,
        after: Option<&Self::Place>,
        limit: usize,
    ) -> ServiceResult<Vec<(Self::Place, Self::Item)>> {
        self.service
            .notifications(
                &self.identity,
                self.lease_id.as_deref(),
                after.map(|(w, id)| (*w, id.as_str())),
                limit,
            )
            .await
    }

    fn wire(item: Self::Item) -> Self::Wire {
        to_wire::notification(item)
    }
}
