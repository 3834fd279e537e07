//! Reservation specs: what one reservation of a lease asks for, typed per resource type.
//!
//! A request's fields are parsed here once, into a [`ReservationSpec`]; everything after
//! (storage, search, allocation, refill, the backends) works on the spec. The spec is stored
//! as the fields Blazar shows on a reservation ([`ReservationSpec::fields`]) and read back
//! with [`ReservationSpec::from_stored`] into the same value.

use serde_json::{Map, Value};

use crate::PHYSICAL_HOST;
use crate::engine::Usage;
use crate::query::PropertyQuery;

pub const VIRTUAL_INSTANCE: &str = "virtual:instance";
pub const FLAVOR_INSTANCE: &str = "flavor:instance";
pub const FLOATINGIP: &str = "virtual:floatingip";
pub const NETWORK: &str = "network";
pub const DEVICE: &str = "device";

/// Every reservation type, in the order error messages list them.
pub const RESOURCE_TYPES: [&str; 6] = [
    PHYSICAL_HOST,
    VIRTUAL_INSTANCE,
    FLAVOR_INSTANCE,
    FLOATINGIP,
    NETWORK,
    DEVICE,
];

/// Longest property query taken (`hypervisor_properties`, `resource_properties`,
/// `network_properties`): real queries are a few hundred bytes.
pub const MAX_QUERY_BYTES: usize = 64 * 1024;

/// Largest vCPU, RAM (MB) or disk (GB) size of a flavor, as Nova's API bounds them.
pub const MAX_FLAVOR_SIZE: i64 = i32::MAX as i64;

/// A request that cannot be taken as it is: the message is for the user (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

type Result<T> = std::result::Result<T, SpecError>;

fn bad(message: impl Into<String>) -> SpecError {
    SpecError(message.into())
}

/// A property query as the user wrote it (shown back verbatim) and as parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    text: String,
    parsed: Option<PropertyQuery>,
}

impl Query {
    /// The query of field `key`: absent or null is no constraint; a JSON list means the same
    /// as its text (Blazar stores the query as a JSON string).
    pub fn from_field(map: &Map<String, Value>, key: &str) -> Result<Query> {
        let text = match map.get(key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(list @ Value::Array(_)) => list.to_string(),
            Some(other) => {
                return Err(bad(format!(
                    "Malformed requirements {key}: expected a query string such as \
                     '[\"==\", \"$gpu\", \"true\"]', got {other}"
                )));
            }
        };
        if text.len() > MAX_QUERY_BYTES {
            return Err(bad(format!(
                "Malformed requirements {key}: the query is {} bytes long; the limit is {MAX_QUERY_BYTES}",
                text.len()
            )));
        }
        let parsed = PropertyQuery::parse(&text)
            .map_err(|e| bad(format!("Malformed requirements {key} {text}: {e}")))?;
        Ok(Query { text, parsed })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// `None`: no constraint.
    pub fn parsed(&self) -> Option<&PropertyQuery> {
        self.parsed.as_ref()
    }

    /// The property names it refers to.
    pub fn keys(&self) -> Vec<&str> {
        self.parsed.as_ref().map(|q| q.keys()).unwrap_or_default()
    }
}

/// What happens to a host or device reservation's servers before the lease ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BeforeEnd {
    #[default]
    Default,
    /// `""`: nothing.
    Nothing,
    /// An image of every server on the hosts.
    Snapshot,
}

