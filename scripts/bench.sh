#!/usr/bin/env bash
# The standard performance matrix of issue 6: blazar-rs on SQLite and on PostgreSQL, driven
# over HTTP by blazar-bench at each scale step. See docs/performance.md.
#
#   scripts/bench.sh                 # full matrix (about 20-30 min on 2 cores, see docs)
#   scripts/bench.sh --quick         # small scales, about 1 min: a smoke test
#   scripts/bench.sh --backends sqlite --steps 100:0,1000:10000 -- --write-ops 64
#
# Options:
#   --quick             small scales and few requests
#   --backends LIST     sqlite,postgres (default both); sqlite-normal is SQLite with
#                       --sqlite-synchronous normal, to measure what durability costs;
#                       postgres-replicas is PostgreSQL with a second, `--role api` server
#                       on the same database, the driver's requests spread over both
#                       (each server with 8 database connections, the one server's 16 shared)
#   --steps LIST        scale steps HOSTS:ALLOCATIONS,... (default: see below)
#   --results DIR       where to write (default bench-results/<date>-<mode>)
#   --pg-url URL        PostgreSQL server to create the throwaway database on
#                       (default postgres://postgres@127.0.0.1:5432)
#   -- ARGS             passed on to `blazar-bench run`
#
# Writes DIR/<backend>.json and .md (one run each), DIR/summary.md (every table plus the
# issue-6 targets), the server and driver logs, and prints the summary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE=full
BACKENDS=sqlite,postgres
STEPS=""
RESULTS=""
PG_URL="${BLAZAR_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}"
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) MODE=quick ;;
        --backends) BACKENDS="$2"; shift ;;
        --steps) STEPS="$2"; shift ;;
        --results) RESULTS="$2"; shift ;;
        --pg-url) PG_URL="$2"; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$MODE" = quick ]; then
    STEPS="${STEPS:-50:0,200:2000}"
    DRIVER_ARGS=(--write-ops 32 --read-ops 8 --phase-seconds 5 --lag-samples 2 --rack-size 10)
else
    # Hosts grow at 0 allocations, then allocations grow at 10,000 hosts. Seed leases take a
    # rack of 100 hosts each, so 100,000 allocations are 1,000 lease creates.
    STEPS="${STEPS:-100:0,1000:0,10000:0,10000:10000,10000:100000}"
    DRIVER_ARGS=(--write-ops 256 --read-ops 16 --phase-seconds 6 --lag-samples 5 --rack-size 100)
fi
RESULTS="${RESULTS:-bench-results/$(date +%Y%m%d-%H%M%S)-$MODE}"
mkdir -p "$RESULTS"
T0=$(date +%s)

echo "building (release)..." >&2
# BLAZAR_SERVER_BIN=path uses that server binary instead of building one.
if [ -n "${BLAZAR_SERVER_BIN:-}" ]; then
    cargo build --release -q -p blazar-bench
    SERVER="$BLAZAR_SERVER_BIN"
else
    cargo build --release -q -p blazar-server -p blazar-bench
    SERVER="$ROOT/target/release/blazar-server"
fi
BENCH="$ROOT/target/release/blazar-bench"

SERVER_PID=""
REPLICA_PID=""
TMPDIR_SQLITE=""
PG_DB=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
    if [ -n "$REPLICA_PID" ] && kill -0 "$REPLICA_PID" 2>/dev/null; then
        kill "$REPLICA_PID" 2>/dev/null || true
        wait "$REPLICA_PID" 2>/dev/null || true
    fi
    REPLICA_PID=""
    if [ -n "$TMPDIR_SQLITE" ]; then rm -rf "$TMPDIR_SQLITE"; TMPDIR_SQLITE=""; fi
    if [ -n "$PG_DB" ]; then
        psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $PG_DB" >/dev/null 2>&1 || true
        PG_DB=""
    fi
}
trap cleanup EXIT INT TERM

free_port() {
    local port=18400
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    echo "$port"
}

FILES=()
IFS=',' read -r -a BACKEND_LIST <<<"$BACKENDS"
for backend in "${BACKEND_LIST[@]}"; do
    case "$backend" in
        sqlite|sqlite-normal)
            TMPDIR_SQLITE="$(mktemp -d)"
            URL="$TMPDIR_SQLITE/blazar.db"
            ;;
        postgres|postgres-replicas)
            PG_DB="blazar_bench_$$"
            psql "$PG_URL/postgres" -qc "CREATE DATABASE $PG_DB" >/dev/null
            URL="$PG_URL/$PG_DB"
            ;;
        *) echo "unknown backend $backend" >&2; exit 2 ;;
    esac
    SERVER_ARGS=()
    LABEL="blazar-rs $backend"
    if [ "$backend" = sqlite-normal ]; then
        SERVER_ARGS=(--sqlite-synchronous normal)
        LABEL="blazar-rs sqlite (synchronous=normal)"
    fi
    if [ "$backend" = postgres-replicas ]; then
        # The two servers share the one server's 16 connections, as replicas in front of
        # one database should (README, "PostgreSQL and several replicas").
        SERVER_ARGS=(--max-connections 8)
    fi
    PORT="$(free_port)"
    "$SERVER" --listen "127.0.0.1:$PORT" --database-url "$URL" --log warn ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"} \
        >"$RESULTS/server-$backend.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 100); do
        curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" 2>/dev/null && break
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "server exited, see $RESULTS/server-$backend.log" >&2; exit 1; }
        sleep 0.1
    done
    URLS="http://127.0.0.1:$PORT"
    if [ "$backend" = postgres-replicas ]; then
        LABEL="blazar-rs postgres, 2 replicas"
        PORT2="$(free_port)"
        "$SERVER" --listen "127.0.0.1:$PORT2" --database-url "$URL" --log warn --role api "${SERVER_ARGS[@]}" \
            >"$RESULTS/server-$backend-api.log" 2>&1 &
        REPLICA_PID=$!
        for _ in $(seq 1 100); do
            curl -fsS -o /dev/null "http://127.0.0.1:$PORT2/healthz" 2>/dev/null && break
            kill -0 "$REPLICA_PID" 2>/dev/null || { echo "replica exited, see $RESULTS/server-$backend-api.log" >&2; exit 1; }
            sleep 0.1
        done
        URLS="$URLS,http://127.0.0.1:$PORT2"
    fi
    LOCK_WAIT=()
    case "$backend" in postgres*) LOCK_WAIT=(--lock-wait-db "$URL") ;; esac
    echo "$backend: blazar-server pid $SERVER_PID at $URLS, steps $STEPS" >&2
    "$BENCH" run --url "$URLS" --label "$LABEL" ${LOCK_WAIT[@]+"${LOCK_WAIT[@]}"} \
        --steps "$STEPS" --server-pid "$SERVER_PID" "${DRIVER_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} \
        --out "$RESULTS/$backend.json" --markdown "$RESULTS/$backend.md" \
        >/dev/null 2> >(tee "$RESULTS/driver-$backend.log" >&2)
    FILES+=("$RESULTS/$backend.json")
    cleanup
done

"$BENCH" report --targets "${FILES[@]}" >"$RESULTS/summary.md"
T1=$(date +%s)
echo "matrix ($MODE) took $((T1 - T0)) s; results in $RESULTS" | tee -a "$RESULTS/summary.md" >&2
cat "$RESULTS/summary.md"
