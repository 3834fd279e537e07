//! Inventory use cases besides hosts: floating IPs, network segments, devices (one generic
//! implementation over a per-kind description) and standalone flavors.

use std::collections::BTreeMap;

use blazar_core::reservation::SourceFlavor;
use blazar_core::{Flavor, Property, Resource, ResourceRecord};
use serde_json::{Map, Value};

use crate::hosts::{AllocationEntry, PropertyListing, as_bool, as_text, check_capability_key};
use crate::pool::{DEVICE, FLOATINGIP, NETWORK};
use crate::{Identity, Service, ServiceError, ServiceResult, new_id};

/// How one kind of pool resource is described on the API.
#[derive(Debug, Clone, Copy)]
pub struct KindSpec {
    pub kind: &'static str,
    /// The policy rule prefix (`blazar:floatingips`).
    pub rules: &'static str,
    /// Name of the id in "not found" messages (`floatingip_id`).
    pub id_param: &'static str,
    /// Fixed fields, in output order.
    pub fields: &'static [&'static str],
    /// Fields a create must give.
    pub required: &'static [&'static str],
    /// Whether other keys become extra capabilities.
    pub capabilities: bool,
}

pub const FLOATINGIPS: KindSpec = KindSpec {
    kind: FLOATINGIP,
    rules: "blazar:floatingips",
    id_param: "floatingip_id",
    fields: &["floating_network_id", "subnet_id", "floating_ip_address"],
    required: &["floating_network_id", "floating_ip_address"],
    capabilities: false,
};

pub const NETWORKS: KindSpec = KindSpec {
    kind: NETWORK,
    rules: "blazar:networks",
    id_param: "network_id",
    fields: &["network_type", "physical_network", "segment_id"],
    required: &["network_type", "segment_id"],
    capabilities: true,
};

pub const DEVICES: KindSpec = KindSpec {
    kind: DEVICE,
    rules: "blazar:devices",
    id_param: "device_id",
    fields: &[
        "name",
        "device_type",
        "device_driver",
        "vendor_id",
        "product_id",
    ],
    required: &["name"],
    capabilities: true,
};

/// Fields of every resource the server manages.
const PROTECTED: &[&str] = &[
    "id",
    "reservable_since",
    "created_at",
    "updated_at",
    "status",
];

pub(crate) fn not_found(spec: &KindSpec, id: &str) -> ServiceError {
    if spec.kind == FLOATINGIP {
        ServiceError::NotFound(format!("Floating IP {id} not found."))
    } else {
        ServiceError::NotFound(format!(
            "Object with {{'{}': '{id}'}} not found",
            spec.id_param
        ))
    }
}

/// Checks a kind's fixed fields and computes what must be unique.
/// Longest text a resource or flavor field holds (Blazar's and Nova's columns).
const MAX_FIELD_LEN: usize = 255;

fn check_length(key: &str, value: &Value) -> ServiceResult<()> {
    match value {
        Value::String(text) if text.chars().count() > MAX_FIELD_LEN => {
            Err(ServiceError::BadRequest(format!(
                "Malformed parameter {key}: at most {MAX_FIELD_LEN} characters, got {}",
                text.chars().count()
            )))
        }
        _ => Ok(()),
    }
}

/// Nova's rule for flavor ids: letters, digits, `.`, `_`, `-` and spaces between them. An
/// id is a path segment of `/v1/flavors/{id}` and a name in Nova.
fn check_flavor_id(id: &str) -> ServiceResult<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ' ');
    if id.chars().all(allowed) {
        return Ok(());
    }
    Err(ServiceError::BadRequest(format!(
        "Malformed parameter id: {:?} may hold only letters, digits, '.', '_', '-' and spaces",
        id.chars().take(64).collect::<String>()
    )))
}

