//! Reservation types over pools of whole resources besides hosts: floating IPs
//! (`virtual:floatingip`), network segments (`network`) and devices (`device`). Each unit is
//! granted exclusively, like a host.

use std::borrow::Cow;

use async_trait::async_trait;
use blazar_core::PropertyQuery;
use blazar_db::{ResourceRecord, Tx};
use serde_json::{Map, Value};

use crate::resources::{
    AllocationRequest, Grant, ResourceType, check_known_properties, grant_whole, int_field,
    pick_free, query_field, refill_whole,
};
use crate::resources::{check_fields, merge_fields};
use crate::{ServiceError, ServiceResult};

pub const FLOATINGIP: &str = "virtual:floatingip";
pub const NETWORK: &str = "network";
pub const DEVICE: &str = "device";

/// Fixed fields of each kind (a query may refer to them besides extra capabilities).
pub fn columns(kind: &str) -> &'static [&'static str] {
    match kind {
        FLOATINGIP => &[
            "id",
            "floating_network_id",
            "subnet_id",
            "floating_ip_address",
            "reservable",
        ],
        NETWORK => &[
            "id",
            "network_type",
            "physical_network",
            "segment_id",
            "reservable",
        ],
        DEVICE => &[
            "id",
            "name",
            "device_type",
            "device_driver",
            "vendor_id",
            "product_id",
            "reservable",
        ],
        _ => &[],
    }
}

/// The value a property query sees for `key` on a pool resource.
pub fn property<'a>(r: &'a ResourceRecord, key: &str) -> Option<Cow<'a, str>> {
    match key {
        "id" => Some(Cow::Borrowed(r.uid.as_str())),
        "reservable" => Some(Cow::Borrowed(if r.reservable { "True" } else { "False" })),
        _ => match r.attrs.get(key) {
            Some(Value::String(s)) => Some(Cow::Borrowed(s.as_str())),
            Some(Value::Number(n)) => Some(Cow::Owned(n.to_string())),
            Some(Value::Bool(b)) => Some(Cow::Owned(b.to_string())),
            _ => r.capabilities.get(key).map(|v| Cow::Borrowed(v.as_str())),
        },
    }
}

pub struct PoolType {
    kind: &'static str,
}

impl PoolType {
    pub fn floating_ips() -> Self {
        PoolType { kind: FLOATINGIP }
    }

    pub fn networks() -> Self {
        PoolType { kind: NETWORK }
    }

    pub fn devices() -> Self {
        PoolType { kind: DEVICE }
    }

