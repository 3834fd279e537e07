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

/// A request body: every named field is an `Option<Value>` that is `Some` exactly when the key
/// was sent, and the field after `..` (`other` or `values`) keeps every other key, in the
/// order sent.
macro_rules! body {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* $field:ident, )*
            ..
            $(#[$rest_meta:meta])*
            $rest:ident
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
        pub struct $name {
            $(
                $(#[$field_meta])*
                #[serde(default, deserialize_with = "sent", skip_serializing_if = "Option::is_none")]
                pub $field: Option<Value>,
            )*
            $(#[$rest_meta])*
            #[serde(flatten)]
            pub $rest: Map<String, Value>,
        }
    };
}

body! {
    /// `POST /v1/leases`, as python-blazarclient sends it.
    pub struct NewLease {
        name,
        /// `YYYY-MM-DD HH:MM` (UTC) or `now`.
        start_date,
        /// `YYYY-MM-DD HH:MM` (UTC) or `now`.
        end_date,
        /// `YYYY-MM-DD HH:MM` (UTC).
        before_end_date,
        /// A list with one object per reservation: `resource_type` plus the keys of that type.
        reservations,
        /// Custom events; only an empty list is accepted (the events come from the dates).
        events,
        /// With `start_date: "earliest"`: the lease's length in minutes (no `end_date`).
        duration,
        /// With `start_date: "earliest"`: the search window, as for offers.
        not_before,
        not_after,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `POST /v1/leases/offers`: a lease request without dates, and where to look.
    pub struct OfferRequest {
        reservations,
        /// Minutes; or `min_duration` and `max_duration` for the longest window up to a bound.
        duration,
        min_duration,
        max_duration,
        /// `YYYY-MM-DD HH:MM` (UTC) or `now` (the default).
        not_before,
        /// `YYYY-MM-DD HH:MM` (UTC); 30 days after `not_before` by default.
        not_after,
        /// How many offers (5 by default).
        limit,
        /// `earliest` (the default) or `longest`.
        order,
        /// Taken and not used, so that a lease create's body without its dates is an offer
        /// request as it is.
        name,
        events,
        before_end_date,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `PUT /v1/leases/{id}`: any of the keys; a reservation change carries the reservation's
    /// `id`.
    pub struct LeaseUpdate {
        name,
        start_date,
        end_date,
        before_end_date,
        reservations,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `POST /v1/os-hosts`: the host's name (or `hypervisor_hostname`), then hypervisor facts,
    /// `reservable` and extra capabilities as flat keys.
    pub struct NewHost {
        name,
        ..
        /// Facts (`vcpus`, `memory_mb`, ...), `reservable` and extra capabilities.
        values
    }
}

body! {
    /// `PUT /v1/os-hosts/{id}`: facts, `reservable` and extra capabilities to set; a `null`
    /// capability is removed.
    pub struct HostUpdate {
        ..
        values
    }
}

body! {
    /// `POST /v1/floatingips`.
    pub struct NewFloatingIp {
        floating_network_id,
        subnet_id,
        floating_ip_address,
        ..
        /// `reservable`; any other key is refused.
        other
    }
}

body! {
    /// `POST /v1/networks` (Chameleon): a network segment.
    pub struct NewNetwork {
        network_type,
        /// Required for VLAN segments only.
        physical_network,
        segment_id,
        ..
        /// `reservable` and extra capabilities.
        other
    }
}

body! {
    /// `POST /v1/devices` (Chameleon).
    pub struct NewDevice {
        name,
        device_type,
        device_driver,
        vendor_id,
        product_id,
        ..
        /// `reservable` and extra capabilities.
        other
    }
}

body! {
    /// `PUT /v1/floatingips|networks|devices/{id}`: `reservable` and extra capabilities to set
    /// (a `null` capability is removed); a device also takes `device_type` and `device_driver`.
    pub struct ResourceUpdate {
        ..
        values
    }
}

body! {
    /// `PATCH .../properties/{name}`: `private` (Blazar) and `is_unique` (Chameleon).
    pub struct PropertyUpdate {
        private,
        is_unique,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `POST /v1/flavors`: a flavor for `flavor:instance` reservations without Nova.
    pub struct NewFlavor {
        /// Chosen by the server when absent.
        id,
        name,
        vcpus,
        ram,
        disk,
        /// Nova's name for the ephemeral disk size, preferred to `ephemeral`.
        #[serde(rename = "OS-FLV-EXT-DATA:ephemeral")]
        nova_ephemeral,
        ephemeral,
        extra_specs,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `PUT /v1/os-hosts|devices/{id}/allocation` (Chameleon): which reservations of the
    /// resource to move elsewhere (all of them when neither is given).
    pub struct Reallocation {
        lease_id,
        reservation_id,
        ..
        /// Any other key; the server refuses them.
        other
    }
}

body! {
    /// `POST /v1/reconcile`: `{"dry_run": true}` only reports.
    pub struct ReconcileRequest {
        dry_run,
        ..
        /// Any other key; the server refuses them.
        other
    }
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