/// Nova's bounds on extra specs: keys of 1 to 255 characters of letters, digits and
/// `-_:. `, values strings, numbers or booleans of at most 255 characters.
fn check_extra_specs(specs: &Map<String, Value>) -> ServiceResult<()> {
    for (key, value) in specs {
        let key_ok = (1..=MAX_FIELD_LEN).contains(&key.chars().count())
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.' | ' '));
        if !key_ok {
            return Err(ServiceError::BadRequest(format!(
                "Malformed extra spec key {:?}: 1 to {MAX_FIELD_LEN} letters, digits or -_:. ",
                key.chars().take(64).collect::<String>()
            )));
        }
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null | Value::Array(_) | Value::Object(_) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed extra spec {key}: expected a string, a number or a boolean"
                )));
            }
        };
        if text.chars().count() > MAX_FIELD_LEN || text.chars().any(char::is_control) {
            return Err(ServiceError::BadRequest(format!(
                "Malformed extra spec {key}: at most {MAX_FIELD_LEN} characters, none of them \
                 control characters"
            )));
        }
    }
    Ok(())
}

fn check_fields(spec: &KindSpec, attrs: &mut Map<String, Value>) -> ServiceResult<String> {
    for (key, value) in attrs.iter() {
        if let Value::String(text) = value {
            // Names, and the ids a reservation names (its `network_id` refuses them too).
            let name = matches!(
                key.as_str(),
                "name" | "physical_network" | "network_type" | "floating_network_id" | "subnet_id"
            );
            crate::check_text(key, text, name)?;
        }
    }
    match spec.kind {
        FLOATINGIP => {
            let address = attrs
                .get("floating_ip_address")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let parsed = blazar_core::reservation::canonical_address(address).ok_or_else(|| {
                ServiceError::BadRequest(format!("IP address {address} is invalid form."))
            })?;
            // No cloud can hand these to a server.
            if let Ok(ip) = parsed.parse::<std::net::IpAddr>()
                && (ip.is_unspecified()
                    || ip.is_multicast()
                    || ip == std::net::IpAddr::V4(std::net::Ipv4Addr::BROADCAST))
            {
                return Err(ServiceError::BadRequest(format!(
                    "IP address {address} cannot be a floating IP: it is unspecified, \
                     broadcast or multicast"
                )));
            }
            let network = attrs
                .get("floating_network_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if network.trim().is_empty() {
                return Err(ServiceError::BadRequest(
                    "Missing parameter floating_network_id".into(),
                ));
            }
            attrs.insert("floating_ip_address".into(), Value::from(parsed.clone()));
            attrs.entry("subnet_id").or_insert(Value::Null);
            Ok(format!("{network}/{parsed}"))
        }
        NETWORK => {
            let network_type = attrs
                .get("network_type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let physical = attrs
                .get("physical_network")
                .and_then(Value::as_str)
                .map(str::to_string);
            let segment = match attrs.get("segment_id") {
                Some(Value::Number(n)) => n.as_i64(),
                Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
                _ => None,
            }
            .ok_or_else(|| {
                ServiceError::BadRequest(format!(
                    "Malformed parameter segment_id: expected an integer, got {}",
                    attrs
                        .get("segment_id")
                        .map(Value::to_string)
                        .unwrap_or_default()
                ))
            })?;
            if network_type == "vlan" && !(1..=4094).contains(&segment) {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter segment_id: a VLAN id is from 1 to 4094, got {segment}"
                )));
            }
            if segment < 0 {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter segment_id: got {segment}"
                )));
            }
            attrs.insert("segment_id".into(), Value::from(segment));
            attrs.entry("physical_network").or_insert(Value::Null);
            Ok(format!(
                "{network_type}/{}/{segment}",
                physical.unwrap_or_default()
            ))
        }
        _ => {
            let name = attrs
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim()
                .to_string();
            if name.is_empty() {
                return Err(ServiceError::BadRequest("Missing parameter name".into()));
            }
            for field in ["device_type", "device_driver", "vendor_id", "product_id"] {
                attrs.entry(field).or_insert(Value::Null);
            }
            Ok(name)
        }
    }
}

