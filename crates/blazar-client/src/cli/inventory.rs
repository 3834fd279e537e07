//! Reservable inventory: `host-*` (Blazar's `/v1/os-hosts`) and the same commands for
//! `network-*` and `device-*` (`/v1/networks`, `/v1/devices`, the Chameleon API shape):
//! list, show, create, update, unset, delete, and their resource properties.

use blazar_client::api::{
    HostUpdate, NewDevice, NewHost, NewNetwork, PropertyUpdate, Reallocation, ResourceUpdate,
};
use clap::{ArgGroup, Args};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::human::localize;
use super::leases::{delete_and_say, show_object};
use super::output::{
    ListOutput, ShowOutput, check_sort, render_list, render_show, show_fields, sort_objects,
};
use super::resolve::{IdShape, Lookup, find_id};
use super::{CliResult, Context, Failure, emit};
use blazar_client::client::segment;

/// One kind of reservable resource and how the Python clients show it.
pub struct Kind {
    /// The word in messages: `Created a new host:`.
    pub resource: &'static str,
    pub path: &'static str,
    pub plural: &'static str,
    pub name_keys: &'static [&'static str],
    pub shape: IdShape,
    pub list_columns: &'static [&'static str],
    pub default_sort: &'static str,
}

impl Kind {
    pub const HOST: Kind = Kind {
        resource: "host",
        path: "/os-hosts",
        plural: "hosts",
        name_keys: &["hypervisor_hostname"],
        shape: IdShape::NumericOrUuid,
        list_columns: &[
            "id",
            "hypervisor_hostname",
            "vcpus",
            "memory_mb",
            "local_gb",
        ],
        default_sort: "hypervisor_hostname",
    };
    /// Chameleon's network segments have no name; the segment id (VLAN id) is what
    /// people know them by.
    pub const NETWORK: Kind = Kind {
        resource: "network",
        path: "/networks",
        plural: "networks",
        name_keys: &["name", "segment_id"],
        shape: IdShape::Uuid,
        list_columns: &["id", "network_type", "physical_network", "segment_id"],
        default_sort: "segment_id",
    };
    pub const DEVICE: Kind = Kind {
        resource: "device",
        path: "/devices",
        plural: "devices",
        name_keys: &["name"],
        shape: IdShape::Uuid,
        list_columns: &["id", "name", "device_type", "device_driver"],
        default_sort: "name",
    };