impl BeforeEnd {
    fn from_field(map: &Map<String, Value>) -> Result<BeforeEnd> {
        match map.get("before_end") {
            None | Some(Value::Null) => Ok(BeforeEnd::Default),
            Some(Value::String(s)) if s == "default" => Ok(BeforeEnd::Default),
            Some(Value::String(s)) if s.is_empty() => Ok(BeforeEnd::Nothing),
            Some(Value::String(s)) if s == "snapshot" => Ok(BeforeEnd::Snapshot),
            Some(other) => Err(bad(format!(
                "Malformed parameter before_end: use one of \"default\", \"\", \"snapshot\", got {other}"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BeforeEnd::Default => "default",
            BeforeEnd::Nothing => "",
            BeforeEnd::Snapshot => "snapshot",
        }
    }
}

/// Placement of a reservation's instances across hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Affinity {
    /// All on one host (`affinity: true`).
    Same,
    /// All on distinct hosts (`affinity: false`).
    Different,
    /// Anywhere (`affinity: null`).
    #[default]
    Any,
}

impl Affinity {
    /// Blazar's spellings: a bool, null, or a string Python's `strutils.bool_from_string`
    /// takes (`"none"` for no rule).
    pub fn from_value(value: Option<&Value>) -> Result<Affinity> {
        let malformed = || {
            bad(format!(
                "Malformed parameter affinity (must be a bool value or None), got {}",
                value.map(Value::to_string).unwrap_or_default()
            ))
        };
        match value {
            None | Some(Value::Null) => Ok(Affinity::Any),
            Some(Value::Bool(true)) => Ok(Affinity::Same),
            Some(Value::Bool(false)) => Ok(Affinity::Different),
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "none" | "" => Ok(Affinity::Any),
                "true" | "yes" | "1" | "on" | "t" | "y" => Ok(Affinity::Same),
                "false" | "no" | "0" | "off" | "f" | "n" => Ok(Affinity::Different),
                _ => Err(malformed()),
            },
            Some(_) => Err(malformed()),
        }
    }

    pub fn to_value(self) -> Value {
        match self {
            Affinity::Same => Value::Bool(true),
            Affinity::Different => Value::Bool(false),
            Affinity::Any => Value::Null,
        }
    }

    /// Whether it asks for a server group (affinity or anti-affinity).
    pub fn has_group(self) -> bool {
        self != Affinity::Any
    }
}

/// A count from 1 to 2^31-1: a JSON integer, or a string holding one (`"2"`, as
/// Chameleon's clients send and its fork accepts; Blazar meant to and answers 500).
pub fn count_field(map: &Map<String, Value>, key: &str) -> Result<u32> {
    let out_of_range = |shown: &dyn std::fmt::Display| {
        bad(format!(
            "Malformed parameter {key}: must be an integer from 1 to {}, got {shown}",
            i32::MAX
        ))
    };
    let in_range = |v: i64| {
        u32::try_from(v)
            .ok()
            .filter(|v| (1..=i32::MAX as u32).contains(v))
    };
    match map.get(key) {
        None | Some(Value::Null) => Err(bad(format!("Missing parameter {key}"))),
        Some(Value::Number(n)) => n.as_i64().and_then(in_range).ok_or_else(|| out_of_range(n)),
        Some(Value::String(s)) if integer_like(s) => s
            .trim()
            .parse::<i64>()
            .ok()
            .and_then(in_range)
            .ok_or_else(|| out_of_range(&Value::from(s.as_str()))),
        Some(other) => Err(bad(format!(
            "Malformed parameter {key}: must be a JSON integer of at least 1, got {other}"
        ))),
    }
}

/// Decimal digits with an optional sign, surrounded by optional blanks: what Python's `int()`
/// takes from a string (but for digit-group underscores).
fn integer_like(text: &str) -> bool {
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// An instance dimension: a JSON integer from `min` to 2^31-1.
fn size_field(map: &Map<String, Value>, key: &str, min: i64) -> Result<i64> {
    match map.get(key) {
        None | Some(Value::Null) => Err(bad(format!("Missing parameter {key}"))),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if v >= min && v <= i64::from(i32::MAX) => Ok(v),
            _ => Err(bad(format!(
                "Malformed parameter {key}: must be an integer from {min} to {}, got {n}",
                i32::MAX
            ))),
        },
        Some(other) => Err(bad(format!(
            "Malformed parameter {key}: must be a JSON integer of at least {min}, got {other}"
        ))),
    }
}

fn text_field(map: &Map<String, Value>, key: &str, required: bool) -> Result<Option<String>> {
    match map.get(key) {
        None | Some(Value::Null) if required => Err(bad(format!("Missing parameter {key}"))),
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if required && s.trim().is_empty() => {
            Err(bad(format!("Missing parameter {key}")))
        }
        // Neutron's names and descriptions are at most 255 characters, without controls.
        Some(Value::String(s)) if s.chars().count() > MAX_TEXT => Err(bad(format!(
            "Malformed parameter {key}: at most {MAX_TEXT} characters"
        ))),
        Some(Value::String(s)) if s.chars().any(char::is_control) => Err(bad(format!(
            "Malformed parameter {key}: control characters are not allowed"
        ))),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(format!(
            "Malformed parameter {key}: expected a string, got {other}"
        ))),
    }
}

/// The longest text a reservation field takes (Neutron's limit on names and descriptions).
const MAX_TEXT: usize = 255;

/// `physical:host`: between `min` and `max` whole hosts matching both queries.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub min: u32,
    pub max: u32,
    pub hypervisor_properties: Query,
    pub resource_properties: Query,
    pub before_end: BeforeEnd,
}

/// The names Nova knows an instance reservation's pieces by once it has an id: the flavor
/// it grants is named after it, and an affinity rule gets a server group.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceIds {
    pub flavor_id: String,
    /// The server group's id (Nova's, once made); `None` without an affinity rule.
    pub server_group_id: Option<String>,
    /// The id of its aggregate in Nova, Blazar's `aggregate_id`: `None` until the cloud
    /// made it (never, with a backend that makes none).
    pub aggregate_id: Option<i64>,
}

/// The ids the cloud gave an instance reservation's pieces when it made them, which the
/// reservation shows from then on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MadeIds {
    pub server_group_id: Option<String>,
    pub aggregate_id: Option<i64>,
}

impl MadeIds {
    pub fn is_empty(&self) -> bool {
        self.server_group_id.is_none() && self.aggregate_id.is_none()
    }
}

/// `virtual:instance`: `amount` instances of one size.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    pub size: Usage,
    pub amount: u32,
    pub affinity: Affinity,
    pub resource_properties: Query,
    /// Set once the reservation has an id.
    pub ids: Option<InstanceIds>,
}

/// A flavor a `flavor:instance` reservation is sized by: registered with blazar-rs or read
/// from Nova, in Nova's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFlavor {
    pub id: String,
    pub name: String,
    pub vcpus: i64,
    pub ram: i64,
    pub disk: i64,
    pub ephemeral: i64,
    pub extra_specs: Map<String, Value>,
}

