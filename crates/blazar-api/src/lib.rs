//! Blazar v1 wire types: the JSON bodies the API sends and accepts, and its date formats.
//! Shared by the server and the client so both sides agree on every field. Response types
//! are here; request bodies are in [`requests`]. Struct field order is the order of the keys
//! on the wire.

pub mod dates;
pub mod requests;

pub use requests::{
    HostUpdate, LeaseUpdate, NewDevice, NewFlavor, NewFloatingIp, NewHost, NewLease, NewNetwork,
    OfferRequest, PropertyUpdate, Reallocation, ReconcileRequest, ResourceUpdate,
};

use std::collections::BTreeMap;

/// The hypervisor facts of a host, under Nova's names on the wire as in the domain.
pub use blazar_core::HostFacts;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Blazar's error body (shape (a) of the spec): `error_name` repeats the numeric code.
/// A refused lease create or update adds `reasons` (Blazar's clients ignore extra keys).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error_code: u16,
    pub error_message: String,
    pub error_name: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<RefusalReason>>,
}

/// One thing at fault in a refused lease create or update. Only the keys that apply are
/// sent: a shortfall has `reservation`, `resource_type`, `requested` and, when the caller
/// may be told, `matching`, `free`, the window and `next_offer`; a policy refusal has
/// `rule`; a bad field has `field`; a usage-enforcement filter's refusal has `filter`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RefusalReason {
    /// The reservation's 1-based position in a create, or its id in an update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<ReservationRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<Requested>,
    /// Resources that match the request and are reservable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matching: Option<i64>,
    /// Of them, those free in the window (free slots, for instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_date: Option<String>,
    /// Sent (null when none is known) whenever the counts are: the next window of the same
    /// length the request would fit in.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub next_offer: Option<Option<OfferWindow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The usage-enforcement filter that refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// The project quota exceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaRefusal>,
}

/// Which project quota a create or update would exceed: its name, the limit, what the
/// project holds without the request and what the request adds, at the worst instant of the
/// lease (`at`, for concurrent limits) or in the worst month (`month`, `YYYY-MM`, for the
/// host-hour budget).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuotaRefusal {
    pub name: String,
    pub limit: i64,
    pub in_use: serde_json::Number,
    pub requested: serde_json::Number,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<String>,
}

/// A calendar feed of a project's leases (ours). `path` (`/ical/<id>_<secret>.ics`, from the
/// server's root) is in the answer to its creation only: it is the secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IcalFeed {
    pub id: String,
    pub project_id: String,
    pub description: String,
    pub created_by: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A webhook (ours): lease events POSTed to `url`, signed with `secret`, which is in the
/// answer to its creation only. `project_id` null: every project's events.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Webhook {
    pub id: String,
    pub project_id: Option<String>,
    pub url: String,
    /// Empty: every event type.
    pub event_types: Vec<String>,
    pub description: String,
    pub created_by: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// One event's delivery to a webhook (ours); `id` is the event's notification id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WebhookDelivery {
    pub id: String,
    pub webhook_id: String,
    pub event_type: String,
    pub lease_id: Option<String>,
    /// `pending`, `delivered` or `dead`.
    pub status: String,
    /// A worker is sending it now: `attempts` counts this attempt, `last_result` is still
    /// the one before.
    #[serde(default)]
    pub sending: bool,
    pub attempts: i64,
    pub next_attempt_at: Option<String>,
    pub last_attempt_at: Option<String>,
    /// The HTTP status the endpoint answered, or why there was none.
    pub last_result: Option<String>,
    pub created_at: String,
}

/// A project's quotas (ours; Blazar has none): every limit in force, `-1` for none, the
/// ones the project's own overrides set, and what it holds now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Quota {
    pub project_id: String,
    pub hosts: i64,
    pub floatingips: i64,
    pub instances: i64,
    pub max_lease_duration: i64,
    pub max_start_ahead: i64,
    pub host_hours_per_month: i64,
    /// The limits set for this project, by name; the others are the defaults.
    pub overrides: BTreeMap<String, i64>,
    pub usage: QuotaUsage,
}

