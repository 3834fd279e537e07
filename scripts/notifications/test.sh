#!/usr/bin/env bash
# Notifications read by a real consumer: installs oslo.messaging from PyPI into
# .venv/notifications (pinned in requirements.txt; reused while that file is unchanged),
# builds blazar-server, makes a RabbitMQ virtual host of its own (rabbitmqctl; without it the
# default one, with an exchange of its own), starts blazar-server on a fresh SQLite file with
# notifications to that broker, and runs check.py: oslo.messaging's NotificationListener
# receives every notification of a lease life driven over the API (create, a dry run and a
# refused create that announce nothing, extend, start, the lease-ending notice, extend again,
# the notice again, end, delete) and checks each envelope and payload as a Ceilometer-like
# consumer would read them. Takes about three minutes: the events run on real time.
#
#   BLAZAR_TEST_AMQP_URL   the broker [default: amqp://guest:guest@127.0.0.1:5672]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${BLAZAR_NOTIFICATIONS_VENV:-$root/.venv/notifications}"
started=$SECONDS

# shellcheck source=../venv.sh
source "$root/scripts/venv.sh"
venv_install "$venv" "$here/requirements.txt" oslo.messaging

# shellcheck source=../server.sh
source "$root/scripts/server.sh"
server="$(server_binary "$root")"

amqp="${BLAZAR_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672}"
amqp="${amqp%/}"
userinfo="${amqp#amqp://}"
userinfo="${userinfo%@*}"
hostport="${amqp##*@}"
name="blazar-notifications-$(date +%s)-$$"
state="$(mktemp -d)"
server_pid=""
vhost=""
exchange="openstack"
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [ -n "$vhost" ]; then
        rabbitmqctl delete_vhost "$vhost" >/dev/null 2>&1 || true
    fi
    rm -rf "$state"
}
trap cleanup EXIT

if rabbitmqctl add_vhost "$name" >/dev/null 2>&1 &&
    rabbitmqctl set_permissions -p "$name" "${userinfo%%:*}" '.*' '.*' '.*' >/dev/null 2>&1; then
    vhost="$name"
    path="/$vhost"
    echo "== RabbitMQ: virtual host $vhost"
else
    # No rabbitmqctl here: the default virtual host, with an exchange nobody else uses.
    exchange="$name"
    path="/"
    echo "== RabbitMQ: default virtual host, exchange $exchange"
fi
transport_url="rabbit://$userinfo@$hostport$path"

port="$("$venv/bin/python" -c \
    'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
BLAZAR_NOTIFICATIONS_TRANSPORT_URL="$transport_url" BLAZAR_LOG="${BLAZAR_LOG:-info}" "$server" \
    --listen "127.0.0.1:$port" --database-url "$state/blazar.db" \
    --notifications-exchange "$exchange" --poll-interval 0.5 >"$state/server.log" 2>&1 &
server_pid=$!

t0=$SECONDS
set +e
"$venv/bin/python" "$here/check.py" --api "http://127.0.0.1:$port" \
    --transport-url "$transport_url" --exchange "$exchange"
status=$?
set -e
if [ "$status" -ne 0 ]; then
    echo "== blazar-server's log:" >&2
    tail -n 60 "$state/server.log" >&2 || true
fi
echo "== notifications: $((SECONDS - t0)) s (whole script $((SECONDS - started)) s)"
exit "$status"