impl SourceFlavor {
    /// A flavor in Nova's JSON shape.
    pub fn from_json(v: &Value) -> Option<SourceFlavor> {
        Some(SourceFlavor {
            id: v.get("id")?.as_str()?.to_string(),
            name: v.get("name")?.as_str()?.to_string(),
            vcpus: v.get("vcpus")?.as_i64()?,
            ram: v.get("ram")?.as_i64()?,
            disk: v.get("disk")?.as_i64()?,
            ephemeral: v
                .get("OS-FLV-EXT-DATA:ephemeral")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            extra_specs: v
                .get("extra_specs")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Nova's JSON shape, as Blazar keeps it in the reservation's `resource_properties`.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("id".into(), Value::from(self.id.as_str()));
        out.insert("name".into(), Value::from(self.name.as_str()));
        out.insert("vcpus".into(), Value::from(self.vcpus));
        out.insert("ram".into(), Value::from(self.ram));
        out.insert("disk".into(), Value::from(self.disk));
        out.insert(
            "OS-FLV-EXT-DATA:ephemeral".into(),
            Value::from(self.ephemeral),
        );
        out.insert(
            "extra_specs".into(),
            Value::Object(self.extra_specs.clone()),
        );
        Value::Object(out)
    }

    /// The instance size it asks for: its vcpus, RAM and disk plus ephemeral disk, with
    /// `resources:VCPU|PCPU|MEMORY_MB|DISK_GB` extra specs overriding them.
    pub fn size(&self) -> Result<Usage> {
        let mut size = Usage {
            vcpus: self.vcpus,
            memory_mb: self.ram,
            disk_gb: self.disk.saturating_add(self.ephemeral),
        };
        for (key, value) in &self.extra_specs {
            let Some(class) = key.strip_prefix("resources:") else {
                continue;
            };
            // Placement's bounds for an amount of a resource class.
            let amount = value
                .as_str()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .or_else(|| value.as_i64())
                .filter(|v| (0..=MAX_FLAVOR_SIZE).contains(v))
                .ok_or_else(|| {
                    bad(format!(
                        "Malformed extra spec {key}={value} in flavor {}: a resource amount is an \
                         integer from 0 to {MAX_FLAVOR_SIZE}",
                        self.name
                    ))
                })?;
            match class {
                "VCPU" | "PCPU" => size.vcpus = amount,
                "MEMORY_MB" => size.memory_mb = amount,
                "DISK_GB" => size.disk_gb = amount,
                _ => {}
            }
        }
        if !size.is_positive() {
            return Err(bad(format!(
                "Flavor {} asks for no vCPU, memory or disk: an instance of it would fit anywhere \
                 without end",
                self.name
            )));
        }
        Ok(size)
    }

    /// Its `trait:<NAME>=required|forbidden` extra specs, as (name, required).
    pub fn traits(&self) -> Result<Vec<(String, bool)>> {
        let mut traits = Vec::new();
        for (key, value) in &self.extra_specs {
            let Some(name) = key.strip_prefix("trait:") else {
                continue;
            };
            let required = match value.as_str() {
                Some("required") => true,
                Some("forbidden") => false,
                _ => {
                    return Err(bad(format!(
                        "Malformed parameter {key}: a trait is \"required\" or \"forbidden\", got {value}"
                    )));
                }
            };
            traits.push((name.to_string(), required));
        }
        Ok(traits)
    }
}

/// The flavor of a `flavor:instance` reservation: as named in the request until it is found
/// (among the registered flavors, or in the cloud), then the flavor itself.
#[derive(Debug, Clone, PartialEq)]
pub enum FlavorChoice {
    Named(String),
    Found(FoundFlavor),
}

/// A source flavor with what it asks for, checked when it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundFlavor {
    pub flavor: SourceFlavor,
    pub size: Usage,
    pub traits: Vec<(String, bool)>,
}

impl FoundFlavor {
    pub fn new(flavor: SourceFlavor) -> Result<FoundFlavor> {
        let size = flavor.size()?;
        let traits = flavor.traits()?;
        Ok(FoundFlavor {
            flavor,
            size,
            traits,
        })
    }
}

/// `flavor:instance`: `amount` instances of a flavor's size (Blazar 2024.1's type).
#[derive(Debug, Clone, PartialEq)]
pub struct FlavorInstanceSpec {
    pub flavor: FlavorChoice,
    pub amount: u32,
    pub affinity: Affinity,
    pub ids: Option<InstanceIds>,
}

/// `virtual:floatingip`: `amount` addresses of one network, some of them named.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatingIpSpec {
    pub network_id: String,
    pub amount: u32,
    pub required_floatingips: Vec<String>,
}

/// `network` (Chameleon): one network segment matching both queries, made into a network
/// of that name at start.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkSpec {
    pub network_name: String,
    pub network_description: Option<String>,
    pub network_properties: Query,
    pub resource_properties: Query,
    pub before_end: BeforeEnd,
}

/// `device` (Chameleon): between `min` and `max` devices matching the query.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    pub min: u32,
    pub max: u32,
    pub resource_properties: Query,
    pub before_end: BeforeEnd,
}

/// What one reservation asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ReservationSpec {
    Host(HostSpec),
    Instance(InstanceSpec),
    FlavorInstance(FlavorInstanceSpec),
    FloatingIp(FloatingIpSpec),
    Network(NetworkSpec),
    Device(DeviceSpec),
}

const HOST_FIELDS: &[&str] = &[
    "min",
    "max",
    "hypervisor_properties",
    "resource_properties",
    "before_end",
];
const INSTANCE_FIELDS: &[&str] = &[
    "vcpus",
    "memory_mb",
    "disk_gb",
    "amount",
    "affinity",
    "resource_properties",
];
/// `resource_properties` is taken and ignored, as Blazar takes it (it keeps the source
/// flavor there instead): Blazar's own tempest scenario sends it empty.
const FLAVOR_FIELDS: &[&str] = &["flavor_id", "amount", "affinity", "resource_properties"];
const FLOATINGIP_FIELDS: &[&str] = &["network_id", "amount", "required_floatingips"];

/// The request fields that size an instance reservation (its type's fields but `amount`,
/// and but `flavor:instance`'s ignored `resource_properties`): what Blazar's instance plugin
/// lets no reservation in force change. Empty for other types.
pub fn sizing_fields(resource_type: &str) -> Vec<&'static str> {
    let (fields, ignored): (&[&'static str], &[&str]) = match resource_type {
        VIRTUAL_INSTANCE => (INSTANCE_FIELDS, &[]),
        FLAVOR_INSTANCE => (FLAVOR_FIELDS, &["resource_properties"]),
        _ => return Vec::new(),
    };
    fields
        .iter()
        .copied()
        .filter(|f| *f != "amount" && !ignored.contains(f))
        .collect()
}
const NETWORK_FIELDS: &[&str] = &[
    "network_name",
    "network_description",
    "network_properties",
    "resource_properties",
    "before_end",
];
const DEVICE_FIELDS: &[&str] = &["resource_properties", "before_end", "min", "max"];

/// The error for a type blazar-rs does not serve.
pub fn unsupported_type(name: &str) -> SpecError {
    bad(format!(
        "The {name} resource type is not supported; use one of: {}",
        RESOURCE_TYPES.join(", ")
    ))
}

