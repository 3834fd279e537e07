#!/usr/bin/env bash
# Brings up a small real OpenStack on this machine, from PyPI only: Keystone, Placement,
# Glance, Nova (API, conductor, scheduler with blazar-nova's BlazarFilter, and fake-driver
# computes, each its own hypervisor) and Neutron (ML2, no agents), on the machine's MariaDB
# and RabbitMQ, with databases and a vhost of its own. See README.md here.
#
# Usage: scripts/openstack/up.sh STATE_DIR [COMPUTES]
# Writes STATE_DIR/openrc (admin) and STATE_DIR/env (service user, user projects, names);
# scripts/openstack/down.sh STATE_DIR stops and removes everything it made.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

state="${1:?usage: up.sh STATE_DIR [COMPUTES]}"
computes="${2:-3}"
mkdir -p "$state"
state="$(cd "$state" && pwd)"
started=$SECONDS

os_install

prefix="bzr$(date +%s | tail -c 6)$$"
echo "$prefix" >"$state/prefix"
: >"$state/pids"
etc="$state/etc"
mkdir -p "$etc"/{keystone,placement,glance,nova,neutron/plugins/ml2} "$state/log" \
    "$state/fernet" "$state/credential" "$state/images" "$state/staging" "$state/lock"

# Everything run-specific: databases, a vhost, ports, passwords.
t0=$SECONDS
for db in keystone placement glance nova_api nova nova_cell0 neutron; do
    os_mysql -e "CREATE DATABASE ${prefix}_$db CHARACTER SET utf8mb4"
done
os_rabbit add_vhost "$prefix" >/dev/null
os_rabbit set_permissions -p "$prefix" guest ".*" ".*" ".*" >/dev/null
transport="rabbit://guest:guest@127.0.0.1:5672/$prefix"
dburl() { echo "mysql+pymysql://root@127.0.0.1:3306/${prefix}_$1?charset=utf8mb4"; }
ks_port=$(os_free_port); pl_port=$(os_free_port); gl_port=$(os_free_port)
nova_port=$(os_free_port); neutron_port=$(os_free_port)
ks="http://127.0.0.1:$ks_port/v3"
admin_pw=$(os_secret); service_pw=$(os_secret); user_pw=$(os_secret)
echo "== OpenStack: databases and vhost $prefix in $((SECONDS - t0)) s"

authtoken() { # authtoken USER
    cat <<CONF
[keystone_authtoken]
www_authenticate_uri = $ks
auth_url = $ks
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = $1
password = $service_pw
region_name = RegionOne
CONF
}
client_section() { # client_section SECTION USER
    cat <<CONF
[$1]
auth_type = password
auth_url = $ks
project_domain_name = Default
user_domain_name = Default
project_name = service
username = $2
password = $service_pw
region_name = RegionOne
valid_interfaces = public
CONF
}

# Keystone.
t0=$SECONDS
cat >"$etc/keystone/keystone.conf" <<CONF
[DEFAULT]
log_file = $state/log/keystone.log
[database]
connection = $(dburl keystone)
max_pool_size = 4
[fernet_tokens]
key_repository = $state/fernet
[credential]
key_repository = $state/credential
[identity]
password_hash_rounds = 4
CONF
ksm() { OS_KEYSTONE_CONFIG_DIR="$etc/keystone" "$os_venv/bin/keystone-manage" --config-file "$etc/keystone/keystone.conf" "$@" >>"$state/log/setup.log" 2>&1; }
ksm db_sync
ksm fernet_setup --keystone-user "$(id -u)" --keystone-group "$(id -g)"
ksm credential_setup --keystone-user "$(id -u)" --keystone-group "$(id -g)"
ksm bootstrap --bootstrap-password "$admin_pw" --bootstrap-region-id RegionOne \
    --bootstrap-admin-url "$ks" --bootstrap-internal-url "$ks" --bootstrap-public-url "$ks"
OS_KEYSTONE_CONFIG_DIR="$etc/keystone" os_serve keystone keystone.wsgi.api "$ks_port" "$state"
os_wait_http "$ks" keystone "$state"
echo "== OpenStack: Keystone on $ks in $((SECONDS - t0)) s"

# The catalog and users first: every other service validates tokens against it.
assignments="$("$os_venv/bin/python" "$os_here/setup.py" "$ks" "$admin_pw" "$service_pw" \
    "$user_pw" "http://127.0.0.1:$pl_port" "http://127.0.0.1:$gl_port" \
    "http://127.0.0.1:$nova_port/v2.1" "http://127.0.0.1:$neutron_port")"
eval "$assignments"

