//! What the inventory, the action queue and the token store hold, as the service and the
//! API see it: flavors, pool resources, resource properties, hand-overs, outside-world
//! actions, API tokens, and which leases a list returns.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::reservation::SourceFlavor;
use crate::status::{ActionKind, ActionPurpose, ActionStatus};

/// A flavor registered with blazar-rs: what a reservation is sized by, and when it was
/// registered.
#[derive(Debug, Clone, PartialEq)]
pub struct Flavor {
    pub source: SourceFlavor,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// A floating IP, network segment or device, as the operator registered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// The id the API shows.
    pub uid: String,
    pub kind: String,
    /// What makes it one of a kind (a floating IP's network and address, ...).
    pub uniq: String,
    pub attrs: Map<String, Value>,
    pub reservable: bool,
    pub capabilities: BTreeMap<String, String>,
}

/// A resource as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRecord {
    /// Internal id, the key of allocations.
    pub id: i64,
    pub resource: Resource,
    /// Why the monitor took it out of service (`taken`); `None` when it did not.
    pub status: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl Resource {
    /// The name people know the resource by, on calendars and in offers: a floating IP's
    /// address, a segment as `physical_network:segment_id` (its id alone when it has no
    /// physical network), a device's name; the API id when the attribute is missing.
    pub fn display_name(&self) -> String {
        let text = |key: &str| match self.attrs.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let name = match self.kind.as_str() {
            crate::reservation::FLOATINGIP => text("floating_ip_address"),
            crate::reservation::NETWORK => match (text("physical_network"), text("segment_id")) {
                (Some(physical), Some(segment)) => Some(format!("{physical}:{segment}")),
                (None, Some(segment)) => Some(segment),
                _ => None,
            },
            crate::reservation::DEVICE => text("name"),
            _ => None,
        };
        name.unwrap_or_else(|| self.uid.clone())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    pub id: String,
    pub resource_type: String,
    pub property_name: String,
    pub private: bool,
    /// No two resources of the type may hold the same value of this property.
    pub is_unique: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Handover {
    pub resource_type: String,
    pub resource_id: i64,
    pub project_id: String,
    pub lease_id: String,
    pub reservation_id: String,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// Which hand-overs a list returns. Every field narrows the result.
#[derive(Debug, Clone, Default)]
pub struct HandoverFilter {
    pub resource_type: Option<String>,
    pub lease_id: Option<String>,
    pub project_id: Option<String>,
    /// Ended hand-overs too (history), not only those still open.
    pub include_ended: bool,
}

/// Where a hand-over stands in the list's order (type, resource, start, then its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoverPlace {
    pub resource_type: String,
    pub resource_id: i64,
    pub started_at: DateTime<Utc>,
    pub id: String,
}

/// A hand-over as listed, with the id the API shows for its resource: a host's id, or the
/// uid of a floating IP, segment or device (their internal ids are the allocations' keys).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedHandover {
    pub handover: Handover,
    pub api_id: String,
}

/// An HTTP(S) endpoint that receives lease events, signed with its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub id: String,
    /// `None`: every project's events (an admin's webhook).
    pub project_id: Option<String>,
    pub url: String,
    /// The HMAC-SHA256 key of its deliveries' signatures.
    pub secret: String,
    /// The event types it receives; empty: all of them.
    pub event_types: Vec<String>,
    pub description: String,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Where a webhook's delivery of one event stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    pub webhook_id: String,
    pub notification_id: String,
    pub event_type: String,
    pub lease_id: Option<String>,
    /// `pending`, `delivered` or `dead`.
    pub status: String,
    /// A worker is sending it now: its attempt is counted, its result not yet known.
    pub sending: bool,
    pub attempts: i64,
    pub next_attempt_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The HTTP status answered, or why there was none.
    pub last_result: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A project's leases published as an iCalendar feed at a URL carrying a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcalFeed {
    /// The public part of the feed's URL, used to find it.
    pub id: String,
    /// Hex SHA-256 digest of the secret part of the URL.
    pub secret_sha256: String,
    pub project_id: String,
    pub description: String,
    /// The user who created it, when known.
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// The public part of the token, used to find it.
    pub id: String,
    /// Hex SHA-256 digest of the token's secret part.
    pub secret_sha256: String,
    pub user_id: String,
    pub project_id: String,
    pub roles: Vec<String>,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A notification of the outbox: what happened to a lease or the inventory, in the words of
/// Blazar's notifications.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub id: String,
    /// `lease.create`, `lease.event.start_lease`, `lease.degraded`, ...
    pub event_type: String,
    pub lease_id: Option<String>,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
    /// The global id of the API request that caused it, if one did.
    pub request_id: Option<String>,
}

