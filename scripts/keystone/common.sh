# Shared by test.sh and run.sh: install Keystone into a venv inside the clone, bootstrap it on
# SQLite in a state directory, serve it on loopback. Source this file; it defines functions.

keystone_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
keystone_here="$keystone_root/scripts/keystone"
keystone_venv="${BLAZAR_KEYSTONE_VENV:-$keystone_root/.venv/keystone}"
# shellcheck source=../venv.sh
source "$keystone_root/scripts/venv.sh"

# Installs Keystone once per requirements.txt (the venv is reused while it is unchanged).
keystone_install() {
    venv_install "$keystone_venv" "$keystone_here/requirements.txt" Keystone
}

keystone_secret() { "$keystone_venv/bin/python" -c 'import secrets; print(secrets.token_hex(16))'; }

keystone_free_port() {
    "$keystone_venv/bin/python" -c \
        'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# keystone_bootstrap STATE_DIR URL ADMIN_PASSWORD: a fresh Keystone database and keys.
keystone_bootstrap() {
    local state="$1" url="$2" admin_password="$3" t0=$SECONDS
    echo "== Keystone: bootstrapping in $state"
    mkdir -p "$state/etc" "$state/fernet" "$state/credential"
    cat > "$state/etc/keystone.conf" <<CONF
[DEFAULT]
log_file = $state/keystone.log
[database]
connection = sqlite:///$state/keystone.sqlite
[fernet_tokens]
key_repository = $state/fernet
[credential]
key_repository = $state/credential
[token]
expiration = 3600
[identity]
# The cheapest bcrypt: these passwords need no brute-force resistance, and every login and
# user creation pays for the hashing.
password_hash_rounds = 4
[cache]
enabled = false
CONF
    local step
    for step in "db_sync" \
        "fernet_setup --keystone-user $(id -u) --keystone-group $(id -g)" \
        "credential_setup --keystone-user $(id -u) --keystone-group $(id -g)" \
        "bootstrap --bootstrap-password $admin_password --bootstrap-region-id RegionOne --bootstrap-public-url $url"; do
        # shellcheck disable=SC2086
        if ! "$keystone_venv/bin/keystone-manage" --config-file "$state/etc/keystone.conf" $step \
            >>"$state/manage.log" 2>&1; then
            tail -n 40 "$state/manage.log" >&2
            echo "keystone-manage ${step%% *} failed" >&2
            return 1
        fi
    done
    echo "== Keystone: bootstrapped in $((SECONDS - t0)) s"
}

# keystone_start STATE_DIR PORT: serves Keystone in the background (sets keystone_pid) and
# waits until it answers.
keystone_start() {
    local state="$1" port="$2"
    OS_KEYSTONE_CONFIG_DIR="$state/etc" "$keystone_venv/bin/python" "$keystone_here/serve.py" \
        "127.0.0.1:$port" >"$state/serve.log" 2>&1 &
    keystone_pid=$!
    if ! "$keystone_venv/bin/python" - "http://127.0.0.1:$port/v3" "$keystone_pid" <<'PY'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("Keystone exited")
    try:
        urllib.request.urlopen(url, timeout=2)
        sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit("Keystone did not answer within 120 s")
PY
    then
        echo "== Keystone could not be started; its output:" >&2
        tail -n 40 "$state/serve.log" "$state/keystone.log" >&2 || true
        return 1
    fi
}

# keystone_stop: stops the Keystone this shell started.
keystone_stop() {
    if [ -n "${keystone_pid:-}" ]; then
        kill "$keystone_pid" 2>/dev/null || true
        wait "$keystone_pid" 2>/dev/null || true
        keystone_pid=""
    fi
}
