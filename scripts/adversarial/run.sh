#!/usr/bin/env bash
# The adversarial checks, against the release build of blazar-server in its default
# configuration (crates/blazar-attack): a bounded fuzzer of the write endpoints that checks
# every answer and the database after each refused request; more idle and slowloris
# connections than the server may hold, under a 1,024 open-file limit, while another client is
# served; 1,024 distinct large property queries under the 200 MB memory budget; kill -9 during
# bursts of creates and restart, on SQLite and (when PostgreSQL is reachable) with two
# replicas on PostgreSQL. Each check is bounded in time; the script prints how long each took
# and fails if any check fails.
#
# Usage: scripts/adversarial/run.sh [fuzz|connections|memory|durability|durability-pg ...]
set -euo pipefail
cd "$(dirname "$0")/../.."

checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(fuzz connections memory durability durability-pg)

t0=$SECONDS
echo "== adversarial: building the release server and the attacker"
cargo build --release --quiet -p blazar-server -p blazar-attack
echo "== adversarial: built in $((SECONDS - t0)) s"

work="$(mktemp -d)"
pgdb=""
cleanup() {
    if [ -n "$pgdb" ]; then
        psql -d postgres -qc "DROP DATABASE IF EXISTS $pgdb WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

attack=target/release/blazar-attack
server=target/release/blazar-server
# The attacker itself holds over a thousand sockets.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

failed=()
run_check() {
    local name="$1"
    shift
    local dir="$work/$name" t=$SECONDS
    mkdir -p "$dir"
    echo "== adversarial: $name"
    if "$attack" "$@" --server "$server" --workdir "$dir"; then
        echo "== adversarial: $name passed in $((SECONDS - t)) s"
    else
        echo "== adversarial: $name FAILED after $((SECONDS - t)) s; the server's log ends:" >&2
        tail -n 20 "$dir"/*-server.log >&2 || true
        failed+=("$name")
    fi
}

for check in "${checks[@]}"; do
    case "$check" in
        fuzz) run_check fuzz fuzz --requests 4000 --seconds 150 --seed "${BLAZAR_ATTACK_SEED:-$RANDOM}" ;;
        connections) run_check connections connections --nofile 1024 --idle 550 --slow 550 --hold 45 ;;
        memory) run_check memory memory --queries 1024 --sizes 819200,61440 --limit-mb 200 ;;
        durability) run_check durability durability --rounds 5 --writers 8 ;;
        durability-pg)
            export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
            if ! psql -d postgres -qc "SELECT 1" >/dev/null 2>&1; then
                echo "== adversarial: durability-pg skipped: no PostgreSQL at $PGHOST:$PGPORT"
                continue
            fi
            pgdb="blazar_attack_$(date +%s)_$$"
            psql -d postgres -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $pgdb"
            psql -d "$pgdb" -v ON_ERROR_STOP=1 -qc "CREATE EXTENSION IF NOT EXISTS btree_gist"
            run_check durability-pg durability --rounds 5 --writers 8 --replicas 2 \
                --database-url "postgres://$PGUSER@$PGHOST:$PGPORT/$pgdb"
            ;;
        *) echo "unknown check: $check" >&2; exit 2 ;;
    esac
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "== adversarial: failed: ${failed[*]} (whole script $((SECONDS - t0)) s)" >&2
    exit 1
fi
echo "== adversarial: all passed in $((SECONDS - t0)) s"
