#!/usr/bin/env bash
# A Keystone to try blazar-server with by hand: installs it like test.sh, bootstraps it once
# in .venv/keystone-state (kept between runs), serves it on 127.0.0.1:5000 (or $PORT) until
# Ctrl-C, with projects alpha and beta (users alpha-member, beta-member, ... ), the service
# user blazar, and the reservation endpoint http://127.0.0.1:1234/v1 (or $BLAZAR_URL) in the
# catalog. It writes an openrc file per user and blazar-server's password into the state
# directory. For development only: the passwords are random but stored in plain files.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

port="${PORT:-5000}"
url="http://127.0.0.1:$port/v3"
state="${BLAZAR_KEYSTONE_STATE:-$keystone_root/.venv/keystone-state}"

keystone_install
trap keystone_stop EXIT
if [ ! -f "$state/ready" ]; then
    rm -rf "$state"
    mkdir -p "$state"
    admin_password="$(keystone_secret)"
    keystone_bootstrap "$state" "$url" "$admin_password"
    keystone_start "$state" "$port"
    user_password="$(keystone_secret)"
    service_password="$(keystone_secret)"
    "$keystone_venv/bin/python" "$keystone_here/setup.py" "$url" "$admin_password" \
        "$service_password" "$user_password" "${BLAZAR_URL:-http://127.0.0.1:1234/v1}" >/dev/null
    printf '%s\n' "$service_password" > "$state/blazar-password"
    for project in alpha beta; do
        for role in admin member reader; do
            cat > "$state/openrc-$project-$role" <<RC
export OS_AUTH_URL=$url
export OS_IDENTITY_API_VERSION=3
export OS_USERNAME=$project-$role
export OS_PASSWORD=$user_password
export OS_PROJECT_NAME=$project
export OS_USER_DOMAIN_ID=default
export OS_PROJECT_DOMAIN_ID=default
RC
        done
    done
    touch "$state/ready"
else
    keystone_start "$state" "$port"
fi
echo "== Keystone serving $url (state in $state); Ctrl-C stops it"
echo "   blazar-server's password: $state/blazar-password; users: source $state/openrc-alpha-member"
wait "$keystone_pid"
