# Shared by the scripts that run the debug blazar-server. Source it; it defines one function.
#
# server_binary ROOT: prints the path of the debug blazar-server to run. It is
# $BLAZAR_SERVER_BIN when set (CI passes the one its test stage built: building it again
# with `-p blazar-server` alone would resolve other features for the shared dependencies and
# compile them again, minutes on two cores); otherwise it is built here.
server_binary() {
    local root="$1"
    if [ -n "${BLAZAR_SERVER_BIN:-}" ]; then
        if [ ! -x "$BLAZAR_SERVER_BIN" ]; then
            echo "== BLAZAR_SERVER_BIN=$BLAZAR_SERVER_BIN is not an executable" >&2
            return 1
        fi
        echo "$BLAZAR_SERVER_BIN"
        return
    fi
    echo "== building blazar-server" >&2
    # Called as `server="$(server_binary ...)"`, where set -e does not reach: a failed
    # build must fail the call itself.
    (cd "$root" && cargo build --quiet -p blazar-server --bin blazar-server) >&2 || return 1
    echo "${CARGO_TARGET_DIR:-$root/target}/debug/blazar-server"
}
