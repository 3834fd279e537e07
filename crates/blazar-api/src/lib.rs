//! Blazar v1 wire types: the JSON bodies the API sends and accepts, and its date formats.
//! Shared by the server and the client so both sides agree on every field. Response types
//! are here; request bodies are in [`requests`]. Struct field order is the order of the keys
//! on the wire.

pub mod dates;
pub mod requests;

pub use requests::{
    HostUpdate, LeaseUpdate, NewDevice, NewFlavor, NewFloatingIp, NewHost, NewLease, NewNetwork,
    PropertyUpdate, Reallocation, ReconcileRequest, ResourceUpdate,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Blazar's error body (shape (a) of the spec): `error_name` repeats the numeric code.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error_code: u16,
    pub error_message: String,
    pub error_name: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Lease {
    pub id: String,
    pub name: String,
    pub user_id: String,
    pub project_id: String,
    pub trust_id: String,
    pub start_date: String,
    pub end_date: String,
    pub status: String,
    pub degraded: bool,
    pub created_at: String,
    pub updated_at: Option<String>,
    pub reservations: Vec<Reservation>,
    pub events: Vec<Event>,
}

/// A reservation: common keys plus the keys of its resource type (`min`, `max`,
/// `hypervisor_properties`, ... for `physical:host`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reservation {
    pub id: String,
    pub lease_id: String,
    pub resource_id: String,
    pub resource_type: String,
    pub status: String,
    pub missing_resources: bool,
    pub resources_changed: bool,
    pub created_at: String,
    pub updated_at: Option<String>,
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub id: String,
    pub lease_id: String,
    pub event_type: String,
    pub time: String,
    pub status: String,
    pub created_at: String,
    pub updated_at: Option<String>,
}

/// A host: Nova's hypervisor facts, Blazar's columns, and one top-level key per extra
/// capability (values are always strings).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Host {
    pub id: String,
    pub hypervisor_hostname: String,
    pub service_name: String,
    pub hypervisor_type: String,
    pub hypervisor_version: i64,
    pub vcpus: i64,
    pub memory_mb: i64,
    pub local_gb: i64,
    pub cpu_info: String,
    pub availability_zone: String,
    pub status: Option<String>,
    pub reservable: bool,
    pub trust_id: String,
    pub created_at: String,
    pub updated_at: Option<String>,
    #[serde(flatten)]
    pub capabilities: BTreeMap<String, Value>,
}

/// One reservation's use of a resource, with the dates of its lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AllocationReservation {
    pub id: String,
    pub lease_id: String,
    pub start_date: String,
    pub end_date: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Allocation {
    pub resource_id: String,
    pub reservations: Vec<AllocationReservation>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PropertyName {
    pub property: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PropertyDetail {
    pub property: String,
    pub private: bool,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResourceProperty {
    pub id: String,
    pub resource_type: String,
    pub property_name: String,
    pub private: bool,
    /// Chameleon's: no two resources may hold the same value. Sent only when set, so a
    /// site that does not use it sees Blazar's exact answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_unique: bool,
    pub created_at: String,
    pub updated_at: Option<String>,
}

/// Who holds a resource right now, as recorded by the standalone backend at lease start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Handover {
    pub resource_type: String,
    pub resource_id: String,
    pub project_id: String,
    pub lease_id: String,
    pub reservation_id: String,
    pub since: String,
    /// When the resource was taken back; absent while it is still held.
    pub until: Option<String>,
}

/// An outside-world action of a lease, as `GET /v1/leases/{id}/actions` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Action {
    pub seq: i64,
    pub lease_id: String,
    pub reservation_id: String,
    pub project_id: String,
    pub kind: String,
    pub purpose: String,
    pub resource_type: String,
    /// The ids of the resources it touches.
    pub resources: Value,
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub request_id: Option<String>,
    pub not_before: String,
    pub created_at: String,
    pub updated_at: Option<String>,
}