/// Refuses fields a reservation type does not know (besides `resource_type`, and `id` in an
/// update).
fn check_fields(request: &Map<String, Value>, fields: &[&str], kind: &str) -> Result<()> {
    let unknown: Vec<&str> = request
        .keys()
        .map(String::as_str)
        .filter(|k| !fields.contains(k) && *k != "resource_type" && *k != "id")
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(bad(format!(
        "Unknown field(s) {} in a {kind} reservation; accepted fields: {}",
        unknown.join(", "),
        fields.join(", ")
    )))
}

/// The stored fields of a reservation (none for a create) with the request's changes on top.
fn merge_fields(
    request: &Map<String, Value>,
    current: Option<&ReservationSpec>,
    fields: &[&str],
) -> Map<String, Value> {
    let mut merged = current.map(ReservationSpec::fields).unwrap_or_default();
    for (k, v) in request {
        if fields.contains(&k.as_str()) {
            merged.insert(k.clone(), v.clone());
        }
    }
    merged
}

/// `min` and `max`, refused with Blazar's own messages where Blazar refuses them: below 1
/// once both are integers, or `max` below `min`.
fn min_max(map: &Map<String, Value>, noun: &str) -> Result<(u32, u32)> {
    let integer = |key: &str| match map.get(key) {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) if integer_like(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    if let (Some(min), Some(max)) = (integer("min"), integer("max"))
        && (min < 1 || max < 1)
    {
        return Err(bad(
            "Malformed parameter min and max (must be greater than or equal to 1)",
        ));
    }
    let min = count_field(map, "min")?;
    let max = count_field(map, "max")?;
    if max < min {
        return Err(bad(format!(
            "Invalid values for min/max of {noun}. Max must be equal to or larger than min."
        )));
    }
    Ok((min, max))
}

fn instance_size(map: &Map<String, Value>) -> Result<Usage> {
    Ok(Usage {
        vcpus: size_field(map, "vcpus", 1)?,
        memory_mb: size_field(map, "memory_mb", 1)?,
        disk_gb: size_field(map, "disk_gb", 0)?,
    })
}

/// The instance ids a stored reservation shows (absent before it has an id).
fn stored_ids(map: &Map<String, Value>) -> Option<InstanceIds> {
    let flavor_id = map.get("flavor_id")?.as_str()?.to_string();
    Some(InstanceIds {
        flavor_id,
        server_group_id: map
            .get("server_group_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        aggregate_id: map.get("aggregate_id").and_then(Value::as_i64),
    })
}

/// An IP address in the one spelling a floating IP is stored and compared in: IPv6 in its
/// shortest form, an IPv4-mapped IPv6 address (`::ffff:10.0.0.5`) as the IPv4 address it
/// is, so that one address can never be registered, or booked, twice.
pub fn canonical_address(text: &str) -> Option<String> {
    text.parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical().to_string())
}

/// The required addresses, each once, in the order given, written as floating IPs are
/// stored ([`canonical_address`]): an address asked for twice, or in two spellings, is one
/// floating IP (a list of one address repeated was bound once per repeat and could
/// overflow the database's bind limit).
fn addresses(map: &Map<String, Value>) -> Result<Vec<String>> {
    match map.get("required_floatingips") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            let mut seen = std::collections::HashSet::new();
            let mut addresses = Vec::new();
            for v in items {
                match v.as_str().and_then(canonical_address) {
                    Some(a) => {
                        if seen.insert(a.clone()) {
                            addresses.push(a);
                        }
                    }
                    None => {
                        // Blazar's words, with the value as written (a string unquoted).
                        let shown = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                        return Err(bad(format!("IP address {shown} is invalid form.")));
                    }
                }
            }
            Ok(addresses)
        }
        Some(other) => Err(bad(format!(
            "Malformed parameter required_floatingips: expected a list of addresses, got {other}"
        ))),
    }
}

impl ReservationSpec {
    /// Parses a reservation request of `resource_type`: a create (`current` is `None`), or
    /// an update whose `request` holds only what changes of the stored `current`.
    pub fn parse(
        resource_type: &str,
        request: &Map<String, Value>,
        current: Option<&ReservationSpec>,
    ) -> Result<ReservationSpec> {
        match resource_type {
            PHYSICAL_HOST => {
                check_fields(request, HOST_FIELDS, PHYSICAL_HOST)?;
                Self::host(&merge_fields(request, current, HOST_FIELDS))
            }
            VIRTUAL_INSTANCE => {
                check_fields(request, INSTANCE_FIELDS, VIRTUAL_INSTANCE)?;
                Self::instance(&merge_fields(request, current, INSTANCE_FIELDS), current)
            }
            FLAVOR_INSTANCE => {
                check_fields(request, FLAVOR_FIELDS, FLAVOR_INSTANCE)?;
                let current = match current {
                    Some(ReservationSpec::FlavorInstance(c)) => Some(c),
                    _ => None,
                };
                Self::flavor_instance(request, current)
            }
            FLOATINGIP => {
                check_fields(request, FLOATINGIP_FIELDS, FLOATINGIP)?;
                if let Some(ReservationSpec::FloatingIp(current)) = current
                    && let Some(new) = request.get("network_id")
                    && new.as_str() != Some(current.network_id.as_str())
                {
                    return Err(bad(
                        "Floating IP reservation cannot be updated with requested parameters. \
                         Updating network_id is not supported",
                    ));
                }
                Self::floating_ip(&merge_fields(request, current, FLOATINGIP_FIELDS))
            }
            NETWORK => {
                check_fields(request, NETWORK_FIELDS, NETWORK)?;
                Self::network(&merge_fields(request, current, NETWORK_FIELDS))
            }
            DEVICE => {
                check_fields(request, DEVICE_FIELDS, DEVICE)?;
                Self::device(&merge_fields(request, current, DEVICE_FIELDS))
            }
            other => Err(unsupported_type(other)),
        }
    }

