#!/usr/bin/env bash
# Tests the OpenStack backend against a real cloud: brings one up (up.sh: Keystone,
# Placement, Glance, Nova with BlazarFilter and three fake computes, Neutron), runs the Rust
# tests that need it (crates/blazar-server/tests/it/openstack.rs), the README's walk with
# the real clients (walk.sh) and blazar-tempest-plugin's scenarios (tempest.sh) on that one
# cloud, and takes it down again, whatever happened. Prints how long each part took.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
started=$SECONDS

state="$(mktemp -d)"
cleanup() { os_down "$state"; rm -rf "$state"; }
trap cleanup EXIT

"$os_here/up.sh" "$state" 3

t0=$SECONDS
cd "$os_root"
log="$state/cargo-test.log"
set +e
BLAZAR_TEST_OPENSTACK_STATE="$state" cargo test --workspace --test it openstack:: 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    echo "== OpenStack tests failed; the cloud's logs end:" >&2
    for f in "$state"/log/nova-scheduler.log "$state"/log/nova-conductor.log "$state"/log/compute-1.log; do
        echo "-- $f" >&2
        grep -E "ERROR|WARNING" "$f" | tail -n 10 >&2 || true
    done
    exit "$status"
fi
ran="$(grep -c '^test openstack::.* ok$' "$log" || true)"
if [ "$ran" -lt 21 ]; then
    echo "== only $ran OpenStack tests ran; expected at least 21" >&2
    exit 1
fi
echo "== OpenStack tests: $ran passed in $((SECONDS - t0)) s"

# The README's walk, with the real openstack and blazar clients.
"$os_here/walk.sh" "$state"

# Replicas on PostgreSQL (SKIP LOCKED claims) against the same cloud, when one is reachable.
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
if psql -d postgres -qc "SELECT 1" >/dev/null 2>&1; then
    t0=$SECONDS
    pgdb="blazar_os_$(date +%s)_$$"
    psql -d postgres -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $pgdb"
    psql -d "$pgdb" -v ON_ERROR_STOP=1 -qc "CREATE EXTENSION IF NOT EXISTS btree_gist"
    set +e
    BLAZAR_TEST_OPENSTACK_STATE="$state" \
        BLAZAR_TEST_DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$pgdb" \
        cargo test --workspace --test it openstack::two_replicas 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    psql -d postgres -qc "DROP DATABASE IF EXISTS $pgdb WITH (FORCE)" || true
    if [ "$status" -ne 0 ] || ! grep -q '^test openstack::two_replicas.* ok$' "$log"; then
        echo "== the replicas test on PostgreSQL failed" >&2
        exit 1
    fi
    echo "== OpenStack replicas on PostgreSQL passed in $((SECONDS - t0)) s"
fi

# Blazar's own scenarios, last: they need every compute enrolled.
"$os_here/tempest.sh" "$state"
echo "== OpenStack: whole script $((SECONDS - started)) s"