    fn fields(&self) -> &'static [&'static str] {
        match self.kind {
            FLOATINGIP => &["network_id", "amount", "required_floatingips"],
            NETWORK => &[
                "network_name",
                "network_description",
                "network_properties",
                "resource_properties",
                "before_end",
            ],
            _ => &["resource_properties", "before_end", "min", "max"],
        }
    }

    /// How many units the request wants: `(min, max)`.
    fn count(&self, params: &Map<String, Value>) -> ServiceResult<(i64, i64)> {
        match self.kind {
            FLOATINGIP => {
                let amount = int_field(params, "amount")?;
                Ok((amount, amount))
            }
            NETWORK => Ok((1, 1)),
            _ => Ok((int_field(params, "min")?, int_field(params, "max")?)),
        }
    }

    /// Resources that match the request, in preference order, and those it requires.
    async fn matching(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        explain: bool,
    ) -> ServiceResult<(Vec<i64>, Vec<i64>)> {
        let pool = tx.list_resources(self.kind).await?;
        // Chameleon's network reservations have a second query, `network_properties`,
        // that must hold too.
        let fields: &[&str] = match self.kind {
            FLOATINGIP => &[],
            NETWORK => &["network_properties", "resource_properties"],
            _ => &["resource_properties"],
        };
        let mut queries: Vec<PropertyQuery> = Vec::new();
        for field in fields {
            let (_, query) = query_field(params, field)?;
            let Some(q) = query else { continue };
            let columns = columns(self.kind);
            if let Err(unknown) = check_known_properties(
                field,
                &q,
                |k| columns.contains(&k),
                pool.iter().map(|r| &r.capabilities),
                self.noun(),
            ) {
                return Err(unknown.into_error(tx, self.kind).await);
            }
            queries.push(q);
        }
        let network = params.get("network_id").and_then(Value::as_str);
        let matching: Vec<&ResourceRecord> = pool
            .iter()
            .filter(|r| r.reservable)
            .filter(|r| {
                network.is_none_or(|n| {
                    r.attrs.get("floating_network_id").and_then(Value::as_str) == Some(n)
                })
            })
            .filter(|r| {
                let lookup = |k: &str| property(r, k);
                queries.iter().all(|q| q.matches(&lookup))
            })
            .collect();
        let mut required = Vec::new();
        if let Some(Value::Array(addresses)) = params.get("required_floatingips") {
            for address in addresses.iter().filter_map(Value::as_str) {
                let found = matching.iter().find(|r| {
                    r.attrs.get("floating_ip_address").and_then(Value::as_str) == Some(address)
                });
                match found {
                    Some(r) => required.push(r.id),
                    None => {
                        if !explain {
                            return Err(ServiceError::Conflict(self.bare_refusal()));
                        }
                        return Err(ServiceError::Conflict(format!(
                            "Not enough floating IPs available: the required floating IP {address} is \
                             not a reservable floating IP of network {}",
                            network.unwrap_or_default()
                        )));
                    }
                }
            }
        }
        Ok((matching.iter().map(|r| r.id).collect(), required))
    }

    /// Blazar's refusal when units are short, without the reasons.
    fn bare_refusal(&self) -> String {
        format!("Not enough {}s available", self.noun())
    }

    fn noun(&self) -> &'static str {
        match self.kind {
            FLOATINGIP => "floating IP",
            NETWORK => "network segment",
            _ => "device",
        }
    }
}

fn text_field(
    map: &Map<String, Value>,
    key: &str,
    required: bool,
) -> ServiceResult<Option<String>> {
    match map.get(key) {
        None | Some(Value::Null) if required => {
            Err(ServiceError::BadRequest(format!("Missing parameter {key}")))
        }
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if required && s.trim().is_empty() => {
            Err(ServiceError::BadRequest(format!("Missing parameter {key}")))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: expected a string, got {other}"
        ))),
    }
}

fn before_end(map: &Map<String, Value>) -> ServiceResult<String> {
    match map.get("before_end") {
        None | Some(Value::Null) => Ok("default".into()),
        Some(Value::String(s)) if ["default", "", "snapshot"].contains(&s.as_str()) => {
            Ok(s.clone())
        }
        Some(other) => Err(ServiceError::BadRequest(format!(
            "Malformed parameter before_end: use one of \"default\", \"\", \"snapshot\", got {other}"
        ))),
    }
}

