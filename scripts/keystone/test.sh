#!/usr/bin/env bash
# Tests blazar-server against a real Keystone.
#
# Installs Keystone from PyPI into .venv/keystone (reused while requirements.txt is
# unchanged), bootstraps it on SQLite in a temporary directory, serves it on a free loopback
# port, creates projects alpha and beta with admin, member and reader users plus the service
# user blazar (setup.py), then runs the Rust tests that need it (crates/blazar-server/tests/it/
# keystone.rs: the policy matrix with real tokens, revocation, expiry, the binary, the trusts
# leases act through) and stops
# Keystone. Fails if Keystone cannot be installed, started or set up.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
started=$SECONDS

keystone_install

state="$(mktemp -d)"
cleanup() { keystone_stop; rm -rf "$state"; }
trap cleanup EXIT

port="$(keystone_free_port)"
url="http://127.0.0.1:$port/v3"
admin_password="$(keystone_secret)"
keystone_bootstrap "$state" "$url" "$admin_password"
t0=$SECONDS
keystone_start "$state" "$port"
eval "$("$keystone_venv/bin/python" "$keystone_here/setup.py" "$url" "$admin_password" \
    "$(keystone_secret)" "$(keystone_secret)")"
echo "== Keystone: serving $url, started and set up in $((SECONDS - t0)) s"

t0=$SECONDS
cd "$keystone_root"
log="$state/cargo-test.log"
set +e
cargo test --workspace --test it keystone:: 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    # Keystone's own failures first (a 500 is only a traceback in its log), then its last
    # words. The lines of one traceback share their time and process; those ending in a
    # refusal a test or the set-up asks for (Forbidden, Unauthorized, Conflict) are left out.
    echo "== Keystone tests failed; Keystone's errors:" >&2
    awk 'NR == FNR { if (/ ERROR / && /exception\.(Forbidden|Unauthorized|Conflict)/) seen[$2 " " $3] = 1; next }
         / ERROR / && !(($2 " " $3) in seen)' "$state/keystone.log" "$state/keystone.log" |
        head -n 120 >&2 || true
    echo "== Keystone's log, last lines:" >&2
    tail -n 20 "$state/keystone.log" >&2 || true
    # What the WSGI server itself said (an exception outside Keystone's handlers lands here).
    echo "== Keystone's server output, last lines:" >&2
    tail -n 40 "$state/serve.log" >&2 || true
    exit "$status"
fi
ran="$(grep -c '^test keystone::.* ok$' "$log" || true)"
if [ "$ran" -lt 9 ]; then
    echo "== only $ran Keystone tests ran; expected at least 9" >&2
    exit 1
fi
echo "== Keystone tests: $ran passed in $((SECONDS - t0)) s (whole script $((SECONDS - started)) s)"
