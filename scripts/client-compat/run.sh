#!/usr/bin/env bash
# Compatibility with the real clients: installs python-blazarclient 4.6.0, python-openstackclient
# and python-chi from PyPI into .venv/clients (pinned in requirements.txt; reused while that file
# is unchanged), builds blazar-server, and runs compat.py, which drives every command of
# `blazar` and of `openstack reservation` and python-chi's lease helpers against fresh noauth
# servers on loopback, comparing the outputs with the ones recorded against the real Blazar
# (reference/client-transcript.md). No Keystone is needed: both CLIs take
# --os-auth-type none/admin_token with --os-endpoint, and python-chi takes OS_AUTH_TYPE=none
# with OS_ENDPOINT_OVERRIDE. The network is used only when installing.
#
#   scripts/client-compat/run.sh                   # everything (about 4 minutes, plus the install)
#   scripts/client-compat/run.sh --parts blazar    # one part: blazar, openstack, chi
#   scripts/client-compat/run.sh --steps 22-45     # some steps of the recording (debugging)
#   scripts/client-compat/run.sh --install-only    # only the venv (scripts/openstack/walk.sh)
#
# Exits non-zero when a check fails; each failure names the command and shows the expected and
# actual outputs and the HTTP exchanges.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${BLAZAR_CLIENTS_VENV:-$root/.venv/clients}"
started=$SECONDS

# shellcheck source=../venv.sh
source "$root/scripts/venv.sh"
venv_install "$venv" "$here/requirements.txt" clients

if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

# shellcheck source=../server.sh
source "$root/scripts/server.sh"
server="$(server_binary "$root")"

t0=$SECONDS
set +e
"$venv/bin/python" "$here/compat.py" --venv "$venv" --server "$server" "$@"
status=$?
set -e
echo "== client compatibility: $((SECONDS - t0)) s (whole script $((SECONDS - started)) s)"
exit "$status"
