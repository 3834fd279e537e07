#!/usr/bin/env bash
# The README's OpenStack walk, replayed with the real clients (python-openstackclient with
# python-blazarclient's `openstack reservation` commands, from .venv/clients) against
# blazar-server (--auth keystone --backend openstack) on a cloud from up.sh: the catalog
# entry, hypervisors enrolled into the freepool, a floating IP registered, an instance and a
# floating-IP reservation that start now for a project member, a server booted with the
# reservation's flavor, the tagged floating IP, and the lease deleted by its owner taking all
# of it away again.
#
# Usage: scripts/openstack/walk.sh STATE_DIR   (a cloud brought up by up.sh; test.sh runs it)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
state="$1"
started=$SECONDS
clients="${BLAZAR_CLIENTS_VENV:-$os_root/.venv/clients}"
"$os_root/scripts/client-compat/run.sh" --install-only
# shellcheck source=../server.sh
source "$os_root/scripts/server.sh"
server="$(server_binary "$os_root")"

# shellcheck disable=SC1091
source "$state/openrc"
set -a
# shellcheck disable=SC1091
source "$state/env"
set +a

work="$(mktemp -d)"
port="$(os_free_port)"
server_pid=""
service_id=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
    if [ -n "$service_id" ]; then "$clients/bin/openstack" service delete "$service_id" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

BLAZAR_KEYSTONE_PASSWORD="$OS_SERVICE_PASSWORD" "$server" \
    --auth keystone --backend openstack --keystone-url "$OS_AUTH_URL" \
    --keystone-username blazar --os-region RegionOne --listen "127.0.0.1:$port" \
    --database-url "$work/blazar.db" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
    sleep 0.1
done

admin() { echo "\$ openstack $*" >&2; "$clients/bin/openstack" "$@"; }
alpha() {
    echo "\$ (alpha) openstack $*" >&2
    OS_USERNAME="$OS_ALPHA_USERNAME" OS_PASSWORD="$OS_USER_PASSWORD" OS_PROJECT_NAME=alpha \
        "$clients/bin/openstack" "$@"
}
fail() {
    echo "== walk failed: $*" >&2
    echo "-- blazar-server's log ends:" >&2
    tail -n 40 "$work/server.log" >&2
    exit 1
}
# until TRIES COMMAND...: COMMAND succeeds within TRIES half-second tries.
until_ok() {
    local tries="$1" i
    shift
    for i in $(seq 1 "$tries"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    return 1
}
# The reservation of RESOURCE_TYPE in a lease shown with -f json (the client prints the
# reservations as JSON objects one after the other in one string).
reservation_id() {
    "$clients/bin/python" -c '
import json, sys
raw = open(sys.argv[1]).read()
# "Created a new lease:" comes first.
lease = json.loads(raw[raw.index("{"):])
text, kind = lease["reservations"], sys.argv[2]
found, at, decoder = [], 0, json.JSONDecoder()
if isinstance(text, list):
    found = text
else:
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        obj, at = decoder.raw_decode(text, at)
        found.append(obj)
print(next(r["id"] for r in found if r["resource_type"] == kind))
' "$1" "$2"
}

# Step 1: the reservation service in the catalog.
service_id="$(admin service create --name blazar -f value -c id reservation)"
admin endpoint create --region RegionOne reservation public "http://127.0.0.1:$port/v1" >/dev/null

# Step 4: hypervisors enrolled by name land in the freepool; an unknown one is refused.
host_ids=()
for host in $CLOUD_COMPUTE_HOSTS; do
    # The client prints "Created a new host:" before the value.
    host_ids+=("$(admin reservation host create "$host" -f value -c id | tail -n 1)")
done
# Read whole before matching: `grep -q` stopping early could break the client's pipe.
in_freepool() {
    local hosts
    hosts="$(admin aggregate show freepool -f json -c hosts)" || return 1
    grep -q '"compute-1"' <<<"$hosts"
}
if ! until_ok 10 in_freepool; then
    fail "compute-1 is not in the freepool; the aggregates: $(admin aggregate list --long -f json 2>&1)"
fi
if admin reservation host create no-such-hypervisor >/dev/null 2>&1; then
    fail "an unknown hypervisor was enrolled"
fi

# Step 6: a floating IP outside the pool, three instance slots on distinct hosts and the
# address for alpha, starting now.
public="$(admin network show "$CLOUD_EXTERNAL_NETWORK" -f value -c id)"
address=172.24.4.240
fip_id="$(admin reservation floatingip create "$public" "$address" -f value -c id | tail -n 1)"
end="$(date -u -d '+1 hour' '+%Y-%m-%d %H:%M')"
alpha reservation lease create \
    --reservation "resource_type=virtual:instance,vcpus=1,memory_mb=64,disk_gb=1,amount=3,affinity=False" \
    --reservation "resource_type=virtual:floatingip,network_id=$public,amount=1" \
    --end-date "$end" -f json walk >"$work/lease.json"
flavor="$(reservation_id "$work/lease.json" virtual:instance)" \
    || fail "no instance reservation in: $(cat "$work/lease.json")"
fip_reservation="$(reservation_id "$work/lease.json" virtual:floatingip)" \
    || fail "no floating-IP reservation in: $(cat "$work/lease.json")"
lease_active() { [ "$(alpha reservation lease show walk -f value -c status)" = ACTIVE ]; }
until_ok 240 lease_active || fail "the lease did not become ACTIVE"

# The reservation's flavor is alpha's to boot with; the address is alpha's, tagged.
alpha flavor show "$flavor" -f value -c name | grep -qx "reservation:$flavor" \
    || fail "alpha does not see the reservation's flavor"
status="$(alpha --os-compute-api-version 2.61 server create --flavor "$flavor" --image "$CLOUD_IMAGE" --nic none --wait \
    -f value -c status walk-vm)" || fail "alpha could not boot with the reservation's flavor"
[ "$status" = ACTIVE ] || fail "the server is $status"
listed="$(alpha floating ip list --tags "reservation:$fip_reservation" -f value -c "Floating IP Address")"
[ "$listed" = "$address" ] || fail "alpha's tagged floating IPs: '$listed'"

# The owner deletes the lease: the server, the flavor and the floating IP go.
alpha reservation lease delete walk >/dev/null
flavor_gone() { ! admin flavor show "$flavor" >/dev/null 2>&1; }
fip_gone() { [ -z "$(admin floating ip list --floating-ip-address "$address" -f value -c ID)" ]; }
server_gone() { [ -z "$(admin server list --all-projects --name walk-vm -f value -c ID)" ]; }
until_ok 240 flavor_gone || fail "the reservation's flavor outlived its lease"
until_ok 60 fip_gone || fail "the floating IP outlived its lease"
until_ok 60 server_gone || fail "the server outlived its lease"

admin reservation floatingip delete "$fip_id"
for id in "${host_ids[@]}"; do admin reservation host delete "$id"; done
if admin aggregate show freepool >/dev/null 2>&1; then admin aggregate delete freepool; fi
echo "== OpenStack walk with the real clients passed in $((SECONDS - started)) s"