# Placement.
t0=$SECONDS
{
    echo "[DEFAULT]"
    echo "log_file = $state/log/placement.log"
    echo "[placement_database]"
    echo "connection = $(dburl placement)"
    echo "max_pool_size = 4"
    echo "[api]"
    echo "auth_strategy = keystone"
    authtoken placement
} >"$etc/placement/placement.conf"
OS_PLACEMENT_CONFIG_DIR="$etc/placement" "$os_venv/bin/placement-manage" \
    --config-file "$etc/placement/placement.conf" db sync >>"$state/log/setup.log" 2>&1
OS_PLACEMENT_CONFIG_DIR="$etc/placement" os_serve placement placement.wsgi.api "$pl_port" "$state"

# Glance, file store.
cp "$os_venv/etc/glance/glance-api-paste.ini" "$etc/glance/"
{
    echo "[DEFAULT]"
    echo "log_file = $state/log/glance.log"
    echo "enabled_backends = fs:file"
    echo "[glance_store]"
    echo "default_backend = fs"
    echo "[fs]"
    echo "filesystem_store_datadir = $state/images"
    echo "[os_glance_staging_store]"
    echo "filesystem_store_datadir = $state/staging"
    echo "[os_glance_tasks_store]"
    echo "filesystem_store_datadir = $state/staging"
    echo "[database]"
    echo "connection = $(dburl glance)"
    echo "max_pool_size = 4"
    echo "[paste_deploy]"
    echo "flavor = keystone"
    authtoken glance
} >"$etc/glance/glance-api.conf"
"$os_venv/bin/glance-manage" --config-file "$etc/glance/glance-api.conf" db_sync \
    >>"$state/log/setup.log" 2>&1
OS_GLANCE_CONFIG_DIR="$etc/glance" os_serve glance glance.wsgi.api "$gl_port" "$state"

# Neutron: ML2 with the Open vSwitch driver and no agents (API calls only).
cp "$os_venv/etc/neutron/api-paste.ini" "$etc/neutron/"
{
    echo "[DEFAULT]"
    echo "log_file = $state/log/neutron.log"
    echo "core_plugin = ml2"
    echo "service_plugins = router"
    echo "auth_strategy = keystone"
    echo "transport_url = $transport"
    echo "api_paste_config = $etc/neutron/api-paste.ini"
    echo "state_path = $state/neutron"
    echo "notify_nova_on_port_status_changes = false"
    echo "notify_nova_on_port_data_changes = false"
    echo "rpc_workers = 0"
    echo "[database]"
    echo "connection = $(dburl neutron)"
    echo "max_pool_size = 4"
    echo "[oslo_concurrency]"
    echo "lock_path = $state/lock"
    authtoken neutron
} >"$etc/neutron/neutron.conf"
cat >"$etc/neutron/plugins/ml2/ml2_conf.ini" <<CONF
[ml2]
type_drivers = flat,vlan,vxlan
tenant_network_types = vxlan
mechanism_drivers = openvswitch
extension_drivers = port_security
[ml2_type_flat]
flat_networks = public
[ml2_type_vlan]
network_vlan_ranges = physnet1:100:200
[ml2_type_vxlan]
vni_ranges = 1:1000
CONF
"$os_venv/bin/neutron-db-manage" --config-file "$etc/neutron/neutron.conf" \
    --config-file "$etc/neutron/plugins/ml2/ml2_conf.ini" upgrade heads >>"$state/log/setup.log" 2>&1
OS_NEUTRON_CONFIG_DIR="$etc/neutron" os_serve neutron neutron.wsgi.api "$neutron_port" "$state"