fn duplicate(spec: &KindSpec, attrs: &Map<String, Value>) -> ServiceError {
    let show = |k: &str| {
        attrs
            .get(k)
            .map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string()))
            .unwrap_or_default()
    };
    ServiceError::Conflict(match spec.kind {
        FLOATINGIP => format!(
            "Floating IP {} is already registered on network {}",
            show("floating_ip_address"),
            show("floating_network_id")
        ),
        NETWORK => format!(
            "Segment {} of physical network {} is already registered",
            show("segment_id"),
            show("physical_network")
        ),
        _ => format!("Device '{}' is already registered", show("name")),
    })
}

impl Service {
    pub async fn create_resource(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        body: &Map<String, Value>,
    ) -> ServiceResult<ResourceRecord> {
        self.authorize_own(&format!("{}:post", spec.rules), identity)?;
        let missing: Vec<&str> = spec
            .required
            .iter()
            .copied()
            .filter(|k| body.get(*k).is_none_or(Value::is_null))
            .collect();
        if !missing.is_empty() {
            return Err(ServiceError::BadRequest(format!(
                "Missing parameter {}",
                missing.join(",")
            )));
        }
        let mut attrs = Map::new();
        let mut capabilities = BTreeMap::new();
        let mut reservable = true;
        for (key, value) in body {
            match key.as_str() {
                k if PROTECTED.contains(&k) => {
                    return Err(ServiceError::BadRequest(format!(
                        "{k} is set by the server and cannot be given"
                    )));
                }
                "reservable" => reservable = as_bool(key, value)?,
                k if spec.fields.contains(&k) => {
                    check_length(k, value)?;
                    // Every fixed field but a segment's number is text (or left out).
                    if k != "segment_id" && !matches!(value, Value::String(_) | Value::Null) {
                        return Err(ServiceError::BadRequest(format!(
                            "Malformed parameter {k}: expected a string, got {value}"
                        )));
                    }
                    attrs.insert(k.to_string(), value.clone());
                }
                k if spec.capabilities => {
                    check_capability_key(k)?;
                    if !value.is_null() {
                        capabilities.insert(k.to_string(), as_text(k, value)?);
                    }
                }
                k => {
                    return Err(ServiceError::BadRequest(format!(
                        "Unknown field {k}; accepted fields: {}",
                        spec.fields.join(", ")
                    )));
                }
            }
        }
        crate::hosts::check_capability_count(capabilities.keys(), &[])?;
        // Keep the fields in their documented order.
        let mut ordered = Map::new();
        for field in spec.fields {
            if let Some(v) = attrs.remove(*field) {
                ordered.insert(field.to_string(), v);
            }
        }
        let uniq = check_fields(spec, &mut ordered)?;
        if spec.kind == FLOATINGIP {
            // A cloud with networks of its own says which subnet holds the address, and
            // refuses one its DHCP could hand out (Blazar's checks at registration).
            let network = ordered
                .get("floating_network_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let address = ordered
                .get("floating_ip_address")
                .and_then(Value::as_str)
                .and_then(|a| a.parse().ok());
            if let Some(address) = address
                && let Some(subnet) = self.backend.check_floatingip(&network, address).await?
            {
                ordered.insert("subnet_id".into(), Value::from(subnet));
            }
        }
        let mut ordered_out = Map::new();
        for field in spec.fields {
            ordered_out.insert(
                field.to_string(),
                ordered.remove(*field).unwrap_or(Value::Null),
            );
        }
        let record = in_tx!(self, write, |tx| {
            let new = Resource {
                uid: new_id(),
                kind: spec.kind.to_string(),
                uniq: uniq.clone(),
                attrs: ordered_out.clone(),
                reservable,
                capabilities: capabilities.clone(),
            };
            match tx.insert_resource(&new, self.now()).await {
                Err(blazar_db::DbError::Duplicate(_)) => return Err(duplicate(spec, &ordered_out)),
                other => other?,
            };
            tx.get_resource(spec.kind, &new.uid)
                .await?
                .ok_or_else(|| ServiceError::Internal("resource vanished after insert".into()))
        })?;
        tracing::info!(resource.kind = spec.kind, resource.id = %record.resource.uid, "resource registered");
        Ok(record)
    }

    pub async fn list_resources(
        &self,
        identity: &Identity,
        spec: &KindSpec,
    ) -> ServiceResult<Vec<ResourceRecord>> {
        self.authorize_own(&format!("{}:get", spec.rules), identity)?;
        in_tx!(self, read, |tx| { Ok(tx.list_resources(spec.kind).await?) })
    }

    pub async fn get_resource(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        id: &str,
    ) -> ServiceResult<ResourceRecord> {
        self.authorize_own(&format!("{}:get", spec.rules), identity)?;
        in_tx!(self, read, |tx| {
            tx.get_resource(spec.kind, id)
                .await?
                .ok_or_else(|| not_found(spec, id))
        })
    }

    /// Changes extra capabilities (`null` removes one) and `reservable`; taking a resource
    /// out of service heals the reservations that hold it, bringing it back fills those that
    /// are missing resources.
    pub async fn update_resource(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        id: &str,
        body: &Map<String, Value>,
    ) -> ServiceResult<ResourceRecord> {
        // Looked up first, under the `get` rule, as Blazar does (see `delete_resource`).
        self.authorize_own(&format!("{}:get", spec.rules), identity)?;
        in_tx!(self, write, |tx| {
            let found = tx
                .get_resource(spec.kind, id)
                .await?
                .ok_or_else(|| not_found(spec, id))?;
            self.authorize_own(&format!("{}:put", spec.rules), identity)?;
            if body.is_empty() {
                return Err(ServiceError::BadRequest(
                    crate::hosts::NO_DATA_TO_UPDATE.into(),
                ));
            }
            if body.contains_key("reservable") {
                self.lock_leases_to_move(tx, spec.kind, found.id).await?;
            }
            // Read again once locked: a concurrent update committed meanwhile is built on,
            // not written back over.
            if !tx.lock_resource(found.id).await? {
                return Err(not_found(spec, id));
            }
            let record = tx
                .get_resource(spec.kind, id)
                .await?
                .ok_or_else(|| not_found(spec, id))?;
            let now = self.now();
            let mut reservable = record.resource.reservable;
            let mut capability_changes: Vec<(&str, Option<String>)> = Vec::new();
            for (key, value) in body {
                match key.as_str() {
                    "reservable" => reservable = as_bool(key, value)?,
                    k if spec.fields.contains(&k) || PROTECTED.contains(&k) => {
                        return Err(ServiceError::BadRequest(format!("{k} cannot be updated")));
                    }
                    k if spec.capabilities => {
                        check_capability_key(k)?;
                        let new_value = match value.is_null() {
                            true => None,
                            false => Some(as_text(k, value)?),
                        };
                        capability_changes.push((k, new_value));
                    }
                    k => {
                        return Err(ServiceError::BadRequest(format!(
                            "Unknown field {k}: only reservable can be updated"
                        )));
                    }
                }
            }
            crate::hosts::check_capability_count(
                record.resource.capabilities.keys(),
                &capability_changes,
            )?;
            self.check_resource_capabilities_not_in_use(tx, spec, &record, &capability_changes)
                .await?;
            for (key, value) in &capability_changes {
                match value {
                    Some(v) => tx.set_capability(spec.kind, record.id, key, v, now).await?,
                    None => {
                        tx.remove_capability(spec.kind, record.id, key).await?;
                    }
                }
            }
            if body.contains_key("reservable")
                && reservable == record.resource.reservable
                && record.status.is_some()
            {
                // The operator confirms what the monitor chose: their choice from now on, so
                // the monitor no longer puts it back when the cloud lets go of it (a change
                // of `reservable` clears the status the same way).
                tx.set_resource_health(record.id, reservable, None, now)
                    .await?;
            }
            if reservable != record.resource.reservable {
                tx.update_resource(
                    record.id,
                    &record.resource.attrs,
                    &record.resource.uniq,
                    reservable,
                    now,
                )
                .await?;
                if reservable {
                    self.fill_missing(tx, now).await?;
                } else {
                    self.heal_resource(tx, spec.kind, record.id, now).await?;
                }
            }
            tx.get_resource(spec.kind, id)
                .await?
                .ok_or_else(|| not_found(spec, id))
        })
    }

    /// As for hosts: a capability that a current or future reservation holding this
    /// resource filters on cannot change value or go, or the grant would be retroactively
    /// wrong (Blazar's device and network plugins refuse it the same way). New ones may be
    /// added.
    async fn check_resource_capabilities_not_in_use(
        &self,
        tx: &mut blazar_db::Tx,
        spec: &KindSpec,
        record: &ResourceRecord,
        changes: &[(&str, Option<String>)],
    ) -> ServiceResult<()> {
        let changed: Vec<&str> = changes
            .iter()
            .filter(|(k, v)| {
                record
                    .resource
                    .capabilities
                    .get(*k)
                    .is_some_and(|old| Some(old) != v.as_ref())
            })
            .map(|(k, _)| *k)
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let mut in_use = Vec::new();
        for reservation in self.holders(tx, spec.kind, record.id).await? {
            in_use.extend(
                reservation
                    .spec
                    .query_keys()
                    .into_iter()
                    .filter(|k| changed.contains(k))
                    .map(str::to_string),
            );
        }
        crate::hosts::refuse_in_use(
            in_use,
            &format!("{} {}", crate::pool::noun(spec.kind), record.resource.uid),
        )
    }

    pub async fn delete_resource(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        id: &str,
    ) -> ServiceResult<()> {
        // Blazar looks the resource up first, under its `get` rule: a caller who may read it
        // learns that it does not exist (404) before being told it may not delete it.
        self.authorize_own(&format!("{}:get", spec.rules), identity)?;
        in_tx!(self, write, |tx| {
            let record = tx
                .get_resource(spec.kind, id)
                .await?
                .ok_or_else(|| not_found(spec, id))?;
            self.authorize_own(&format!("{}:delete", spec.rules), identity)?;
            // A concurrent delete that got there first leaves nothing to delete.
            if !tx.lock_resource(record.id).await? {
                return Err(not_found(spec, id));
            }
            if tx
                .has_unended_allocation(spec.kind, record.id, self.now())
                .await?
            {
                return Err(ServiceError::Conflict(if spec.kind == FLOATINGIP {
                    format!(
                        "Can't delete floating IP {id}. Floating IP id {id} is allocated by reservations."
                    )
                } else {
                    format!("Can't delete {} {id}. It is reserved.", spec.kind)
                }));
            }
            tx.delete_allocations_of_resource(spec.kind, record.id)
                .await?;
            tx.delete_resource(record.id).await?;
            Ok(())
        })
    }

    /// Allocations of every resource of a kind, or of one.
    /// The allocations of one floating IP, segment or device (the whole list streams:
    /// `Service::allocation_list`).
    pub async fn resource_allocation(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        uid: &str,
        request: &crate::AllocationListRequest,
    ) -> ServiceResult<AllocationEntry> {
        self.authorize_own(&format!("{}:get_allocations", spec.rules), identity)?;
        let filter = self.allocation_filter(request)?;
        in_tx!(self, read, |tx| {
            let record = tx
                .get_resource(spec.kind, uid)
                .await?
                .ok_or_else(|| not_found(spec, uid))?;
            let filter = blazar_db::AllocationFilter {
                resources: Some((record.id, record.id)),
                ..filter.clone()
            };
            let reservations = tx.allocation_views_where(spec.kind, &filter).await?;
            Ok(AllocationEntry {
                resource_id: record.resource.uid,
                reservations,
            })
        })
    }

    pub async fn list_resource_properties(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        detail: bool,
        all: bool,
    ) -> ServiceResult<PropertyListing> {
        self.list_properties(
            identity,
            &format!("{}:get_resource_properties", spec.rules),
            spec.kind,
            detail,
            all,
        )
        .await
    }

    pub async fn update_resource_property(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        name: &str,
        body: &Map<String, Value>,
    ) -> ServiceResult<Property> {
        self.authorize_own(
            &format!("{}:update_resource_properties", spec.rules),
            identity,
        )?;
        self.set_property_private(spec.kind, name, body).await
    }

    pub async fn create_flavor(
        &self,
        identity: &Identity,
        body: &Map<String, Value>,
    ) -> ServiceResult<Flavor> {
        self.authorize_own("blazar:flavors:post", identity)?;
        const FIELDS: &[&str] = &[
            "id",
            "name",
            "vcpus",
            "ram",
            "disk",
            "OS-FLV-EXT-DATA:ephemeral",
            "ephemeral",
            "extra_specs",
        ];
        if let Some(k) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(ServiceError::BadRequest(format!(
                "Unknown field {k}; accepted fields: {}",
                FIELDS.join(", ")
            )));
        }
        let name = match body.get("name") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            _ => return Err(ServiceError::BadRequest("Missing parameter name".into())),
        };
        for key in ["id", "name"] {
            if let Some(value) = body.get(key) {
                check_length(key, value)?;
            }
        }
        // Nova's bounds: vCPUs and RAM from 1, disks from 0, all at most 2^31-1.
        let max = blazar_core::reservation::MAX_FLAVOR_SIZE;
        let number = |key: &str, min: i64, default: Option<i64>| -> ServiceResult<i64> {
            match body.get(key) {
                None | Some(Value::Null) => default
                    .ok_or_else(|| ServiceError::BadRequest(format!("Missing parameter {key}"))),
                Some(Value::Number(n)) if n.as_i64().is_some_and(|v| (min..=max).contains(&v)) => {
                    Ok(n.as_i64().unwrap_or(min))
                }
                Some(other) => Err(ServiceError::BadRequest(format!(
                    "Malformed parameter {key}: must be an integer from {min} to {max}, got {other}"
                ))),
            }
        };
        let ephemeral = match body.get("OS-FLV-EXT-DATA:ephemeral") {
            Some(_) => number("OS-FLV-EXT-DATA:ephemeral", 0, Some(0))?,
            None => number("ephemeral", 0, Some(0))?,
        };
        crate::check_text("name", &name, true)?;
        let extra_specs = match body.get("extra_specs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => {
                check_extra_specs(m)?;
                m.clone()
            }
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter extra_specs: expected an object, got {other}"
                )));
            }
        };
        let id = match body.get("id") {
            Some(Value::String(s)) if !s.trim().is_empty() => {
                check_flavor_id(s.trim())?;
                s.trim().to_string()
            }
            None | Some(Value::Null) => new_id(),
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter id: got {other}"
                )));
            }
        };
        let flavor = Flavor {
            source: SourceFlavor {
                id,
                name,
                vcpus: number("vcpus", 1, None)?,
                ram: number("ram", 1, None)?,
                disk: number("disk", 0, Some(0))?,
                ephemeral,
                extra_specs,
            },
            created_at: self.now(),
            updated_at: None,
        };
        // The size an instance of it takes (extra specs included) and its traits must make
        // sense now, not when a lease first uses it.
        crate::instance::check_flavor(&flavor)?;
        in_tx!(self, write, |tx| {
            match tx.insert_flavor(&flavor).await {
                Err(blazar_db::DbError::Duplicate(_)) => Err(ServiceError::Conflict(format!(
                    "Flavor {} already exists",
                    flavor.source.name
                ))),
                other => Ok(other?),
            }
        })?;
        Ok(flavor)
    }

    pub async fn list_flavors(&self, identity: &Identity) -> ServiceResult<Vec<Flavor>> {
        self.authorize_own("blazar:flavors:get", identity)?;
        in_tx!(self, read, |tx| { Ok(tx.list_flavors().await?) })
    }

    pub async fn get_flavor(&self, identity: &Identity, id: &str) -> ServiceResult<Flavor> {
        self.authorize_own("blazar:flavors:get", identity)?;
        in_tx!(self, read, |tx| {
            tx.find_flavor(id).await?.ok_or_else(|| {
                ServiceError::NotFound(format!("Object with {{'flavor_id': '{id}'}} not found"))
            })
        })
    }

    pub async fn delete_flavor(&self, identity: &Identity, id: &str) -> ServiceResult<()> {
        self.authorize_own("blazar:flavors:delete", identity)?;
        in_tx!(self, write, |tx| {
            let not_found =
                || ServiceError::NotFound(format!("Object with {{'flavor_id': '{id}'}} not found"));
            let flavor = tx.find_flavor(id).await?.ok_or_else(not_found)?;
            // Reservations keep a copy of the flavor they were made from, so deleting it
            // changes nothing already granted.
            if !tx.delete_flavor(&flavor.source.id).await? {
                // Deleted meanwhile by a concurrent request: one of them says so.
                return Err(not_found());
            }
            Ok(())
        })
    }
}

