#!/usr/bin/env bash
# The calendar in a real browser: installs Debian's chromium (when missing) and the pinned
# npm packages (playwright-core, axe-core) into scripts/calendar/node_modules, builds and
# starts blazar-server, seeds 1,000 hosts and 10,000 allocations through the API, starts a
# second server in `tokens` mode on the same database, and drives /calendar headless
# (browser-test.mjs). Screenshots and metrics.json go to artifacts/calendar/ (git-ignored).
#
# Usage: scripts/calendar/test.sh            (release build, as CI after the adversarial stage)
#        BLAZAR_CALENDAR_PROFILE=debug scripts/calendar/test.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
here=scripts/calendar
artifacts="${BLAZAR_CALENDAR_ARTIFACTS:-artifacts/calendar}"
profile="${BLAZAR_CALENDAR_PROFILE:-release}"
hosts="${BLAZAR_CALENDAR_HOSTS:-1000}"
allocations="${BLAZAR_CALENDAR_ALLOCATIONS:-10000}"

t=$SECONDS
if [ ! -x /usr/bin/chromium ]; then
    echo "== calendar: installing Debian's chromium"
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "== calendar: browser and packages ready in $((SECONDS - t)) s"

t=$SECONDS
if [ "$profile" = release ]; then
    cargo build --release --quiet -p blazar-server
else
    cargo build --quiet -p blazar-server
fi
server="target/$profile/blazar-server"
echo "== calendar: $profile server built in $((SECONDS - t)) s"

work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() {
    for _ in $(seq 1 100); do
        curl -fs "$1/healthz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server at $1 did not start; its log:" >&2
    cat "$2" >&2
    return 1
}

db="$work/calendar.db"
admin_port=$(free_port)
"$server" --listen "127.0.0.1:$admin_port" --database-url "$db" >"$work/admin.log" 2>&1 &
pids+=($!)
admin="http://127.0.0.1:$admin_port"
wait_ready "$admin" "$work/admin.log"

t=$SECONDS
node "$here/seed.mjs" "$admin" "$hosts" "$allocations"
echo "== calendar: seeded in $((SECONDS - t)) s"

member_token=$("$server" --database-url "$db" --auth tokens token create --project proj-a --role member --user ada 2>/dev/null)
tokens_port=$(free_port)
"$server" --listen "127.0.0.1:$tokens_port" --database-url "$db" --auth tokens --role api >"$work/tokens.log" 2>&1 &
pids+=($!)
tokens="http://127.0.0.1:$tokens_port"
wait_ready "$tokens" "$work/tokens.log"

t=$SECONDS
mkdir -p "$artifacts"
status=0
node "$here/browser-test.mjs" "$admin" "$tokens" "$member_token" "$artifacts" || status=$?
echo "== calendar: browser run in $((SECONDS - t)) s; screenshots and metrics in $artifacts/"
if [ "$status" -ne 0 ]; then
    echo "== calendar: the admin server's log ends:" >&2
    tail -n 20 "$work/admin.log" >&2
fi
exit "$status"
