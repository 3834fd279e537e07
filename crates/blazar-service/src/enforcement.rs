//! Usage enforcement, as Blazar's `blazar/enforcement`: filters an operator enables may
//! refuse a lease create or update, and are told when a lease ends.
//!
//! The filters are asked outside every transaction and lock. A create or update that some
//! enabled filter must see first runs in a write transaction that is rolled back (a trial,
//! exactly as a dry run), which answers the dates and the resources the lease would hold;
//! the filters decide on that; then the real write runs. Lease ends and early deletes record
//! an `on_end` action in the transaction that decides them; the action workers carry it out
//! after commit (claimed once among replicas, retried), and its failure never holds up the
//! lease. A dry run asks only the filters that tell nobody outside ([`UsageFilter::local`]):
//! Blazar's protocol has no dry run, and an accounting service charges at `check-create`.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use blazar_core::{Allocation, HostRecord, LeaseView, PHYSICAL_HOST, ResourceRecord};
use blazar_db::Tx;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::refusal::{Reason, RefusalKind, Refused};
use crate::{ServiceError, ServiceResult};

/// A lease as filters see it: Blazar's lease values (what an external service receives),
/// and the dates read from them.
#[derive(Debug, Clone)]
pub struct EnforcedLease {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub values: Value,
}

/// Who asks, as Blazar's filters get it: `user_id`, `project_id`, `auth_url`, `region_name`.
#[derive(Debug, Clone)]
pub struct EnforcementContext {
    pub user_id: String,
    pub project_id: String,
    pub auth_url: Option<String>,
    pub region_name: Option<String>,
}

impl EnforcementContext {
    pub fn to_value(&self) -> Value {
        json!({
            "user_id": self.user_id,
            "project_id": self.project_id,
            "auth_url": self.auth_url,
            "region_name": self.region_name,
        })
    }
}

/// A filter's refusal: the HTTP class Blazar answers it with and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub kind: RefusalKind,
    pub message: String,
    /// The request field at fault, when there is one.
    pub field: Option<&'static str>,
}

/// Why telling a filter of a lease end failed: worth another try, or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnEndError {
    Transient(String),
    Permanent(String),
}

#[async_trait]
pub trait UsageFilter: Send + Sync {
    /// The name operators enable it by (Blazar's class name).
    fn name(&self) -> &'static str;

    /// Whether it decides without telling anyone outside, so a dry run may ask it.
    fn local(&self) -> bool {
        true
    }

    /// Whether it reads the resources a lease would hold (then creates are tried first).
    fn reads_allocations(&self) -> bool {
        false
    }

    /// Whether it wants to be told of lease ends.
    fn wants_on_end(&self) -> bool {
        false
    }

    async fn check_create(
        &self,
        context: &EnforcementContext,
        lease: &EnforcedLease,
    ) -> Result<(), Denial>;

    async fn check_update(
        &self,
        context: &EnforcementContext,
        current: &EnforcedLease,
        new: &EnforcedLease,
    ) -> Result<(), Denial>;

    /// `context` and `lease` as recorded when the lease ended (Blazar's JSON).
    async fn on_end(&self, _context: &Value, _lease: &Value) -> Result<(), OnEndError> {
        Ok(())
    }
}

/// Blazar's `MaxLeaseDurationFilter`: no lease longer than `max_seconds`, except for the
/// exempt projects. A create it refuses is a 403, an update a 400, as in Blazar.
pub struct MaxLeaseDurationFilter {
    /// `-1`: no limit (Blazar's default).
    pub max_seconds: i64,
    pub exempt_project_ids: Vec<String>,
}

