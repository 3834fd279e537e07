#!/usr/bin/env bash
# What open lease-event streams cost: lease creates one after another with no stream open
# and with many (`GET /v1/leases/events`, members of eight projects), and the server's CPU
# while the streams sit idle. A release build of blazar-server is used (built if missing).
#
#   scripts/bench-streams.sh                          # SQLite, 1,000 streams
#   scripts/bench-streams.sh --database postgres://postgres@127.0.0.1:5432 --streams 500
#
# Options:
#   --database URL   a PostgreSQL server (a database is made and dropped) or sqlite (default)
#   --streams N      streams in the measured rounds (default 1000)
#   --creates N      creates per round (default 200)
#   --rounds N       rounds without and with streams, alternated (default 2)
#   --server PATH    the blazar-server binary (default target/release/blazar-server)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DATABASE=sqlite
STREAMS=1000
CREATES=200
ROUNDS=2
SERVER=target/release/blazar-server
while [ $# -gt 0 ]; do
    case "$1" in
        --database) DATABASE="$2"; shift ;;
        --streams) STREAMS="$2"; shift ;;
        --creates) CREATES="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --server) SERVER="$2"; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$SERVER" ] || cargo build --release -p blazar-server

WORK="$(mktemp -d)"
PORT=$((20000 + RANDOM % 20000))
DB_NAME=""
if [ "$DATABASE" = sqlite ]; then
    URL="$WORK/blazar.db"
else
    DB_NAME="bench_streams_$$"
    psql "$DATABASE/postgres" -qc "CREATE DATABASE $DB_NAME"
    psql "$DATABASE/$DB_NAME" -qc "CREATE EXTENSION IF NOT EXISTS btree_gist"
    URL="$DATABASE/$DB_NAME"
fi
cleanup() {
    [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    [ -n "$DB_NAME" ] && psql "$DATABASE/postgres" -qc "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)"
    rm -rf "$WORK"
}
trap cleanup EXIT

"$SERVER" --listen "127.0.0.1:$PORT" --database-url "$URL" --max-waiters $((STREAMS * 8)) \
    > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 50); do
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && break
    sleep 0.2
done
# One host per hour is enough: each create takes the next hour.
for i in $(seq 1 8); do
    curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -H 'X-Project-Id: admin' \
        -H 'X-User-Id: bench' -H 'X-Roles: admin' "http://127.0.0.1:$PORT/v1/os-hosts" \
        -d "{\"name\": \"stream-bench-$i\"}"
done

echo "$("$SERVER" --version 2>/dev/null || echo blazar-server), $(basename "${DATABASE%%:*}"), $CREATES creates a round"
echo
echo "| streams open | create p50 ms | create p90 ms | events received | server CPU, streams idle |"
echo "| --- | --- | --- | --- | --- |"
OFFSET=0
for _ in $(seq "$ROUNDS"); do
    for n in 0 "$STREAMS"; do
        python3 scripts/streams/drive.py --port "$PORT" --pid "$SERVER_PID" --streams "$n" \
            --creates "$CREATES" --offset "$OFFSET"
        OFFSET=$((OFFSET + CREATES))
    done
done
