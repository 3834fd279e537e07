//! Resource types: how a reservation request of one type is validated and how resources are
//! chosen for it. `physical:host` is the first; instances, floating IPs, network segments and
//! devices implement the same trait.

use std::collections::HashSet;

use async_trait::async_trait;
use blazar_core::host::HostRecord;
use blazar_core::{PHYSICAL_HOST, PropertyQuery, TimeWindow, engine};
use blazar_db::{NewAllocation, Tx};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::{ServiceError, ServiceResult};

/// What an allocation is for.
#[derive(Debug, Clone)]
pub struct AllocationRequest<'a> {
    pub lease_id: &'a str,
    pub reservation_id: &'a str,
    /// 1-based position of the reservation in the lease, for error messages.
    pub ordinal: usize,
    pub window: TimeWindow,
    pub blocked_until: DateTime<Utc>,
    /// Resources the reservation holds already; kept when possible.
    pub keep: &'a [i64],
}

#[async_trait]
pub trait ResourceType: Send + Sync {
    /// The `resource_type` string of the API.
    fn name(&self) -> &'static str;

    /// Validates a reservation request and returns the type-specific fields to store and show.
    /// For an update, `current` holds the stored fields and `request` only what changes.
    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>>;

    /// Chooses resources for the window and writes the allocations, in the caller's
    /// transaction. Returns the chosen resource ids.
    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Vec<i64>>;
}

pub struct PhysicalHostType;

const HOST_FIELDS: &[&str] = &[
    "min",
    "max",
    "hypervisor_properties",
    "resource_properties",
    "before_end",
];
const BEFORE_END_ACTIONS: &[&str] = &["default", "", "snapshot"];

fn int_field(map: &Map<String, Value>, key: &str) -> ServiceResult<i64> {
    match map.get(key) {
        None | Some(Value::Null) => {
            Err(ServiceError::BadRequest(format!("Missing parameter {key}")))
        }
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if (1..=i64::from(i32::MAX)).contains(&v) => Ok(v),
            _ => Err(ServiceError::BadRequest(format!(
                "Malformed parameter {key}: must be an integer from 1 to {}, got {n}",
                i32::MAX
            ))),
        },
        Some(other) => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: must be a JSON integer of at least 1, got {other}"
        ))),
    }
}

fn query_field(
    map: &Map<String, Value>,
    key: &str,
) -> ServiceResult<(String, Option<PropertyQuery>)> {
    let text = match map.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        // Blazar stores the query as a JSON string; a list sent as JSON means the same thing.
        Some(list @ Value::Array(_)) => list.to_string(),
        Some(other) => {
            return Err(ServiceError::BadRequest(format!(
                "Malformed requirements {key}: expected a query string such as \
                 '[\"==\", \"$gpu\", \"true\"]', got {other}"
            )));
        }
    };
    let query = PropertyQuery::parse(&text).map_err(|e| {
        ServiceError::BadRequest(format!("Malformed requirements {key} {text}: {e}"))
    })?;
    Ok((text, query))
}

/// Refuses queries on properties no host has: Blazar answers those with a 500.
fn check_known_properties(
    hosts: &[HostRecord],
    field: &str,
    query: &PropertyQuery,
) -> ServiceResult<()> {
    for key in query.keys() {
        if HostRecord::is_column(key) || hosts.iter().any(|h| h.capabilities.contains_key(key)) {
            continue;
        }
        let mut known: Vec<&str> = hosts
            .iter()
            .flat_map(|h| h.capabilities.keys().map(String::as_str))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        known.sort_unstable();
        let known = if known.is_empty() {
            "no host has extra capabilities".to_string()
        } else {
            format!("known extra capabilities: {}", known.join(", "))
        };
        return Err(ServiceError::BadRequest(format!(
            "Unknown property ${key} in {field}: no host has it ({known}; columns such as \
             $vcpus or $memory_mb can be used too)"
        )));
    }
    Ok(())
}

