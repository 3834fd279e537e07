#!/usr/bin/env bash
# Do creates scale with API servers on one PostgreSQL database? One server against a server
# plus a `--role api` replica, each server given the same CPU share (a cgroup quota), the
# way servers on machines of their own would be; PostgreSQL and the driver are not limited.
# Without a quota every process shares the same cores: a second server adds no CPU, and
# two servers come closest to one when they share its database connections (the default
# --max-connections 16:8; docs/performance.md, "Two servers sharing one connection budget").
#
#   scripts/bench-replicas.sh                           # 10,000 hosts, 100,000 allocations
#   scripts/bench-replicas.sh --steps 1000:10000 --server-cpus 0.5 --rounds 3
#
# Options:
#   --steps H:A         the one scale step (default 10000:100000)
#   --server-cpus N     CPU share of each server, in cores (default 0.25; needs root and a
#                       writable cgroup cpu controller, v1 or v2)
#   --rounds N          one-server and two-server runs, alternated (default 2)
#   --creates N         creates per run (default 1024), at concurrency 64
#   --max-connections A[:B]  database connections of the one server (A) and of each of the
#                       two servers (B, default A); default 16:8, the one server's
#                       connections shared by the two (README, "PostgreSQL and several
#                       replicas"); 16:16 gives each server the server's default
#   --results DIR       where to write (default bench-results/<date>-replicas)
#   --pg-url URL        PostgreSQL server (default postgres://postgres@127.0.0.1:5432)
#
# Seeds the database once through an unlimited server, then measures each run on the same
# seeded database (`blazar-bench run --already-seeded`; each run deletes what it created).
# Prints a table of creates/s, p50 and lock wait per run and the servers' CPU per create.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STEP=10000:100000
CPUS=0.25
ROUNDS=2
CREATES=1024
POOLS="16:8"
RESULTS=""
PG_URL="${BLAZAR_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}"
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEP="$2"; shift ;;
        --server-cpus) CPUS="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --creates) CREATES="$2"; shift ;;
        --max-connections) POOLS="$2"; shift ;;
        --results) RESULTS="$2"; shift ;;
        --pg-url) PG_URL="$2"; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
RESULTS="${RESULTS:-bench-results/$(date +%Y%m%d-%H%M%S)-replicas}"
mkdir -p "$RESULTS"
T0=$(date +%s)

# Where CPU quotas can be set: cgroup v2 with the cpu controller, or v1's cpu hierarchy.
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    CG_ROOT=/sys/fs/cgroup
    CG_VERSION=2
elif [ -w /sys/fs/cgroup/cpu ]; then
    CG_ROOT=/sys/fs/cgroup/cpu
    CG_VERSION=1
else
    echo "no writable cgroup cpu controller: run as root on a machine that has one" >&2
    exit 1
fi
QUOTA_US=$(awk -v c="$CPUS" 'BEGIN { q = int(c * 100000); if (q < 1000) exit 1; print q }') \
    || { echo "--server-cpus must be at least 0.01" >&2; exit 2; }

echo "building (release)..." >&2
cargo build --release -q -p blazar-server -p blazar-bench
SERVER="${BLAZAR_SERVER_BIN:-$ROOT/target/release/blazar-server}"
BENCH="$ROOT/target/release/blazar-bench"

PIDS=()
GROUPS_MADE=()
PG_DB="blazar_replicas_$$"
stop_servers() {
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
    for cg in ${GROUPS_MADE[@]+"${GROUPS_MADE[@]}"}; do rmdir "$cg" 2>/dev/null || true; done
    GROUPS_MADE=()
}
cleanup() {
    stop_servers
    psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

free_port() {
    local port=18600
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    echo "$port"
}

# A cgroup limited to CPUS cores, named after $1.
make_group() {
    local cg="$CG_ROOT/blazar-bench-$$-$1"
    mkdir -p "$cg"
    if [ "$CG_VERSION" = 2 ]; then
        echo "$QUOTA_US 100000" >"$cg/cpu.max"
    else
        echo 100000 >"$cg/cpu.cfs_period_us"
        echo "$QUOTA_US" >"$cg/cpu.cfs_quota_us"
    fi
    GROUPS_MADE+=("$cg")
}

# start_server NAME LIMITED ARGS...: starts a server (in a quota group when LIMITED is 1),
# waits until it answers, and sets STARTED to its URL (not printed: a command substitution
# would run it in a subshell, which would keep the PID from PIDS).
start_server() {
    local name="$1" limited="$2"
    shift 2
    local port
    port="$(free_port)"
    if [ "$limited" = 1 ]; then
        local cg
        cg="$CG_ROOT/blazar-bench-$$-$name"
        make_group "$name"
        # The shell joins the group, then becomes the server: every thread starts inside.
        bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" \
            "$SERVER" --listen "127.0.0.1:$port" --database-url "$PG_URL/$PG_DB" --log warn "$@" \
            >>"$RESULTS/server-$name.log" 2>&1 &
    else
        "$SERVER" --listen "127.0.0.1:$port" --database-url "$PG_URL/$PG_DB" --log warn "$@" \
            >>"$RESULTS/server-$name.log" 2>&1 &
    fi
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 300); do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "server $name exited, see $RESULTS/server-$name.log" >&2; exit 1; }
        sleep 0.1
    done
    STARTED="http://127.0.0.1:$port"
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

