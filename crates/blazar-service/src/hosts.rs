//! Host inventory, host properties and allocation use cases. All admin-only, as in Blazar.

use std::collections::BTreeMap;
use std::sync::Arc;

use blazar_core::host::{FACT_FIELDS, MAX_CAPABILITY_KEY_LEN};
use blazar_core::{ActionKind, ActionStatus, HostFacts, HostRecord, PHYSICAL_HOST};
use blazar_core::{HandoverFilter, HandoverPlace, ListedHandover, Property};
use blazar_db::{AllocationView, NewHost};
use serde_json::{Map, Value};

use crate::resources::Inventory;
use crate::{Identity, Service, ServiceError, ServiceResult};

/// The hosts of a host list: the shared inventory itself, not a copy of it (a site's hosts
/// are tens of megabytes in memory, and every reader of the list would hold its own).
pub struct HostList(Arc<Inventory>);

/// Blazar's answer to an update of a host with nothing in it.
pub const NO_DATA_TO_UPDATE: &str = "No data to update";

impl HostList {
    pub fn hosts(&self) -> &[HostRecord] {
        &self.0.hosts
    }
}

/// Keys of a host body that are never written by a request.
const PROTECTED_HOST_FIELDS: &[&str] = &["id", "trust_id", "status", "created_at", "updated_at"];

/// Defaults for facts an operator does not give (the values of a small QEMU hypervisor).
fn default_facts(name: &str) -> HostFacts {
    HostFacts {
        hypervisor_hostname: name.to_string(),
        service_name: name.to_string(),
        hypervisor_type: "QEMU".to_string(),
        hypervisor_version: 0,
        vcpus: 16,
        memory_mb: 65536,
        local_gb: 500,
        cpu_info: "{}".to_string(),
        availability_zone: "nova".to_string(),
    }
}

/// One resource's allocations, as `/allocations` lists them.
#[derive(Debug, Clone)]
pub struct AllocationEntry {
    /// The id the API shows for the resource.
    pub resource_id: String,
    pub reservations: Vec<AllocationView>,
}

/// The `/allocations` entries of `resources` (internal id, API id), in resource id order, each
/// with the views of its allocations. `views` come from the store sorted by resource, so
/// one walk of both lists pairs them; resources are sorted first if a caller did not.
pub(crate) fn allocation_entries(
    resources: impl IntoIterator<Item = (i64, String)>,
    views: Vec<AllocationView>,
) -> Vec<AllocationEntry> {
    let mut resources: Vec<(i64, String)> = resources.into_iter().collect();
    if !resources.is_sorted_by_key(|r| r.0) {
        resources.sort_by_key(|r| r.0);
    }
    debug_assert!(views.is_sorted_by_key(|v| v.resource_id));
    let mut views = views.into_iter().peekable();
    resources
        .into_iter()
        .map(|(id, resource_id)| {
            while views.next_if(|v| v.resource_id < id).is_some() {}
            let mut reservations = Vec::new();
            while let Some(view) = views.next_if(|v| v.resource_id == id) {
                reservations.push(view);
            }
            AllocationEntry {
                resource_id,
                reservations,
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
pub enum PropertyListing {
    Names(Vec<String>),
    Detail(Vec<blazar_db::PropertyWithValues>),
}

pub(crate) fn host_not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!("Object with {{'host_id': '{id}'}} not found"))
}

/// Blazar's `CantDeleteHost` for a host granted to a lease that has not ended.
fn host_reserved(host_id: i64) -> ServiceError {
    ServiceError::Conflict(format!(
        "Can't delete host {host_id}. The host is reserved."
    ))
}

pub(crate) fn parse_host_id(id: &str) -> ServiceResult<i64> {
    id.parse::<i64>().map_err(|_| host_not_found(id))
}

/// Longest text a host fact or an extra capability holds (a MySQL `TEXT`).
const MAX_TEXT_LEN: usize = 65_535;

/// Longest name-like host fact (Blazar's `String(255)` columns).
const MAX_NAME_LEN: usize = 255;

pub(crate) fn as_text(key: &str, value: &Value) -> ServiceResult<String> {
    match value {
        Value::String(s) if s.chars().count() > MAX_TEXT_LEN => {
            Err(ServiceError::BadRequest(format!(
                "Malformed parameter {key}: at most {MAX_TEXT_LEN} characters, got {}",
                s.chars().count()
            )))
        }
        Value::String(s) => {
            crate::check_text(key, s, false)?;
            Ok(s.clone())
        }
        // As Blazar on MySQL stores them: a boolean as 1 or 0, a whole number without a
        // fraction (1.0 and 1e3 are 1 and 1000), so that queries match the same hosts.
        Value::Number(n) => Ok(number_text(n)),
        Value::Bool(b) => Ok(if *b { "1" } else { "0" }.to_string()),
        other => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: expected a string, a number or a boolean, got {other}"
        ))),
    }
}

