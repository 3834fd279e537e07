//! Request bodies. Blazar checks what it is sent field by field and answers a wrong one with a
//! message naming it, so the fields are loosely typed: an `Option<Value>` is `Some` exactly
//! when the key was sent (`null` included), and keys a body does not define are kept in its
//! `other` map. Reading any JSON object into these types succeeds; the server checks them.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A key that is present reads as `Some`, even when its value is `null`.
fn sent<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// `POST /v1/leases`, as python-blazarclient sends it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewLease {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Value>,
    /// `YYYY-MM-DD HH:MM` (UTC) or `now`.
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub start_date: Option<Value>,
    /// `YYYY-MM-DD HH:MM` (UTC) or `now`.
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub end_date: Option<Value>,
    /// `YYYY-MM-DD HH:MM` (UTC).
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub before_end_date: Option<Value>,
    /// A list with one object per reservation: `resource_type` plus the keys of that type.
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub reservations: Option<Value>,
    /// Custom events; only an empty list is accepted (the events come from the dates).
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub events: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `PUT /v1/leases/{id}`: any of the keys; a reservation change carries the reservation's
/// `id`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LeaseUpdate {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub start_date: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub end_date: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub before_end_date: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub reservations: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/os-hosts`: the host's name (or `hypervisor_hostname`), then hypervisor facts,
/// `reservable` and extra capabilities as flat keys.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewHost {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Value>,
    /// Facts (`vcpus`, `memory_mb`, ...), `reservable` and extra capabilities.
    #[serde(flatten)]
    pub values: Map<String, Value>,
}

/// `PUT /v1/os-hosts/{id}`: facts, `reservable` and extra capabilities to set; a `null`
/// capability is removed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostUpdate {
    #[serde(flatten)]
    pub values: Map<String, Value>,
}

/// `POST /v1/floatingips`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewFloatingIp {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_network_id: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub subnet_id: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ip_address: Option<Value>,
    /// `reservable`; any other key is refused.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/networks` (Chameleon): a network segment.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewNetwork {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_type: Option<Value>,
    /// Required for VLAN segments only.
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub physical_network: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub segment_id: Option<Value>,
    /// `reservable` and extra capabilities.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/devices` (Chameleon).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewDevice {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub device_type: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub device_driver: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub vendor_id: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub product_id: Option<Value>,
    /// `reservable` and extra capabilities.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `PUT /v1/floatingips|networks|devices/{id}`: `reservable` and extra capabilities to set
/// (a `null` capability is removed); a device also takes `device_type` and `device_driver`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ResourceUpdate {
    #[serde(flatten)]
    pub values: Map<String, Value>,
}

/// `PATCH .../properties/{name}`: `private` (Blazar) and `is_unique` (Chameleon).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PropertyUpdate {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub private: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub is_unique: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/flavors`: a flavor for `flavor:instance` reservations without Nova.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewFlavor {
    /// Chosen by the server when absent.
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub id: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub vcpus: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub ram: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk: Option<Value>,
    /// Nova's name for the ephemeral disk size, preferred to `ephemeral`.
    #[serde(
        rename = "OS-FLV-EXT-DATA:ephemeral",
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub nova_ephemeral: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub extra_specs: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `PUT /v1/os-hosts|devices/{id}/allocation` (Chameleon): which reservations of the
/// resource to move elsewhere (all of them when neither is given).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Reallocation {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub lease_id: Option<Value>,
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub reservation_id: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/reconcile`: `{"dry_run": true}` only reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReconcileRequest {
    #[serde(
        default,
        deserialize_with = "sent",
        skip_serializing_if = "Option::is_none"
    )]
    pub dry_run: Option<Value>,
    /// Any other key; the server refuses them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sent_null_is_kept_apart_from_an_absent_key() {
        let lease: NewLease =
            serde_json::from_value(json!({"name": null, "id": 1, "status": "x"})).unwrap();
        assert_eq!(lease.name, Some(Value::Null));
        assert_eq!(lease.start_date, None);
        let other: Vec<&str> = lease.other.keys().map(String::as_str).collect();
        assert_eq!(other, ["id", "status"], "in the order sent");
    }

    #[test]
    fn any_object_reads() {
        let body = json!({"name": 5, "reservations": "x", "events": {}, "extra": [1]});
        let lease: NewLease = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(serde_json::to_value(&lease).unwrap(), body);
        let flavor: NewFlavor =
            serde_json::from_value(json!({"OS-FLV-EXT-DATA:ephemeral": 1})).unwrap();
        assert_eq!(flavor.nova_ephemeral, Some(json!(1)));
    }
}
