//! Domain to wire: the one place where stored rows become Blazar's JSON objects.

/// A body with one key, `{"<key>": value}`, serialized straight to bytes: large lists (10,000
/// hosts) never go through an intermediate `serde_json::Value` tree.
pub struct Envelope<T>(pub &'static str, pub T);

impl<T: serde::Serialize> serde::Serialize for Envelope<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.0, &self.1)?;
        map.end()
    }
}

use std::collections::BTreeMap;

use blazar_api::dates::{format_space, format_t};
use blazar_api::{
    Action, Allocation, AllocationReservation, Event, Handover, Host, Lease, Reservation,
    ResourceProperty,
};
use blazar_core::{ActionRecord, Property};
use blazar_core::{HostRecord, LeaseView};
use blazar_service::AllocationEntry;
use serde_json::Value;

pub fn host(h: HostRecord) -> Host {
    let capabilities: BTreeMap<String, Value> = h
        .capabilities
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    Host {
        id: h.id.to_string(),
        hypervisor_hostname: h.facts.hypervisor_hostname,
        service_name: h.facts.service_name,
        hypervisor_type: h.facts.hypervisor_type,
        hypervisor_version: h.facts.hypervisor_version,
        vcpus: h.facts.vcpus,
        memory_mb: h.facts.memory_mb,
        local_gb: h.facts.local_gb,
        cpu_info: h.facts.cpu_info,
        availability_zone: h.facts.availability_zone,
        status: h.status,
        reservable: h.reservable,
        trust_id: h.trust_id,
        created_at: format_space(h.created_at),
        updated_at: h.updated_at.map(format_space),
        capabilities,
    }
}

fn reservation(r: blazar_core::Reservation) -> Reservation {
    Reservation {
        resource_type: r.resource_type().to_string(),
        id: r.id,
        lease_id: r.lease_id,
        resource_id: r.resource_id,
        status: r.status.to_string(),
        missing_resources: r.missing_resources,
        resources_changed: r.resources_changed,
        created_at: format_space(r.created_at),
        updated_at: r.updated_at.map(format_space),
        params: r.spec.fields(),
    }
}

fn event(e: blazar_core::Event) -> Event {
    Event {
        id: e.id,
        lease_id: e.lease_id,
        event_type: e.event_type.to_string(),
        time: format_t(e.time),
        status: e.status.to_string(),
        created_at: format_space(e.created_at),
        updated_at: e.updated_at.map(format_space),
    }
}

pub fn lease(v: LeaseView) -> Lease {
    let l = v.lease;
    Lease {
        id: l.id,
        name: l.name,
        user_id: l.user_id,
        project_id: l.project_id,
        trust_id: l.trust_id,
        start_date: format_t(l.start),
        end_date: format_t(l.end),
        status: l.status.to_string(),
        degraded: l.degraded,
        created_at: format_space(l.created_at),
        updated_at: l.updated_at.map(format_space),
        reservations: v.reservations.into_iter().map(reservation).collect(),
        events: v.events.into_iter().map(event).collect(),
    }
}

pub fn allocation(a: AllocationEntry) -> Allocation {
    Allocation {
        resource_id: a.resource_id,
        reservations: a
            .reservations
            .into_iter()
            .map(|r| AllocationReservation {
                id: r.reservation_id,
                lease_id: r.lease_id,
                start_date: format_t(r.lease_start),
                end_date: format_t(r.lease_end),
            })
            .collect(),
    }
}

pub fn resource_property(p: Property) -> ResourceProperty {
    ResourceProperty {
        id: p.id,
        resource_type: p.resource_type,
        property_name: p.property_name,
        private: p.private,
        is_unique: p.is_unique,
        created_at: format_t(p.created_at),
        updated_at: p.updated_at.map(format_t),
    }
}

pub fn handover(h: blazar_core::Handover) -> Handover {
    Handover {
        resource_type: h.resource_type,
        resource_id: h.resource_id.to_string(),
        project_id: h.project_id,
        lease_id: h.lease_id,
        reservation_id: h.reservation_id,
        since: format_t(h.started_at),
        until: h.ended_at.map(format_t),
    }
}

/// An outside-world action, as `GET /v1/leases/{id}/actions` shows it.
pub fn action(row: &ActionRecord) -> Action {
    let payload: Value = serde_json::from_str(&row.payload).unwrap_or(Value::Null);
    Action {
        seq: row.seq,
        lease_id: row.lease_id.clone(),
        reservation_id: row.reservation_id.clone(),
        project_id: row.project_id.clone(),
        kind: row.kind.to_string(),
        purpose: row.purpose.to_string(),
        resource_type: row.resource_type.clone(),
        resources: payload["resources"].clone(),
        status: row.status.to_string(),
        attempts: row.attempts,
        last_error: row.last_error.clone(),
        request_id: row.request_id.clone(),
        not_before: format_t(row.not_before),
        created_at: format_t(row.created_at),
        updated_at: row.updated_at.map(format_t),
    }
}
