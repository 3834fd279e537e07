#!/usr/bin/env bash
# Stops the cloud up.sh started in STATE_DIR and removes its databases, vhost and files.
# Usage: scripts/openstack/down.sh STATE_DIR
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
state="${1:?usage: down.sh STATE_DIR}"
os_down "$state"
rm -rf "$state"
echo "== OpenStack: down"
