//! The Neutron calls of Blazar's floating-IP plugin and Chameleon's network plugin: checking
//! an address against its network's subnets, floating IPs made with an exact address and
//! tagged for their reservation, provider networks made on a reserved segment, and their
//! removal with whatever was attached to them. Every call is made safe to repeat.

use std::net::IpAddr;

use ipnet::IpNet;
use reqwest::Method;
use serde_json::{Value, json};

use crate::error::{Error, Result, tolerate};
use crate::placement::urlencode;
use crate::session::{Api, Session, items};

pub struct Neutron<'a> {
    api: Api<'a>,
}

/// Where an address stands on a Neutron network (Blazar's `FloatingIPPool.fetch_subnet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressCheck {
    /// The network does not exist.
    NoNetwork,
    /// No subnet of the network holds the address.
    NoSubnet,
    /// Neutron may hand the address out itself: inside an allocation pool, or the gateway.
    UsedByNeutron { subnet_id: String },
    /// Reservable: in this subnet, outside its pools.
    Reservable { subnet_id: String },
}

/// A floating IP as Neutron shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatingIp {
    pub id: String,
    pub address: String,
    pub project_id: String,
    pub port_id: Option<String>,
    pub tags: Vec<String>,
}

/// What making sure of a reservation's floating IP or network took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// It was made.
    Made,
    /// It was there, the project's, and given the reservation's tags.
    Tagged,
    /// It was there as it should be.
    Found,
}

impl Ensured {
    /// How a log line says it.
    pub fn done(self) -> &'static str {
        match self {
            Ensured::Made => "created",
            Ensured::Tagged => "tagged as its reservation's",
            Ensured::Found => "already in place",
        }
    }
}

/// A network as Neutron shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    pub id: String,
    pub name: String,
    pub project_id: String,
    pub network_type: String,
    pub segmentation_id: Option<i64>,
    pub physical_network: Option<String>,
    pub tags: Vec<String>,
}

/// What a network is made with.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNetwork<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    pub project_id: &'a str,
    pub network_type: &'a str,
    pub physical_network: Option<&'a str>,
    pub segmentation_id: i64,
    pub tags: &'a [String],
}

