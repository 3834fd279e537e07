#!/usr/bin/env bash
# Blazar's own conformance tests for the cloud side: the host, instance and flavor
# reservation scenarios of blazar-tempest-plugin (PyPI), run by tempest against blazar-rs
# (--auth keystone --backend openstack) and a cloud from up.sh, as Blazar's gate runs them
# against devstack. The scenarios expect every compute to be Blazar's (a server booted
# without a reservation must find no host): every compute is enrolled before they run.
#
# Usage: scripts/openstack/tempest.sh [STATE_DIR]  (the cloud up.sh brought up in STATE_DIR,
# left up; without it, a cloud of one compute brought up and taken down here. Builds
# blazar-server; installs tempest into .venv/tempest, reused while tempest-requirements.txt is
# unchanged)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
started=$SECONDS
tempest_venv="$os_root/.venv/tempest"

venv_install "$tempest_venv" "$os_here/tempest-requirements.txt" tempest
# shellcheck source=../server.sh
source "$os_root/scripts/server.sh"
server="$(server_binary "$os_root")"

server_pid=""
if [ -n "${1:-}" ]; then
    # Everything this run makes goes into a directory of its own inside the cloud's.
    cloud="$(cd "$1" && pwd)"
    state="$(mktemp -d "$cloud/tempest-XXXXXX")"
    mkdir -p "$state/log"
    # The cloud stays up for whoever brought it up: what this run put into it goes again.
    cleanup() {
        if [ -n "$server_pid" ]; then
            "$os_venv/bin/python" "$os_here/tempest_cloud.py" teardown "$state" || true
            kill "$server_pid" 2>/dev/null || true
        fi
    }
else
    state="$(mktemp -d)"
    cloud="$state"
    cleanup() {
        if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
        os_down "$state"
        rm -rf "$state"
    }
    "$os_here/up.sh" "$state" 1
fi
trap cleanup EXIT
# shellcheck disable=SC1091
source "$cloud/openrc"
OS_SERVICE_PASSWORD="$(sed -n 's/^OS_SERVICE_PASSWORD=//p' "$cloud/env")"

port="$(os_free_port)"
BLAZAR_KEYSTONE_PASSWORD="$OS_SERVICE_PASSWORD" "$server" \
    --auth keystone --backend openstack --keystone-url "$OS_AUTH_URL" \
    --keystone-username blazar --os-region RegionOne --listen "127.0.0.1:$port" \
    --database-url "$state/blazar.db" >"$state/log/blazar-server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
    sleep 0.1
done

# The reservation service in the catalog, as a deployment registers it; every compute
# enrolled; then tempest.conf (tempest_cloud.py).
"$os_venv/bin/python" "$os_here/tempest_cloud.py" setup "$state" "http://127.0.0.1:$port/v1"

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