impl Notification {
    /// The payload's text at `key` (its `project_id`, `status`, ...), if it has one.
    pub fn payload_text(&self, key: &str) -> Option<&str> {
        self.payload.get(key).and_then(Value::as_str)
    }
}

/// A notification with its place in the outbox's order, which is final once readable: the
/// lease event stream resumes after it.
#[derive(Debug, Clone, PartialEq)]
pub struct SequencedNotification {
    pub seq: i64,
    pub notification: Notification,
}

/// What an outside-world action is to do, and for which lease: fixed when the transaction
/// that decides it records it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionIntent {
    /// Empty for inventory actions, which belong to no lease.
    pub lease_id: String,
    pub reservation_id: String,
    pub project_id: String,
    pub kind: ActionKind,
    pub purpose: ActionPurpose,
    pub resource_type: String,
    /// JSON: what the backend needs to carry it out without reading the database.
    pub payload: String,
    /// The global id of the API request that decided it, if one did.
    pub request_id: Option<String>,
}

/// An action in the queue: its intent, and how far carrying it out has come.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRecord {
    pub seq: i64,
    pub intent: ActionIntent,
    pub status: ActionStatus,
    pub attempts: i64,
    pub not_before: DateTime<Utc>,
    pub claimed_by: Option<String>,
    pub claimed_until: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
    /// When it was first claimed: its retries are counted from there.
    pub first_tried_at: Option<DateTime<Utc>>,
    /// Attempts whose worker stopped or hung before reporting back.
    pub lost_attempts: i64,
}

/// Which actions a list returns, newest first. Every field narrows the result.
#[derive(Debug, Clone, Default)]
pub struct ActionFilter {
    /// Any of these statuses; every status when empty.
    pub statuses: Vec<ActionStatus>,
    pub lease_id: Option<String>,
    pub project_id: Option<String>,
    /// Only actions recorded before this one (`seq` below it): the page after it.
    pub before_seq: Option<i64>,
    pub limit: usize,
}

/// Which leases a list returns. Every field narrows the result.
#[derive(Debug, Clone, Default)]
pub struct LeaseFilter {
    pub id: Option<String>,
    /// Any of these leases.
    pub ids: Option<Vec<String>>,
    pub project_id: Option<String>,
    pub user_id: Option<String>,
    pub status: Option<String>,
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::{DEVICE, FLOATINGIP, NETWORK};
    use serde_json::json;

    #[test]
    fn pool_resources_are_named_for_people() {
        let rows = [
            (
                FLOATINGIP,
                json!({"floating_ip_address": "172.24.4.10"}),
                "172.24.4.10",
            ),
            (
                NETWORK,
                json!({"physical_network": "physnet1", "segment_id": 1001}),
                "physnet1:1001",
            ),
            (
                NETWORK,
                json!({"physical_network": null, "segment_id": 7}),
                "7",
            ),
            (NETWORK, json!({"physical_network": "physnet1"}), "uid-1"),
            (DEVICE, json!({"name": "gpu-1"}), "gpu-1"),
            (DEVICE, json!({"name": ""}), "uid-1"),
            (FLOATINGIP, json!({}), "uid-1"),
        ];
        for (kind, fields, expected) in rows {
            let resource = Resource {
                uid: "uid-1".into(),
                kind: kind.into(),
                uniq: String::new(),
                attrs: fields.as_object().cloned().unwrap_or_default(),
                reservable: true,
                capabilities: BTreeMap::new(),
            };
            assert_eq!(resource.display_name(), expected, "{fields}");
        }
    }
}