    fn lookup(&self) -> Lookup<'static> {
        Lookup {
            resource: self.resource,
            list_path: self.path,
            list_key: self.plural,
            name_keys: self.name_keys,
            shape: self.shape,
            list_command: match self.resource {
                "host" => "host-list",
                "network" => "network-list",
                _ => "device-list",
            },
        }
    }

    fn object_path(&self, id: &str) -> String {
        format!("{}/{}", self.path, segment(id))
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Column name used to sort result (default: hypervisor_hostname for hosts,
    /// segment_id for networks, name for devices)
    #[arg(long, value_name = "COLUMN")]
    sort_by: Option<String>,
    #[command(flatten)]
    out: ListOutput,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// ID or name to look up
    #[arg(value_name = "ID_OR_NAME")]
    id: String,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a host
#[derive(Debug, Args)]
pub struct HostCreateArgs {
    /// Name of the host to add
    #[arg(value_name = "HOST")]
    name: String,
    /// Extra capabilities key/value pairs to add for the host
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a network segment
#[derive(Debug, Args)]
pub struct NetworkCreateArgs {
    /// Type of physical mechanism associated with the network segment. For example: flat,
    /// geneve, gre, local, vlan, vxlan
    #[arg(long, required = true)]
    network_type: String,
    /// Name of the physical network in which the network segment is available, required
    /// for VLAN networks
    #[arg(long)]
    physical_network: Option<String>,
    /// VLAN ID for VLAN networks or Tunnel ID for GENEVE/GRE/VXLAN networks
    #[arg(long = "segment", required = true)]
    segment_id: String,
    /// Extra capabilities key/value pairs to add for the network
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    #[command(flatten)]
    out: ShowOutput,
}

/// Create a device
#[derive(Debug, Args)]
pub struct DeviceCreateArgs {
    /// Name of the device to add
    #[arg(value_name = "DEVICE")]
    name: String,
    /// Choose from container, vm, or shell
    #[arg(long, default_value = "container")]
    device_type: String,
    /// The driver of the device
    #[arg(long, default_value = "zun")]
    device_driver: String,
    /// Extra capabilities key/value pairs to add for the device
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
    #[command(flatten)]
    out: ShowOutput,
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// ID or name to update
    #[arg(value_name = "ID_OR_NAME")]
    id: String,
    /// Extra capabilities key/value pairs to update
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
}

/// Update attributes of a device
#[derive(Debug, Args)]
pub struct DeviceUpdateArgs {
    /// ID or name of device to update
    #[arg(value_name = "DEVICE")]
    id: String,
    /// Choose from container, vm, or shell
    #[arg(long)]
    device_type: Option<String>,
    /// The driver of the device
    #[arg(long)]
    device_driver: Option<String>,
    /// Extra capabilities key/value pairs to update for the device
    #[arg(long = "extra", value_name = "KEY=VALUE")]
    extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct UnsetArgs {
    /// ID or name to update
    #[arg(value_name = "ID_OR_NAME")]
    id: String,
    /// Extra capability keys which should be unset
    #[arg(long = "extra", value_name = "KEY")]
    extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// ID or name to delete
    #[arg(value_name = "ID_OR_NAME")]
    id: String,
}

/// Move the reservations holding a resource onto another matching one
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("from").args(["lease_id", "reservation_id"]).required(true)))]
pub struct ReallocateArgs {
    /// ID or name of the device or host
    #[arg(value_name = "RESOURCE")]
    id: String,
    /// Lease ID to reallocate the resource from
    #[arg(long)]
    lease_id: Option<String>,
    /// Reservation ID to reallocate the resource from
    #[arg(long)]
    reservation_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct PropertyListArgs {
    /// Return properties with values and attributes
    #[arg(long)]
    detail: bool,
    /// Column name used to sort result
    #[arg(long, value_name = "COLUMN", default_value = "property")]
    sort_by: String,
    /// Return all properties, public and private
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    out: ListOutput,
}

#[derive(Debug, Args)]
pub struct PropertyShowArgs {
    /// Name of property
    #[arg(value_name = "PROPERTY_NAME")]
    property_name: String,
    #[command(flatten)]
    out: ShowOutput,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("visibility").args(["private", "public"]).required(true)))]
pub struct PropertySetArgs {
    /// Name of property to patch
    #[arg(value_name = "PROPERTY_NAME")]
    property_name: String,
    /// Set property to private
    #[arg(long)]
    private: bool,
    /// Set property to public
    #[arg(long)]
    public: bool,
}

/// `--extra k=v` pairs; a repeated key keeps its last value, as in the Python client.
fn extras(pairs: &[String]) -> Map<String, Value> {
    let mut map = Map::new();
    for pair in pairs {
        let (key, value) = pair.split_once('=').unwrap_or((pair.as_str(), ""));
        map.insert(key.to_string(), Value::String(value.to_string()));
    }
    map
}

pub async fn list(ctx: &Context, kind: &Kind, args: ListArgs) -> CliResult {
    let sort_by = args.sort_by.as_deref().unwrap_or(kind.default_sort);
    check_sort(sort_by, kind.list_columns)?;
    let mut items: Vec<Map<String, Value>> = ctx.client.get(kind.path, kind.plural).await?;
    sort_objects(&mut items, sort_by);
    if args.out.is_human() {
        items.iter_mut().for_each(|item| localize(item, ctx.utc));
    }
    emit(&render_list(&items, kind.list_columns, &args.out)?);
    Ok(())
}

pub async fn show(ctx: &Context, kind: &Kind, args: ShowArgs) -> CliResult {
    let id = find_id(ctx, &kind.lookup(), &args.id).await?;
    let object: Map<String, Value> = ctx
        .client
        .get(&kind.object_path(&id), kind.resource)
        .await?;
    emit(&show_object(ctx, object, &args.out)?);
    Ok(())
}

