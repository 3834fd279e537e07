//! `/v1/floatingips`, `/v1/networks`, `/v1/devices` (one set of handlers over a kind
//! description), `/v1/flavors` and `/v1/notifications`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{get, patch};
use axum::{Json, Router};
use blazar_api::dates::{format_space, format_t};
use blazar_core::{Flavor, ResourceRecord};
use blazar_service::{DEVICES, FLOATINGIPS, KindSpec, NETWORKS};
use serde_json::{Map, Value, json};

use crate::convert;
use crate::error::ApiResult;
use crate::extract::{Caller, JsonObject, Query};
use crate::state::AppState;

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

/// A pool resource as the API shows it: id, fixed fields, reservable, timestamps, then one
/// key per extra capability. `raw_times` selects the `T` format Blazar uses for objects it
/// returns straight from a write (a floating IP create).
pub fn resource(r: ResourceRecord, raw_times: bool) -> Value {
    let time = |t| {
        if raw_times {
            format_t(t)
        } else {
            format_space(t)
        }
    };
    let mut out = Map::new();
    out.insert("id".into(), Value::from(r.uid));
    for (k, v) in r.attrs {
        out.insert(k, v);
    }
    out.insert("reservable".into(), Value::from(r.reservable));
    out.insert("created_at".into(), Value::from(time(r.created_at)));
    out.insert(
        "updated_at".into(),
        r.updated_at.map_or(Value::Null, |t| Value::from(time(t))),
    );
    for (k, v) in r.capabilities {
        out.entry(k).or_insert(Value::from(v));
    }
    Value::Object(out)
}

fn flag(query: &std::collections::HashMap<String, String>, key: &str) -> bool {
    crate::reply::flag(query, key)
}

/// The routes of one kind, to nest under its prefix.
pub fn routes(spec: &'static KindSpec) -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(move |s, c| list(s, c, spec)).post(move |s, c, b| create(s, c, b, spec)),
        )
        .route(
            "/allocations",
            get(move |s, c, q| allocations(s, c, q, spec)),
        )
        .route("/properties", get(move |s, c, q| properties(s, c, q, spec)))
        .route(
            "/properties/{name}",
            patch(move |s, c, p, b| update_property(s, c, p, b, spec)),
        )
        .route(
            "/{id}",
            get(move |s, c, p| show(s, c, p, spec))
                .put(move |s, c, p, b| update(s, c, p, b, spec))
                .delete(move |s, c, p| delete(s, c, p, spec)),
        )
        .route("/{id}/allocation", {
            let route = get(move |s, c, p, q| allocation(s, c, p, q, spec));
            // Chameleon re-allocates devices (and hosts, in hosts.rs) only.
            if spec.kind == DEVICES.kind {
                route.put(reallocate_device)
            } else {
                route
            }
        })
}

/// `PUT /v1/devices/{id}/allocation` (Chameleon): moves reservations off the device.
async fn reallocate_device(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let filter = crate::hosts::reallocation_filter(&body)?;
    let entry = state
        .service
        .reallocate_device(&identity, &id, &filter)
        .await?;
    Ok(Json(json!({ "allocation": convert::allocation(entry) })))
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
) -> ApiResult<Json<Value>> {
    let items: Vec<Value> = state
        .service
        .list_resources(&identity, spec)
        .await?
        .into_iter()
        .map(|r| resource(r, false))
        .collect();
    Ok(Json(json!({ names(spec).many: items })))
}

async fn create(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
    spec: &'static KindSpec,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let record = state
        .service
        .create_resource(&identity, spec, &body)
        .await?;
    let raw = spec.id_param == "floatingip_id";
    Ok((
        StatusCode::CREATED,
        Json(json!({ names(spec).one: resource(record, raw) })),
    ))
}

async fn show(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    spec: &'static KindSpec,
) -> ApiResult<Json<Value>> {
    let record = state.service.get_resource(&identity, spec, &id).await?;
    Ok(Json(json!({ names(spec).one: resource(record, false) })))
}

async fn update(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
    spec: &'static KindSpec,
) -> ApiResult<Json<Value>> {
    let record = state
        .service
        .update_resource(&identity, spec, &id, &body)
        .await?;
    Ok(Json(json!({ names(spec).one: resource(record, false) })))
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

async fn allocations(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    spec: &'static KindSpec,
) -> ApiResult<impl IntoResponse> {
    let entries = state
        .service
        .resource_allocations(
            &identity,
            spec,
            None,
            query.get("lease_id").map(String::as_str),
            query.get("reservation_id").map(String::as_str),
        )
        .await?;
    let allocations: Vec<_> = entries.into_iter().map(convert::allocation).collect();
    Ok(Json(convert::Envelope("allocations", allocations)))
}

async fn allocation(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
    spec: &'static KindSpec,
) -> ApiResult<Json<Value>> {
    let mut entries = state
        .service
        .resource_allocations(
            &identity,
            spec,
            Some(&id),
            query.get("lease_id").map(String::as_str),
            query.get("reservation_id").map(String::as_str),
        )
        .await?;
    Ok(Json(
        json!({ "allocation": entries.pop().map(convert::allocation) }),
    ))
}

async fn properties(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    spec: &'static KindSpec,
) -> ApiResult<Json<Value>> {
    let listing = state
        .service
        .list_resource_properties(&identity, spec, flag(&query, "detail"), flag(&query, "all"))
        .await?;
    Ok(Json(
        json!({ "resource_properties": crate::hosts::property_listing(listing) }),
    ))
}

async fn update_property(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
    spec: &'static KindSpec,
) -> ApiResult<Json<Value>> {
    let property = state
        .service
        .update_resource_property(&identity, spec, &name, &body)
        .await?;
    Ok(Json(
        json!({ "resource_property": convert::resource_property(property) }),
    ))
}

fn flavor(f: Flavor) -> Value {
    json!({
        "id": f.id,
        "name": f.name,
        "vcpus": f.vcpus,
        "ram": f.ram,
        "disk": f.disk,
        "OS-FLV-EXT-DATA:ephemeral": f.ephemeral,
        "extra_specs": f.extra_specs,
        "created_at": format_space(f.created_at),
        "updated_at": f.updated_at.map(format_space),
    })
}

pub fn flavor_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(list_flavors).post(create_flavor))
        .route("/{id}", get(show_flavor).delete(delete_flavor))
}

async fn list_flavors(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<Json<Value>> {
    let flavors: Vec<Value> = state
        .service
        .list_flavors(&identity)
        .await?
        .into_iter()
        .map(flavor)
        .collect();
    Ok(Json(json!({ "flavors": flavors })))
}

async fn create_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let created = state.service.create_flavor(&identity, &body).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "flavor": flavor(created) })),
    ))
}

async fn show_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(
        json!({ "flavor": flavor(state.service.get_flavor(&identity, &id).await?) }),
    ))
}

async fn delete_flavor(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    state.service.delete_flavor(&identity, &id).await?;
    Ok(crate::reply::no_content())
}

/// `GET /v1/notifications[?lease_id=..]`: the outbox of lease notifications (admin).
pub async fn list_notifications(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<Json<Value>> {
    let rows = state
        .service
        .notifications(&identity, query.get("lease_id").map(String::as_str))
        .await?;
    let items: Vec<Value> = rows
        .into_iter()
        .map(|n| {
            json!({
                "id": n.id,
                "event_type": n.event_type,
                "lease_id": n.lease_id,
                "payload": n.payload,
                "created_at": format_t(n.created_at),
            })
        })
        .collect();
    Ok(Json(json!({ "notifications": items })))
}
