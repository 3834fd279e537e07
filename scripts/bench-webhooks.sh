#!/usr/bin/env bash
# Webhook delivery under a backlog of failing endpoints: six all_projects webhooks on
# endpoints that answer 400, never answer, send headers for ever or refuse the connection,
# N leases (N x 6 pending deliveries), then the server's CPU and RSS while it retries them
# with no API traffic, and how long a healthy endpoint registered after them waits.
#
#   scripts/bench-webhooks.sh                          # 12,000 leases, 60 s window
#   scripts/bench-webhooks.sh --leases 3000 --window 30 --server /path/to/blazar-server
#
# Options:
#   --leases N     leases behind the backlog (default 12000)
#   --window S     seconds of sampling with no API traffic (default 60)
#   --port P       first of three ports: server, endpoints, a closed one (default 42600)
#   --server PATH  the blazar-server binary (default $BLAZAR_SERVER, else
#                  target/release/blazar-server)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

LEASES=12000
WINDOW=60
PORT=42600
SERVER="${BLAZAR_SERVER:-$ROOT/target/release/blazar-server}"
while [ $# -gt 0 ]; do
    case "$1" in
        --leases) LEASES="$2"; shift ;;
        --window) WINDOW="$2"; shift ;;
        --port) PORT="$2"; shift ;;
        --server) SERVER="$2"; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$SERVER" ] || { echo "no blazar-server at $SERVER: run 'cargo build --release -p" \
    "blazar-server', or pass --server PATH (or set BLAZAR_SERVER)" >&2; exit 1; }
ENDPOINTS=$((PORT + 1))
REFUSED=$((PORT + 2))  # left closed: connection refused
for p in "$PORT" "$ENDPOINTS" "$REFUSED"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && { echo "port $p is in use (see --port)" >&2; exit 1; }
done

WORK="$(mktemp -d)"
cleanup() {
    # The server's log goes with $WORK: show its end if the server died under us.
    if [ -n "${SERVER_PID:-}" ] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "blazar-server exited:" >&2; tail -5 "$WORK/server.log" >&2
    fi
    for pid in ${DRIVE_PID:-} ${SERVER_PID:-} ${ENDPOINTS_PID:-}; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for URL PID: until URL answers; fails if PID exits or 30 s pass.
wait_for() {
    for _ in $(seq 300); do
        curl -s -o /dev/null "$1" && return 0
        kill -0 "$2" 2>/dev/null || exit 1
        sleep 0.1
    done
    echo "nothing answered at $1 in 30 s" >&2
    exit 1
}
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

echo "$("$SERVER" --version 2>/dev/null || echo "$SERVER"), $LEASES leases, window $WINDOW s, $(nproc) CPUs"
echo "1. endpoints on 127.0.0.1:$ENDPOINTS (closed: $REFUSED) ..."
T=$(date +%s.%N)
python3 "$ROOT/scripts/webhooks/endpoints.py" "$ENDPOINTS" &
ENDPOINTS_PID=$!
wait_for "http://127.0.0.1:$ENDPOINTS/_counts" "$ENDPOINTS_PID"
echo "  done in $(elapsed "$T") s"

echo "2. blazar-server on 127.0.0.1:$PORT ..."
T=$(date +%s.%N)
"$SERVER" --listen "127.0.0.1:$PORT" --database-url "sqlite://$WORK/bench.db" \
    --webhook-timeout 5 --webhook-max-attempts 8 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
wait_for "http://127.0.0.1:$PORT/healthz" "$SERVER_PID"
echo "  done in $(elapsed "$T") s"

python3 "$ROOT/scripts/webhooks/drive.py" --port "$PORT" --pid "$SERVER_PID" --endpoints "$ENDPOINTS" \
    --refused "$REFUSED" --db "$WORK/bench.db" --leases "$LEASES" --window "$WINDOW" &
# In the background so that INT or TERM stop it at once: bash defers traps behind a foreground child.
DRIVE_PID=$!
RC=0
wait "$DRIVE_PID" || RC=$?
DRIVE_PID=
exit "$RC"
