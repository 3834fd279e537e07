#!/usr/bin/env bash
# Side by side with the real OpenStack Blazar (the reference peer of ../shared/peer), in one
# sitting: the same blazar-bench workload against the peer and against blazar-rs (SQLite), at
# 100 and at 1,000 hosts, then the ratios. See docs/performance.md.
#
#   scripts/bench-vs-blazar.sh [--peer-dir DIR] [--results DIR] [--only 100|1000]
#
# The peer folder is copied to a scratch directory (default /tmp/blazar-peer) and set up there
# (peer/setup.sh: venv from PyPI + Debian's mariadb-server) unless it already is. Blazar takes
# about 1 s per lease create at 100 hosts and 3-7 s at 1,000, so the workload is small:
# few requests per phase, concurrency 1 and 8, new connection per request on both sides, and
# a burst of 50 leases starting in the same minute (Blazar's 10 s event loop against ours).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PEER_SRC="${PEER_SRC:-$ROOT/../shared/peer}"
PEER_DIR=/tmp/blazar-peer
RESULTS="bench-results/$(date +%Y%m%d-%H%M%S)-vs-blazar"
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --peer-dir) PEER_DIR="$2"; shift ;;
        --results) RESULTS="$2"; shift ;;
        --only) ONLY="$2"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$RESULTS"
T0=$(date +%s)

if [ ! -x "$PEER_DIR/.venv/bin/python" ]; then
    mkdir -p "$PEER_DIR"
    cp -r "$PEER_SRC/." "$PEER_DIR/"
    chmod -R u+w "$PEER_DIR"
    "$PEER_DIR/setup.sh"
fi
# BLAZAR_SERVER_BIN=path uses that server binary instead of building one.
if [ -n "${BLAZAR_SERVER_BIN:-}" ]; then
    cargo build --release -q -p blazar-bench
    SERVER="$BLAZAR_SERVER_BIN"
else
    cargo build --release -q -p blazar-server -p blazar-bench
    SERVER="$ROOT/target/release/blazar-server"
fi
BENCH="$ROOT/target/release/blazar-bench"
PEER_PORT=18200
RS_PORT=18300

RS_PID=""
RS_TMP=""
cleanup() {
    if [ -n "$RS_PID" ] && kill -0 "$RS_PID" 2>/dev/null; then kill "$RS_PID"; wait "$RS_PID" 2>/dev/null || true; fi
    RS_PID=""
    if [ -n "$RS_TMP" ]; then rm -rf "$RS_TMP"; RS_TMP=""; fi
    "$PEER_DIR/stop.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

# label url pid out steps args...
drive() {
    local label="$1" url="$2" pid="$3" out="$4" steps="$5"; shift 5
    "$BENCH" run --url "$url" --label "$label" --steps "$steps" --server-pid "$pid" \
        --concurrency 1,8 --fresh-connections --phase-seconds 120 --lag-timeout 30 \
        --lag-samples 2 --rack-size 10 --seed-concurrency 4 "$@" \
        --out "$RESULTS/$out.json" --markdown "$RESULTS/$out.md" \
        >/dev/null 2> >(tee "$RESULTS/$out.log" >&2)
}

# hosts steps peer-burst-lead args...: the burst's leases must all be created before they
# start, which takes Blazar minutes where blazar-rs needs a second, so its lead is longer.
run_scale() {
    local hosts="$1" steps="$2" peer_lead="$3"; shift 3
    # the peer: fresh state, MariaDB, Blazar's 10 s event loop as upstream
    "$PEER_DIR/start.sh" --fresh --port "$PEER_PORT" >/dev/null
    drive "blazar $hosts" "http://127.0.0.1:$PEER_PORT" "$(cat "$PEER_DIR/run/peer.pid")" \
        "peer-$hosts" "$steps" --burst-lead "$peer_lead" "$@"
    "$PEER_DIR/stop.sh" >/dev/null
    # blazar-rs on a fresh SQLite file, same workload
    RS_TMP="$(mktemp -d)"
    "$SERVER" --listen "127.0.0.1:$RS_PORT" --database-url "$RS_TMP/blazar.db" --log warn \
        >"$RESULTS/server-rs-$hosts.log" 2>&1 &
    RS_PID=$!
    for _ in $(seq 1 100); do
        curl -fsS -o /dev/null "http://127.0.0.1:$RS_PORT/healthz" 2>/dev/null && break
        sleep 0.1
    done
    drive "blazar-rs $hosts" "http://127.0.0.1:$RS_PORT" "$RS_PID" "rs-$hosts" "$steps" "$@"
    cleanup
    "$BENCH" report --compare "$RESULTS/peer-$hosts.json" "$RESULTS/rs-$hosts.json" \
        >"$RESULTS/compare-$hosts.md"
}

# The burst: leases of one host each starting in the same minute (half the hosts at 100, as
# many at 1,000 as Blazar creates in a few minutes).
if [ "$ONLY" != 1000 ]; then
    run_scale 100 100:0,100:1000 120 --write-ops 10 --read-ops 5 --project-leases 100 \
        --burst-leases 50
fi
if [ "$ONLY" != 100 ]; then
    run_scale 1000 1000:0 300 --write-ops 6 --read-ops 3 --project-leases 20 --burst-leases 50
fi
cat "$RESULTS"/compare-*.md >"$RESULTS/summary.md"
echo "side by side took $(( $(date +%s) - T0 )) s; results in $RESULTS" | tee -a "$RESULTS/summary.md" >&2
cat "$RESULTS/summary.md"