    /// Reads back what [`ReservationSpec::fields`] stored.
    pub fn from_stored(
        resource_type: &str,
        stored: &Map<String, Value>,
    ) -> Result<ReservationSpec> {
        match resource_type {
            PHYSICAL_HOST => Self::host(stored),
            VIRTUAL_INSTANCE => {
                let mut spec = Self::instance(stored, None)?;
                if let ReservationSpec::Instance(i) = &mut spec {
                    i.ids = stored_ids(stored);
                }
                Ok(spec)
            }
            FLAVOR_INSTANCE => {
                let flavor = stored
                    .get("resource_properties")
                    .and_then(Value::as_str)
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .and_then(|f| SourceFlavor::from_json(&f))
                    .ok_or_else(|| bad("flavor:instance reservation without its flavor"))?;
                Ok(ReservationSpec::FlavorInstance(FlavorInstanceSpec {
                    flavor: FlavorChoice::Found(FoundFlavor::new(flavor)?),
                    amount: count_field(stored, "amount")?,
                    affinity: Affinity::from_value(stored.get("affinity"))?,
                    ids: stored_ids(stored),
                }))
            }
            FLOATINGIP => Self::floating_ip(stored),
            NETWORK => Self::network(stored),
            DEVICE => Self::device(stored),
            other => Err(unsupported_type(other)),
        }
    }

    fn host(map: &Map<String, Value>) -> Result<ReservationSpec> {
        let (min, max) = min_max(map, "hosts")?;
        Ok(ReservationSpec::Host(HostSpec {
            min,
            max,
            hypervisor_properties: Query::from_field(map, "hypervisor_properties")?,
            resource_properties: Query::from_field(map, "resource_properties")?,
            before_end: BeforeEnd::from_field(map)?,
        }))
    }

    fn instance(
        map: &Map<String, Value>,
        current: Option<&ReservationSpec>,
    ) -> Result<ReservationSpec> {
        let size = instance_size(map)?;
        let amount = count_field(map, "amount")?;
        let affinity = Affinity::from_value(map.get("affinity"))?;
        let resource_properties = Query::from_field(map, "resource_properties")?;
        let ids = match current {
            Some(ReservationSpec::Instance(c)) => c.ids.clone(),
            _ => None,
        };
        Ok(ReservationSpec::Instance(InstanceSpec {
            size,
            amount,
            affinity,
            resource_properties,
            ids,
        }))
    }

    fn flavor_instance(
        request: &Map<String, Value>,
        current: Option<&FlavorInstanceSpec>,
    ) -> Result<ReservationSpec> {
        let flavor = match (request.get("flavor_id"), current) {
            (Some(Value::String(f)), _) if !f.trim().is_empty() => FlavorChoice::Named(f.clone()),
            (None, Some(current)) => current.flavor.clone(),
            (None | Some(Value::Null) | Some(Value::String(_)), _) => {
                return Err(bad("Missing parameter flavor_id"));
            }
            (Some(other), _) => {
                return Err(bad(format!(
                    "Malformed parameter flavor_id: expected a flavor id or name, got {other}"
                )));
            }
        };
        let mut amounts = Map::new();
        match (request.get("amount"), current) {
            (Some(amount), _) => {
                amounts.insert("amount".into(), amount.clone());
            }
            (None, Some(current)) => {
                amounts.insert("amount".into(), Value::from(current.amount));
            }
            (None, None) => {}
        }
        let amount = count_field(&amounts, "amount")?;
        let affinity = match (request.get("affinity"), current) {
            (Some(v), _) => Affinity::from_value(Some(v))?,
            (None, Some(current)) => current.affinity,
            (None, None) => Affinity::Any,
        };
        Ok(ReservationSpec::FlavorInstance(FlavorInstanceSpec {
            flavor,
            amount,
            affinity,
            ids: current.and_then(|c| c.ids.clone()),
        }))
    }

    fn floating_ip(map: &Map<String, Value>) -> Result<ReservationSpec> {
        let network_id = text_field(map, "network_id", true)?.unwrap_or_default();
        let amount = count_field(map, "amount")?;
        let required_floatingips = addresses(map)?;
        if required_floatingips.len() > usize::try_from(amount).unwrap_or(usize::MAX) {
            // Blazar's words, then the two numbers.
            return Err(bad(format!(
                "Invalid values for required_floatingips and amount. The amount must be equal \
                 to or longer than length of required_floatingips. (amount {amount}, {} \
                 required_floatingips)",
                required_floatingips.len()
            )));
        }
        Ok(ReservationSpec::FloatingIp(FloatingIpSpec {
            network_id,
            amount,
            required_floatingips,
        }))
    }

    fn network(map: &Map<String, Value>) -> Result<ReservationSpec> {
        Ok(ReservationSpec::Network(NetworkSpec {
            network_name: text_field(map, "network_name", true)?.unwrap_or_default(),
            network_description: text_field(map, "network_description", false)?,
            network_properties: Query::from_field(map, "network_properties")?,
            resource_properties: Query::from_field(map, "resource_properties")?,
            before_end: BeforeEnd::from_field(map)?,
        }))
    }

    fn device(map: &Map<String, Value>) -> Result<ReservationSpec> {
        let (min, max) = min_max(map, "devices")?;
        Ok(ReservationSpec::Device(DeviceSpec {
            min,
            max,
            resource_properties: Query::from_field(map, "resource_properties")?,
            before_end: BeforeEnd::from_field(map)?,
        }))
    }