POOL_ONE=(--max-connections "${POOLS%%:*}")
POOL_TWO=(--max-connections "${POOLS#*:}")

DRIVER=(--steps "$STEP" --rack-size 100 --lag-samples 0 --project-leases 100)
psql "$PG_URL/postgres" -qc "CREATE DATABASE $PG_DB" >/dev/null

echo "seeding $STEP through an unlimited server..." >&2
start_server seed 0
"$BENCH" run --url "$STARTED" "${DRIVER[@]}" --only lease_create --concurrency 1 --write-ops 8 \
    --out "$RESULTS/seed.json" >/dev/null 2>"$RESULTS/driver-seed.log"
stop_servers

printf '| run | servers | creates/s at c=64 | p50 | lock wait (session-ms) | server CPU per create |\n' \
    >"$RESULTS/summary.md"
printf '| --- | --- | --- | --- | --- | --- |\n' >>"$RESULTS/summary.md"
for round in $(seq 1 "$ROUNDS"); do
    for servers in 1 2; do
        name="r$round-s$servers"
        if [ "$servers" = 1 ]; then pool=("${POOL_ONE[@]}"); else pool=("${POOL_TWO[@]}"); fi
        start_server "$name-a" 1 "${pool[@]}"
        URLS="$STARTED"
        if [ "$servers" = 2 ]; then
            start_server "$name-b" 1 --role api "${pool[@]}"
            URLS="$URLS,$STARTED"
        fi
        cpu0=0
        for pid in "${PIDS[@]}"; do cpu0=$(awk -v a="$cpu0" -v b="$(cpu_seconds "$pid")" 'BEGIN { print a + b }'); done
        "$BENCH" run --url "$URLS" "${DRIVER[@]}" --already-seeded --only lease_create \
            --concurrency 64 --write-ops "$CREATES" --phase-seconds 120 \
            --lock-wait-db "$PG_URL/$PG_DB" --label "$servers server(s), $CPUS cores each" \
            --out "$RESULTS/$name.json" --markdown "$RESULTS/$name.md" \
            >/dev/null 2>"$RESULTS/driver-$name.log"
        cpu1=0
        for pid in "${PIDS[@]}"; do cpu1=$(awk -v a="$cpu1" -v b="$(cpu_seconds "$pid")" 'BEGIN { print a + b }'); done
        stop_servers
        # The create row of the run's table: throughput, p50 and lock wait.
        row="$(python3 - "$RESULTS/$name.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
for step in run["steps"]:
    for op in step["ops"]:
        if op["op"] == "lease_create" and op["concurrency"] == 64:
            print(op["ok"], f'{op["throughput_per_s"]:.0f}', f'{op["p50_ms"]:.1f} ms',
                  f'{op.get("lock_wait_ms") or 0:.0f}')
EOF
)"
        read -r ok rate p50 p50unit wait <<<"$row"
        per=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$ok" 'BEGIN { printf "%.2f ms", (b - a) * 1000 / (n > 0 ? n : 1) }')
        printf '| %s | %s | %s | %s %s | %s | %s |\n' "$round" "$servers" "$rate" "$p50" "$p50unit" "$wait" "$per" \
            | tee -a "$RESULTS/summary.md" >&2
    done
done
T1=$(date +%s)
echo "replicas ($STEP, $CPUS cores per server) took $((T1 - T0)) s; results in $RESULTS" \
    | tee -a "$RESULTS/summary.md" >&2
cat "$RESULTS/summary.md"