/// Shared by the host and pool property endpoints.
impl Service {
    /// `GET .../properties` under policy `rule`: the properties of `kind`, with their values
    /// (`detail`) or by name; private ones only for an admin who asks for `all`.
    pub(crate) async fn list_properties(
        &self,
        identity: &Identity,
        rule: &str,
        kind: &str,
        detail: bool,
        all: bool,
    ) -> ServiceResult<PropertyListing> {
        self.authorize_own(rule, identity)?;
        let show_private = all && self.is_admin(identity);
        let properties = in_tx!(self, read, |tx| { Ok(tx.list_properties(kind).await?) })?
            .into_iter()
            .filter(|p| show_private || !p.private)
            .collect::<Vec<_>>();
        Ok(if detail {
            PropertyListing::Detail(properties)
        } else {
            PropertyListing::Names(properties.into_iter().map(|p| p.property_name).collect())
        })
    }

    /// `PATCH .../properties/<name>`: `private` (Blazar) and `is_unique` (Chameleon), either
    /// or both.
    pub(crate) async fn set_property_private(
        &self,
        kind: &str,
        name: &str,
        body: &Map<String, Value>,
    ) -> ServiceResult<Property> {
        let unknown: Vec<&str> = body
            .keys()
            .map(String::as_str)
            .filter(|k| !matches!(*k, "private" | "is_unique"))
            .collect();
        if !unknown.is_empty() {
            return Err(ServiceError::BadRequest(format!(
                "Only \"private\" and \"is_unique\" can be updated on a resource property; got {}",
                unknown.join(", ")
            )));
        }
        let private = body
            .get("private")
            .map(|v| as_bool("private", v))
            .transpose()?;
        let is_unique = body
            .get("is_unique")
            .map(|v| as_bool("is_unique", v))
            .transpose()?;
        in_tx!(self, write, |tx| {
            let property = tx.get_property(kind, name).await?.ok_or_else(|| {
                ServiceError::NotFound(format!("Resource property {name} not found for {kind}"))
            })?;
            if let Some(private) = private {
                tx.set_property_private(&property.id, private, self.now())
                    .await?;
            }
            if let Some(is_unique) = is_unique {
                tx.set_property_unique(&property, is_unique, self.now())
                    .await?;
            }
            tx.get_property(kind, name)
                .await?
                .ok_or_else(|| ServiceError::Internal(format!("property {name} vanished")))
        })
    }
}