    /// The `resource_type` of the API.
    pub fn resource_type(&self) -> &'static str {
        match self {
            ReservationSpec::Host(_) => PHYSICAL_HOST,
            ReservationSpec::Instance(_) => VIRTUAL_INSTANCE,
            ReservationSpec::FlavorInstance(_) => FLAVOR_INSTANCE,
            ReservationSpec::FloatingIp(_) => FLOATINGIP,
            ReservationSpec::Network(_) => NETWORK,
            ReservationSpec::Device(_) => DEVICE,
        }
    }

    /// The inventory kind whose allocations it holds (instance slots are allocations of
    /// hosts).
    pub fn kind(&self) -> &'static str {
        match self {
            ReservationSpec::Instance(_) | ReservationSpec::FlavorInstance(_) => PHYSICAL_HOST,
            other => other.resource_type(),
        }
    }

    /// The property queries it filters resources with, by field name.
    pub fn queries(&self) -> Vec<(&'static str, &Query)> {
        match self {
            ReservationSpec::Host(h) => vec![
                ("hypervisor_properties", &h.hypervisor_properties),
                ("resource_properties", &h.resource_properties),
            ],
            ReservationSpec::Instance(i) => vec![("resource_properties", &i.resource_properties)],
            ReservationSpec::Network(n) => vec![
                ("network_properties", &n.network_properties),
                ("resource_properties", &n.resource_properties),
            ],
            ReservationSpec::Device(d) => vec![("resource_properties", &d.resource_properties)],
            ReservationSpec::FlavorInstance(_) | ReservationSpec::FloatingIp(_) => Vec::new(),
        }
    }

    /// The property names its queries use.
    pub fn query_keys(&self) -> Vec<&str> {
        self.queries()
            .into_iter()
            .flat_map(|(_, q)| q.keys())
            .collect()
    }

    pub fn before_end(&self) -> Option<BeforeEnd> {
        match self {
            ReservationSpec::Host(h) => Some(h.before_end),
            ReservationSpec::Network(n) => Some(n.before_end),
            ReservationSpec::Device(d) => Some(d.before_end),
            _ => None,
        }
    }

    /// The instance reservation's ids, once it has them.
    pub fn instance_ids(&self) -> Option<&InstanceIds> {
        match self {
            ReservationSpec::Instance(i) => i.ids.as_ref(),
            ReservationSpec::FlavorInstance(f) => f.ids.as_ref(),
            _ => None,
        }
    }

    /// The affinity rule of an instance reservation.
    pub fn affinity(&self) -> Option<Affinity> {
        match self {
            ReservationSpec::Instance(i) => Some(i.affinity),
            ReservationSpec::FlavorInstance(f) => Some(f.affinity),
            _ => None,
        }
    }

    /// Gives an instance reservation the ids it is known by in the cloud once it has an id:
    /// the flavor is named after it, and an affinity rule has a server group (kept if it
    /// had one, else `new_group()`).
    pub fn assign_ids(&mut self, reservation_id: &str, new_group: impl FnOnce() -> String) {
        let (affinity, ids) = match self {
            ReservationSpec::Instance(i) => (i.affinity, &mut i.ids),
            ReservationSpec::FlavorInstance(f) => (f.affinity, &mut f.ids),
            _ => return,
        };
        let group = affinity.has_group().then(|| {
            ids.as_ref()
                .and_then(|i| i.server_group_id.clone())
                .unwrap_or_else(new_group)
        });
        let aggregate_id = ids.as_ref().and_then(|i| i.aggregate_id);
        *ids = Some(InstanceIds {
            flavor_id: reservation_id.to_string(),
            server_group_id: group,
            aggregate_id,
        });
    }

    /// Takes the ids the cloud gave what it made (those it says); returns whether any
    /// changed.
    pub fn set_made(&mut self, made: &MadeIds) -> bool {
        let ids = match self {
            ReservationSpec::Instance(i) => i.ids.as_mut(),
            ReservationSpec::FlavorInstance(f) => f.ids.as_mut(),
            _ => None,
        };
        let Some(ids) = ids else {
            return false;
        };
        let mut changed = false;
        if let Some(group) = &made.server_group_id
            && ids.server_group_id.as_ref() != Some(group)
        {
            ids.server_group_id = Some(group.clone());
            changed = true;
        }
        if made.aggregate_id.is_some() && ids.aggregate_id != made.aggregate_id {
            ids.aggregate_id = made.aggregate_id;
            changed = true;
        }
        changed
    }

    /// The fields a reservation of this spec shows (and stores), in Blazar's order.
    pub fn fields(&self) -> Map<String, Value> {
        let mut out = Map::new();
        let mut put = |k: &str, v: Value| {
            out.insert(k.to_string(), v);
        };
        match self {
            ReservationSpec::Host(h) => {
                put(
                    "hypervisor_properties",
                    h.hypervisor_properties.text().into(),
                );
                put("resource_properties", h.resource_properties.text().into());
                put("before_end", h.before_end.as_str().into());
                put("min", h.min.into());
                put("max", h.max.into());
            }
            ReservationSpec::Instance(i) => {
                instance_fields(
                    &mut put,
                    i.size,
                    i.amount,
                    i.affinity,
                    i.resource_properties.text().to_string(),
                    i.ids.as_ref(),
                );
            }
            ReservationSpec::FlavorInstance(f) => match &f.flavor {
                FlavorChoice::Found(found) => instance_fields(
                    &mut put,
                    found.size,
                    f.amount,
                    f.affinity,
                    found.flavor.to_json().to_string(),
                    f.ids.as_ref(),
                ),
                // Not stored: a flavor is found before its reservation is written.
                FlavorChoice::Named(name) => {
                    put("flavor_id", name.as_str().into());
                    put("amount", f.amount.into());
                    put("affinity", f.affinity.to_value());
                }
            },
            ReservationSpec::FloatingIp(f) => {
                put("network_id", f.network_id.as_str().into());
                put("amount", f.amount.into());
                put(
                    "required_floatingips",
                    f.required_floatingips.clone().into(),
                );
            }
            ReservationSpec::Network(n) => {
                put("network_name", n.network_name.as_str().into());
                put(
                    "network_description",
                    n.network_description
                        .as_deref()
                        .map_or(Value::Null, Value::from),
                );
                put("network_properties", n.network_properties.text().into());
                put("resource_properties", n.resource_properties.text().into());
                put("before_end", n.before_end.as_str().into());
            }
            ReservationSpec::Device(d) => {
                put("resource_properties", d.resource_properties.text().into());
                put("before_end", d.before_end.as_str().into());
                put("min", d.min.into());
                put("max", d.max.into());
            }
        }
        out
    }
}