#[async_trait]
impl ResourceType for PhysicalHostType {
    fn name(&self) -> &'static str {
        PHYSICAL_HOST
    }

    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>> {
        let unknown: Vec<&str> = request
            .keys()
            .map(String::as_str)
            .filter(|k| !HOST_FIELDS.contains(k) && *k != "resource_type" && *k != "id")
            .collect();
        if !unknown.is_empty() {
            return Err(ServiceError::BadRequest(format!(
                "Unknown field(s) {} in a physical:host reservation; accepted fields: {}",
                unknown.join(", "),
                HOST_FIELDS.join(", ")
            )));
        }
        let mut merged = current.cloned().unwrap_or_default();
        for (k, v) in request {
            if HOST_FIELDS.contains(&k.as_str()) {
                merged.insert(k.clone(), v.clone());
            }
        }
        let min = int_field(&merged, "min")?;
        let max = int_field(&merged, "max")?;
        if max < min {
            return Err(ServiceError::BadRequest(format!(
                "Invalid values for min/max of hosts. Max must be equal to or larger than min \
                 (got min {min}, max {max})"
            )));
        }
        let (hypervisor_properties, _) = query_field(&merged, "hypervisor_properties")?;
        let (resource_properties, _) = query_field(&merged, "resource_properties")?;
        let before_end = match merged.get("before_end") {
            None | Some(Value::Null) => "default".to_string(),
            Some(Value::String(s)) if BEFORE_END_ACTIONS.contains(&s.as_str()) => s.clone(),
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter before_end: use one of \"default\", \"\", \"snapshot\", got {other}"
                )));
            }
        };
        // Blazar's key order, which clients print as they receive it.
        let mut out = Map::new();
        out.insert(
            "hypervisor_properties".into(),
            Value::from(hypervisor_properties),
        );
        out.insert(
            "resource_properties".into(),
            Value::from(resource_properties),
        );
        out.insert("before_end".into(), Value::from(before_end));
        out.insert("min".into(), Value::from(min));
        out.insert("max".into(), Value::from(max));
        Ok(out)
    }

    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Vec<i64>> {
        let min = int_field(params, "min")? as usize;
        let max = int_field(params, "max")? as usize;
        let (_, hypervisor_query) = query_field(params, "hypervisor_properties")?;
        let (_, resource_query) = query_field(params, "resource_properties")?;

        tx.lock_allocations().await?;
        let hosts = tx.list_hosts().await?;
        for (field, query) in [
            ("hypervisor_properties", &hypervisor_query),
            ("resource_properties", &resource_query),
        ] {
            if let Some(q) = query {
                check_known_properties(&hosts, field, q)?;
            }
        }
        let matching: Vec<i64> = hosts
            .iter()
            .filter(|h| h.reservable)
            .filter(|h| {
                let lookup = |k: &str| h.property(k);
                [&hypervisor_query, &resource_query]
                    .iter()
                    .all(|q| q.as_ref().is_none_or(|q| q.matches(&lookup)))
            })
            .map(|h| h.id)
            .collect();
        let busy = tx
            .busy_resources(PHYSICAL_HOST, request.window.start(), request.blocked_until)
            .await?;
        let chosen = engine::pick(&matching, &busy, request.keep, min, max).map_err(|s| {
            ServiceError::Conflict(format!(
                "Not enough hosts available for reservation {} (physical:host, min {}): {} host(s) \
                 match the filters and are reservable, {} of them free from {} to {}",
                request.ordinal,
                s.min,
                s.matching,
                s.free,
                request.window.start().format("%Y-%m-%d %H:%M"),
                request.window.end().format("%Y-%m-%d %H:%M"),
            ))
        })?;
        // A host deleted or put in maintenance by a concurrent transaction since we read the
        // inventory: start over with a fresh view.
        let still_there = tx.lock_reservable_hosts(&chosen).await?;
        if still_there.len() != chosen.len() {
            return Err(ServiceError::Retry(
                "a chosen host changed concurrently".into(),
            ));
        }
        for host_id in &chosen {
            tx.insert_allocation(&NewAllocation {
                reservation_id: request.reservation_id.to_string(),
                lease_id: request.lease_id.to_string(),
                resource_type: PHYSICAL_HOST.to_string(),
                resource_id: *host_id,
                start: request.window.start(),
                end: request.window.end(),
                blocked_until: request.blocked_until,
            })
            .await?;
        }
        Ok(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn validate(v: Value) -> Result<Map<String, Value>, ServiceError> {
        let Value::Object(map) = v else {
            panic!("object")
        };
        PhysicalHostType.validate(&map, None)
    }

    #[test]
    fn validation_table() {
        let ok = [
            json!({"min": 1, "max": 2, "hypervisor_properties": "", "resource_properties": ""}),
            json!({"min": 1, "max": 1}),
            json!({"min": 2, "max": 2, "resource_properties": "[\"==\", \"$gpu\", \"true\"]", "before_end": "snapshot"}),
            json!({"min": 1, "max": 1, "resource_properties": ["or", ["==", "$a", "1"], ["==", "$a", "2"]]}),
        ];
        for v in ok {
            assert!(validate(v.clone()).is_ok(), "{v}");
        }
        let bad = [
            (json!({"max": 1}), "Missing parameter min"),
            (json!({"min": "1", "max": 1}), "Malformed parameter min"),
            (json!({"min": "", "max": ""}), "Malformed parameter min"),
            (json!({"min": 0, "max": 1}), "Malformed parameter min"),
            (json!({"min": 1.5, "max": 2}), "Malformed parameter min"),
            (
                json!({"min": 3, "max": 2}),
                "Max must be equal to or larger than min",
            ),
            (
                json!({"min": 1, "max": 1, "resource_properties": "[\"==\", \"gpu\"]"}),
                "Malformed requirements",
            ),
            (
                json!({"min": 1, "max": 1, "before_end": "explode"}),
                "Malformed parameter before_end",
            ),
            (
                json!({"min": 1, "max": 1, "amount": 3}),
                "Unknown field(s) amount",
            ),
        ];
        for (v, expected) in bad {
            let err = validate(v.clone()).unwrap_err();
            assert!(
                matches!(err, ServiceError::BadRequest(ref m) if m.contains(expected)),
                "{v}: {err:?}"
            );
        }
    }

    #[test]
    fn update_merges_with_stored_fields() {
        let stored = validate(
            json!({"min": 1, "max": 2, "resource_properties": "[\"==\", \"$gpu\", \"true\"]"}),
        )
        .unwrap();
        let change = json!({"max": 1});
        let Value::Object(change) = change else {
            unreachable!()
        };
        let merged = PhysicalHostType.validate(&change, Some(&stored)).unwrap();
        assert_eq!(merged["max"], json!(1));
        assert_eq!(
            merged["resource_properties"],
            json!("[\"==\", \"$gpu\", \"true\"]")
        );
    }
}