/// A body built as flat keys (fixed fields and `--extra` ones alike), as its request type.
fn request<T: DeserializeOwned>(body: Map<String, Value>) -> CliResult<T> {
    serde_json::from_value(Value::Object(body)).map_err(|e| Failure::plain(e.to_string()))
}

async fn create<B: Serialize>(ctx: &Context, kind: &Kind, body: &B, out: &ShowOutput) -> CliResult {
    let object: Map<String, Value> = ctx.client.post(kind.path, kind.resource, body).await?;
    let table = show_object(ctx, object, out)?;
    emit(&format!("Created a new {}:\n{table}", kind.resource));
    Ok(())
}

pub async fn create_host(ctx: &Context, args: HostCreateArgs) -> CliResult {
    let mut body = Map::new();
    body.insert("name".into(), Value::String(args.name.clone()));
    body.extend(extras(&args.extra));
    let body: NewHost = request(body)?;
    create(ctx, &Kind::HOST, &body, &args.out).await
}

pub async fn create_network(ctx: &Context, args: NetworkCreateArgs) -> CliResult {
    let vlan = args.network_type == "vlan";
    let physical_network = match (&args.physical_network, vlan) {
        (Some(_), false) => {
            return Err(Failure::plain(
                "--physical-network is only valid for VLAN segments",
            ));
        }
        (None, true) => {
            return Err(Failure::plain(
                "--physical-network is required for VLAN segments",
            ));
        }
        (Some(name), true) => Value::String(name.clone()),
        (None, false) => Value::Null,
    };
    let mut body = Map::new();
    body.insert(
        "network_type".into(),
        Value::String(args.network_type.clone()),
    );
    body.insert("physical_network".into(), physical_network);
    body.insert("segment_id".into(), Value::String(args.segment_id.clone()));
    body.extend(extras(&args.extra));
    let body: NewNetwork = request(body)?;
    create(ctx, &Kind::NETWORK, &body, &args.out).await
}

pub async fn create_device(ctx: &Context, args: DeviceCreateArgs) -> CliResult {
    let mut body = Map::new();
    body.insert("name".into(), Value::String(args.name.clone()));
    body.insert(
        "device_type".into(),
        Value::String(args.device_type.clone()),
    );
    body.insert(
        "device_driver".into(),
        Value::String(args.device_driver.clone()),
    );
    body.extend(extras(&args.extra));
    let body: NewDevice = request(body)?;
    create(ctx, &Kind::DEVICE, &body, &args.out).await
}

async fn put_values(
    ctx: &Context,
    kind: &Kind,
    given: &str,
    values: Map<String, Value>,
) -> CliResult {
    let id = find_id(ctx, &kind.lookup(), given).await?;
    let path = kind.object_path(&id);
    let _: Value = if kind.resource == Kind::HOST.resource {
        let body = HostUpdate { values };
        ctx.client.put(&path, kind.resource, &body).await?
    } else {
        let body = ResourceUpdate { values };
        ctx.client.put(&path, kind.resource, &body).await?
    };
    emit(&format!("Updated {}: {given}\n", kind.resource));
    Ok(())
}

pub async fn update(ctx: &Context, kind: &Kind, args: UpdateArgs) -> CliResult {
    if args.extra.is_empty() {
        return Err(Failure::plain(
            "No values to update passed: give --extra KEY=VALUE (repeatable)",
        ));
    }
    put_values(ctx, kind, &args.id, extras(&args.extra)).await
}

pub async fn update_device(ctx: &Context, args: DeviceUpdateArgs) -> CliResult {
    let mut values = Map::new();
    if let Some(t) = &args.device_type {
        values.insert("device_type".into(), Value::String(t.clone()));
    }
    if let Some(d) = &args.device_driver {
        values.insert("device_driver".into(), Value::String(d.clone()));
    }
    values.extend(extras(&args.extra));
    if values.is_empty() {
        return Err(Failure::plain(
            "No values to update passed: give --device-type, --device-driver or --extra KEY=VALUE",
        ));
    }
    put_values(ctx, &Kind::DEVICE, &args.id, values).await
}

