#!/usr/bin/env bash
# Blazar's own conformance tests for the cloud side: the host, instance and flavor
# reservation scenarios of blazar-tempest-plugin (PyPI), run by tempest against blazar-rs (--auth keystone --backend
# openstack) and a cloud of one fake compute from up.sh, as Blazar's gate runs them against
# devstack (one compute: the scenarios expect every compute to be Blazar's).
#
# Usage: scripts/openstack/tempest.sh  (builds blazar-server; installs tempest into
# .venv/tempest, reused while tempest-requirements.txt is unchanged)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
started=$SECONDS
tempest_venv="$os_root/.venv/tempest"

if ! cmp -s "$os_here/tempest-requirements.txt" "$tempest_venv/.requirements.txt"; then
    t0=$SECONDS
    rm -rf "$tempest_venv"
    "${PYTHON:-python3}" -m venv "$tempest_venv"
    "$tempest_venv/bin/pip" install --quiet --disable-pip-version-check uv
    "$tempest_venv/bin/uv" pip install --quiet --python "$tempest_venv/bin/python" \
        -r "$os_here/tempest-requirements.txt"
    cp "$os_here/tempest-requirements.txt" "$tempest_venv/.requirements.txt"
    echo "== tempest: installed in $((SECONDS - t0)) s"
fi
(cd "$os_root" && cargo build --quiet -p blazar-server)

state="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
    os_down "$state"
    rm -rf "$state"
}
trap cleanup EXIT

"$os_here/up.sh" "$state" 1
# shellcheck disable=SC1091
source "$state/openrc"
OS_SERVICE_PASSWORD="$(sed -n 's/^OS_SERVICE_PASSWORD=//p' "$state/env")"

port="$(os_free_port)"
BLAZAR_KEYSTONE_PASSWORD="$OS_SERVICE_PASSWORD" "$os_root/target/debug/blazar-server" \
    --auth keystone --backend openstack --keystone-url "$OS_AUTH_URL" \
    --keystone-username blazar --os-region RegionOne --listen "127.0.0.1:$port" \
    --database-url "$state/blazar.db" >"$state/log/blazar-server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
    sleep 0.1
done

# The reservation service in the catalog, as a deployment registers it; then tempest.conf.
"$os_venv/bin/python" - "$state" "http://127.0.0.1:$port/v1" <<'PY'
import os
import sys
import openstack

state, url = sys.argv[1:3]
password = os.environ["OS_PASSWORD"]
auth_url = os.environ["OS_AUTH_URL"]
conn = openstack.connect(
    auth_url=auth_url, username="admin", password=password, project_name="admin",
    user_domain_name="Default", project_domain_name="Default", region_name="RegionOne")
svc = conn.identity.create_service(name="blazar", type="reservation")
for interface in ["public", "internal", "admin"]:
    conn.identity.create_endpoint(service_id=svc.id, interface=interface, url=url,
                                  region_id="RegionOne")
image = next(conn.image.images(name="cirros-fake"))
flavor = conn.compute.find_flavor("m1.tiny")
with open(f"{state}/tempest.conf", "w") as f:
    f.write(f"""[DEFAULT]
log_dir = {state}/log
log_file = tempest.log
[auth]
admin_username = admin
admin_password = {password}
admin_project_name = admin
admin_domain_name = Default
use_dynamic_credentials = True
create_isolated_networks = False
[identity]
uri_v3 = {auth_url}
auth_version = v3
region = RegionOne
[identity-feature-enabled]
api_v2 = False
[compute]
image_ref = {image.id}
flavor_ref = {flavor.id}
build_timeout = 120
[validation]
run_validation = False
[service_available]
blazar = True
nova = True
neutron = True
glance = True
cinder = False
swift = False
placement = True
[resource_reservation]
lease_interval = 2
lease_end_timeout = 300
""")
PY

work="$state/tempest"
# tempest keeps a registry of workspaces in $HOME: keep it in the run's directory.
export HOME="$state"
"$tempest_venv/bin/tempest" init "$work" >/dev/null
cp "$state/tempest.conf" "$work/etc/tempest.conf"
t0=$SECONDS
set +e
(cd "$work" && "$tempest_venv/bin/tempest" run --concurrency 1 \
    --regex 'blazar_tempest_plugin\.tests\.scenario\.test_(host|instance|flavor)_reservation') 2>&1 \
    | tee "$state/tempest-run.log" | grep -E "^\{|Totals|Passed|Failed|Skipped|====="
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    mkdir -p "$os_root/target/tempest"
    cp "$state/tempest-run.log" "$state/log/blazar-server.log" "$os_root/target/tempest/" || true
    echo "== tempest failed (logs kept in target/tempest); its failures:" >&2
    grep -E -A25 "^(FAIL|Traceback|ft[0-9]|=====)" "$state/tempest-run.log" | head -n 80 >&2 || true
    exit "$status"
fi
passed="$(grep -cE '^\{.*\} .*test_(host|instance|flavor)_reservation.* ok$' "$state/tempest-run.log" || true)"
if [ "$passed" -lt 7 ]; then
    echo "== only $passed host, instance and flavor reservation scenarios passed; expected 7" >&2
    exit 1
fi
echo "== tempest: $passed blazar-tempest-plugin host, instance and flavor reservation scenarios passed in $((SECONDS - t0)) s (whole script $((SECONDS - started)) s)"
