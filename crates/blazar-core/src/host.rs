//! Compute hosts: the hypervisor facts Blazar would read from Nova, plus free-form extra
//! capabilities.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What Nova would report about a hypervisor. blazar-rs takes these from the operator.
/// Nova's names are also Blazar's keys on the wire, so the API's host shows these as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    pub hypervisor_hostname: String,
    pub service_name: String,
    pub hypervisor_type: String,
    pub hypervisor_version: i64,
    pub vcpus: i64,
    pub memory_mb: i64,
    pub local_gb: i64,
    pub cpu_info: String,
    pub availability_zone: String,
}

/// The fact fields, in the order Blazar's host object lists them. Request keys with these names
/// set facts; any other key becomes an extra capability.
pub const FACT_FIELDS: &[&str] = &[
    "hypervisor_hostname",
    "service_name",
    "hypervisor_type",
    "hypervisor_version",
    "vcpus",
    "memory_mb",
    "local_gb",
    "cpu_info",
    "availability_zone",
];

/// Columns of a host that a query may refer to besides the facts.
pub const OTHER_COLUMNS: &[&str] = &["id", "status", "reservable", "trust_id"];

/// Longest extra-capability key Blazar accepts.
pub const MAX_CAPABILITY_KEY_LEN: usize = 64;

/// A registered host as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRecord {
    pub id: i64,
    pub facts: HostFacts,
    pub reservable: bool,
    pub status: Option<String>,
    pub trust_id: String,
    pub capabilities: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl HostRecord {
    /// The value a property query sees for `key`: a column first (as Blazar's SQL filter does),
    /// then an extra capability.
    pub fn property(&self, key: &str) -> Option<Cow<'_, str>> {
        let f = &self.facts;
        let column = match key {
            "id" => Some(Cow::Owned(self.id.to_string())),
            "hypervisor_hostname" => Some(Cow::Borrowed(f.hypervisor_hostname.as_str())),
            "service_name" => Some(Cow::Borrowed(f.service_name.as_str())),
            "hypervisor_type" => Some(Cow::Borrowed(f.hypervisor_type.as_str())),
            "hypervisor_version" => Some(Cow::Owned(f.hypervisor_version.to_string())),
            "vcpus" => Some(Cow::Owned(f.vcpus.to_string())),
            "memory_mb" => Some(Cow::Owned(f.memory_mb.to_string())),
            "local_gb" => Some(Cow::Owned(f.local_gb.to_string())),
            "cpu_info" => Some(Cow::Borrowed(f.cpu_info.as_str())),
            "availability_zone" => Some(Cow::Borrowed(f.availability_zone.as_str())),
            "status" => self.status.as_deref().map(Cow::Borrowed),
            "reservable" => Some(Cow::Borrowed(if self.reservable {
                "True"
            } else {
                "False"
            })),
            "trust_id" => Some(Cow::Borrowed(self.trust_id.as_str())),
            _ => None,
        };
        column.or_else(|| {
            self.capabilities
                .get(key)
                .map(|v| Cow::Borrowed(v.as_str()))
        })
    }

    /// True when `key` is a column of every host (so it never counts as an unknown property).
    pub fn is_column(key: &str) -> bool {
        FACT_FIELDS.contains(&key) || OTHER_COLUMNS.contains(&key)
    }
}