/// What a project's reservations hold at `at`, and its weighted host-hours in that month
/// (`YYYY-MM`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuotaUsage {
    pub at: String,
    pub hosts: i64,
    pub floatingips: i64,
    pub instances: i64,
    pub month: String,
    pub host_hours: serde_json::Number,
}

/// A key that is there, even as null, reads as `Some`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A reservation named by position (create) or id (update).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ReservationRef {
    Position(u64),
    Id(String),
}

/// What a refused reservation asked for; the keys of its type are sent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Requested {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<i64>,
    /// `same`, `different` or `any` host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_floatingips: Vec<String>,
}

/// A window offered instead of the one refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OfferWindow {
    pub start_date: String,
    pub end_date: String,
}

/// The framework's error body, for unknown URLs, wrong methods and version problems.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FrameworkError {
    pub error: u16,
    pub error_message: String,
}

/// keystonemiddleware's error body (a 401, or a 503 when a token cannot be checked).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuthError {
    pub error: AuthErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuthErrorDetail {
    pub code: u16,
    pub title: String,
    pub message: String,
}

/// One API version of the version document (`GET /`, `GET /versions`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Version {
    pub id: String,
    pub status: String,
    pub links: Vec<Link>,
    pub min_version: String,
    pub max_version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Link {
    pub href: String,
    pub rel: String,
}

/// One event of `GET /v1/leases/events` (the data of a server-sent event whose id is `seq`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseEvent {
    /// Its place in the order of events; resume after it with `Last-Event-ID`.
    pub seq: i64,
    /// The notification's event type: `lease.create`, `lease.event.start_lease`, ...
    pub event_type: String,
    pub lease_id: Option<String>,
    pub project_id: Option<String>,
    /// The lease's status the event left it in, when the event says.
    pub status: Option<String>,
    pub created_at: String,
}

/// `GET /healthz` and `GET /readyz`: `ok`, or why not.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Lease {
    pub id: String,
    pub name: String,
    pub user_id: String,
    pub project_id: String,
    // Blazar's key order (a client printing the object shows it).
    pub start_date: String,
    pub end_date: String,
    pub trust_id: String,
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
    /// What the reservation was granted; sent only when asked for
    /// (`GET /v1/leases/{id}?allocations=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<Vec<ReservationAllocation>>,
}

/// One resource granted to a reservation, with its dates and the units it takes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReservationAllocation {
    pub resource_type: String,
    pub resource_id: String,
    pub start_date: String,
    pub end_date: String,
    pub units: i64,
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
    #[serde(flatten)]
    pub facts: HostFacts,
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
    /// Chameleon's: sent only when set, so Blazar's listing stays as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_unique: bool,
}

/// The `resource_properties` list: names, or names with their values (`?detail=True`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PropertyListing {
    Detail(Vec<PropertyDetail>),
    Names(Vec<PropertyName>),
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

/// A floating IP, network segment or device: its id, the fixed fields of its kind (in the
/// kind's order), Blazar's columns, then one key per extra capability (values are strings).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolResource {
    pub id: String,
    /// `floating_network_id`, `subnet_id`, `floating_ip_address` for a floating IP, ...
    #[serde(flatten)]
    pub fields: Map<String, Value>,
    pub reservable: bool,
    pub created_at: String,
    pub updated_at: Option<String>,
    /// Read back, the capabilities are among `fields`: the keys alone do not tell them apart.
    #[serde(flatten, skip_deserializing)]
    pub capabilities: BTreeMap<String, Value>,
}

