//! The Nova calls of Blazar's host plugin: hypervisors and compute services, aggregates,
//! servers on a host. Microversion 2.61 (hypervisor facts up to 2.87 need <2.88; 2.53 for
//! hypervisor search by name).

use std::future::Future;
use std::time::Duration;

use blazar_core::HostFacts;
use reqwest::Method;
use serde_json::{Value, json};

use crate::error::{Error, Result, tolerate};
use crate::session::{Api, Session, items};

const MICROVERSION: &str = "2.61";

/// What Nova knows of a hypervisor.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypervisor {
    pub id: String,
    /// What blazar-rs records of it: `service_name` is the compute service's host (what
    /// aggregates hold); Nova does not give a hypervisor's zone, so it is left empty here.
    pub facts: HostFacts,
    pub state: String,
    pub status: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ComputeService {
    pub host: String,
    /// `up` or `down`.
    pub state: String,
    /// `enabled` or `disabled`.
    pub status: String,
    pub forced_down: bool,
    /// Its availability zone.
    pub zone: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    pub id: i64,
    /// Its id in Placement, where Nova mirrors which compute nodes are members.
    pub uuid: String,
    pub name: String,
    pub availability_zone: Option<String>,
    pub hosts: Vec<String>,
    pub metadata: serde_json::Map<String, Value>,
}

/// Whether `aggregate` is an instance reservation's: named after the reservation its
/// `reservation` metadata names.
pub fn names_reservation(aggregate: &Aggregate) -> bool {
    aggregate
        .metadata
        .get("reservation")
        .and_then(Value::as_str)
        == Some(aggregate.name.as_str())
}

/// The metadata key Nova mirrors an aggregate's availability zone into.
const ZONE_KEY: &str = "availability_zone";

/// The keys of `have` not as `wanted` says: missing, with another value, or not wanted at
/// all (`ignored` aside); sorted.
fn map_drift(
    have: &serde_json::Map<String, Value>,
    wanted: &serde_json::Map<String, Value>,
    ignored: Option<&str>,
) -> Vec<String> {
    let mut keys: Vec<String> = wanted
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(
            have.keys()
                .filter(|k| Some(k.as_str()) != ignored && !wanted.contains_key(*k))
                .cloned(),
        )
        .collect();
    keys.sort();
    keys
}

/// The keys of `aggregate`'s metadata that are not as `wanted` says (the zone's aside):
/// missing, with another value, or not wanted at all; sorted.
pub fn metadata_drift(
    aggregate: &Aggregate,
    wanted: &serde_json::Map<String, Value>,
) -> Vec<String> {
    map_drift(&aggregate.metadata, wanted, Some(ZONE_KEY))
}

/// The extra specs of `flavor` (as Nova shows it from 2.61 on) that are not as `wanted`
/// says; sorted. A stray key could loosen what the reservation's keys hold to its hosts.
pub fn extra_specs_drift(flavor: &Value, wanted: &serde_json::Map<String, Value>) -> Vec<String> {
    let none = serde_json::Map::new();
    let have = flavor["extra_specs"].as_object().unwrap_or(&none);
    map_drift(have, wanted, None)
}

/// The fields of a flavor Nova cannot change in place, compared where `wanted` sets them.
const FIXED_FLAVOR_FIELDS: [&str; 5] = [
    "vcpus",
    "ram",
    "disk",
    "OS-FLV-EXT-DATA:ephemeral",
    "os-flavor-access:is_public",
];

/// Whether `found` differs from `wanted` in what only making the flavor again changes (its
/// size, or made public by hand).
pub fn flavor_differs(found: &Value, wanted: &Value) -> bool {
    FIXED_FLAVOR_FIELDS
        .iter()
        .any(|k| !wanted[*k].is_null() && found[*k] != wanted[*k])
}

/// `s` as one segment of a URL path (`form_urlencoded` writes a space as `+`, which a path
/// keeps as a plus).
fn path_segment(s: &str) -> String {
    crate::placement::urlencode(s).replace('+', "%20")
}

pub struct Nova<'a> {
    api: Api<'a>,
}