/// A JSON number as text: whole numbers (within what a double holds exactly) without a
/// fraction or exponent, others as JSON writes them.
fn number_text(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
            // Exact: a whole number below 2^53.
            (f as i64).to_string()
        }
        _ => n.to_string(),
    }
}

fn as_int(key: &str, value: &Value) -> ServiceResult<i64> {
    let parsed = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    // What Blazar's integer columns hold; instance capacity sums these over many hosts.
    match parsed {
        Some(v) if (0..=i64::from(i32::MAX)).contains(&v) => Ok(v),
        _ => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: expected an integer from 0 to {}, got {value}",
            i32::MAX
        ))),
    }
}

/// A name-like fact: a host's names and zone, which logs and aggregates show.
fn as_name(key: &str, value: &Value) -> ServiceResult<String> {
    let text = as_text(key, value)?;
    if text.chars().count() > MAX_NAME_LEN {
        return Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: at most {MAX_NAME_LEN} characters, got {}",
            text.chars().count()
        )));
    }
    crate::check_text(key, &text, true)?;
    Ok(text)
}

pub(crate) fn as_bool(key: &str, value: &Value) -> ServiceResult<bool> {
    match value {
        Value::Bool(b) => Ok(*b),
        // Blazar's columns are SQLAlchemy booleans, which take 1 and 0 as well.
        Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
        Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "yes" | "1" | "on" => Ok(true),
            "false" | "no" | "0" | "off" => Ok(false),
            _ => Err(ServiceError::BadRequest(format!(
                "Malformed parameter {key}: expected a boolean, got {value}"
            ))),
        },
        _ => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: expected a boolean, got {value}"
        ))),
    }
}

/// Applies one fact from a request body to `facts`.
fn set_fact(facts: &mut HostFacts, key: &str, value: &Value) -> ServiceResult<()> {
    match key {
        "hypervisor_hostname" => facts.hypervisor_hostname = as_name(key, value)?,
        "service_name" => facts.service_name = as_name(key, value)?,
        "hypervisor_type" => facts.hypervisor_type = as_text(key, value)?,
        "hypervisor_version" => facts.hypervisor_version = as_int(key, value)?,
        "vcpus" => facts.vcpus = as_int(key, value)?,
        "memory_mb" => facts.memory_mb = as_int(key, value)?,
        "local_gb" => facts.local_gb = as_int(key, value)?,
        "cpu_info" => facts.cpu_info = as_text(key, value)?,
        "availability_zone" => facts.availability_zone = as_name(key, value)?,
        _ => {}
    }
    Ok(())
}

/// Most extra capabilities one resource may have. Far above what an operator describes a
/// resource with, yet each is a row that every listing, query and calendar of the kind
/// reads: without a bound, one request of 40,000 keys held the write lock for half a
/// minute and made every host listing megabytes long.
pub(crate) const MAX_CAPABILITIES: usize = 256;