#[async_trait]
impl ResourceType for PoolType {
    fn name(&self) -> &'static str {
        self.kind
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>> {
        let fields = self.fields();
        check_fields(request, fields, self.kind)?;
        if let (Some(current), FLOATINGIP) = (current, self.kind)
            && let Some(new) = request.get("network_id")
            && Some(new) != current.get("network_id")
        {
            return Err(ServiceError::BadRequest(
                "Floating IP reservation cannot be updated with requested parameters. Updating \
                 network_id is not supported"
                    .into(),
            ));
        }
        let merged = merge_fields(request, current, fields);
        let mut out = Map::new();
        match self.kind {
            FLOATINGIP => {
                let network = text_field(&merged, "network_id", true)?.unwrap_or_default();
                let amount = int_field(&merged, "amount")?;
                let required: Vec<String> = match merged.get("required_floatingips") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .map(|v| match v.as_str() {
                            Some(a) if a.parse::<std::net::IpAddr>().is_ok() => Ok(a.to_string()),
                            _ => Err(ServiceError::BadRequest(format!(
                                "IP address {v} is invalid form."
                            ))),
                        })
                        .collect::<ServiceResult<_>>()?,
                    Some(other) => {
                        return Err(ServiceError::BadRequest(format!(
                            "Malformed parameter required_floatingips: expected a list of addresses, got {other}"
                        )));
                    }
                };
                if required.len() as i64 > amount {
                    return Err(ServiceError::BadRequest(format!(
                        "Invalid values for required_floatingips and amount. The amount ({amount}) must be \
                         equal to or larger than the number of required_floatingips ({})",
                        required.len()
                    )));
                }
                out.insert("network_id".into(), Value::from(network));
                out.insert("amount".into(), Value::from(amount));
                out.insert("required_floatingips".into(), Value::from(required));
            }
            NETWORK => {
                let name = text_field(&merged, "network_name", true)?.unwrap_or_default();
                let description = text_field(&merged, "network_description", false)?;
                let (network_properties, _) = query_field(&merged, "network_properties")?;
                let (properties, _) = query_field(&merged, "resource_properties")?;
                out.insert("network_name".into(), Value::from(name));
                out.insert(
                    "network_description".into(),
                    description.map_or(Value::Null, Value::from),
                );
                out.insert("network_properties".into(), Value::from(network_properties));
                out.insert("resource_properties".into(), Value::from(properties));
                out.insert("before_end".into(), Value::from(before_end(&merged)?));
            }
            _ => {
                let min = int_field(&merged, "min")?;
                let max = int_field(&merged, "max")?;
                if max < min {
                    return Err(ServiceError::BadRequest(format!(
                        "Invalid values for min/max of devices. Max must be equal to or larger than min \
                         (got min {min}, max {max})"
                    )));
                }
                let (properties, _) = query_field(&merged, "resource_properties")?;
                out.insert("resource_properties".into(), Value::from(properties));
                out.insert("before_end".into(), Value::from(before_end(&merged)?));
                out.insert("min".into(), Value::from(min));
                out.insert("max".into(), Value::from(max));
            }
        }
        Ok(out)
    }

    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant> {
        tx.lock_allocations().await?;
        let (min, max) = self.count(params)?;
        let (matching, required) = self.matching(tx, params, request.explain).await?;
        let busy = tx
            .busy_among(
                self.kind,
                &required,
                request.window.start(),
                request.blocked_until,
            )
            .await?;
        if required.iter().any(|id| busy.contains(id)) {
            if !request.explain {
                return Err(ServiceError::Conflict(self.bare_refusal()));
            }
            return Err(ServiceError::Conflict(format!(
                "Not enough floating IPs available for reservation {}: a required floating IP is \
                 reserved by another lease in that window",
                request.ordinal
            )));
        }
        let keep: Vec<i64> = required
            .iter()
            .chain(request.keep.iter())
            .copied()
            .collect();
        let chosen = pick_free(
            tx,
            self.kind,
            &matching,
            &keep,
            request,
            min as usize,
            max as usize,
        )
        .await?
        .map_err(|s| {
            if !request.explain {
                return ServiceError::Conflict(self.bare_refusal());
            }
            ServiceError::Conflict(format!(
                "Not enough {}s available for reservation {} ({}, {} wanted): {} match the request \
                 and are reservable, {} of them free from {} to {}",
                self.noun(),
                request.ordinal,
                self.kind,
                min,
                s.matching,
                s.free,
                request.window.start().format("%Y-%m-%d %H:%M"),
                request.window.end().format("%Y-%m-%d %H:%M"),
            ))
        })?;
        grant_whole(tx, self.kind, request, chosen).await
    }

    async fn refill(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64> {
        tx.lock_allocations().await?;
        // A replacement need not be one of the required addresses (one of them may be what
        // failed).
        let mut loose = params.clone();
        loose.remove("required_floatingips");
        let (matching, _) = self.matching(tx, &loose, request.explain).await?;
        refill_whole(tx, self.kind, &matching, request, missing).await
    }
}