/// A standalone flavor, in Nova's shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Flavor {
    pub id: String,
    pub name: String,
    pub vcpus: i64,
    pub ram: i64,
    pub disk: i64,
    #[serde(rename = "OS-FLV-EXT-DATA:ephemeral")]
    pub ephemeral: i64,
    pub extra_specs: Map<String, Value>,
    pub created_at: String,
    pub updated_at: Option<String>,
}

/// A lease notification of the outbox (`GET /v1/notifications`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Notification {
    pub id: String,
    pub event_type: String,
    pub lease_id: Option<String>,
    pub payload: Value,
    pub created_at: String,
}

/// What a reconciler pass found and, unless a dry run, repaired (`POST /v1/reconcile`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReconcileReport {
    pub applied: bool,
    /// One line per difference.
    pub repairs: Vec<String>,
    /// Repairs that failed, and parts of the cloud that could not be read, with their
    /// errors (the pass went on past them).
    #[serde(default)]
    pub failed: Vec<String>,
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
    /// Of `attempts`, those whose worker stopped or hung before reporting back (a process
    /// killed mid-attempt): the action fails at the fifth.
    pub lost_attempts: i64,
    /// When it was first tried: a transient failure is retried for
    /// `--action-retry-minutes` from there.
    pub first_tried_at: Option<String>,
    pub last_error: Option<String>,
    pub request_id: Option<String>,
    pub not_before: String,
    pub created_at: String,
    pub updated_at: Option<String>,
}

/// `POST /v1/leases/offers`: windows in which a lease request fits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Offers {
    pub offers: Vec<Offer>,
}

/// One window the whole request fits in, and what each reservation would get there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Offer {
    pub start_date: String,
    pub end_date: String,
    /// The window's length in minutes.
    pub duration: i64,
    /// One per requested reservation, in request order.
    pub reservations: Vec<OfferedReservation>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OfferedReservation {
    pub resource_type: String,
    /// Hosts, addresses, segments or devices; instances for instance reservations. Null
    /// when a member's query names a private property and asked for a range (which
    /// resources match, or how many, would tell the property's values).
    pub amount: Option<i64>,
    pub resources: Vec<OfferedResource>,
}

/// A resource an offer grants: a host (with `slots`, the instances on it, for instance
/// reservations), a floating IP (named by its address), a network segment or a device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OfferedResource {
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<i64>,
}

/// `GET /v1/leases/{id}/extension`: whether and how far a lease can be extended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Extension {
    pub lease_id: String,
    pub end_date: String,
    /// The end asked about (`end_date` or `prolong_for` of the query), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_end_date: Option<String>,
    /// Whether an update to `requested_end_date` would be granted now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub possible: Option<bool>,
    /// Why it would be refused: the update's own message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether it reaches `requested_end_date` on exactly the resources it holds (an update
    /// of a lease that has not started may move it to others instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeps_resources: Option<bool>,
    /// The latest end the lease reaches keeping every resource it holds, up to
    /// `searched_until`; null when it cannot be extended at all.
    pub latest_end_date: Option<String>,
    pub searched_until: String,
}