pub async fn unset(ctx: &Context, kind: &Kind, args: UnsetArgs) -> CliResult {
    if args.extra.is_empty() {
        return Err(Failure::plain(
            "No values to update passed: give --extra KEY for each capability to remove",
        ));
    }
    let values = args
        .extra
        .iter()
        .map(|k| (k.clone(), Value::Null))
        .collect();
    put_values(ctx, kind, &args.id, values).await
}

pub async fn delete(ctx: &Context, kind: &Kind, args: DeleteArgs) -> CliResult {
    let id = find_id(ctx, &kind.lookup(), &args.id).await?;
    delete_and_say(ctx, &kind.object_path(&id), kind.resource, &args.id).await
}

pub async fn reallocate(ctx: &Context, kind: &Kind, args: ReallocateArgs) -> CliResult {
    let id = find_id(ctx, &kind.lookup(), &args.id).await?;
    let mut body = Reallocation::default();
    if let Some(reservation) = &args.reservation_id {
        body.reservation_id = Some(Value::String(reservation.clone()));
    } else if let Some(lease) = &args.lease_id {
        body.lease_id = Some(Value::String(lease.clone()));
    }
    let body = serde_json::to_value(&body).map_err(|e| Failure::plain(e.to_string()))?;
    ctx.client
        .send(
            reqwest::Method::PUT,
            &format!("{}/allocation", kind.object_path(&id)),
            Some(&body),
        )
        .await?;
    emit(&format!("Reallocated {}: {}\n", kind.resource, args.id));
    Ok(())
}

const PROPERTY_COLUMNS: &[&str] = &["property", "private", "property_values"];

/// `GET .../properties`, with `values` renamed `property_values` in detail mode (cliff
/// reserves `values`), as the Python client does.
async fn properties(
    ctx: &Context,
    kind: &Kind,
    detail: bool,
    all: bool,
) -> CliResult<Vec<Map<String, Value>>> {
    let mut query = Vec::new();
    if detail {
        query.push("detail=True");
    }
    if all {
        query.push("all=True");
    }
    let path = if query.is_empty() {
        format!("{}/properties", kind.path)
    } else {
        format!("{}/properties?{}", kind.path, query.join("&"))
    };
    let mut items: Vec<Map<String, Value>> = ctx.client.get(&path, "resource_properties").await?;
    if detail {
        for item in &mut items {
            if let Some(values) = item.shift_remove("values") {
                item.insert("property_values".into(), values);
            }
        }
    }
    Ok(items)
}

pub async fn property_list(ctx: &Context, kind: &Kind, args: PropertyListArgs) -> CliResult {
    check_sort(&args.sort_by, PROPERTY_COLUMNS)?;
    let mut items = properties(ctx, kind, args.detail, args.all).await?;
    sort_objects(&mut items, &args.sort_by);
    emit(&render_list(&items, PROPERTY_COLUMNS, &args.out)?);
    Ok(())
}

pub async fn property_show(ctx: &Context, kind: &Kind, args: PropertyShowArgs) -> CliResult {
    let items = properties(ctx, kind, true, false).await?;
    let Some(property) = items
        .into_iter()
        .find(|p| p.get("property").and_then(Value::as_str) == Some(args.property_name.as_str()))
    else {
        return Err(Failure::plain(format!(
            "The resource property does not exist. `blazar {}-property-list` lists them",
            kind.resource
        )));
    };
    // The Python client formats values for tables only: `-f json` keeps the list.
    let fields = show_fields(&property, args.out.is_human());
    emit(&render_show(fields, &args.out)?);
    Ok(())
}

pub async fn property_set(ctx: &Context, kind: &Kind, args: PropertySetArgs) -> CliResult {
    let body = PropertyUpdate {
        private: Some(Value::Bool(args.private)),
        ..PropertyUpdate::default()
    };
    let _: Value = ctx
        .client
        .patch(
            &format!("{}/properties/{}", kind.path, segment(&args.property_name)),
            "resource_property",
            &body,
        )
        .await?;
    emit(&format!(
        "Updated {} property: {}\n",
        kind.resource, args.property_name
    ));
    Ok(())
}