# Nova: one file for the API, conductor and scheduler; one more per compute, kept outside
# the API's config directory (it would load them all).
cp "$os_venv/etc/nova/api-paste.ini" "$etc/nova/"
{
    echo "[DEFAULT]"
    echo "log_dir = $state/log"
    echo "transport_url = $transport"
    echo "state_path = $state/nova"
    echo "my_ip = 127.0.0.1"
    echo "[api]"
    echo "auth_strategy = keystone"
    echo "[wsgi]"
    echo "api_paste_config = $etc/nova/api-paste.ini"
    echo "[api_database]"
    echo "connection = $(dburl nova_api)"
    echo "max_pool_size = 4"
    echo "[database]"
    echo "connection = $(dburl nova)"
    echo "max_pool_size = 4"
    echo "[scheduler]"
    echo "discover_hosts_in_cells_interval = -1"
    # Computes see providers nested under theirs (blazar_<host>, made and removed as tests
    # enrol and remove hosts) within a second instead of five minutes.
    echo "[compute]"
    echo "resource_provider_association_refresh = 1"
    echo "[filter_scheduler]"
    echo "available_filters = nova.scheduler.filters.all_filters"
    echo "available_filters = blazarnova.scheduler.filters.blazar_filter.BlazarFilter"
    echo "enabled_filters = ComputeFilter,ImagePropertiesFilter,ServerGroupAntiAffinityFilter,ServerGroupAffinityFilter,AggregateInstanceExtraSpecsFilter,BlazarFilter"
    echo "[oslo_concurrency]"
    echo "lock_path = $state/lock"
    # Versioned notifications on the cloud's vhost: `service.update` wakes blazar-rs's host
    # monitor (--monitor-notifications), as it does Blazar's notification monitor.
    echo "[oslo_messaging_notifications]"
    echo "driver = messagingv2"
    echo "[notifications]"
    echo "notification_format = versioned"
    echo "[glance]"
    echo "valid_interfaces = public"
    authtoken nova
    client_section placement placement
    client_section neutron neutron
} >"$etc/nova/nova.conf"
nm() { "$os_venv/bin/nova-manage" --config-file "$etc/nova/nova.conf" "$@" >>"$state/log/setup.log" 2>&1; }
nm api_db sync
nm cell_v2 map_cell0 --database_connection "$(dburl nova_cell0)"
nm cell_v2 create_cell --name cell1
nm db sync
OS_NOVA_CONFIG_DIR="$etc/nova" os_serve nova-api nova.wsgi.osapi_compute "$nova_port" "$state"
os_start nova-conductor "$state" "$os_venv/bin/nova-conductor" --config-file "$etc/nova/nova.conf"
os_start nova-scheduler "$state" "$os_venv/bin/nova-scheduler" --config-file "$etc/nova/nova.conf"
mkdir -p "$state/computes"
hosts=()
for i in $(seq 1 "$computes"); do
    host="compute-$i"
    hosts+=("$host")
    mkdir -p "$state/$host"
    cat >"$state/computes/$host.conf" <<CONF
[DEFAULT]
host = $host
state_path = $state/$host
compute_driver = fake.FakeDriver
log_file = $state/log/$host.log
CONF
    os_start "$host" "$state" "$os_venv/bin/nova-compute" --config-file "$etc/nova/nova.conf" \
        --config-file "$state/computes/$host.conf"
done
os_wait_http "http://127.0.0.1:$pl_port" placement "$state"
os_wait_http "http://127.0.0.1:$gl_port" glance "$state"
os_wait_http "http://127.0.0.1:$neutron_port" neutron "$state"
os_wait_http "http://127.0.0.1:$nova_port" nova-api "$state"
echo "== OpenStack: all APIs answer after $((SECONDS - started)) s"

cat >"$state/openrc" <<ENV
export OS_AUTH_URL=$ks
export OS_IDENTITY_API_VERSION=3
export OS_USERNAME=admin
export OS_PASSWORD=$admin_pw
export OS_PROJECT_NAME=admin
export OS_USER_DOMAIN_NAME=Default
export OS_PROJECT_DOMAIN_NAME=Default
export OS_REGION_NAME=RegionOne
ENV
cat >"$state/env" <<ENV
OS_SERVICE_USERNAME=blazar
OS_SERVICE_PASSWORD=$service_pw
OS_SERVICE_PROJECT_NAME=service
OS_USER_PASSWORD=$user_pw
OS_ALPHA_USERNAME=alpha-member
OS_ALPHA_PROJECT_ID=$OS_ALPHA_PROJECT_ID
OS_BETA_USERNAME=beta-member
OS_BETA_PROJECT_ID=$OS_BETA_PROJECT_ID
CLOUD_COMPUTE_HOSTS="${hosts[*]}"
CLOUD_EXTERNAL_NETWORK=public
CLOUD_IMAGE=cirros-fake
CLOUD_FLAVOR=m1.tiny
CLOUD_TRANSPORT_URL=$transport
ENV

# The computes register, then cells learn of them; an image, a flavor, an external network.
t0=$SECONDS
"$os_venv/bin/python" "$os_here/finish.py" "$state" "$computes" >>"$state/log/setup.log" 2>&1 \
    || { echo "== OpenStack: finishing failed; see $state/log/setup.log" >&2; tail -n 30 "$state/log/setup.log" >&2; exit 1; }
echo "== OpenStack: $computes computes, image, flavor and network ready in $((SECONDS - t0)) s"
echo "== OpenStack: up in $((SECONDS - started)) s; source $state/openrc"
