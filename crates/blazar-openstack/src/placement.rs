//! The Placement calls of Blazar's host plugin: the compute node's resource provider, its
//! inventory and traits, and the `blazar_<hostname>` provider nested under it.

use reqwest::Method;
use serde_json::{Value, json};

use crate::error::Result;
use crate::session::{Api, Session, items};

const MICROVERSION: &str = "1.29";

#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub uuid: String,
    pub name: String,
    pub generation: i64,
    pub parent: Option<String>,
}

pub struct Placement<'a> {
    api: Api<'a>,
}

/// The nested provider Blazar keeps per host for instance reservations' classes.
pub fn reservation_provider_name(hypervisor_hostname: &str) -> String {
    format!("blazar_{hypervisor_hostname}")
}

fn provider_from(v: &Value) -> Provider {
    Provider {
        uuid: v["uuid"].as_str().unwrap_or_default().to_string(),
        name: v["name"].as_str().unwrap_or_default().to_string(),
        generation: v["generation"].as_i64().unwrap_or(0),
        parent: v["parent_provider_uuid"].as_str().map(str::to_string),
    }
}

impl<'a> Placement<'a> {
    pub(crate) fn new(session: &'a Session, request_id: Option<&'a str>) -> Placement<'a> {
        let headers = vec![("openstack-api-version", format!("placement {MICROVERSION}"))];
        Placement {
            api: Api::new(session, "placement", headers, request_id),
        }
    }

    pub async fn provider_by_name(&self, name: &str) -> Result<Option<Provider>> {
        let found = self
            .api
            .get(&format!("/resource_providers?name={}", urlencode(name)))
            .await?;
        Ok(found["resource_providers"]
            .as_array()
            .and_then(|a| a.first())
            .map(provider_from))
    }

    /// The provider named `name` under `parent`, created if missing.
    pub async fn ensure_child_provider(&self, name: &str, parent: &str) -> Result<Provider> {
        if let Some(found) = self.provider_by_name(name).await? {
            return Ok(found);
        }
        match self
            .api
            .call(
                Method::POST,
                "/resource_providers",
                Some(json!({"name": name, "parent_provider_uuid": parent})),
            )
            .await
        {
            Ok(made) => Ok(provider_from(&made)),
            // Made meanwhile by another attempt; if it is not there either, the conflict
            // was something else (the name taken under another parent being deleted):
            // the call fails and is tried again.
            Err(e) if e.is_conflict() => match self.provider_by_name(name).await? {
                Some(found) => Ok(found),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    pub async fn delete_provider(&self, uuid: &str) -> Result<()> {
        self.api
            .delete(&format!("/resource_providers/{uuid}"))
            .await
    }

    /// Inventories by resource class: (total, allocation_ratio, reserved).
    pub async fn inventories(&self, uuid: &str) -> Result<Vec<(String, i64, f64, i64)>> {
        Ok(self
            .inventory_map(uuid)
            .await?
            .iter()
            .map(|(class, inv)| {
                (
                    class.clone(),
                    inv["total"].as_i64().unwrap_or(0),
                    inv["allocation_ratio"].as_f64().unwrap_or(1.0),
                    inv["reserved"].as_i64().unwrap_or(0),
                )
            })
            .collect())
    }

    /// The inventory of `class` on provider `uuid`, as Placement shows it (`None`: none).
    pub async fn inventory_of(&self, uuid: &str, class: &str) -> Result<Option<Value>> {
        Ok(self.inventory_map(uuid).await?.remove(class))
    }

    /// How many units of `class` the servers on provider `uuid` hold.
    pub async fn usage_of(&self, uuid: &str, class: &str) -> Result<i64> {
        let found = self
            .api
            .get(&format!("/resource_providers/{uuid}/usages"))
            .await?;
        Ok(found["usages"][class].as_i64().unwrap_or(0))
    }

    /// Provider `uuid`'s inventories by resource class, as Placement shows them.
    async fn inventory_map(&self, uuid: &str) -> Result<serde_json::Map<String, Value>> {
        let mut found = self
            .api
            .get(&format!("/resource_providers/{uuid}/inventories"))
            .await?;
        Ok(match found.get_mut("inventories").map(Value::take) {
            Some(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        })
    }

    pub async fn traits(&self, uuid: &str) -> Result<Vec<String>> {
        let found = self
            .api
            .get(&format!("/resource_providers/{uuid}/traits"))
            .await?;
        Ok(items(&found, "traits")
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect())
    }
}

impl Placement<'_> {
    /// Creates the custom resource class `name`; already there is fine.
    pub async fn ensure_resource_class(&self, name: &str) -> Result<()> {
        self.api
            .call(Method::PUT, &format!("/resource_classes/{name}"), None)
            .await
            .map(|_| ())
    }

    /// Names of the custom resource classes of instance reservations.
    pub async fn reservation_classes(&self) -> Result<Vec<String>> {
        let found = self.api.get("/resource_classes").await?;
        Ok(items(&found, "resource_classes")
            .filter_map(|c| c["name"].as_str())
            .filter(|n| n.starts_with(RESERVATION_CLASS_PREFIX))
            .map(str::to_string)
            .collect())
    }

    /// Deletes the resource class `name`; absent is fine. Placement refuses (409) while an
    /// inventory still uses it.
    pub async fn delete_resource_class(&self, name: &str) -> Result<()> {
        self.api.delete(&format!("/resource_classes/{name}")).await
    }

    /// Sets the provider's inventory of `class` to `total` units of one (Blazar's instance
    /// slots), retrying on generation conflicts with a concurrent writer (nova-compute
    /// updates its tree too).
    pub async fn set_slots(&self, uuid: &str, class: &str, total: i64) -> Result<()> {
        let mut tries = 0;
        loop {
            let provider = self.api.get(&format!("/resource_providers/{uuid}")).await?;
            let generation = provider["generation"].as_i64().unwrap_or(0);
            let current = self
                .api
                .get(&format!("/resource_providers/{uuid}/inventories"))
                .await?;
            if slots_as_granted(&current["inventories"][class], total) {
                return Ok(());
            }
            let mut body = json!({
                "resource_provider_generation": generation,
                "total": total,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": 1,
                "step_size": 1,
                "allocation_ratio": 1.0,
            });
            // A class the provider has no inventory of yet is added; one it has is replaced.
            let (method, path) = if current["inventories"][class].is_null() {
                body["resource_class"] = json!(class);
                (
                    Method::POST,
                    format!("/resource_providers/{uuid}/inventories"),
                )
            } else {
                (
                    Method::PUT,
                    format!("/resource_providers/{uuid}/inventories/{class}"),
                )
            };
            match self.api.call(method, &path, Some(body)).await {
                Ok(_) => return Ok(()),
                // Another writer moved the provider's generation: read again, after a
                // pause that grows, so that two writers do not keep colliding.
                Err(e) if e.is_conflict() && tries < 5 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100 * tries)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Providers with a unit of `class` free: every provider with an inventory of it once
    /// the servers holding its units are gone.
    pub async fn providers_with_class(&self, class: &str) -> Result<Vec<Provider>> {
        let found = match self
            .api
            .get(&format!(
                "/resource_providers?resources={}:1",
                urlencode(class)
            ))
            .await
        {
            Ok(found) => found,
            // Placement refuses a class it does not know: no provider has any of it.
            Err(e) if e.status() == Some(400) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(found["resource_providers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(provider_from)
            .collect())
    }

    /// The consumers (servers) holding units of `class` on provider `uuid`.
    pub async fn consumers_of(&self, uuid: &str, class: &str) -> Result<Vec<String>> {
        let found = self
            .api
            .get(&format!("/resource_providers/{uuid}/allocations"))
            .await?;
        Ok(found["allocations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, a)| a["resources"].get(class).is_some())
            .map(|(consumer, _)| consumer.clone())
            .collect())
    }

    /// Whether `consumer`'s allocations are known not to be a migration's (Placement's
    /// consumer type, 1.38): a resize or move in progress holds its source host's units
    /// under the migration's id, which Nova does not show as a server. Where Placement
    /// cannot say (older than 1.38), not known.
    pub async fn not_a_migration(&self, consumer: &str) -> Result<bool> {
        let api = self
            .api
            .with_headers(vec![("openstack-api-version", "placement 1.38".into())]);
        match api
            .get(&format!("/allocations/{}", urlencode(consumer)))
            .await
        {
            Ok(found) => Ok(found["consumer_type"] != "MIGRATION"),
            Err(e) if e.status() == Some(406) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes every allocation of `consumer` (a server Nova has deleted); none is fine.
    pub async fn delete_allocations(&self, consumer: &str) -> Result<()> {
        self.api
            .delete(&format!("/allocations/{}", urlencode(consumer)))
            .await
    }

    /// Removes the provider's inventory of `class`; absent is fine. Placement refuses (409)
    /// while servers still hold units of it.
    pub async fn delete_inventory(&self, uuid: &str, class: &str) -> Result<()> {
        self.api
            .delete(&format!("/resource_providers/{uuid}/inventories/{class}"))
            .await
    }

    /// Every resource provider (one call: Placement does not page this list).
    pub async fn providers(&self) -> Result<Vec<Provider>> {
        let found = self.api.get("/resource_providers").await?;
        Ok(items(&found, "resource_providers")
            .map(provider_from)
            .collect())
    }

    /// Names of the providers that Placement counts as members of aggregate `uuid`
    /// (its copy of Nova's host aggregates, which Nova writes as hosts are added).
    pub async fn providers_in_aggregate(&self, uuid: &str) -> Result<Vec<Provider>> {
        let found = self
            .api
            .get(&format!(
                "/resource_providers?member_of={}",
                urlencode(uuid)
            ))
            .await?;
        Ok(items(&found, "resource_providers")
            .map(provider_from)
            .collect())
    }

    /// Puts provider `uuid` into aggregate `aggregate` (`member`) or takes it out; as it is
    /// already is fine. A concurrent writer of the provider (nova-compute, Nova's API
    /// mirroring another aggregate) moves its generation: read again and tried again.
    pub async fn set_member_of(&self, uuid: &str, aggregate: &str, member: bool) -> Result<()> {
        let path = format!("/resource_providers/{uuid}/aggregates");
        let mut tries = 0;
        loop {
            let current = self.api.get(&path).await?;
            let mut aggregates: Vec<String> = items(&current, "aggregates")
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect();
            if aggregates.iter().any(|a| a == aggregate) == member {
                return Ok(());
            }
            if member {
                aggregates.push(aggregate.to_string());
            } else {
                aggregates.retain(|a| a != aggregate);
            }
            let body = json!({
                "aggregates": aggregates,
                "resource_provider_generation": current["resource_provider_generation"],
            });
            match self.api.call(Method::PUT, &path, Some(body)).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_conflict() && tries < 5 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100 * tries)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Names of the providers with every trait of `required` and none of `forbidden`.
    pub async fn providers_with_traits(
        &self,
        required: &[String],
        forbidden: &[String],
    ) -> Result<Vec<String>> {
        let query: Vec<String> = required
            .iter()
            .cloned()
            .chain(forbidden.iter().map(|t| format!("!{t}")))
            .collect();
        let found = self
            .api
            .get(&format!(
                "/resource_providers?required={}",
                urlencode(&query.join(","))
            ))
            .await?;
        Ok(items(&found, "resource_providers")
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect())
    }
}

/// The custom resource class of an instance reservation (`CUSTOM_RESERVATION_<ID>`, the id
/// upper-cased with `_` for `-`).
pub fn reservation_class(reservation_id: &str) -> String {
    format!(
        "{RESERVATION_CLASS_PREFIX}{}",
        reservation_id.to_uppercase().replace('-', "_")
    )
}

const RESERVATION_CLASS_PREFIX: &str = "CUSTOM_RESERVATION_";

/// The reservation id a class of `reservation_class` names (ids are lower-case UUIDs).
pub fn class_reservation(class: &str) -> Option<String> {
    class
        .strip_prefix(RESERVATION_CLASS_PREFIX)
        .map(|id| id.to_lowercase().replace('_', "-"))
}

/// Whether `inventory` holds `total` slots of an instance reservation and nothing more:
/// one server a slot, none held back. A higher `allocation_ratio` (or a wider unit) would let
/// the project run more servers than it booked, on capacity promised to others.
pub fn slots_as_granted(inventory: &Value, total: i64) -> bool {
    inventory["total"].as_i64() == Some(total)
        && inventory["reserved"].as_i64() == Some(0)
        && inventory["min_unit"].as_i64() == Some(1)
        && inventory["max_unit"].as_i64() == Some(1)
        && inventory["step_size"].as_i64() == Some(1)
        && inventory["allocation_ratio"].as_f64() == Some(1.0)
}

/// A query value, percent-encoded.
pub(crate) fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_as_granted_only_one_server_each() {
        let granted = json!({"total": 2, "reserved": 0, "min_unit": 1, "max_unit": 1,
            "step_size": 1, "allocation_ratio": 1.0});
        assert!(slots_as_granted(&granted, 2));
        assert!(!slots_as_granted(&granted, 3));
        for (key, value) in [
            ("allocation_ratio", json!(8.0)),
            ("reserved", json!(2)),
            ("max_unit", json!(2)),
            ("min_unit", json!(2)),
        ] {
            let mut changed = granted.clone();
            changed[key] = value;
            assert!(!slots_as_granted(&changed, 2), "{key}");
        }
        assert!(!slots_as_granted(&Value::Null, 0));
    }

    #[test]
    fn names_are_escaped_in_queries() {
        assert_eq!(urlencode("compute-1.example"), "compute-1.example");
        assert_eq!(urlencode("a b&c"), "a+b%26c");
        assert_eq!(reservation_provider_name("c1"), "blazar_c1");
        assert_eq!(
            reservation_class("0d3e-aa9f"),
            "CUSTOM_RESERVATION_0D3E_AA9F"
        );
    }
}