/// Refuses a resource that would have more than [`MAX_CAPABILITIES`] extra capabilities:
/// `current` it has, with `changes` (a `None` value removes one) applied.
pub(crate) fn check_capability_count<'a>(
    current: impl IntoIterator<Item = &'a String>,
    changes: &[(&str, Option<String>)],
) -> ServiceResult<()> {
    let mut keys: std::collections::BTreeSet<&str> =
        current.into_iter().map(String::as_str).collect();
    for (key, value) in changes {
        match value {
            Some(_) => keys.insert(key),
            None => keys.remove(key),
        };
    }
    if keys.len() > MAX_CAPABILITIES {
        return Err(ServiceError::BadRequest(format!(
            "Too many extra capabilities: {} given, a resource may have at most \
             {MAX_CAPABILITIES}",
            keys.len()
        )));
    }
    Ok(())
}

/// An extra capability of a host as stored. An allocation ratio must be a number above 0:
/// instance capacity is the host's totals times it, and a value that is not one would
/// silently fall back to the default ratio (Blazar fails the next instance lease instead).
fn host_capability(key: &str, value: &Value) -> ServiceResult<String> {
    let text = as_text(key, value)?;
    if crate::instance::RATIO_KEYS.contains(&key) && crate::instance::ratio(&text).is_none() {
        return Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: an allocation ratio must be a number above 0, got {text:?}"
        )));
    }
    Ok(text)
}

pub(crate) fn check_capability_key(key: &str) -> ServiceResult<()> {
    if key.is_empty() {
        return Err(ServiceError::BadRequest(
            "An extra capability needs a non-empty name".into(),
        ));
    }
    // A name: queries, listings and error messages show it.
    crate::check_text("extra capability name", key, true)?;
    if key.chars().count() > MAX_CAPABILITY_KEY_LEN {
        return Err(ServiceError::BadRequest(format!(
            "Extra capability key too long: {key:?} has {} characters, the limit is {MAX_CAPABILITY_KEY_LEN}",
            key.chars().count()
        )));
    }
    Ok(())
}