fn hypervisor_from(v: &Value) -> Hypervisor {
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    Hypervisor {
        id: v["id"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v["id"].to_string()),
        facts: HostFacts {
            hypervisor_hostname: text("hypervisor_hostname"),
            service_name: v["service"]["host"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            hypervisor_type: text("hypervisor_type"),
            hypervisor_version: v["hypervisor_version"].as_i64().unwrap_or(0),
            vcpus: v["vcpus"].as_i64().unwrap_or(0),
            memory_mb: v["memory_mb"].as_i64().unwrap_or(0),
            local_gb: v["local_gb"].as_i64().unwrap_or(0),
            cpu_info: match &v["cpu_info"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            },
            availability_zone: String::new(),
        },
        state: text("state"),
        status: text("status"),
    }
}

fn aggregate_from(v: &Value) -> Aggregate {
    Aggregate {
        id: v["id"].as_i64().unwrap_or_default(),
        uuid: v["uuid"].as_str().unwrap_or_default().to_string(),
        name: v["name"].as_str().unwrap_or_default().to_string(),
        availability_zone: v["availability_zone"].as_str().map(str::to_string),
        hosts: items(v, "hosts")
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect(),
        metadata: v["metadata"].as_object().cloned().unwrap_or_default(),
    }
}

/// How often a server still there while a delete is awaited is looked at again: a delete
/// Nova accepted can fail afterwards (its compute service or Placement unreachable), leaving
/// the server with no task in progress, and nothing but a new delete takes it away.
const REDELETE_EVERY: Duration = Duration::from_secs(10);

impl<'a> Nova<'a> {
    pub(crate) fn new(session: &'a Session, request_id: Option<&'a str>) -> Nova<'a> {
        let headers = vec![
            ("openstack-api-version", format!("compute {MICROVERSION}")),
            ("x-openstack-nova-api-version", MICROVERSION.to_string()),
        ];
        Nova {
            api: Api::new(session, "compute", headers, request_id),
        }
    }

    /// The hypervisor named `name` (its hypervisor hostname, or its id).
    pub async fn find_hypervisor(&self, name: &str) -> Result<Option<Hypervisor>> {
        let all = self
            .api
            .get_all("/os-hypervisors/detail", "hypervisors")
            .await?;
        Ok(items(&all, "hypervisors").map(hypervisor_from).find(|h| {
            h.facts.hypervisor_hostname == name || h.id == name || h.facts.service_name == name
        }))
    }

    pub async fn hypervisors(&self) -> Result<Vec<Hypervisor>> {
        let all = self
            .api
            .get_all("/os-hypervisors/detail", "hypervisors")
            .await?;
        Ok(items(&all, "hypervisors").map(hypervisor_from).collect())
    }

    pub async fn compute_services(&self) -> Result<Vec<ComputeService>> {
        let all = self.api.get("/os-services?binary=nova-compute").await?;
        Ok(items(&all, "services")
            .map(|s| ComputeService {
                host: s["host"].as_str().unwrap_or_default().to_string(),
                state: s["state"].as_str().unwrap_or_default().to_string(),
                status: s["status"].as_str().unwrap_or_default().to_string(),
                forced_down: s["forced_down"].as_bool().unwrap_or(false),
                zone: s["zone"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// Whether Nova has a compute service for `host` right now (one call, filtered by Nova).
    pub async fn has_compute_service(&self, host: &str) -> Result<bool> {
        let found = self
            .api
            .get(&format!(
                "/os-services?binary=nova-compute&host={}",
                crate::placement::urlencode(host)
            ))
            .await?;
        Ok(items(&found, "services").any(|s| s["host"].as_str() == Some(host)))
    }

    pub async fn aggregates(&self) -> Result<Vec<Aggregate>> {
        let all = self.api.get("/os-aggregates").await?;
        Ok(items(&all, "aggregates").map(aggregate_from).collect())
    }

    pub async fn find_aggregate(&self, name: &str) -> Result<Option<Aggregate>> {
        Ok(self
            .aggregates()
            .await?
            .into_iter()
            .find(|a| a.name == name))
    }

    /// The aggregate named `name`, created (with `availability_zone`) if missing.
    pub async fn ensure_aggregate(
        &self,
        name: &str,
        availability_zone: Option<&str>,
    ) -> Result<Aggregate> {
        if let Some(found) = self.find_aggregate(name).await? {
            return Ok(found);
        }
        let mut aggregate = json!({ "name": name });
        if let Some(az) = availability_zone {
            aggregate["availability_zone"] = json!(az);
        }
        match self
            .api
            .call(
                Method::POST,
                "/os-aggregates",
                Some(json!({ "aggregate": aggregate })),
            )
            .await
        {
            Ok(made) => Ok(aggregate_from(&made["aggregate"])),
            // Made meanwhile by another attempt.
            Err(e) if e.is_conflict() => self
                .find_aggregate(name)
                .await?
                .ok_or_else(|| Error::Decode(format!("aggregate {name} conflicts but is absent"))),
            Err(e) => Err(e),
        }
    }

    async fn aggregate_action(&self, id: i64, action: Value) -> Result<Aggregate> {
        let made = self
            .api
            .call(
                Method::POST,
                &format!("/os-aggregates/{id}/action"),
                Some(action),
            )
            .await?;
        Ok(aggregate_from(&made["aggregate"]))
    }

    /// Adds `host` (a compute service host); already there is fine.
    pub async fn add_host(&self, aggregate: &Aggregate, host: &str) -> Result<()> {
        if aggregate.hosts.iter().any(|h| h == host) {
            return Ok(());
        }
        tolerate(
            self.aggregate_action(aggregate.id, json!({"add_host": {"host": host}}))
                .await,
            already_has_host,
        )
    }

    /// Removes `host`; absent is fine. Nova answers 409 while servers are still on a host
    /// it is asked to take out of an aggregate with an availability zone (transient).
    pub async fn remove_host(&self, aggregate: &Aggregate, host: &str) -> Result<()> {
        if !aggregate.hosts.iter().any(|h| h == host) {
            return Ok(());
        }
        tolerate(
            self.aggregate_action(aggregate.id, json!({"remove_host": {"host": host}}))
                .await,
            Error::is_not_found,
        )
    }

    pub async fn set_metadata(
        &self,
        aggregate: &Aggregate,
        metadata: serde_json::Map<String, Value>,
    ) -> Result<()> {
        if metadata
            .iter()
            .all(|(k, v)| aggregate.metadata.get(k) == Some(v))
        {
            return Ok(());
        }
        self.aggregate_action(
            aggregate.id,
            json!({"set_metadata": {"metadata": metadata}}),
        )
        .await
        .map(|_| ())
    }

    /// Makes the aggregate's metadata exactly `wanted`, beside the zone Nova keeps there:
    /// sets what differs and removes every other key. A stray key is not harmless on a
    /// reservation's aggregate: BlazarFilter admits a project whose id is a key.
    pub async fn set_exact_metadata(
        &self,
        aggregate: &Aggregate,
        wanted: &serde_json::Map<String, Value>,
    ) -> Result<()> {
        let mut change = serde_json::Map::new();
        for key in metadata_drift(aggregate, wanted) {
            change.insert(
                key.clone(),
                wanted.get(&key).cloned().unwrap_or(Value::Null),
            );
        }
        if change.is_empty() {
            return Ok(());
        }
        self.aggregate_action(aggregate.id, json!({"set_metadata": {"metadata": change}}))
            .await
            .map(|_| ())
    }

    /// Puts the aggregate in availability zone `zone`.
    pub async fn set_zone(&self, aggregate: &Aggregate, zone: &str) -> Result<()> {
        if aggregate.availability_zone.as_deref() == Some(zone) {
            return Ok(());
        }
        self.api
            .call(
                Method::PUT,
                &format!("/os-aggregates/{}", aggregate.id),
                Some(json!({"aggregate": {"availability_zone": zone}})),
            )
            .await
            .map(|_| ())
    }

    /// Deletes the aggregate (hosts must be out of it); absent is fine.
    pub async fn delete_aggregate(&self, aggregate: &Aggregate) -> Result<()> {
        self.api
            .delete(&format!("/os-aggregates/{}", aggregate.id))
            .await
    }

    /// Ids and names of the servers on `host`, every project's.
    pub async fn servers_on_host(&self, host: &str) -> Result<Vec<(String, String)>> {
        self.servers_on_host_of(host, None).await
    }

    /// Ids and names of the servers on `host`, of `project` only when given.
    pub async fn servers_on_host_of(
        &self,
        host: &str,
        project: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        let mut path = format!(
            "/servers/detail?all_tenants=1&host={}",
            crate::placement::urlencode(host)
        );
        if let Some(project) = project {
            path.push_str(&format!(
                "&project_id={}",
                crate::placement::urlencode(project)
            ));
        }
        let found = self.api.get_all(&path, "servers").await?;
        let mut servers = Vec::new();
        for server in items(&found, "servers") {
            // The project filter goes with the host filter when Nova drops filters.
            if !on_host(server, host)?
                || project.is_some_and(|p| server["tenant_id"].as_str() != Some(p))
            {
                continue;
            }
            servers.push((
                server["id"].as_str().unwrap_or_default().to_string(),
                server["name"].as_str().unwrap_or_default().to_string(),
            ));
        }
        Ok(servers)
    }

    /// Deletes the servers on `host` of the projects `doomed` says, and waits until they
    /// are gone, at most `within` (then a transient error, for the next pass); answers how
    /// many. Nova keeps a host with servers in its availability zone, so a move right after
    /// a delete that has not finished would fail, and the host wait a whole pass.
    pub async fn evict_from_host(
        &self,
        host: &str,
        doomed: impl Fn(&str) -> bool,
        within: Duration,
    ) -> Result<usize> {
        let doomed_on_host = || async {
            let path = format!(
                "/servers/detail?all_tenants=1&host={}",
                crate::placement::urlencode(host)
            );
            let found = self.api.get_all(&path, "servers").await?;
            let mut ids = Vec::new();
            for server in items(&found, "servers") {
                if !on_host(server, host)? {
                    continue;
                }
                let project = server["tenant_id"].as_str().unwrap_or_default();
                if let Some(id) = server["id"].as_str()
                    && doomed(project)
                {
                    ids.push((id.to_string(), project.to_string()));
                }
            }
            Ok(ids)
        };
        let doomed_now = doomed_on_host().await?;
        for (id, project) in &doomed_now {
            tracing::warn!(host, server.id = %id, project = %project,
                "deleting a server on a host not granted to its project");
            self.delete_server(id).await?;
        }
        if !doomed_now.is_empty() {
            let ids = || async {
                let left = doomed_on_host().await?;
                Ok(left.into_iter().map(|(id, _)| id).collect())
            };
            self.wait_until_gone(
                ids,
                within,
                &format!("delete servers on {host}"),
                &format!("still on {host}"),
            )
            .await?;
        }
        Ok(doomed_now.len())
    }

    pub async fn delete_server(&self, id: &str) -> Result<()> {
        self.api.delete(&format!("/servers/{id}")).await
    }

    /// Lists the servers `remaining` (their ids) every half second until none is left, at
    /// most `within`; then a transient error (503) for `request`, telling how many servers
    /// are `still` there. Every [`REDELETE_EVERY`], those whose delete failed in Nova are
    /// deleted again rather than waited for until the deadline.
    async fn wait_until_gone<Fut>(
        &self,
        remaining: impl Fn() -> Fut,
        within: Duration,
        request: &str,
        still: &str,
    ) -> Result<()>
    where
        Fut: Future<Output = Result<Vec<String>>>,
    {
        let deadline = tokio::time::Instant::now() + within;
        let mut looked = tokio::time::Instant::now();
        loop {
            let left = remaining().await?;
            if left.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Status {
                    service: "compute".into(),
                    request: request.to_string(),
                    status: 503,
                    message: format!("{} server(s) {still}", left.len()),
                });
            }
            if looked.elapsed() >= REDELETE_EVERY {
                self.delete_again_where_failed(&left).await;
                looked = tokio::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Deletes again those of the servers `ids` that no task is deleting (Nova set the
    /// failed delete's server back, in ERROR). Errors are only logged: the wait's deadline
    /// decides.
    async fn delete_again_where_failed(&self, ids: &[String]) {
        for id in ids {
            let server = match self.api.get(&format!("/servers/{id}")).await {
                Ok(found) => found["server"].clone(),
                Err(e) if e.is_not_found() => continue,
                Err(e) => {
                    tracing::warn!(server.id = %id, error = %e, "could not look at a server awaited to go");
                    continue;
                }
            };
            // Being deleted, or deleted and still shown for a moment.
            if !server["OS-EXT-STS:task_state"].is_null() || server["status"] == "DELETED" {
                continue;
            }
            tracing::warn!(server.id = %id, status = %server["status"],
                "a server's delete failed in Nova: deleting it again");
            if let Err(e) = self.delete_server(id).await
                && !e.is_not_found()
            {
                tracing::warn!(server.id = %id, error = %e, "could not delete a server again");
            }
        }
    }

    /// Deletes every server on `host` and waits until none is left, at most `within`
    /// (then a transient error: the action is tried again later).
    pub async fn clear_host(&self, host: &str, within: Duration) -> Result<usize> {
        self.clear_host_of(host, None, within).await
    }

    /// As [`Self::clear_host`], for the servers of `project` only when given.
    pub async fn clear_host_of(
        &self,
        host: &str,
        project: Option<&str>,
        within: Duration,
    ) -> Result<usize> {
        let servers = self.servers_on_host_of(host, project).await?;
        for (id, name) in &servers {
            tracing::info!(host, server.id = %id, server.name = %name, "deleting a server on a reserved host");
            self.delete_server(id).await?;
        }
        let ids = || async {
            let left = self.servers_on_host_of(host, project).await?;
            Ok(left.into_iter().map(|(id, _)| id).collect())
        };
        self.wait_until_gone(
            ids,
            within,
            &format!("delete servers on {host}"),
            &format!("still on {host}"),
        )
        .await?;
        Ok(servers.len())
    }

    /// The flavor `id`, if Nova has it (admin view, private flavors included).
    pub async fn flavor(&self, id: &str) -> Result<Option<Value>> {
        match self.api.get(&format!("/flavors/{id}")).await {
            Ok(found) => Ok(Some(found["flavor"].clone())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The flavor `id_or_name` with its extra specs as a member of `project` sees it: Nova's
    /// rule for non-admins is public flavors and private ones the project was given access
    /// to (`project` `None`: the admin view, every flavor). A name is looked up when no
    /// flavor has that id.
    pub async fn flavor_seen_by(
        &self,
        id_or_name: &str,
        project: Option<&str>,
    ) -> Result<Option<Value>> {
        let by_id = if id_or_name.contains('/') || id_or_name.contains('?') {
            None
        } else {
            self.flavor(&crate::placement::urlencode(id_or_name))
                .await?
        };
        let flavor = match by_id {
            Some(f) => f,
            None => {
                let all = self
                    .api
                    .get_all("/flavors/detail?is_public=None", "flavors")
                    .await?;
                let Some(found) = items(&all, "flavors")
                    .find(|f| f["name"].as_str() == Some(id_or_name))
                    .cloned()
                else {
                    return Ok(None);
                };
                found
            }
        };
        let public = flavor["os-flavor-access:is_public"]
            .as_bool()
            .unwrap_or(true);
        if let (Some(project), false) = (project, public) {
            let id = flavor["id"].as_str().unwrap_or_default();
            if !self.flavor_access(id).await?.iter().any(|p| p == project) {
                return Ok(None);
            }
        }
        Ok(Some(flavor))
    }

    /// Ids of the flavors named `name`, private ones included.
    pub async fn flavor_ids_named(&self, name: &str) -> Result<Vec<String>> {
        Ok(self
            .flavor_names()
            .await?
            .into_iter()
            .filter(|(_, n)| n == name)
            .map(|(id, _)| id)
            .collect())
    }

    /// Ids of the flavors named `reservation:<id>` after their own id: the reservation
    /// flavors blazar-rs (or Blazar) made, private ones included.
    pub async fn reservation_flavors(&self) -> Result<Vec<String>> {
        Ok(self
            .flavor_names()
            .await?
            .into_iter()
            .filter(|(id, name)| *name == format!("reservation:{id}"))
            .map(|(id, _)| id)
            .collect())
    }

    /// (id, name) of every flavor, private ones included.
    async fn flavor_names(&self) -> Result<Vec<(String, String)>> {
        let all = self
            .api
            .get_all("/flavors/detail?is_public=None", "flavors")
            .await?;
        Ok(items(&all, "flavors")
            .filter_map(|f| {
                Some((
                    f["id"].as_str()?.to_string(),
                    f["name"].as_str()?.to_string(),
                ))
            })
            .collect())
    }

    /// Makes the private flavor `flavor` (its `id` given) unless it is there already as
    /// `flavor` says (an earlier attempt); its extra specs are made exactly `extra_specs`
    /// either way.
    pub async fn ensure_flavor(
        &self,
        flavor: Value,
        extra_specs: serde_json::Map<String, Value>,
    ) -> Result<()> {
        let id = flavor["id"].as_str().unwrap_or_default().to_string();
        let existing = self.flavor(&id).await?;
        // A reservation resized before it started: its flavor is made again (Blazar deletes
        // and re-creates it on such an update). So is one made again by hand differently.
        let stale = existing
            .as_ref()
            .is_some_and(|found| flavor_differs(found, &flavor));
        if stale {
            self.delete_flavor(&id).await?;
        }
        let none = serde_json::Map::new();
        let have = match &existing {
            Some(found) if !stale => found["extra_specs"].as_object().unwrap_or(&none),
            _ => &none,
        };
        if stale || existing.is_none() {
            let body = json!({ "flavor": flavor });
            match self
                .api
                .call(Method::POST, "/flavors", Some(body.clone()))
                .await
            {
                Ok(_) => {}
                // Flavor names are unique too: one made by hand under the reservation's name
                // (with another id) would keep the reservation's own from being made.
                Err(e) if e.is_conflict() => {
                    let name = flavor["name"].as_str().unwrap_or_default();
                    let squatters: Vec<String> = self
                        .flavor_ids_named(name)
                        .await?
                        .into_iter()
                        .filter(|other| *other != id)
                        .collect();
                    if !squatters.is_empty() {
                        for other in &squatters {
                            tracing::warn!(flavor = %other, name,
                                "deleting a flavor that took a reservation flavor's name");
                            self.delete_flavor(other).await?;
                        }
                        tolerate(
                            self.api.call(Method::POST, "/flavors", Some(body)).await,
                            Error::is_conflict,
                        )?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // Exactly these extra specs: a key added by hand goes.
        for key in have.keys().filter(|k| !extra_specs.contains_key(*k)) {
            self.api
                .delete(&format!(
                    "/flavors/{id}/os-extra_specs/{}",
                    path_segment(key)
                ))
                .await?;
        }
        if extra_specs.iter().any(|(k, v)| have.get(k) != Some(v)) {
            self.api
                .call(
                    Method::POST,
                    &format!("/flavors/{id}/os-extra_specs"),
                    Some(json!({ "extra_specs": extra_specs })),
                )
                .await?;
        }
        Ok(())
    }

    pub async fn delete_flavor(&self, id: &str) -> Result<()> {
        self.api.delete(&format!("/flavors/{id}")).await
    }

    /// Projects that may use the private flavor `id`.
    pub async fn flavor_access(&self, id: &str) -> Result<Vec<String>> {
        let found = self
            .api
            .get(&format!("/flavors/{id}/os-flavor-access"))
            .await?;
        Ok(items(&found, "flavor_access")
            .filter_map(|a| a["tenant_id"].as_str().map(str::to_string))
            .collect())
    }

    /// Lets `project` use the flavor; already allowed is fine.
    pub async fn add_flavor_access(&self, id: &str, project: &str) -> Result<()> {
        if self.flavor_access(id).await?.iter().any(|p| p == project) {
            return Ok(());
        }
        tolerate(
            self.api
                .call(
                    Method::POST,
                    &format!("/flavors/{id}/action"),
                    Some(json!({"addTenantAccess": {"tenant": project}})),
                )
                .await,
            Error::is_conflict,
        )
    }

    /// Lets `project`, and no other project, use the private flavor `id`: access given to
    /// another project by hand would let it take the reservation's slots.
    pub async fn grant_flavor_only_to(&self, id: &str, project: &str) -> Result<()> {
        for other in self.flavor_access(id).await? {
            if other != project {
                tracing::warn!(flavor = %id, project = %other,
                    "taking a reservation flavor away from a project it was not granted to");
                self.remove_flavor_access(id, &other).await?;
            }
        }
        self.add_flavor_access(id, project).await
    }

    /// Takes the flavor away from `project`; not allowed (or no flavor) is fine.
    pub async fn remove_flavor_access(&self, id: &str, project: &str) -> Result<()> {
        tolerate(
            self.api
                .call(
                    Method::POST,
                    &format!("/flavors/{id}/action"),
                    Some(json!({"removeTenantAccess": {"tenant": project}})),
                )
                .await,
            Error::is_not_found,
        )
    }

    /// Every project's servers booted with flavor `id`, as `list` (`/servers`, or
    /// `/servers/detail` for their projects) shows them.
    async fn flavor_servers(&self, list: &str, id: &str) -> Result<Value> {
        match self
            .api
            .get_all(
                &format!(
                    "{list}?all_tenants=1&flavor={}",
                    crate::placement::urlencode(id)
                ),
                "servers",
            )
            .await
        {
            // No such flavor (deleted by an earlier attempt): no server can use it.
            Err(e) if e.is_not_found() || e.status() == Some(400) => Ok(Value::Null),
            other => other,
        }
    }

    /// Ids of every project's servers booted with flavor `id`.
    pub async fn servers_with_flavor(&self, id: &str) -> Result<Vec<String>> {
        let found = self.flavor_servers("/servers", id).await?;
        Ok(items(&found, "servers")
            .filter_map(|s| s["id"].as_str().map(str::to_string))
            .collect())
    }

    /// Ids of the servers booted with flavor `id` by projects other than `owner`.
    pub async fn foreign_servers_with_flavor(&self, id: &str, owner: &str) -> Result<Vec<String>> {
        let found = self.flavor_servers("/servers/detail", id).await?;
        Ok(items(&found, "servers")
            .filter(|s| s["tenant_id"].as_str().is_some_and(|p| p != owner))
            .filter_map(|s| s["id"].as_str().map(str::to_string))
            .collect())
    }

    /// Deletes every server booted with flavor `id` and waits until none is left, at most
    /// `within` (then a transient error).
    pub async fn clear_flavor(&self, id: &str, within: Duration) -> Result<usize> {
        let servers = self.servers_with_flavor(id).await?;
        for server in &servers {
            tracing::info!(server.id = %server, flavor.id = id, "deleting a server of an ended instance reservation");
            self.delete_server(server).await?;
        }
        self.wait_until_gone(
            || self.servers_with_flavor(id),
            within,
            &format!("delete servers of flavor {id}"),
            &format!("of flavor {id} still there"),
        )
        .await?;
        Ok(servers.len())
    }

    /// Ids of `project`'s servers booted with a flavor named `name`, found by the flavor
    /// Nova keeps in each server (2.47 on), so also after the flavor was deleted.
    pub async fn servers_of_flavor_named(&self, project: &str, name: &str) -> Result<Vec<String>> {
        let found = self
            .api
            .get_all(
                &format!(
                    "/servers/detail?all_tenants=1&project_id={}",
                    crate::placement::urlencode(project)
                ),
                "servers",
            )
            .await?;
        Ok(items(&found, "servers")
            .filter(|s| s["flavor"]["original_name"].as_str() == Some(name))
            .filter_map(|s| s["id"].as_str().map(str::to_string))
            .collect())
    }

    /// Deletes the servers `ids` (any project's) and waits until they are gone.
    pub async fn clear_servers(&self, ids: &[String], within: Duration) -> Result<()> {
        for id in ids {
            self.delete_server(id).await?;
        }
        self.wait_until_gone(
            || async {
                let mut left = Vec::new();
                for id in ids {
                    match self.api.get(&format!("/servers/{id}")).await {
                        Ok(_) => left.push(id.clone()),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(left)
            },
            within,
            "delete servers",
            "still there",
        )
        .await
    }

    /// The server group named `name` of the session's project, made with `policy` if
    /// missing. Returns its id.
    pub async fn ensure_server_group(&self, name: &str, policy: &str) -> Result<String> {
        if let Some(id) = self.find_server_group(name, false).await? {
            return Ok(id);
        }
        let made = self
            .api
            .call(
                Method::POST,
                "/os-server-groups",
                Some(json!({"server_group": {"name": name, "policies": [policy]}})),
            )
            .await?;
        Ok(made["server_group"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// The id of the server group named `name` (every project's when `all_projects`).
    pub async fn find_server_group(
        &self,
        name: &str,
        all_projects: bool,
    ) -> Result<Option<String>> {
        Ok(self
            .server_groups(all_projects)
            .await?
            .into_iter()
            .find(|(_, n)| n == name)
            .map(|(id, _)| id))
    }

    /// (id, name) of every server group (every project's when `all_projects`).
    pub async fn server_groups(&self, all_projects: bool) -> Result<Vec<(String, String)>> {
        // Server groups page by offset, at most 1,000 at a time.
        const PAGE: usize = 1_000;
        let scope = if all_projects {
            "all_projects=true&"
        } else {
            ""
        };
        let mut groups = Vec::new();
        let mut offset = 0;
        loop {
            let found = self
                .api
                .get(&format!(
                    "/os-server-groups?{scope}limit={PAGE}&offset={offset}"
                ))
                .await?;
            let before = groups.len();
            groups.extend(items(&found, "server_groups").filter_map(|g| {
                Some((
                    g["id"].as_str()?.to_string(),
                    g["name"].as_str().unwrap_or_default().to_string(),
                ))
            }));
            // An empty page ends the list (a cloud whose `max_limit` is below the page
            // size answers short pages that are not the last).
            let count = groups.len() - before;
            if count == 0 || offset >= 1_000 * PAGE {
                return Ok(groups);
            }
            offset += count;
        }
    }

    pub async fn delete_server_group(&self, id: &str) -> Result<()> {
        self.api.delete(&format!("/os-server-groups/{id}")).await
    }

    /// Snapshots a server (Blazar's `before_end: snapshot`).
    pub async fn create_image(&self, server_id: &str, name: &str) -> Result<()> {
        self.api
            .call(
                Method::POST,
                &format!("/servers/{server_id}/action"),
                Some(json!({"createImage": {"name": name}})),
            )
            .await
            .map(|_| ())
    }
}

/// Whether `server` (from a `/servers/detail` list filtered by `host`) is on `host`. Nova
/// drops the `host` filter for a caller its policy does not allow it to (answering every
/// server): each server's own host is checked before anything is done to it, and a list
/// that does not show it is refused rather than taken for the host's.
fn on_host(server: &Value, host: &str) -> Result<bool> {
    match server["OS-EXT-SRV-ATTR:host"].as_str() {
        Some(on) => Ok(on == host),
        None => Err(Error::Refused(format!(
            "Nova does not show which host its servers are on to this service user: \
             servers on {host} not checked"
        ))),
    }
}

/// Nova's 409 for a host already in the aggregate (done by an earlier attempt). Its other
/// 409 for an `add_host`, a host already in another availability zone, is a failure: the
/// host is not in the aggregate.
fn already_has_host(e: &Error) -> bool {
    matches!(e, Error::Status { status: 409, message, .. } if message.contains("already has host"))
}

#[cfg(test)]
mod add_host_tests {
    use super::*;

    fn conflict(message: &str) -> Error {
        Error::Status {
            service: "nova".into(),
            request: "POST /os-aggregates/7/action".into(),
            status: 409,
            message: message.into(),
        }
    }

    #[test]
    fn metadata_drift_names_every_key_not_as_wanted() {
        let aggregate = Aggregate {
            id: 7,
            uuid: String::new(),
            name: "r".into(),
            availability_zone: Some("blazar_r".into()),
            hosts: Vec::new(),
            metadata: serde_json::from_value(json!({
                "availability_zone": "blazar_r",
                "blazar:owner": "other",
                "0badc0de": "true",
            }))
            .unwrap(),
        };
        let mut wanted = serde_json::Map::new();
        wanted.insert("blazar:owner".into(), json!("p"));
        assert_eq!(
            metadata_drift(&aggregate, &wanted),
            ["0badc0de", "blazar:owner"]
        );
        wanted.insert("blazar:owner".into(), json!("other"));
        wanted.insert("0badc0de".into(), json!("true"));
        assert!(metadata_drift(&aggregate, &wanted).is_empty());
    }

    #[test]
    fn an_instance_aggregate_is_named_after_the_reservation_it_names() {
        let aggregate = |name: &str, metadata: Value| Aggregate {
            id: 1,
            uuid: String::new(),
            name: name.into(),
            availability_zone: Some("blazar_by_hand".into()),
            hosts: Vec::new(),
            metadata: serde_json::from_value(metadata).unwrap(),
        };
        assert!(names_reservation(&aggregate(
            "r1",
            json!({"reservation": "r1"})
        )));
        assert!(!names_reservation(&aggregate(
            "r1",
            json!({"reservation": "r2"})
        )));
        // A host reservation's aggregate carries its owner, not a `reservation` key.
        assert!(!names_reservation(&aggregate(
            "r1",
            json!({"blazar:owner": "p"})
        )));
    }

    #[test]
    fn a_flavor_drifts_by_extra_specs_size_or_visibility() {
        let found = json!({
            "vcpus": 1, "ram": 64, "disk": 1, "OS-FLV-EXT-DATA:ephemeral": 0,
            "os-flavor-access:is_public": false,
            "extra_specs": {"resources:CUSTOM_RESERVATION_R": "0", "hw:stray": "x"},
        });
        let mut wanted = serde_json::Map::new();
        wanted.insert("resources:CUSTOM_RESERVATION_R".into(), json!("1"));
        wanted.insert(
            "aggregate_instance_extra_specs:reservation".into(),
            json!("r"),
        );
        assert_eq!(
            extra_specs_drift(&found, &wanted),
            [
                "aggregate_instance_extra_specs:reservation",
                "hw:stray",
                "resources:CUSTOM_RESERVATION_R"
            ]
        );
        assert_eq!(extra_specs_drift(&json!({}), &wanted).len(), 2);
        // Only the fields the wanted flavor sets are compared.
        let same = json!({"vcpus": 1, "ram": 64, "disk": 1, "os-flavor-access:is_public": false});
        assert!(!flavor_differs(&found, &same));
        let public = json!({"vcpus": 1, "ram": 64, "disk": 1, "os-flavor-access:is_public": true});
        assert!(flavor_differs(&found, &public));
        let bigger = json!({"vcpus": 2, "ram": 64, "disk": 1});
        assert!(flavor_differs(&found, &bigger));
        assert_eq!(path_segment("hw:a b"), "hw%3Aa%20b");
    }

    #[test]
    fn only_the_host_being_there_already_counts_as_added() {
        assert!(already_has_host(&conflict(
            "Aggregate 7 already has host compute-1."
        )));
        assert!(!already_has_host(&conflict(
            "Cannot add host to aggregate 7. Reason: One or more hosts already in \
             availability zone(s) ['blazar_x']."
        )));
        let mut other = conflict("Aggregate 7 already has host compute-1.");
        if let Error::Status { status, .. } = &mut other {
            *status = 400;
        }
        assert!(!already_has_host(&other));
    }
}
