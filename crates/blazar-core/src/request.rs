//! Reservations as a request carries them: read once where the request enters, into a spec
//! (a create, an offer search) or into a change that applies to a stored spec (an update).
//!
//! A create's reservation is parsed when it is read, but the verdict waits: the use case
//! gives it after the checks Blazar makes first (policy, lease name, dates), so a caller who
//! may not create leases is told so (403) before hearing what is wrong with the body, as in
//! Blazar. An update's fields can only be read against the reservation they change (its
//! type says what `resource_properties` means, its stored values fill what the update leaves
//! out), so a [`ReservationChange`] keeps them until [`ReservationChange::apply`].

use serde_json::{Map, Value};

use crate::reservation::{ReservationSpec, SpecError};

/// One reservation of a lease create or offer search: its spec, or why it is not one.
#[derive(Debug, Clone)]
pub struct ReservationRequest {
    position: usize,
    resource_type: Option<String>,
    spec: Result<ReservationSpec, SpecError>,
    sent: Value,
}

impl ReservationRequest {
    /// Reads the reservation at `position` (1-based, as messages count) of a request body.
    pub fn read(position: usize, body: Map<String, Value>) -> ReservationRequest {
        let resource_type = body
            .get("resource_type")
            .and_then(Value::as_str)
            .map(str::to_string);
        let spec = match body.get("resource_type") {
            Some(Value::String(kind)) => ReservationSpec::parse(kind, &body, None),
            None | Some(Value::Null) => Err(SpecError(format!(
                "Missing parameter resource_type in reservation {position}"
            ))),
            Some(other) => Err(SpecError(format!(
                "Malformed parameter resource_type in reservation {position}: expected a \
                 string, got {other}"
            ))),
        };
        ReservationRequest {
            position,
            resource_type,
            spec,
            sent: Value::Object(body),
        }
    }

    /// Reads a whole `reservations` list.
    pub fn read_all(bodies: Vec<Map<String, Value>>) -> Vec<ReservationRequest> {
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| ReservationRequest::read(i + 1, body))
            .collect()
    }

    /// Where it stands in the request, from 1.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The `resource_type` it names, when it names one as a string.
    pub fn resource_type(&self) -> Option<&str> {
        self.resource_type.as_deref()
    }

    /// The spec, or the 400 that the request earns.
    pub fn spec(&self) -> Result<&ReservationSpec, &SpecError> {
        self.spec.as_ref()
    }

    /// The reservation as the caller sent it: what Blazar shows usage-enforcement filters.
    pub fn as_sent(&self) -> &Value {
        &self.sent
    }
}

/// One reservation of a lease update: the reservation it changes and the fields it sets.
#[derive(Debug, Clone)]
pub struct ReservationChange {
    id: Option<String>,
    resource_type: Option<Value>,
    fields: Map<String, Value>,
}

impl ReservationChange {
    /// Reads one entry of an update's `reservations` list.
    pub fn read(body: Map<String, Value>) -> ReservationChange {
        // Any other JSON value names no reservation of the lease: refused as an invalid id,
        // as Blazar does.
        let id = match body.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        ReservationChange {
            id,
            resource_type: body.get("resource_type").cloned(),
            fields: body,
        }
    }

    /// Reads a whole `reservations` list.
    pub fn read_all(bodies: Vec<Map<String, Value>>) -> Vec<ReservationChange> {
        bodies.into_iter().map(ReservationChange::read).collect()
    }

    /// The id of the reservation it changes, if it names one.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Whether it asks to change the reservation's type, which no update may: it names a
    /// `resource_type` other than `current`.
    pub fn changes_type(&self, current: &str) -> bool {
        self.resource_type
            .as_ref()
            .is_some_and(|kind| kind.as_str() != Some(current))
    }

    /// Whether it sets any of the fields `keys`.
    pub fn sets_any(&self, keys: &[&str]) -> bool {
        keys.iter().any(|k| self.fields.contains_key(*k))
    }

    /// The spec `current` (of type `resource_type`) becomes with this change.
    pub fn apply(
        &self,
        resource_type: &str,
        current: &ReservationSpec,
    ) -> Result<ReservationSpec, SpecError> {
        ReservationSpec::parse(resource_type, &self.fields, Some(current))
    }

    /// The change as the caller sent it: what Blazar shows usage-enforcement filters.
    pub fn as_sent(&self) -> Value {
        Value::Object(self.fields.clone())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn a_create_reservation_is_parsed_when_read_and_judged_later() {
        let read = ReservationRequest::read_all(vec![
            body(json!({"resource_type": "physical:host", "min": 1, "max": 2})),
            body(json!({"min": 1})),
            body(json!({"resource_type": 7})),
            body(json!({"resource_type": "physical:host", "min": 3, "max": 2})),
        ]);
        let Ok(ReservationSpec::Host(h)) = read[0].spec() else {
            panic!("a host spec: {:?}", read[0].spec());
        };
        assert_eq!((h.min, h.max), (1, 2));
        assert_eq!(read[0].resource_type(), Some("physical:host"));
        assert_eq!(read[0].as_sent()["min"], 1);
        assert_eq!(
            read[1].spec().map_err(|e| e.0.as_str()).err(),
            Some("Missing parameter resource_type in reservation 2")
        );
        assert_eq!(read[1].resource_type(), None);
        assert_eq!(
            read[2].spec().map_err(|e| e.0.as_str()).err(),
            Some("Malformed parameter resource_type in reservation 3: expected a string, got 7")
        );
        assert_eq!(read[3].position(), 4);
        assert!(
            read[3]
                .spec()
                .is_err_and(|e| e.0.starts_with("Invalid values for min/max of hosts"))
        );
    }

    #[test]
    fn an_update_change_applies_on_top_of_the_stored_spec() {
        let current = ReservationSpec::parse(
            "physical:host",
            &body(json!({"min": 1, "max": 3, "resource_properties": "[\"==\", \"$a\", \"b\"]"})),
            None,
        )
        .unwrap();
        let change = ReservationChange::read(body(json!({"id": "r1", "max": 5})));
        assert_eq!(change.id(), Some("r1"));
        assert!(!change.changes_type("physical:host"));
        let Ok(ReservationSpec::Host(h)) = change.apply("physical:host", &current) else {
            panic!("a host spec");
        };
        assert_eq!((h.min, h.max), (1, 5));
        assert_eq!(h.resource_properties.text(), "[\"==\", \"$a\", \"b\"]");

        assert_eq!(ReservationChange::read(body(json!({"max": 1}))).id(), None);
        let retyped = ReservationChange::read(body(json!({"id": 4, "resource_type": "device"})));
        assert_eq!(retyped.id(), Some("4"));
        assert!(retyped.changes_type("physical:host"));
        assert!(
            ReservationChange::read(body(json!({"id": "r1", "min": 9})))
                .apply("physical:host", &current)
                .is_err()
        );
    }
}