fn instance_fields(
    put: &mut impl FnMut(&str, Value),
    size: Usage,
    amount: u32,
    affinity: Affinity,
    resource_properties: String,
    ids: Option<&InstanceIds>,
) {
    put("vcpus", size.vcpus.into());
    put("memory_mb", size.memory_mb.into());
    put("disk_gb", size.disk_gb.into());
    put("amount", amount.into());
    put("affinity", affinity.to_value());
    put("resource_properties", resource_properties.into());
    if let Some(ids) = ids {
        put("flavor_id", ids.flavor_id.as_str().into());
        // Null until the cloud made it (Blazar's order).
        put(
            "aggregate_id",
            ids.aggregate_id.map_or(Value::Null, Value::from),
        );
        // Empty: the cloud is to make the group and has not said its id yet.
        put(
            "server_group_id",
            ids.server_group_id
                .as_deref()
                .filter(|id| !id.is_empty())
                .map_or(Value::Null, Value::from),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn parse(kind: &str, v: Value) -> Result<ReservationSpec> {
        ReservationSpec::parse(kind, &map(v), None)
    }

    fn flavor() -> SourceFlavor {
        SourceFlavor {
            id: "f1".into(),
            name: "m1.small".into(),
            vcpus: 2,
            ram: 2048,
            disk: 20,
            ephemeral: 5,
            extra_specs: map(json!({"resources:VCPU": "4", "trait:CUSTOM_GPU": "required"})),
        }
    }

    /// Every type stores as the fields it shows and reads back into the same spec.
    #[test]
    fn stored_fields_read_back_into_the_same_spec() {
        let mut specs = vec![
            parse(
                PHYSICAL_HOST,
                json!({"min": "1", "max": 3, "hypervisor_properties": "[\">=\", \"$memory_mb\", \"4096\"]",
                       "resource_properties": ["==", "$gpu", "true"], "before_end": "snapshot"}),
            ),
            parse(
                VIRTUAL_INSTANCE,
                json!({"vcpus": 2, "memory_mb": 1024, "disk_gb": 0, "amount": 3, "affinity": "False"}),
            ),
            parse(
                FLOATINGIP,
                json!({"network_id": "net", "amount": 2, "required_floatingips": ["10.0.0.5"]}),
            ),
            parse(
                NETWORK,
                json!({"network_name": "n", "network_properties": "[\"==\", \"$physical_network\", \"physnet1\"]"}),
            ),
            parse(DEVICE, json!({"min": 1, "max": 1, "before_end": ""})),
        ]
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap();
        specs.push(ReservationSpec::FlavorInstance(FlavorInstanceSpec {
            flavor: FlavorChoice::Found(FoundFlavor::new(flavor()).unwrap()),
            amount: 2,
            affinity: Affinity::Same,
            ids: None,
        }));
        for mut spec in specs {
            spec.assign_ids("r1", || "g1".into());
            let stored = spec.fields();
            let back = ReservationSpec::from_stored(spec.resource_type(), &stored).unwrap();
            assert_eq!(back, spec, "{stored:?}");
        }
    }

    #[test]
    fn requests_are_refused_with_the_field_at_fault() {
        let cases: &[(&str, Value, &str)] = &[
            (
                PHYSICAL_HOST,
                json!({"min": 2, "max": 1}),
                "Max must be equal to or larger than min",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": 0, "max": 1}),
                "Malformed parameter min and max (must be greater than or equal to 1)",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": "1", "max": -2}),
                "Malformed parameter min and max (must be greater than or equal to 1)",
            ),
            (PHYSICAL_HOST, json!({"max": 1}), "Missing parameter min"),
            (
                PHYSICAL_HOST,
                json!({"min": 1.5, "max": 2}),
                "Malformed parameter min",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": "2147483648", "max": 1}),
                "Malformed parameter min",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": 1, "max": 1, "colour": "red"}),
                "Unknown field(s) colour",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": 1, "max": 1, "resource_properties": "[\"==\""}),
                "Malformed requirements resource_properties",
            ),
            (
                PHYSICAL_HOST,
                json!({"min": 1, "max": 1, "before_end": "reboot"}),
                "Malformed parameter before_end",
            ),
            (
                VIRTUAL_INSTANCE,
                json!({"vcpus": 0, "memory_mb": 1, "disk_gb": 0, "amount": 1}),
                "Malformed parameter vcpus",
            ),
            (
                VIRTUAL_INSTANCE,
                json!({"vcpus": 1, "memory_mb": 1, "disk_gb": 0, "amount": 1, "affinity": 3}),
                "Malformed parameter affinity",
            ),
            (
                VIRTUAL_INSTANCE,
                json!({"vcpus": 1, "memory_mb": 1, "amount": 1}),
                "Missing parameter disk_gb",
            ),
            (
                FLAVOR_INSTANCE,
                json!({"amount": 1}),
                "Missing parameter flavor_id",
            ),
            (
                FLOATINGIP,
                json!({"network_id": "n", "amount": 1, "required_floatingips": ["a.b"]}),
                "IP address a.b is invalid form.",
            ),
            (
                FLOATINGIP,
                json!({"network_id": "n", "amount": 1, "required_floatingips": ["10.0.0.1", "10.0.0.2"]}),
                "The amount must be equal to or longer than length of required_floatingips. \
                 (amount 1, 2 required_floatingips)",
            ),
            (
                NETWORK,
                json!({"network_name": " "}),
                "Missing parameter network_name",
            ),
            (
                NETWORK,
                json!({"network_name": "n".repeat(256)}),
                "network_name: at most 255 characters",
            ),
            (
                NETWORK,
                json!({"network_name": "n", "network_description": "a\u{0}b"}),
                "network_description: control characters",
            ),
            (
                "virtual:gpu",
                json!({}),
                "The virtual:gpu resource type is not supported",
            ),
        ];
        for (kind, body, expected) in cases {
            let err = parse(kind, body.clone()).unwrap_err();
            assert!(err.0.contains(expected), "{kind} {body}: {err}");
        }
    }

    #[test]
    fn a_required_address_given_twice_is_one() {
        let repeated: Vec<&str> = std::iter::repeat_n("10.0.0.1", 40_000)
            .chain(["10.0.0.2", "10.0.0.1"])
            .collect();
        let spec = parse(
            FLOATINGIP,
            json!({"network_id": "n", "amount": 2, "required_floatingips": repeated}),
        )
        .unwrap();
        let ReservationSpec::FloatingIp(f) = spec else {
            panic!("{spec:?}")
        };
        assert_eq!(f.required_floatingips, ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn an_update_changes_only_what_it_names() {
        let current = parse(
            PHYSICAL_HOST,
            json!({"min": 1, "max": 2, "resource_properties": "[\"==\", \"$gpu\", \"true\"]"}),
        )
        .unwrap();
        let updated =
            ReservationSpec::parse(PHYSICAL_HOST, &map(json!({"max": 4})), Some(&current)).unwrap();
        let ReservationSpec::Host(h) = &updated else {
            panic!("{updated:?}");
        };
        assert_eq!((h.min, h.max), (1, 4));
        assert_eq!(h.resource_properties.text(), "[\"==\", \"$gpu\", \"true\"]");
        // A change that breaks a rule of the whole is refused.
        assert!(
            ReservationSpec::parse(PHYSICAL_HOST, &map(json!({"min": 3})), Some(&current)).is_err()
        );

        let fip = parse(FLOATINGIP, json!({"network_id": "n", "amount": 1})).unwrap();
        let err = ReservationSpec::parse(FLOATINGIP, &map(json!({"network_id": "m"})), Some(&fip))
            .unwrap_err();
        assert!(
            err.0.contains("Updating network_id is not supported"),
            "{err}"
        );

        let mut instance = parse(
            VIRTUAL_INSTANCE,
            json!({"vcpus": 1, "memory_mb": 512, "disk_gb": 1, "amount": 1, "affinity": true}),
        )
        .unwrap();
        instance.assign_ids("r9", || "group".into());
        let more = ReservationSpec::parse(
            VIRTUAL_INSTANCE,
            &map(json!({"amount": 2})),
            Some(&instance),
        )
        .unwrap();
        // The ids it is known by in the cloud survive an update.
        assert_eq!(more.instance_ids(), instance.instance_ids());
    }

    #[test]
    fn ids_the_cloud_has_not_made_yet_show_as_null() {
        let mut instance = parse(
            VIRTUAL_INSTANCE,
            json!({"vcpus": 1, "memory_mb": 512, "disk_gb": 1, "amount": 1, "affinity": true}),
        )
        .unwrap();
        instance.assign_ids("r9", String::new);
        assert_eq!(instance.fields()["server_group_id"], Value::Null);
        assert_eq!(instance.fields()["aggregate_id"], Value::Null);
        let made = MadeIds {
            server_group_id: Some("made-by-nova".into()),
            aggregate_id: Some(7),
        };
        assert!(instance.set_made(&made));
        assert!(!instance.set_made(&made));
        assert_eq!(instance.fields()["server_group_id"], json!("made-by-nova"));
        assert_eq!(instance.fields()["aggregate_id"], json!(7));
        // An action that made only the aggregate again leaves the group as it was.
        assert!(instance.set_made(&MadeIds {
            server_group_id: None,
            aggregate_id: Some(8),
        }));
        assert_eq!(instance.fields()["server_group_id"], json!("made-by-nova"));
        // Both survive storing, and an update (which assigns the ids again).
        let stored = ReservationSpec::from_stored(VIRTUAL_INSTANCE, &instance.fields()).unwrap();
        assert_eq!(stored.fields()["aggregate_id"], json!(8));
        let mut updated = stored.clone();
        updated.assign_ids("r9", || unreachable!("the group is kept"));
        assert_eq!(updated, stored);
    }

    #[test]
    fn affinity_reads_as_blazar_reads_it() {
        let cases = [
            (Value::Null, Affinity::Any),
            (json!("None"), Affinity::Any),
            (json!(true), Affinity::Same),
            (json!("True"), Affinity::Same),
            (json!("yes"), Affinity::Same),
            (json!(false), Affinity::Different),
            (json!("False"), Affinity::Different),
            (json!("off"), Affinity::Different),
        ];
        for (value, expected) in cases {
            assert_eq!(Affinity::from_value(Some(&value)), Ok(expected), "{value}");
        }
        assert_eq!(Affinity::from_value(None), Ok(Affinity::Any));
        assert!(Affinity::from_value(Some(&json!("sometimes"))).is_err());
        assert!(Affinity::from_value(Some(&json!(3))).is_err());
        assert!(Affinity::from_value(Some(&json!(1))).is_err());
    }

    #[test]
    fn a_flavor_asks_for_its_extra_specs_resources_and_traits() {
        let found = FoundFlavor::new(flavor()).unwrap();
        assert_eq!(
            found.size,
            Usage {
                vcpus: 4,
                memory_mb: 2048,
                disk_gb: 25
            }
        );
        assert_eq!(found.traits, vec![("CUSTOM_GPU".to_string(), true)]);
        let mut empty = flavor();
        empty.vcpus = 0;
        empty.ram = 0;
        empty.disk = 0;
        empty.ephemeral = 0;
        empty.extra_specs = Map::new();
        assert!(FoundFlavor::new(empty).is_err());
    }
}