/// `GET /v1/<resources>/timeline` (additive): a page of the resources of one type over a
/// window, each with the allocations that overlap it, for calendars.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Timeline {
    pub resource_type: String,
    pub start_date: String,
    pub end_date: String,
    pub resources: Vec<TimelineResource>,
    /// The `marker` of the next page; null on the last one.
    pub next_marker: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineResource {
    pub id: String,
    /// `hypervisor_hostname`, `floating_ip_address`, `physical_network:segment_id` or the
    /// device's name.
    pub name: String,
    /// Whether it may be reserved now.
    pub reservable: bool,
    /// Periods in which it may not be reserved (maintenance), for a calendar to shade: the
    /// whole window while it is not reservable.
    pub non_reservable: Vec<TimelinePeriod>,
    /// Hosts only: what instances may use of the host (totals times allocation ratios).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_capacity: Option<InstanceSize>,
    /// The allocations that overlap the window, in start order, with their own dates.
    pub busy: Vec<TimelineInterval>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelinePeriod {
    pub start_date: String,
    pub end_date: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct InstanceSize {
    pub vcpus: i64,
    pub memory_mb: i64,
    pub disk_gb: i64,
}

/// One allocation of a resource. Whose lease it is (`lease_id`, `lease_name`, `project_id`,
/// `reservation_id`) is null unless the caller is an admin or of the lease's project.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineInterval {
    pub start_date: String,
    pub end_date: String,
    /// The end of the cleaning margin after `end_date`; null without one.
    pub blocked_until: Option<String>,
    /// The lease's status, as the lease API spells it.
    pub status: String,
    pub degraded: bool,
    /// Whether the lease is the caller's project's.
    pub own: bool,
    pub lease_id: Option<String>,
    pub lease_name: Option<String>,
    pub project_id: Option<String>,
    pub reservation_id: Option<String>,
    /// `whole` (the resource itself) or `instances` (slots of a host).
    pub allocation: String,
    /// For `instances`: how many slots, and the size of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<SlotUse>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct SlotUse {
    pub units: i64,
    pub vcpus: i64,
    pub memory_mb: i64,
    pub disk_gb: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pool_resource_puts_capabilities_last() {
        let item = PoolResource {
            id: "d1".into(),
            fields: json!({"name": "gpu-1", "device_type": null})
                .as_object()
                .unwrap()
                .clone(),
            reservable: true,
            created_at: "2030-01-01 10:00:00".into(),
            updated_at: None,
            capabilities: [("rack".to_string(), json!("r1"))].into(),
        };
        let text = serde_json::to_string(&item).unwrap();
        assert_eq!(
            text,
            r#"{"id":"d1","name":"gpu-1","device_type":null,"reservable":true,"created_at":"2030-01-01 10:00:00","updated_at":null,"rack":"r1"}"#
        );
        let back: PoolResource = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.fields.len(),
            3,
            "capabilities read back among the fields"
        );
        assert!(back.capabilities.is_empty());
    }

    #[test]
    fn a_host_shows_its_facts_in_blazar_order_and_reads_back_without_them_as_capabilities() {
        let host = Host {
            id: "1".into(),
            facts: HostFacts {
                hypervisor_hostname: "compute-1".into(),
                service_name: "compute-1".into(),
                hypervisor_type: "QEMU".into(),
                hypervisor_version: 8002000,
                vcpus: 8,
                memory_mb: 16384,
                local_gb: 100,
                cpu_info: "{}".into(),
                availability_zone: "nova".into(),
            },
            status: None,
            reservable: true,
            trust_id: "t".into(),
            created_at: "2030-01-01 10:00:00".into(),
            updated_at: None,
            capabilities: [("gpu".to_string(), json!("true"))].into(),
        };
        let text = serde_json::to_string(&host).unwrap();
        assert_eq!(
            text,
            r#"{"id":"1","hypervisor_hostname":"compute-1","service_name":"compute-1","hypervisor_type":"QEMU","hypervisor_version":8002000,"vcpus":8,"memory_mb":16384,"local_gb":100,"cpu_info":"{}","availability_zone":"nova","status":null,"reservable":true,"trust_id":"t","created_at":"2030-01-01 10:00:00","updated_at":null,"gpu":"true"}"#
        );
        let back: Host = serde_json::from_str(&text).unwrap();
        assert_eq!(back, host, "facts read back as facts, not as capabilities");
    }

    #[test]
    fn property_listings_read_either_shape() {
        let names: PropertyListing = serde_json::from_value(json!([{"property": "gpu"}])).unwrap();
        assert!(matches!(names, PropertyListing::Names(n) if n.len() == 1));
        let detail: PropertyListing =
            serde_json::from_value(json!([{"property": "gpu", "private": false, "values": ["a"]}]))
                .unwrap();
        assert!(matches!(detail, PropertyListing::Detail(d) if !d[0].is_unique));
    }
}
