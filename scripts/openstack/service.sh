#!/usr/bin/env bash
# Stops or starts again one service of a cloud brought up by up.sh: an outage of that
# service alone, as the real-cloud tests break it on purpose. Not a compute: the fake
# driver, started again, makes a new node that Nova refuses as a duplicate of the old one
# (disable its compute service instead).
#
# Usage: scripts/openstack/service.sh STATE_DIR NAME stop|start
#   stop:  kills NAME's process group (as down.sh would) and forgets its pid;
#   start: starts it again with the environment and command up.sh started it with.
set -euo pipefail

state="${1:?usage: service.sh STATE_DIR NAME stop|start}"
name="${2:?usage: service.sh STATE_DIR NAME stop|start}"
what="${3:?usage: service.sh STATE_DIR NAME stop|start}"
pids="$state/pids"

case "$what" in
stop)
    pid="$(awk -v n="$name" '$1 == n {print $2}' "$pids")"
    if [ -z "$pid" ]; then
        echo "service.sh: $name is not running" >&2
        exit 1
    fi
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 -- "-$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    awk -v n="$name" '$1 != n' "$pids" >"$pids.new"
    mv "$pids.new" "$pids"
    ;;
start)
    if awk -v n="$name" '$1 == n {found = 1} END {exit !found}' "$pids"; then
        echo "service.sh: $name is running already" >&2
        exit 1
    fi
    setsid bash "$state/start/$name" >>"$state/log/$name.out" 2>&1 </dev/null &
    echo "$name $!" >>"$pids"
    ;;
*)
    echo "usage: service.sh STATE_DIR NAME stop|start" >&2
    exit 2
    ;;
esac
