# Shared by the scripts that run the debug blazar-server. Source it; it defines one function.
#
# server_binary ROOT: prints the path of the debug blazar-server to run. It is
# $BLAZAR_SERVER_BIN when set (CI passes the one its test stage built: building it again
# with `-p blazar-server` alone would resolve other features for the shared dependencies and
# compile them again, minutes on two cores); otherwise it is built here.
server_binary() {
    local root="$1"
    if [ -n "${BLAZAR_SERVER_BIN:-}" ]; then
        echo "$BLAZAR_SERVER_BIN"
        return
    fi
    echo "== building blazar-server" >&2
    (cd "$root" && cargo build --quiet -p blazar-server --bin blazar-server) >&2
    echo "${CARGO_TARGET_DIR:-$root/target}/debug/blazar-server"
}
