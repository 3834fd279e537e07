# Shared by up.sh, down.sh and test.sh. Source it; it defines functions.

os_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
os_here="$os_root/scripts/openstack"
os_venv="${BLAZAR_OPENSTACK_VENV:-$os_root/.venv/openstack}"

# shellcheck source=../venv.sh
source "$os_root/scripts/venv.sh"

# Installs the pinned OpenStack 2026.1 set once per requirements.txt (reused while it is
# unchanged).
os_install() {
    venv_install "$os_venv" "$os_here/requirements.txt" OpenStack
}

os_mysql() { mysql -h 127.0.0.1 -P 3306 -u root "$@"; }

# rabbitmqctl needs the broker's Erlang cookie: root's, or sudo to root.
os_rabbit() {
    if [ "$(id -u)" = 0 ]; then rabbitmqctl -q "$@"; else sudo -n rabbitmqctl -q "$@"; fi
}

os_secret() { "$os_venv/bin/python" -c 'import secrets; print(secrets.token_hex(12))'; }

os_free_port() {
    "$os_venv/bin/python" -c \
        'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# os_start NAME STATE COMMAND...: in its own session (so down.sh can kill the whole group),
# output to STATE/log/NAME.out, pid recorded in STATE/pids. STATE/start/NAME keeps the
# environment and the command, for service.sh to start it again after stopping it.
os_start() {
    local name="$1" state="$2"
    shift 2
    mkdir -p "$state/start"
    { export -p; printf 'exec'; printf ' %q' "$@"; printf '\n'; } >"$state/start/$name"
    setsid "$@" >"$state/log/$name.out" 2>&1 </dev/null &
    echo "$name $!" >>"$state/pids"
}

# os_serve NAME MODULE PORT STATE: a WSGI API under gunicorn.
os_serve() {
    local name="$1" module="$2" port="$3" state="$4"
    os_start "$name" "$state" "$os_venv/bin/python" "$os_here/serve.py" "$module" \
        "127.0.0.1:$port" "$name"
}

# os_wait_http URL NAME STATE: until URL answers at all (any HTTP status), at most 120 s.
os_wait_http() {
    local url="$1" name="$2" state="$3" i
    for i in $(seq 1 600); do
        if curl -s -o /dev/null --max-time 2 "$url"; then return 0; fi
        local pid
        pid="$(awk -v n="$name" '$1 == n {print $2}' "$state/pids")"
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            echo "== OpenStack: $name exited; its output:" >&2
            tail -n 40 "$state/log/$name.out" >&2 || true
            return 1
        fi
        sleep 0.2
    done
    echo "== OpenStack: $name did not answer at $url within 120 s" >&2
    tail -n 40 "$state/log/$name.out" >&2 || true
    return 1
}

# os_down STATE: stops every process group started, drops the databases and the vhost.
os_down() {
    local state="$1" name pid prefix
    if [ -f "$state/pids" ]; then
        while read -r name pid; do
            kill -TERM -- "-$pid" 2>/dev/null || true
        done <"$state/pids"
        sleep 2
        while read -r name pid; do
            kill -KILL -- "-$pid" 2>/dev/null || true
        done <"$state/pids"
    fi
    if [ -f "$state/prefix" ]; then
        prefix="$(cat "$state/prefix")"
        for db in keystone placement glance nova_api nova nova_cell0 neutron; do
            os_mysql -e "DROP DATABASE IF EXISTS ${prefix}_$db" 2>/dev/null || true
        done
        os_rabbit delete_vhost "$prefix" >/dev/null 2>&1 || true
    fi
}