/// How long a host create or delete waits for the cloud to have done its part before
/// answering anyway (it is finished later).
const ENROL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Service {
    pub async fn create_host(
        &self,
        identity: &Identity,
        body: &Map<String, Value>,
    ) -> ServiceResult<HostRecord> {
        self.authorize_own("blazar:oshosts:post", identity)?;
        // Blazar takes the hypervisor's `id` instead of its `name`, and refuses a body with
        // neither as an invalid host (403).
        let by_id = body.get("name").is_none() && body.get("hypervisor_hostname").is_none();
        let given = body
            .get("name")
            .or_else(|| body.get("hypervisor_hostname"))
            .or_else(|| body.get("id"));
        let name = match given {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(Value::Number(n)) if by_id => n.to_string(),
            None => {
                return Err(ServiceError::Forbidden(format!(
                    "Invalid values for host {}",
                    Value::Object(body.clone())
                )));
            }
            Some(Value::String(_)) | Some(Value::Null) => {
                return Err(ServiceError::BadRequest("Missing parameter name".into()));
            }
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter name: expected a string, got {other}"
                )));
            }
        };
        if name.chars().count() > MAX_NAME_LEN {
            return Err(ServiceError::BadRequest(
                "The host name is longer than 255 characters".into(),
            ));
        }
        crate::check_text("name", &name, true)?;
        let mut facts = default_facts(&name);
        let mut capabilities = BTreeMap::new();
        let mut reservable = true;
        for (key, value) in body {
            match key.as_str() {
                "name" | "hypervisor_hostname" => {}
                "id" if by_id => {}
                k if PROTECTED_HOST_FIELDS.contains(&k) => {
                    return Err(ServiceError::BadRequest(format!(
                        "{k} is set by the server and cannot be given"
                    )));
                }
                "reservable" => reservable = as_bool(key, value)?,
                k if FACT_FIELDS.contains(&k) => set_fact(&mut facts, k, value)?,
                k => {
                    check_capability_key(k)?;
                    if !value.is_null() {
                        capabilities.insert(k.to_string(), host_capability(k, value)?);
                    }
                }
            }
        }
        check_capability_count(capabilities.keys(), &[])?;
        // A cloud with an inventory of its own says what the host is (Blazar reads Nova);
        // facts in the request are then ignored, as Blazar drops them.
        match self.backend.describe_host(&name).await {
            Ok(Some(described)) => facts = described,
            Ok(None) => {}
            Err(e) => return Err(e.into()),
        }
        for (key, value) in self.backend.host_capabilities(&facts).await? {
            capabilities.entry(key).or_insert(value);
        }
        let (host, enrol) = in_tx!(self, write, |tx| {
            let now = self.now();
            let new = NewHost {
                facts: facts.clone(),
                trust_id: uuid::Uuid::new_v4().simple().to_string(),
                capabilities: capabilities.clone(),
                created_at: now,
            };
            let id = match tx.insert_host(&new).await {
                Err(blazar_db::DbError::Duplicate(_)) => {
                    return Err(ServiceError::Conflict(format!(
                        "Host '{name}' is already registered"
                    )));
                }
                other => other?,
            };
            if !reservable {
                tx.update_host_facts(id, &facts, false, now).await?;
            }
            let host = tx.get_host(id).await?.ok_or_else(|| {
                ServiceError::Internal(format!("host {id} vanished after insert"))
            })?;
            let enrol = self
                .record_host_action(tx, ActionKind::Enrol, &host)
                .await?;
            Ok((host, enrol))
        })?;
        let host = match enrol {
            None => host,
            // Answered once the cloud has it (in the freepool), as Blazar answers; a cloud
            // that refuses it for good means it is not enrolled.
            Some(seq) => match self.see_through(seq, ENROL_WAIT).await? {
                Some(action) if action.status == ActionStatus::Failed => {
                    let reason = action.last_error.unwrap_or_default();
                    in_tx!(self, write, |tx| {
                        tx.delete_host(host.id).await?;
                        self.record_host_action(tx, ActionKind::Withdraw, &host)
                            .await?;
                        Ok(())
                    })?;
                    return Err(ServiceError::Conflict(format!(
                        "Host '{name}' could not be enrolled: {reason}"
                    )));
                }
                Some(_) => host,
                None => {
                    tracing::warn!(
                        host.id = host.id,
                        "enrolment still under way; answering now"
                    );
                    host
                }
            },
        };
        tracing::info!(host.id = host.id, host.name = %host.facts.hypervisor_hostname, "host registered");
        Ok(host)
    }

    pub async fn get_host(&self, identity: &Identity, id: &str) -> ServiceResult<HostRecord> {
        self.authorize_own("blazar:oshosts:get", identity)?;
        let host_id = parse_host_id(id)?;
        in_tx!(self, read, |tx| {
            tx.get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(id))
        })
    }

    /// Every host, as the shared inventory holds them.
    pub async fn list_hosts(&self, identity: &Identity) -> ServiceResult<HostList> {
        self.authorize_own("blazar:oshosts:get", identity)?;
        let inventory = in_tx!(self, read, |tx| { self.host_cache.inventory(tx).await })?;
        Ok(HostList(inventory))
    }

    /// Sets extra capabilities (a `null` value removes one), hypervisor facts, and
    /// `reservable` (maintenance).
    pub async fn update_host(
        &self,
        identity: &Identity,
        id: &str,
        body: &Map<String, Value>,
    ) -> ServiceResult<HostRecord> {
        // Blazar looks the host up first, under `oshosts:get`.
        self.authorize_own("blazar:oshosts:get", identity)?;
        self.authorize_own("blazar:oshosts:put", identity)?;
        let host_id = parse_host_id(id)?;
        // Whether the update may move reservations off the host or fill missing ones.
        let may_move = body.keys().any(|k| {
            k == "reservable"
                || FACT_FIELDS.contains(&k.as_str())
                || crate::instance::RATIO_KEYS.contains(&k.as_str())
        });
        let host = in_tx!(self, write, |tx| {
            if may_move {
                self.lock_leases_to_move(tx, PHYSICAL_HOST, host_id).await?;
            }
            // Locked before it is read: a concurrent update's facts, committed meanwhile,
            // are kept rather than written back as they were.
            if !tx.lock_host(host_id).await? {
                return Err(host_not_found(id));
            }
            let mut host = tx
                .get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(id))?;
            if body.is_empty() {
                return Err(ServiceError::BadRequest(NO_DATA_TO_UPDATE.into()));
            }
            let now = self.now();
            let mut facts = host.facts.clone();
            let mut reservable = host.reservable;
            let mut row_changed = false;
            let mut capability_changes: Vec<(&str, Option<String>)> = Vec::new();
            for (key, value) in body {
                match key.as_str() {
                    "name" | "hypervisor_hostname" => {
                        return Err(ServiceError::BadRequest(format!(
                            "{key} cannot be updated; delete and register the host again"
                        )));
                    }
                    k if PROTECTED_HOST_FIELDS.contains(&k) => {
                        return Err(ServiceError::BadRequest(format!(
                            "{k} is set by the server and cannot be updated"
                        )));
                    }
                    "reservable" => {
                        reservable = as_bool(key, value)?;
                        row_changed = true;
                    }
                    k if FACT_FIELDS.contains(&k) => {
                        set_fact(&mut facts, k, value)?;
                        row_changed = true;
                    }
                    k => {
                        check_capability_key(k)?;
                        let new_value = if value.is_null() {
                            None
                        } else {
                            Some(host_capability(k, value)?)
                        };
                        capability_changes.push((k, new_value));
                    }
                }
            }
            check_capability_count(host.capabilities.keys(), &capability_changes)?;
            self.check_capabilities_not_in_use(tx, &host, &capability_changes)
                .await?;
            for (key, value) in &capability_changes {
                match value {
                    Some(v) => {
                        tx.set_capability(PHYSICAL_HOST, host_id, key, v, now)
                            .await?
                    }
                    None => {
                        tx.remove_capability(PHYSICAL_HOST, host_id, key).await?;
                    }
                }
            }
            if row_changed {
                tx.update_host_facts(host_id, &facts, reservable, now)
                    .await?;
            }
            if body.contains_key("reservable") && host.status.is_some() {
                // The operator decides from now on: the monitor puts back only the hosts it
                // took out itself, not one an operator kept out.
                tx.set_host_health(host_id, reservable, None, now).await?;
            }
            // New facts or ratios change what the host holds instance slots for: slots
            // over a lower capacity move elsewhere, and a higher one may fill reservations
            // that are missing some.
            let capacity_changed = facts != host.facts
                || capability_changes
                    .iter()
                    .any(|(k, _)| crate::instance::RATIO_KEYS.contains(k));
            if !reservable && host.reservable {
                self.heal_resource(tx, PHYSICAL_HOST, host_id, now).await?;
            } else if reservable {
                if capacity_changed {
                    self.shed_overflow(tx, host_id, now).await?;
                }
                if capacity_changed || !host.reservable {
                    self.fill_missing(tx, now).await?;
                }
            }
            host = tx
                .get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(id))?;
            Ok(host)
        })?;
        Ok(host)
    }

    /// Blazar refuses to change a capability that a current or future reservation holding
    /// this host filtered on: the change could make the grant retroactively wrong.
    async fn check_capabilities_not_in_use(
        &self,
        tx: &mut blazar_db::Tx,
        host: &HostRecord,
        changes: &[(&str, Option<String>)],
    ) -> ServiceResult<()> {
        let altered: Vec<&(&str, Option<String>)> = changes
            .iter()
            .filter(|(k, v)| host.capabilities.get(*k) != v.as_ref())
            .collect();
        let changed: Vec<&str> = altered
            .iter()
            .filter(|(k, _)| host.capabilities.contains_key(*k))
            .map(|(k, _)| *k)
            .collect();
        if altered.is_empty() {
            return Ok(());
        }
        // A trait a `flavor:instance` reservation requires or forbids is matched on the
        // capability of its name (`<TRAIT>=true`) where the cloud was never asked: a change
        // that turns the match over (a required one no longer true, a forbidden one true)
        // makes the grant wrong as a filtered capability's change would.
        let mut after = host.clone();
        for (k, v) in &altered {
            match v {
                Some(v) => after.capabilities.insert((*k).to_string(), v.clone()),
                None => after.capabilities.remove(*k),
            };
        }
        let turned = |name: &str| {
            crate::instance::has_trait(host, name) != crate::instance::has_trait(&after, name)
        };
        let mut in_use = Vec::new();
        for reservation in self.holders(tx, PHYSICAL_HOST, host.id).await? {
            if let blazar_core::ReservationSpec::FlavorInstance(f) = &reservation.spec
                && let blazar_core::reservation::FlavorChoice::Found(found) = &f.flavor
                && self.trait_hosts.hosts(&found.traits).is_none()
            {
                in_use.extend(
                    found
                        .traits
                        .iter()
                        .filter(|(name, _)| turned(name))
                        .map(|(name, _)| name.clone()),
                );
            }
            for (field, query) in reservation.spec.queries() {
                if field != "resource_properties" {
                    continue;
                }
                in_use.extend(
                    query
                        .keys()
                        .into_iter()
                        .filter(|k| changed.contains(k))
                        .map(str::to_string),
                );
            }
        }
        refuse_in_use(in_use, &format!("Host {}", host.id))
    }

    /// The reservations holding resource `id` of `kind` now or later.
    pub(crate) async fn holders(
        &self,
        tx: &mut blazar_db::Tx,
        kind: &str,
        id: i64,
    ) -> ServiceResult<Vec<blazar_core::Reservation>> {
        let views = tx
            .allocation_views(kind, Some(id), None, None, self.now())
            .await?;
        let mut holders = Vec::new();
        for view in views {
            holders.extend(
                tx.reservations_of(&view.lease_id)
                    .await?
                    .into_iter()
                    .filter(|r| *r.id == *view.reservation_id),
            );
        }
        Ok(holders)
    }

    pub async fn delete_host(&self, identity: &Identity, id: &str) -> ServiceResult<()> {
        // Blazar looks the host up first, under `oshosts:get`.
        self.authorize_own("blazar:oshosts:get", identity)?;
        self.authorize_own("blazar:oshosts:delete", identity)?;
        let host_id = parse_host_id(id)?;
        // The cloud is asked first, outside the transaction, in Blazar's order: a reserved
        // host is refused before one with servers.
        let facts = in_tx!(self, read, |tx| {
            let host = tx
                .get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(id))?;
            if tx
                .has_unended_allocation(PHYSICAL_HOST, host_id, self.now())
                .await?
            {
                return Err(host_reserved(host_id));
            }
            Ok(host.facts)
        })?;
        self.backend.check_withdrawal(&facts).await?;
        let withdraw = in_tx!(self, write, |tx| {
            if !tx.lock_host(host_id).await? {
                return Err(host_not_found(id));
            }
            if tx
                .has_unended_allocation(PHYSICAL_HOST, host_id, self.now())
                .await?
            {
                return Err(host_reserved(host_id));
            }
            let host = tx
                .get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(id))?;
            tx.delete_allocations_of_resource(PHYSICAL_HOST, host_id)
                .await?;
            tx.delete_host(host_id).await?;
            self.record_host_action(tx, ActionKind::Withdraw, &host)
                .await
        })?;
        if let Some(seq) = withdraw
            && self.see_through(seq, ENROL_WAIT).await?.is_none()
        {
            tracing::warn!(
                host.id = host_id,
                "withdrawal still under way; answering now"
            );
        }
        tracing::info!(host.id = host_id, "host deleted");
        Ok(())
    }

    pub async fn list_host_properties(
        &self,
        identity: &Identity,
        detail: bool,
        all: bool,
    ) -> ServiceResult<PropertyListing> {
        self.list_properties(
            identity,
            "blazar:oshosts:get_resource_properties",
            PHYSICAL_HOST,
            detail,
            all,
        )
        .await
    }

    pub async fn update_host_property(
        &self,
        identity: &Identity,
        name: &str,
        body: &Map<String, Value>,
    ) -> ServiceResult<Property> {
        self.authorize_own("blazar:oshosts:update_resource_properties", identity)?;
        self.set_property_private(PHYSICAL_HOST, name, body).await
    }

    /// The allocations of one host (the whole list streams: `Service::allocation_list`).
    pub async fn host_allocation(
        &self,
        identity: &Identity,
        host: &str,
        request: &crate::AllocationListRequest,
    ) -> ServiceResult<AllocationEntry> {
        // Blazar looks the host up first, under `oshosts:get`.
        self.authorize_own("blazar:oshosts:get", identity)?;
        self.authorize_own("blazar:oshosts:get_allocations", identity)?;
        let host_id = parse_host_id(host)?;
        let filter = blazar_db::AllocationFilter {
            resources: Some((host_id, host_id)),
            ..self.allocation_filter(request)?
        };
        in_tx!(self, read, |tx| {
            tx.get_host(host_id)
                .await?
                .ok_or_else(|| host_not_found(host))?;
            let reservations = tx.allocation_views_where(PHYSICAL_HOST, &filter).await?;
            Ok(AllocationEntry {
                resource_id: host_id.to_string(),
                reservations,
            })
        })
    }

    /// A page of who holds which resource now (or ever, with `include_ended`), as the
    /// backend recorded at lease start and end, after `after` in the list's order. Admins
    /// see all (or one project's); others their project's, decided in the query, so a
    /// page is full.
    pub async fn handovers_page(
        &self,
        identity: &Identity,
        filter: &HandoverFilter,
        after: Option<&HandoverPlace>,
        limit: usize,
    ) -> ServiceResult<Vec<(HandoverPlace, ListedHandover)>> {
        self.authorize_own("blazar:handovers:get", identity)?;
        let mut filter = filter.clone();
        if !self.is_admin(identity) {
            // Another project's, asked by name, lists none, as lease lists do.
            match &filter.project_id {
                Some(p) if *p != identity.project_id => return Ok(Vec::new()),
                _ => filter.project_id = Some(identity.project_id.clone()),
            }
        }
        in_tx!(self, read, |tx| {
            Ok(tx.handovers_page(&filter, after, limit).await?)
        })
    }
}

/// Refuses a change of the capabilities `in_use` (holders filter on them) of `what`, in
/// Blazar's words, with the names as it prints a Python list of them (`['gpu', 'rack']`),
/// so scripts that match its refusals keep working; nothing in use, nothing refused.
pub(crate) fn refuse_in_use(mut in_use: Vec<String>, what: &str) -> ServiceResult<()> {
    if in_use.is_empty() {
        return Ok(());
    }
    in_use.sort();
    in_use.dedup();
    let quoted: Vec<String> = in_use.iter().map(|n| format!("'{n}'")).collect();
    Err(ServiceError::Conflict(format!(
        "Can't add extracapabilities [{}] to {what}",
        quoted.join(", ")
    )))
}