impl MaxLeaseDurationFilter {
    fn check(
        &self,
        context: &EnforcementContext,
        lease: &EnforcedLease,
        kind: RefusalKind,
    ) -> Result<(), Denial> {
        if self.max_seconds == -1 || self.exempt_project_ids.contains(&context.project_id) {
            return Ok(());
        }
        let seconds = (lease.end - lease.start).num_seconds();
        if seconds > self.max_seconds {
            return Err(Denial {
                kind,
                message: format!(
                    "Lease duration of {seconds} seconds must be less than or equal to the \
                     maximum lease duration of {} seconds.",
                    self.max_seconds
                ),
                field: Some("end_date"),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl UsageFilter for MaxLeaseDurationFilter {
    fn name(&self) -> &'static str {
        "MaxLeaseDurationFilter"
    }

    async fn check_create(
        &self,
        context: &EnforcementContext,
        lease: &EnforcedLease,
    ) -> Result<(), Denial> {
        // Blazar re-raises this NotAuthorized on create as a plain NotAuthorized: a 403.
        self.check(context, lease, RefusalKind::Forbidden)
    }

    async fn check_update(
        &self,
        context: &EnforcementContext,
        _current: &EnforcedLease,
        new: &EnforcedLease,
    ) -> Result<(), Denial> {
        self.check(context, new, RefusalKind::BadRequest)
    }
}

/// The enabled filters, in the order they are asked, and what their context says of the
/// cloud.
#[derive(Clone, Default)]
pub struct Enforcement {
    filters: Vec<Arc<dyn UsageFilter>>,
    /// The identity endpoint (`auth_url` of the context).
    pub auth_url: Option<String>,
    pub region_name: Option<String>,
}

impl Enforcement {
    pub fn new(
        filters: Vec<Arc<dyn UsageFilter>>,
        auth_url: Option<String>,
        region_name: Option<String>,
    ) -> Self {
        Enforcement {
            filters,
            auth_url,
            region_name,
        }
    }

    pub fn filter_names(&self) -> Vec<&'static str> {
        self.filters.iter().map(|f| f.name()).collect()
    }

    /// The filters a call asks: all of them, or on a dry run the local ones.
    pub(crate) fn consulted(&self, dry_run: bool) -> Vec<Arc<dyn UsageFilter>> {
        self.filters
            .iter()
            .filter(|f| !dry_run || f.local())
            .cloned()
            .collect()
    }

    pub(crate) fn wants_on_end(&self) -> bool {
        self.filters.iter().any(|f| f.wants_on_end())
    }

    pub(crate) fn context(&self, user_id: &str, project_id: &str) -> EnforcementContext {
        EnforcementContext {
            user_id: user_id.to_string(),
            project_id: project_id.to_string(),
            auth_url: self.auth_url.clone(),
            region_name: self.region_name.clone(),
        }
    }

    /// Tells every filter that wants it of a lease end; the first failure is answered.
    pub(crate) async fn on_end(&self, context: &Value, lease: &Value) -> Result<(), OnEndError> {
        for filter in self.filters.iter().filter(|f| f.wants_on_end()) {
            filter.on_end(context, lease).await?;
        }
        Ok(())
    }
}

/// A denial as the refusal a create or update answers: Blazar's class and message, and a
/// reason naming the filter.
pub(crate) fn refusal(filter: &str, denial: Denial) -> ServiceError {
    tracing::info!(filter, refusal = %denial.message, "enforcement checks failed");
    ServiceError::Refused(Box::new(Refused {
        kind: denial.kind,
        message: denial.message,
        reasons: vec![Reason {
            filter: Some(filter.to_string()),
            field: denial.field.map(str::to_string),
            ..Reason::default()
        }],
        retry: None,
        shortfall: false,
    }))
}

/// Python's `datetime.isoformat()` of a naive UTC datetime, as Blazar sends dates.
pub(crate) fn iso(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// The resources of `allocations` as Blazar's plugins `get` them (a host with its extra
/// capabilities flattened in; a floating IP or other pool resource with its attributes),
/// grouped by reservation id, each resource once per reservation.
pub(crate) async fn resources_by_reservation(
    tx: &mut Tx,
    allocations: &[Allocation],
) -> ServiceResult<HashMap<String, Vec<Value>>> {
    let mut hosts: HashMap<i64, Option<Value>> = HashMap::new();
    let mut pools: HashMap<String, HashMap<i64, Value>> = HashMap::new();
    let mut out: HashMap<String, Vec<Value>> = HashMap::new();
    let mut seen: HashSet<(&str, &str, i64)> = HashSet::new();
    for a in allocations {
        if !seen.insert((&a.reservation_id, &a.resource_type, a.resource_id)) {
            continue;
        }
        let value = if a.resource_type == PHYSICAL_HOST {
            let host = match hosts.entry(a.resource_id) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(slot) => {
                    let host = tx.get_host(a.resource_id).await?;
                    slot.insert(host.map(|h| host_value(&h)))
                }
            };
            host.clone()
        } else {
            let by_id = match pools.entry(a.resource_type.clone()) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(slot) => {
                    let listed = tx.list_resources(&a.resource_type).await?;
                    slot.insert(listed.iter().map(|r| (r.id, resource_value(r))).collect())
                }
            };
            by_id.get(&a.resource_id).cloned()
        };
        out.entry(a.reservation_id.clone())
            .or_default()
            .push(value.unwrap_or_else(|| json!({"id": a.resource_id})));
    }
    Ok(out)
}

/// A host as Blazar's host plugin `get`s it: the row, its extra capabilities on top.
fn host_value(h: &HostRecord) -> Value {
    let f = &h.facts;
    let mut m = Map::new();
    m.insert("id".into(), json!(h.id));
    m.insert("hypervisor_hostname".into(), json!(f.hypervisor_hostname));
    m.insert("service_name".into(), json!(f.service_name));
    m.insert("vcpus".into(), json!(f.vcpus));
    m.insert("cpu_info".into(), json!(f.cpu_info));
    m.insert("hypervisor_type".into(), json!(f.hypervisor_type));
    m.insert("hypervisor_version".into(), json!(f.hypervisor_version));
    m.insert("memory_mb".into(), json!(f.memory_mb));
    m.insert("local_gb".into(), json!(f.local_gb));
    m.insert("status".into(), json!(h.status));
    m.insert("availability_zone".into(), json!(f.availability_zone));
    m.insert("trust_id".into(), json!(h.trust_id));
    with_common(m, h.reservable, h.created_at, h.updated_at, &h.capabilities)
}

/// A pool resource (floating IP, network, device) as its plugin `get`s it.
fn resource_value(record: &ResourceRecord) -> Value {
    let r = &record.resource;
    let mut m = r.attrs.clone();
    m.insert("id".into(), json!(r.uid));
    let (created, updated) = (record.created_at, record.updated_at);
    with_common(m, r.reservable, created, updated, &r.capabilities)
}

/// What every plugin's resource ends with, in this order: whether it is reservable, its
/// dates, and its extra capabilities on top.
fn with_common(
    mut m: Map<String, Value>,
    reservable: bool,
    created_at: DateTime<Utc>,
    updated_at: Option<DateTime<Utc>>,
    capabilities: &BTreeMap<String, String>,
) -> Value {
    m.insert("reservable".into(), json!(reservable));
    m.insert("created_at".into(), json!(iso(created_at)));
    m.insert("updated_at".into(), json!(updated_at.map(iso)));
    for (k, v) in capabilities {
        m.insert(k.clone(), json!(v));
    }
    Value::Object(m)
}

/// A stored lease as Blazar's `lease_get` gives it to filters (the current lease of an
/// update, the lease that ends), each reservation with the resources it holds.
pub(crate) fn stored_lease_values(
    view: &LeaseView,
    resources: &HashMap<String, Vec<Value>>,
) -> Value {
    let l = &view.lease;
    let reservations: Vec<Value> = view
        .reservations
        .iter()
        .map(|r| {
            let mut m = r.spec.fields();
            m.insert("id".into(), json!(r.id));
            m.insert("lease_id".into(), json!(r.lease_id));
            m.insert("resource_id".into(), json!(r.resource_id));
            m.insert("resource_type".into(), json!(r.resource_type()));
            m.insert("status".into(), json!(r.status.as_str()));
            m.insert("missing_resources".into(), json!(r.missing_resources));
            m.insert("resources_changed".into(), json!(r.resources_changed));
            m.insert("created_at".into(), json!(iso(r.created_at)));
            m.insert("updated_at".into(), json!(r.updated_at.map(iso)));
            m.insert(
                "allocations".into(),
                Value::Array(resources.get(&r.id).cloned().unwrap_or_default()),
            );
            Value::Object(m)
        })
        .collect();
    let events: Vec<Value> = view
        .events
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "lease_id": e.lease_id,
                "event_type": e.event_type.as_str(),
                "time": iso(e.time),
                "status": e.status.as_str(),
                "created_at": iso(e.created_at),
                "updated_at": e.updated_at.map(iso),
            })
        })
        .collect();
    json!({
        "id": l.id,
        "name": l.name,
        "user_id": l.user_id,
        "project_id": l.project_id,
        "trust_id": l.trust_id,
        "start_date": iso(l.start),
        "end_date": iso(l.end),
        "status": l.status.as_str(),
        "degraded": l.degraded,
        "created_at": iso(l.created_at),
        "updated_at": l.updated_at.map(iso),
        "reservations": reservations,
        "events": events,
    })
}