fn text(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

fn tags_of(v: &Value) -> Vec<String> {
    items(v, "tags")
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect()
}

fn floatingip_from(v: &Value) -> FloatingIp {
    FloatingIp {
        id: text(v, "id"),
        address: text(v, "floating_ip_address"),
        project_id: text(v, "project_id"),
        port_id: v["port_id"].as_str().map(str::to_string),
        tags: tags_of(v),
    }
}

fn network_from(v: &Value) -> Network {
    Network {
        id: text(v, "id"),
        name: text(v, "name"),
        project_id: text(v, "project_id"),
        network_type: text(v, "provider:network_type"),
        segmentation_id: v["provider:segmentation_id"].as_i64(),
        physical_network: v["provider:physical_network"].as_str().map(str::to_string),
        tags: tags_of(v),
    }
}

/// Whether `address` lies in `[start, end]` (same family; Neutron pools are ranges).
fn in_range(address: IpAddr, start: &str, end: &str) -> bool {
    match (start.parse::<IpAddr>(), end.parse::<IpAddr>()) {
        (Ok(s), Ok(e)) => s <= address && address <= e && s.is_ipv4() == address.is_ipv4(),
        _ => false,
    }
}

impl<'a> Neutron<'a> {
    pub(crate) fn new(session: &'a Session, request_id: Option<&'a str>) -> Neutron<'a> {
        Neutron {
            api: Api::new(session, "network", Vec::new(), request_id),
        }
    }

    /// A call whose 404 means "already gone".
    async fn call_gone_ok(&self, method: Method, path: &str, body: Option<Value>) -> Result<()> {
        tolerate(self.api.call(method, path, body).await, Error::is_not_found)
    }

    /// Checks `address` against network `network_id` as Blazar does when it is registered.
    pub async fn check_address(&self, network_id: &str, address: IpAddr) -> Result<AddressCheck> {
        let network = match self
            .api
            .get(&format!("/v2.0/networks/{}", urlencode(network_id)))
            .await
        {
            Ok(n) => n,
            Err(e) if e.is_not_found() => return Ok(AddressCheck::NoNetwork),
            Err(e) => return Err(e),
        };
        let subnets = self.subnets_of(network_id).await?;
        let listed: Vec<String> = network["network"]["subnets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        for subnet in items(&subnets, "subnets") {
            let id = text(subnet, "id");
            if !listed.is_empty() && !listed.contains(&id) {
                continue;
            }
            let Ok(cidr) = text(subnet, "cidr").parse::<IpNet>() else {
                continue;
            };
            if !cidr.contains(&address) {
                continue;
            }
            let gateway = subnet["gateway_ip"].as_str().and_then(|g| g.parse().ok());
            let pooled = items(subnet, "allocation_pools")
                .any(|p| in_range(address, &text(p, "start"), &text(p, "end")));
            return Ok(if pooled || gateway == Some(address) {
                AddressCheck::UsedByNeutron { subnet_id: id }
            } else {
                AddressCheck::Reservable { subnet_id: id }
            });
        }
        Ok(AddressCheck::NoSubnet)
    }

    /// The floating IP holding `address` on `network_id`, if Neutron has one.
    pub async fn find_floatingip(
        &self,
        network_id: &str,
        address: &str,
    ) -> Result<Option<FloatingIp>> {
        let found = self
            .api
            .get(&format!(
                "/v2.0/floatingips?floating_network_id={}&floating_ip_address={}",
                urlencode(network_id),
                urlencode(address)
            ))
            .await?;
        Ok(items(&found, "floatingips").map(floatingip_from).next())
    }

    /// Every floating IP on `network_id`, every project's.
    pub async fn floatingips_on(&self, network_id: &str) -> Result<Vec<FloatingIp>> {
        let found = self
            .api
            .get(&format!(
                "/v2.0/floatingips?floating_network_id={}",
                urlencode(network_id)
            ))
            .await?;
        Ok(items(&found, "floatingips").map(floatingip_from).collect())
    }

    /// Every network with its segment, every project's.
    pub async fn networks(&self) -> Result<Vec<Network>> {
        let found = self.api.get("/v2.0/networks").await?;
        Ok(items(&found, "networks").map(network_from).collect())
    }

    /// The floating IPs tagged `tag`, every project's.
    pub async fn floatingips_tagged(&self, tag: &str) -> Result<Vec<FloatingIp>> {
        self.tagged("floatingips", tag, floatingip_from).await
    }

    /// Makes the floating IP `address` in `project_id`, tagged `tags`. Already made (by an
    /// earlier attempt) is fine: the tags are set again. Says which it was.
    pub async fn ensure_floatingip(
        &self,
        network_id: &str,
        subnet_id: Option<&str>,
        address: &str,
        project_id: &str,
        tags: &[String],
    ) -> Result<(FloatingIp, Ensured)> {
        let existing = self.find_floatingip(network_id, address).await?;
        let (fip, mut done) = match existing {
            Some(f) if f.project_id == project_id => (f, Ensured::Found),
            Some(f) => {
                return Err(Error::HeldOutside(format!(
                    "floating IP {address} already exists in project {} ({})",
                    f.project_id, f.id
                )));
            }
            None => {
                let mut body = json!({
                    "floating_network_id": network_id,
                    "floating_ip_address": address,
                    "project_id": project_id,
                });
                if let Some(subnet) = subnet_id {
                    body["subnet_id"] = json!(subnet);
                }
                let made = floatingip_from(&self.create("floatingip", body).await?);
                (made, Ensured::Made)
            }
        };
        if tags.iter().any(|t| !fip.tags.contains(t)) {
            self.set_tags("floatingips", &fip.id, tags).await?;
            if done == Ensured::Found {
                done = Ensured::Tagged;
            }
        }
        Ok((fip, done))
    }

    /// Detaches the floating IP from its port, if any, and deletes it (Neutron would delete
    /// the association with it, but Blazar detaches first). Gone is fine.
    pub async fn delete_floatingip(&self, fip: &FloatingIp) -> Result<()> {
        if fip.port_id.is_some() {
            self.call_gone_ok(
                Method::PUT,
                &format!("/v2.0/floatingips/{}", fip.id),
                Some(json!({"floatingip": {"port_id": null}})),
            )
            .await?;
        }
        self.call_gone_ok(
            Method::DELETE,
            &format!("/v2.0/floatingips/{}", fip.id),
            None,
        )
        .await
    }

    /// The networks tagged `tag`, every project's.
    pub async fn networks_tagged(&self, tag: &str) -> Result<Vec<Network>> {
        self.tagged("networks", tag, network_from).await
    }

    /// The resources of `collection` (`floatingips`, `networks`) tagged `tag`.
    async fn tagged<T>(
        &self,
        collection: &str,
        tag: &str,
        from: fn(&Value) -> T,
    ) -> Result<Vec<T>> {
        let found = self
            .api
            .get(&format!("/v2.0/{collection}?tags={}", urlencode(tag)))
            .await?;
        Ok(items(&found, collection).map(from).collect())
    }

    /// The network on segment (`network_type`, `physical_network`, `segmentation_id`), if
    /// Neutron has one. The physical network is part of the segment: VLAN 100 on `physnet1`
    /// and VLAN 100 on `physnet2` are two segments, each with a network of its own.
    pub async fn network_on_segment(
        &self,
        network_type: &str,
        physical_network: Option<&str>,
        segmentation_id: i64,
    ) -> Result<Option<Network>> {
        let mut query = format!(
            "/v2.0/networks?provider%3Anetwork_type={}&provider%3Asegmentation_id={segmentation_id}",
            urlencode(network_type)
        );
        if let Some(physical) = physical_network {
            query.push_str(&format!(
                "&provider%3Aphysical_network={}",
                urlencode(physical)
            ));
        }
        let found = self.api.get(&query).await?;
        Ok(items(&found, "networks").map(network_from).next())
    }

    /// Makes the provider network `new` unless the segment already carries one with the
    /// same tags (an earlier attempt).
    pub async fn ensure_network(&self, new: &NewNetwork<'_>) -> Result<(Network, Ensured)> {
        if let Some(found) = self
            .network_on_segment(new.network_type, new.physical_network, new.segmentation_id)
            .await?
        {
            if new.tags.iter().all(|t| found.tags.contains(t)) {
                return Ok((found, Ensured::Found));
            }
            // The project's own network on the segment it holds: an earlier attempt that made
            // it and failed to tag it, or one whose tags (or name) the project edited, or the
            // one an earlier lease of the project left. Tagged now, so that it is found (and
            // taken back) as this reservation's.
            if found.project_id == new.project_id {
                self.set_tags("networks", &found.id, new.tags).await?;
                let tagged = Network {
                    tags: new.tags.to_vec(),
                    ..found
                };
                return Ok((tagged, Ensured::Tagged));
            }
            return Err(Error::HeldOutside(format!(
                "segment {} {} is already used by network {} of project {}",
                new.network_type, new.segmentation_id, found.id, found.project_id
            )));
        }
        let mut body = json!({
            "name": new.name,
            "project_id": new.project_id,
            "provider:network_type": new.network_type,
            "provider:segmentation_id": new.segmentation_id,
        });
        if let Some(physical) = new.physical_network {
            body["provider:physical_network"] = json!(physical);
        }
        if let Some(description) = new.description {
            body["description"] = json!(description);
        }
        let network = network_from(&self.create("network", body).await?);
        self.set_tags("networks", &network.id, new.tags).await?;
        Ok((network, Ensured::Made))
    }

    /// The subnets of a network, as Neutron lists them.
    async fn subnets_of(&self, network_id: &str) -> Result<Value> {
        self.api
            .get(&format!(
                "/v2.0/subnets?network_id={}",
                urlencode(network_id)
            ))
            .await
    }

    /// Makes a `kind` (`floatingip`, `network`) from `body`: Neutron's answer for it.
    async fn create(&self, kind: &str, body: Value) -> Result<Value> {
        let mut wrapped = serde_json::Map::new();
        wrapped.insert(kind.to_string(), body);
        let mut made = self
            .api
            .call(
                Method::POST,
                &format!("/v2.0/{kind}s"),
                Some(Value::Object(wrapped)),
            )
            .await?;
        // Null when the answer lacks it, as indexing would read it.
        Ok(made.get_mut(kind).map(Value::take).unwrap_or(Value::Null))
    }

    /// Replaces the tags of a resource of `collection` (`floatingips`, `networks`).
    async fn set_tags(&self, collection: &str, id: &str, tags: &[String]) -> Result<()> {
        self.api
            .call(
                Method::PUT,
                &format!("/v2.0/{collection}/{id}/tags"),
                Some(json!({ "tags": tags })),
            )
            .await?;
        Ok(())
    }

    /// Deletes a network with what hangs on it, as Chameleon's plugin does: servers' ports,
    /// router interfaces on its subnets, the subnets, any port left, then the network.
    pub async fn delete_network(&self, network_id: &str) -> Result<()> {
        let ports = self
            .api
            .get(&format!("/v2.0/ports?network_id={}", urlencode(network_id)))
            .await?;
        let ports: Vec<Value> = ports["ports"].as_array().cloned().unwrap_or_default();
        for port in &ports {
            let owner = text(port, "device_owner");
            if owner == "network:router_interface"
                || owner == "network:ha_router_replicated_interface"
            {
                let router = text(port, "device_id");
                for fixed in items(port, "fixed_ips") {
                    self.call_gone_ok(
                        Method::PUT,
                        &format!("/v2.0/routers/{router}/remove_router_interface"),
                        Some(json!({"subnet_id": text(fixed, "subnet_id")})),
                    )
                    .await?;
                }
            }
        }
        for port in &ports {
            let owner = text(port, "device_owner");
            // DHCP ports go with their subnet; router ports went above.
            if owner == "network:dhcp" || owner.starts_with("network:router") {
                continue;
            }
            self.call_gone_ok(
                Method::DELETE,
                &format!("/v2.0/ports/{}", text(port, "id")),
                None,
            )
            .await?;
        }
        let subnets = self.subnets_of(network_id).await?;
        for subnet in items(&subnets, "subnets") {
            self.call_gone_ok(
                Method::DELETE,
                &format!("/v2.0/subnets/{}", text(subnet, "id")),
                None,
            )
            .await?;
        }
        self.call_gone_ok(
            Method::DELETE,
            &format!("/v2.0/networks/{network_id}"),
            None,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_their_ends_and_keep_to_one_family() {
        let a: IpAddr = "172.24.4.10".parse().unwrap();
        assert!(in_range(a, "172.24.4.10", "172.24.4.200"));
        assert!(!in_range(a, "172.24.4.11", "172.24.4.200"));
        assert!(!in_range(
            "::1".parse().unwrap(),
            "172.24.4.1",
            "172.24.4.200"
        ));
        assert!(!in_range(a, "bad", "172.24.4.200"));
    }
}
